"""What a typed reply to a `TextChannel` answers: yes or no to an approval (a reason may
follow), an option of a question by its id, label or number, or free text where allowed."""

from __future__ import annotations

import bisect
import itertools
import re
import unicodedata
from collections.abc import Callable

from .._option_names import folded, named_options
from .._text import is_blank, is_utf8, visible
from .._types import InputRequest, InputResponse

__all__ = ["parse_reply"]

_APPROVE = frozenset({"y", "yes", "approve", "approved", "ok", "1"})
_DENY = frozenset({"n", "no", "deny", "denied", "reject", "cancel", "2"})
# Read in compatibility form (`_compatible`): a full-width `：` or `！` is `:` or `!`; the
# ideographic `、` and `。` separate as `,` and `.` do.
_WORD = re.compile(r"^\s*([^\s:,.!、。-]+)[\s:,.!、。-]*(.*)$", re.DOTALL)
# A word joined on without a space is one word: `no-brainer`, `1.5` and `1,000` say no yes or no.
_JOINED = re.compile(r"^\s*[^\s:,.!、。-]+(?:-\w|[.,]\d)")


def parse_reply(request: InputRequest, text: str) -> InputResponse | None:
    """The answer a typed reply gives `request`, or None if it is not one.

    Approvals take `yes` / `no` (or approve / deny, 1 / 2), optionally followed by a reason
    (`no: too large`); questions take an option's id, label or number, or free text if allowed.
    Text that shows nothing, names two options at once, or is not UTF-8 (a lone surrogate, as
    a byte piped in reads) answers nothing: the byte, drawing nothing, was passed over, so that
    `y` and one approved.
    """
    text = text.strip()
    if is_blank(text) or not is_utf8(text):
        return None
    if request.kind == "tool-approval":
        compatible, typed_at = _compatible(text)
        m = _WORD.match(compatible)
        if m is None or _JOINED.match(compatible):
            return None
        # the word as options are named; the reason as typed (none if it shows nothing)
        word, rest = folded(m.group(1)), text[typed_at(m.start(2)) :].strip()
        reason = None if is_blank(rest) else rest
        if word in _APPROVE:
            return InputResponse(request_id=request.id, option_id="approve", text=reason)
        if word in _DENY:
            return InputResponse(request_id=request.id, option_id="cancel", text=reason)
        return None
    named = named_options(request.options, text)
    if len(named) == 1:
        return InputResponse(request_id=request.id, option_id=named[0].id)
    if named:  # ambiguous: taken as text, the person would think they chose an option
        return None
    if request.allow_text:
        return InputResponse(request_id=request.id, text=text)
    return None


def _compatible(text: str) -> tuple[str, Callable[[int], int]]:
    """`text` in Unicode's compatibility form character by character (full-width `ｎｏ：` is
    `no:`) without what draws nothing (`yes` + U+200B is `yes`), and where in `text` the
    character holding an index of it is (the next one where that index is inside one that became
    several, or the first of those dropped before it)."""
    parts = [unicodedata.normalize("NFKC", visible(c)) for c in text]
    starts = list(itertools.accumulate((len(p) for p in parts), initial=0))
    return "".join(parts), lambda i: bisect.bisect_left(starts, i)
