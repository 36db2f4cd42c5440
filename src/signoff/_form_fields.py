"""The one bound every urlencoded form read checks on its raw bytes before parsing it: no more
`&` separators than a form may have fields. Parsers count fields, not the empty ones between
`&&`, and do a step of work for each: 4 MB of `&` cost a second of CPU to parse, for anyone who
could post (the dashboard's forms, signing in, Slack's interactivity endpoint)."""

from __future__ import annotations

__all__ = ["MAX_FIELDS", "TOO_MANY_FIELDS", "too_many_fields"]

MAX_FIELDS = 1000
"""Fields a form may have at most (Starlette's own bound on a parsed form's fields)."""
TOO_MANY_FIELDS = f"Too many fields. Maximum number of fields is {MAX_FIELDS}."
"""What a form over the bound is told, in the words of Starlette's own refusal."""


def too_many_fields(body: bytes) -> bool:
    """Whether the urlencoded `body` has more separators than a form may have fields: one pass
    over its bytes, in C, which is all such a body is given."""
    return body.count(b"&") > MAX_FIELDS
