"""A reviewer's edited arguments from the dashboard's approval form: read as one JSON object,
none where they are the call as proposed (the form posts its box back unchanged), and whether
the approval recorded them, which is the answer's rule (`edited_input`), not the page's."""

from __future__ import annotations

import json
from typing import Any

from .._answer_edits import as_proposed
from .._exceptions import InvalidAnswer
from .._types import InputRequest
from ._context import ServerContext
from ._json_body import RepeatedKey, unique_keys

__all__ = ["edit_recorded", "posted_edit", "posted_object"]


def posted_edit(request: InputRequest, raw: str) -> dict[str, Any] | None:
    """The arguments a reviewer typed, as one JSON object, or None if they are the call as
    proposed; `InvalidAnswer` if they are not a JSON object."""
    parsed = posted_object(raw)
    return None if as_proposed(request, parsed) else parsed


def posted_object(raw: str) -> dict[str, Any]:
    """An edit box's text as the one JSON object it must be; `InvalidAnswer` if it is not."""
    try:  # a key typed twice would silently mean its last value: refused
        parsed = json.loads(raw, object_pairs_hook=unique_keys)
    except RepeatedKey as exc:
        raise InvalidAnswer(f"the edited arguments are ambiguous: {exc}") from None
    except RecursionError:  # absurd nesting: the parser's own words name Python's stack
        raise InvalidAnswer("the edited arguments are not JSON: nested too deeply") from None
    except ValueError as exc:
        raise InvalidAnswer(f"the edited arguments are not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise InvalidAnswer("the edited arguments must be a JSON object")
    return parsed


async def edit_recorded(ctx: ServerContext, request_id: str) -> bool:
    """Whether the approval of `request_id` recorded edited input: an edit that validates to
    the call as proposed (a key left to its default) is none, and the reviewer is not told of
    one."""
    stored = await ctx.runtime.store.get_request(request_id)
    resolution = (stored.resolution if stored else None) or {}
    return resolution.get("edited_input") is not None
