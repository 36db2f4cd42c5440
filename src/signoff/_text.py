"""Text shown to people (a page, a Slack message): the characters that are invisible or reorder
what is around them, written as JSON-style escapes, so what a reviewer reads is what runs."""

from __future__ import annotations

import re
from datetime import UTC, datetime

__all__ = [
    "BIDI",
    "HIDDEN",
    "NOTHING_SAID",
    "SAID",
    "cut",
    "escape_as_json",
    "far_off",
    "in_utc",
    "is_blank",
    "is_utf8",
    "storable",
    "utc_text",
    "visible",
]

BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""Bidirectional controls: they make the text around them read in another order."""

HIDDEN = re.compile(
    "[\x7f-\x9f\xad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f"
    "\u2028-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff9-\ufffb\ud800-\udfff"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]"
)
"""The above and what is invisible: C1 controls, zero-width and formatting characters, line
separators, variation selectors, tag characters (every character Unicode says to draw nothing
for: Default_Ignorable_Code_Point), and lone surrogates (which UTF-8 cannot hold).
Inside a JSON string they can be escaped and the text still parses to the same value."""


_C0 = re.compile("[\x00-\x1f]")
_DRAWN_NOTHING = re.compile(f"(?!\\s){HIDDEN.pattern}")
"""`HIDDEN` but for the line separators (U+0085, U+2028, U+2029), which part words as spaces do."""


def cut(text: str, cap: int) -> str:
    """`text`, or its first `cap` characters marked ` [cut]` when longer: a message or reason of
    megabytes is stored, and read again by the model, no longer than its bound allows."""
    return text if len(text) <= cap else text[:cap] + " [cut]"


def is_blank(text: str) -> bool:
    """Whether `text` shows nothing: only whitespace, controls and invisible characters. A
    typed reply like that is no answer, and a prompt or message like that starts no turn, as an
    empty one does not: this is the one rule, for the runtime, the API, the CLI and channels."""
    return not HIDDEN.sub("", _C0.sub("", text)).strip()


def visible(text: str) -> str:
    """`text` without the characters that draw nothing (a zero-width space, a bidirectional mark,
    a variation selector): a typed reply as a person reads it, to compare with an option's name."""
    return _DRAWN_NOTHING.sub("", text)


SAID = (
    "[^\\x00-\\x20\\x7f-\\xa0\\xad\\u034f\\u061c\\u115f\\u1160\\u1680\\u17b4\\u17b5"
    "\\u180b-\\u180f\\u2000-\\u200f\\u2028-\\u202f\\u205f-\\u206f\\u3000\\u3164\\ufe00-\\ufe0f"
    "\\ufeff\\uffa0\\ufff9-\\ufffb\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e0fff]"
)
"""A character that `is_blank` does not pass over, spelled so that JSON Schema reads the same
class (the characters above the basic plane written as themselves): the OpenAPI document
says a message needs one. Lone surrogates are left to the check that refuses them anywhere."""


NOTHING_SAID = (
    "{what} says nothing (it is empty, or only whitespace, controls or invisible characters): "
    "write something for the agent to read"
)
"""Why text that `is_blank` is refused; `what` names it."""


def is_utf8(text: str) -> bool:
    """Whether `text` has a UTF-8 form: not if it holds a lone surrogate, which neither store
    can take as a key or look up (the driver raises UnicodeEncodeError), so no id holds one."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def storable(text: str) -> str:
    """`text` with each lone surrogate written as its escape (`\\udcff`), which UTF-8 holds: a
    principal's text as an audit entry keeps it (a sign-out's, a deletion's `by`)."""
    return text.encode("utf-8", "backslashreplace").decode()


def escape_as_json(match: re.Match[str]) -> str:
    """The matched character as JSON writes it escaped (`\\u202e`; a surrogate pair above the
    basic plane): a substitution for `BIDI.sub` and `HIDDEN.sub`."""
    code = ord(match.group())
    if code > 0xFFFF:
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


def in_utc(at: float, form: str) -> str | None:
    """`at` (seconds since the epoch) as a UTC date in strftime `form`, or None for a time no
    datetime holds (a deadline `expires_in=1e12` away is past the year 9999)."""
    try:
        return datetime.fromtimestamp(at, UTC).strftime(form)
    except (OverflowError, ValueError, OSError):
        return None


def utc_text(at: float, form: str) -> str:
    """`at` as `in_utc` writes it, or as `far_off` names it when no datetime holds it."""
    shown = in_utc(at, form)
    return far_off(at) if shown is None else shown


def far_off(at: float) -> str:
    """A time past the years a datetime holds, named by the bound it passes."""
    return "after 9999-12-31" if at > 0 else "before 0001-01-01"
