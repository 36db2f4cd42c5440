"""Whether a call's input is still the one its approval is bound to, when it runs: by the
hash of the form the reviewer saw; and the input an ungated call's body got when it first ran,
for a re-run. Apart from `_tool_calls` so the engine's part stays short."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Secret, SecretBytes, SecretStr, ValidationError
from pydantic_core import PydanticSerializationError

from ._input_sets import python_dump, sets_alike
from ._tool_json import holds_mask, is_mask, own_input
from ._tools import Tool
from ._types import Action, input_hash, same_json

__all__ = ["as_approved", "as_started", "binds", "left_out", "still_bound"]


def still_bound(action: Action, tool: Tool, validated: BaseModel) -> bool:
    """Whether `validated` is the input `action` binds, by the hash the reviewer approved (or,
    a set's items in another order, by the form so hashed: `sets_alike`): not if it has no
    JSON form now (a validator that made another value), which no one saw."""
    try:
        form = tool.approved_form(validated)
    except PydanticSerializationError:
        return False
    if input_hash(form, tool_name=action.tool_name, call_id=action.call_id) == action.input_hash:
        return True
    # A set an older signoff showed in its own order (the same in each process where
    # PYTHONHASHSEED is pinned) binds by its items: the form it hashed, checked, is `form` else.
    authentic = input_hash(action.input, tool_name=action.tool_name, call_id=action.call_id)
    return authentic == action.input_hash and sets_alike(action.input, form, validated)


def binds(action: Action, tool: Tool, raw: Any, validated: BaseModel) -> bool:
    """Whether `validated` (of `raw`) is the input `action` binds (`still_bound`), leaving it
    whole for the body: a lazy input is checked on a validation of its own, as the check uses
    up its iterators."""
    try:
        return still_bound(action, tool, own_input(tool, raw, validated))
    except ValidationError:  # validated again, it is not valid: no input anybody approved
        return False


def as_approved(action: Action, tool: Tool, raw: Any) -> tuple[Any, BaseModel] | None:
    """The input approved, when the model's own no longer validates to it: a value pydantic
    generates for what is left out (a `default_factory`: an id, a time) is another one each
    time, the one the reviewer saw is in the form. First the model's input with what it left
    out taken from the form (a secret's mask left out: its default applies, unless generated);
    else, as that pairs list items by place (a validator that sorts them, a text it makes an
    object of), the form itself, when it holds no mask. Either is taken only if its hash is
    the one approved; a deploy that changed what the input validates to is refused. The raw
    input taken, with it validated (a lazy input's other readers validate that raw too, so
    they read the values that run); None if neither is the input approved."""
    filled, masks_left = _filled(raw, action.input)
    validated = _bound(action, tool, filled)
    if validated is not None and masks_left:
        again = _bound(action, tool, filled)  # a secret generated anew: not one anybody saw
        if again is None or _secrets(again) != _secrets(validated):
            validated = None
    if validated is not None:
        return filled, validated
    validated = _bound(action, tool, action.input)
    return None if validated is None else (action.input, validated)


def left_out(tool: Tool, raw: Any, validated: BaseModel) -> dict[str, Any] | list[Any] | None:
    """What validation filled in of `validated` that the model's `raw` input leaves out, at any
    depth, as its JSON form shows it (a secret's mask left out): a `default_factory`'s id or
    time is another one each time the input is validated, and a re-run of an ungated call's
    body is to get the one its first run got (`as_started`). None if nothing was, or the input
    has no JSON form; a parameter's plain default, the same every time, is not kept. Where
    those values, put back by their places, validate to another input (a set's items, its form
    sorted by them; a list a validator reorders), the whole form instead, in a one-item list."""
    if not isinstance(raw, dict) or tool.holds_lazy(validated):  # its form uses up the body's
        return None
    try:
        form = tool.approved_form(validated)
    except PydanticSerializationError:
        return None
    found = _found(raw, validated, form)
    if found is None or _validates_to(tool, _filled(raw, found)[0], form) is not None:
        return found
    return [form]  # not an object: an older signoff reads it as nothing kept


def as_started(tool: Tool, raw: Any, filled: Any) -> tuple[Any, BaseModel] | None:
    """The input an ungated call's body first ran with: the model's `raw` input with what
    validation filled in then (`left_out`) put back, as `as_approved` fills it from a reviewer's
    form, and that validated. None if that is no valid input now, holds a secret's mask, or
    validates to other values than those (a validator that changes a value it is given): `raw`
    is validated then, as before the values were kept. A whole form kept is taken as
    `as_approved` takes one: `raw` filled from it, else the form, whichever validates to it."""
    if isinstance(filled, list):
        if len(filled) != 1 or not isinstance(filled[0], dict):
            return None
        form = filled[0]
        for given in (_filled(raw, form)[0], form):
            if (validated := _validates_to(tool, given, form)) is not None:
                return given, validated
        return None
    given = _filled(raw, filled)[0]
    try:
        validated = tool.validate(given)
    except ValidationError:
        return None
    if holds_mask(validated) or tool.holds_lazy(validated) or not isinstance(filled, dict):
        return None
    try:  # values kept by their places (as an older signoff kept all): validated to them again
        if _found(raw, validated, tool.approved_form(validated)) != filled:
            return None
    except PydanticSerializationError:
        return None
    return given, validated


def _found(raw: Any, validated: BaseModel, form: dict[str, Any]) -> dict[str, Any] | None:
    """What of `form` (`validated`'s) `raw` lacks by keys and places (`_lacking`), but for a
    parameter's plain default, the same every time; None if nothing."""
    found: dict[str, Any] | None = _lacking(raw, form)
    if found is None:
        return None
    model = type(validated)
    fields = {f.serialization_alias or f.alias or n: n for n, f in model.model_fields.items()}
    for key in [k for k in found if k not in raw and k in fields]:
        info = model.model_fields[fields[key]]
        if info.default_factory is None and _same(getattr(validated, fields[key]), info.default):
            del found[key]
    return found or None


def _validates_to(tool: Tool, given: Any, form: dict[str, Any]) -> BaseModel | None:
    """`given` validated, if it is valid, holds no secret's mask and its JSON form is `form`."""
    try:
        validated = tool.validate(given)
        if tool.holds_lazy(validated):  # its form would use up the body's iterators
            return None
        again = tool.approved_form(validated)
    except (ValidationError, PydanticSerializationError):
        return None
    if holds_mask(validated) or not same_json(again, form):
        return None
    return validated


def _lacking(raw: Any, form: Any) -> Any:
    """What of `form` `_filled` puts into `raw`: the values of the keys `raw` lacks, at any
    depth and by the same keys and places, without a secret's mask; None if nothing."""
    if isinstance(raw, dict) and isinstance(form, dict):
        found = {k: _unmasked(v) for k, v in form.items() if k not in raw and not is_mask(v)}
        for k, v in raw.items():
            if k in form and (inner := _lacking(v, form[k])) is not None:
                found[k] = inner
        return found or None
    if isinstance(raw, list) and isinstance(form, list) and len(raw) == len(form):
        items = [_lacking(v, f) for v, f in zip(raw, form, strict=True)]
        if all(item is None for item in items):
            return None
        return [{} if item is None else item for item in items]  # `{}` fills in nothing
    return None


def _unmasked(value: Any) -> Any:
    """`value` without the secrets' masks of its objects: no value of theirs to keep."""
    if isinstance(value, dict):
        return {k: _unmasked(v) for k, v in value.items() if not is_mask(v)}
    if isinstance(value, list):
        return [_unmasked(v) for v in value]
    return value


def _same(value: Any, default: Any) -> bool:
    """Whether a parameter's value is its plain default, which validation gives it again."""
    try:
        return type(value) is type(default) and bool(value == default)
    except Exception:  # an object whose == raises, or gives no truth value
        return False


def _bound(action: Action, tool: Tool, raw: Any) -> BaseModel | None:
    """`raw` validated, if that is the input `action` binds and no secret in it is its mask."""
    try:
        validated = tool.validate(raw)
    except ValidationError:
        return None
    if holds_mask(validated) or not binds(action, tool, raw, validated):
        return None
    return validated


def _filled(raw: Any, form: Any) -> tuple[Any, bool]:
    """`raw` with the keys it lacks (in its objects, at any depth) taken from `form`, but for a
    secret's mask, and whether a mask was so left out (a secret from a default)."""
    left = False

    def fill(raw: Any, form: Any) -> Any:
        nonlocal left
        if isinstance(raw, dict) and isinstance(form, dict):
            kept = {k: v for k, v in form.items() if k in raw or not is_mask(v)}
            left = left or len(kept) < len(form)
            return {**kept, **{k: fill(v, form.get(k)) for k, v in raw.items()}}
        if isinstance(raw, list) and isinstance(form, list) and len(raw) == len(form):
            return [fill(v, f) for v, f in zip(raw, form, strict=True)]
        return raw

    return fill(raw, form), left


def _secrets(validated: BaseModel) -> list[Any]:
    """The values of the secrets in validated input, in the order its fields are walked."""
    found: list[Any] = []
    stack: list[Any] = [python_dump(validated)]
    seen: set[int] = set()  # a container walked once: one inside itself looped for ever
    while stack:
        value = stack.pop()
        if isinstance(value, SecretStr | SecretBytes | Secret):
            found.append(value.get_secret_value())
        elif isinstance(value, dict | list | tuple | set | frozenset) and id(value) not in seen:
            seen.add(id(value))
            stack.extend(value.values() if isinstance(value, dict) else value)
    return found
