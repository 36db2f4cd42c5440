"""What a typed reply to a `TextChannel` answers: yes or no to an approval (a reason may
follow), an option of a question by its id, label or number, or free text where allowed."""

from __future__ import annotations

import re

from .._text import is_blank
from .._types import InputRequest, InputResponse, folded, named_options

__all__ = ["parse_reply"]

_APPROVE = frozenset({"y", "yes", "approve", "approved", "ok", "1"})
_DENY = frozenset({"n", "no", "deny", "denied", "reject", "cancel", "2"})
_WORD = re.compile(r"^\s*([^\s:,.!-]+)[\s:,.!-]*(.*)$", re.DOTALL)
# A word joined on without a space is one word: `no-brainer`, `1.5` and `1,000` say no yes or no.
_JOINED = re.compile(r"^\s*[^\s:,.!-]+(?:-\w|[.,]\d)")


def parse_reply(request: InputRequest, text: str) -> InputResponse | None:
    """The answer a typed reply gives `request`, or None if it is not one.

    Approvals take `yes` / `no` (or approve / deny, 1 / 2), optionally followed by a reason
    (`no: too large`); questions take an option's id, label or number, or free text if allowed.
    Text that shows nothing, or names two options at once, answers nothing.
    """
    text = text.strip()
    if is_blank(text):
        return None
    if request.kind == "tool-approval":
        m = _WORD.match(text)
        if m is None or _JOINED.match(text):
            return None
        word, rest = folded(m.group(1)), m.group(2).strip() or None  # as options are named
        if word in _APPROVE:
            return InputResponse(request_id=request.id, option_id="approve", text=rest)
        if word in _DENY:
            return InputResponse(request_id=request.id, option_id="cancel", text=rest)
        return None
    named = named_options(request.options, text)
    if len(named) == 1:
        return InputResponse(request_id=request.id, option_id=named[0].id)
    if named:  # ambiguous: taken as text, the person would think they chose an option
        return None
    if request.allow_text:
        return InputResponse(request_id=request.id, text=text)
    return None
