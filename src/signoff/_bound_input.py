"""Whether a call's input is still the one its approval is bound to, when it runs: by the
hash of the form the reviewer saw. Apart from `_tool_calls` so the engine's part stays short."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticSerializationError

from ._tool_json import holds_mask
from ._tools import Tool
from ._types import Action, input_hash

__all__ = ["as_approved", "still_bound"]


def still_bound(action: Action, tool: Tool, validated: BaseModel) -> bool:
    """Whether `validated` is the input `action` binds, by the hash the reviewer approved: not
    if it has no JSON form now (a validator that made another value), which no one saw."""
    try:
        form = tool.approved_form(validated)
    except PydanticSerializationError:
        return False
    return input_hash(form, tool_name=action.tool_name, call_id=action.call_id) == (
        action.input_hash
    )


def as_approved(action: Action, tool: Tool, raw: Any) -> BaseModel | None:
    """The model's input with what it left out taken from the approved form, validated, if it
    is the input approved: a value pydantic generates for what is left out (a `default_factory`:
    an id, a time) is another one each time, the one the reviewer saw is in the form. None if
    it is not, or if a secret would reach the tool as the form's mask."""
    filled = _filled(raw, action.input)
    try:
        validated = tool.validate(filled)
    except ValidationError:
        return None
    if holds_mask(validated) or not still_bound(action, tool, validated):
        return None
    return validated


def _filled(raw: Any, form: Any) -> Any:
    """`raw` with the keys it lacks (in its objects, at any depth) taken from `form`."""
    if isinstance(raw, dict) and isinstance(form, dict):
        return {**form, **{k: _filled(v, form.get(k)) for k, v in raw.items()}}
    if isinstance(raw, list) and isinstance(form, list) and len(raw) == len(form):
        return [_filled(v, f) for v, f in zip(raw, form, strict=True)]
    return raw
