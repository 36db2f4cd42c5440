"""An approval's edited input on its way in: validated against the tool's input, refused where
the call would not run with it as given, and no edit at all where it is the call as proposed;
with the bounds every answer's JSON shares with it (its depth, a schema problem named)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from ._exceptions import InvalidAnswer
from ._text import cut
from ._tool_json import edit_changed, holds_mask, kept, key_not_text, own_input, unlike
from ._tools import Tool
from ._types import InputRequest, same_json

__all__ = [
    "MAX_DEPTH",
    "SHOWN_PROBLEMS",
    "as_proposed",
    "check_depth",
    "edited_input",
    "first_problems",
]


def edited_input(
    request: InputRequest, given: dict[str, Any], tool: Tool | None
) -> dict[str, Any] | None:
    """The edited input an approval of `request` records: `given` as the tool validated it, or
    None where that is the call as proposed (a form posted back unchanged), which is no edit:
    the model is told of none, a plain approve repeats it, a quorum's voter may send it.
    Raises InvalidAnswer for an edit this approval does not take or the call would not run with.
    """
    rid = request.id
    if as_proposed(request, given):
        return None  # as shown: no validation, which a masked secret in it would fail
    if tool is None or request.source == "tool":
        raise InvalidAnswer(f"request {rid}: this approval takes no edited input", [rid])
    try:
        edited = _validated_edit(rid, tool, given)
    except InvalidAnswer:
        if request.approvers > 1:
            raise _no_quorum_edit(request) from None
        raise
    if same_json(edited, request.input):
        return None
    if request.approvers > 1:
        raise _no_quorum_edit(request)
    return edited


def as_proposed(request: InputRequest, given: Any) -> bool:
    """Whether edited input `given` is the input `request` shows, as JSON (`true` is not `1`):
    the call as proposed, no edit."""
    return request.action is not None and same_json(given, request.input)


def _no_quorum_edit(request: InputRequest) -> InvalidAnswer:
    """The refusal of an edit to a quorum's approval: each approver must approve the same
    call, so one of them may not change it alone."""
    return InvalidAnswer(
        f"request {request.id} needs {request.approvers} approvers, who all approve the call "
        "as proposed: it takes no edited input",
        [request.id],
    )


def _validated_edit(rid: str, tool: Tool, given: dict[str, Any]) -> dict[str, Any]:
    """The JSON form of `given` validated against `tool`'s input, which the call runs with;
    InvalidAnswer if it does not fit or would not run as given."""
    _check_edit_as_given(rid, given)
    try:
        validated = tool.validate(given)
        if tool.holds_lazy(validated):
            kept(validated)  # its form uses the iterators up: what they held is compared
        edited = tool.approved_form(validated)
    except ValidationError as exc:
        problems = first_problems(exc)
        raise InvalidAnswer(
            f"request {rid}: edited input does not fit {tool.name}'s schema: {problems}", [rid]
        ) from None
    except PydanticSerializationError as exc:
        raise InvalidAnswer(
            f"request {rid}: validated, the edited input has no JSON form to record: {exc}", [rid]
        ) from None
    _check_edit_kept(rid, tool, validated, edited)
    _check_edit_unchanged(rid, tool, given, edited, validated)
    return edited


def _check_edit_kept(rid: str, tool: Tool, validated: BaseModel, edited: dict[str, Any]) -> None:
    """Refuse an edit the call would not run with: the recorded edit (the JSON form of the
    `validated` edit) is validated again when the call runs, and must come out the same, as
    JSON and as the tool gets it (a validator that changes a value would not, nor a value the
    form leaves out or shows otherwise: a serializer's mask), holding no secret's mask (which
    would run as the mask)."""
    try:
        again = tool.validate(edited)
        form = None if holds_mask(again) else tool.approved_form(own_input(tool, edited, again))
    except (ValidationError, PydanticSerializationError):
        again, form = None, None
    if form != edited:
        raise InvalidAnswer(
            f"request {rid}: {tool.name}'s input cannot be edited: validated again, the edit "
            "does not come out as it went in (a masked secret, or a validator that changes "
            "its value), so the call could not run with it",
            [rid],
        )
    found = unlike(validated, again, edited)
    if found is not None:
        where = ".".join(str(part) for part in found[0]) or "the input"
        raise InvalidAnswer(
            f"request {rid}: {tool.name}'s input cannot be edited: its JSON form, which is "
            f"recorded and runs, shows {where!r} otherwise than the edit gives it (a serializer "
            "that shows less than the value), so the call would not run with the edit",
            [rid],
        )


def _check_edit_unchanged(
    rid: str, tool: Tool, given: Any, edited: dict[str, Any], validated: BaseModel | None = None
) -> None:
    """Refuse an edit that validation changed (`edit_changed`): the reviewer approved what they
    gave, and the call would run with something else, recorded as if they had approved it."""
    found = edit_changed(given, edited, validated)
    if found is None:
        return
    loc, shown, dropped = found
    where = ".".join(str(part) for part in loc) or "the input"
    if dropped and shown is not None:
        raise InvalidAnswer(
            f"request {rid}: the edit's {where!r} is {tool.name}'s field shown as {shown!r} in "
            f"the form, which is recorded and binds the approval: edit it by that name",
            [rid],
        )
    if dropped:
        what = "is dropped (a key the tool does not take)"
    else:
        what = f"comes out as {cut(json.dumps(shown), 100)}, not as the edit gives it"
    raise InvalidAnswer(
        f"request {rid}: validated, the edit's {where!r} {what}: {tool.name} would run with "
        "other input than approved; edit it to the value it takes",
        [rid],
    )


def _check_edit_as_given(rid: str, edited: Any) -> None:
    """Refuse an edit pydantic would not refuse by name: one nested too deeply (its serializer
    raises a bare ValueError), holding a lone surrogate (it turns a key's into U+FFFD) or an
    integer past Python's digit limit (no JSON text holds it)."""
    check_depth(rid, edited)
    try:
        json.dumps(edited, ensure_ascii=False, default=str).encode()
    except ValueError as exc:  # UnicodeEncodeError is one
        raise InvalidAnswer(
            f"request {rid}: the answer is not plain JSON text: {exc}", [rid]
        ) from None


MAX_DEPTH = 100
"""How deeply an answer's value or edited input may nest (lists and objects)."""


def check_depth(rid: str, value: Any) -> None:
    """Refuse `value` (an answer's value, an edit) if it nests deeper than `MAX_DEPTH` levels,
    or holds a key that is not text: recorded as JSON, `{1: "a"}` would reach the run as it is
    and a resumed run as `{"1": "a"}` (and `{1: "a", "1": "b"}` would lose a key)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, tuple, dict)):
            if depth > MAX_DEPTH:
                raise InvalidAnswer(
                    f"request {rid}: the answer's value nests deeper than {MAX_DEPTH} levels", [rid]
                )
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    problem = key_not_text(value)
    if problem is not None:
        raise InvalidAnswer(
            f"request {rid}: the answer is not plain JSON: its {problem}; JSON keys are text",
            [rid],
        )


SHOWN_PROBLEMS = 10
"""How many of an edit's schema problems a refusal names: one with thousands of unknown keys
made a refusal twice the size of the body, and took seconds to write."""


def first_problems(exc: ValidationError) -> str:
    """The first `SHOWN_PROBLEMS` problems of `exc`, and how many more there are."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    shown = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'input'}: {e['msg']}"
        for e in errors[:SHOWN_PROBLEMS]
    )
    more = len(errors) - SHOWN_PROBLEMS
    return shown if more <= 0 else f"{shown}; and {more} more"
