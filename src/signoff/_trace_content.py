"""What spans carry with `trace_content=True`: values as JSON text, the conversation bounded to
`MESSAGES_MAX` bytes, and tool input as its tool validated it, secrets masked, on every span that
shows it (`_tracing`) and in every view of the event log (the dashboard, `signoff events`)."""

from __future__ import annotations

import dataclasses
import json
import typing
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, get_args, get_origin, is_typeddict

from pydantic import AliasChoices, AliasPath, BaseModel, Secret, SecretBytes, SecretStr

from ._text import cut, storable

if TYPE_CHECKING:
    from ._types import ToolCall

__all__ = [
    "MASK",
    "MESSAGES_MAX",
    "ShownInputs",
    "json_form",
    "json_text",
    "messages_json",
    "shown_data",
    "shown_input",
    "span_attributes",
    "span_value",
]

MASK = "**********"
"""How pydantic shows a secret's value in JSON, and how a span shows one it cannot validate."""

MESSAGES_MAX = 65_536
"""With content on, `gen_ai.input.messages` holds at most this many bytes (UTF-8): the newest
messages that fit, after a marker of how many were left off. The whole conversation went on
every model span: 500 turns made the last one's 280 KB, and the turn's spans 70 MB."""

_SECRETS = (SecretStr, SecretBytes, Secret)


def span_value(value: Any) -> Any:
    """`value` as a span carries it: text (or each text of a list) `storable`, each lone
    surrogate written as its escape (`\\udce9`; JSON's own, in JSON text). The OTLP exporter
    cannot encode one: it dropped the attribute, or for a status description the whole batch."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, list | tuple):
        return [storable(v) if isinstance(v, str) else v for v in value]
    return value


def span_attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """`attributes` with each value as `span_value` gives it."""
    return {key: span_value(value) for key, value in attributes.items()}


def json_text(value: Any) -> str:
    """`value` as JSON text for an attribute: pydantic models by their JSON form, anything
    else with none by its text, a lone surrogate as its escape (`span_value`), so the bound on
    the conversation counts the bytes a span carries. It never raises: a trace must not fail
    the turn."""
    return storable(_json_dumps(value))


def _json_dumps(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=json_form)
    except Exception:  # a key JSON has no form for, a container holding itself, deep nesting
        pass
    try:
        return json.dumps(_json_data(value, frozenset()), ensure_ascii=False)
    except Exception:  # nested past the recursion limit
        return json.dumps(_text(value), ensure_ascii=False)


def json_form(value: Any) -> Any:
    """A pydantic model's JSON form (secrets masked), or any other value's text. It never
    raises: a model with no JSON form (a validator made a field an object JSON has none for) is
    its Python form made JSON data, else its text."""
    dump = getattr(value, "model_dump", None)
    if not callable(dump):
        return _text(value)
    try:
        return dump(mode="json")
    except Exception:  # pydantic's serialization error, a key's TypeError, a cycle's ValueError
        pass
    # The call runs all the same, so its span must not fail it. Secrets stay masked, as their
    # Python form and `str` show them.
    try:
        return _json_data(dump(warnings=False), frozenset())
    except Exception:  # a serializer that raised in Python mode too
        return _text(value)


def _text(value: Any) -> str:
    """`str(value)`, or `<unrepresentable: {its type}>` if that raises."""
    try:
        return str(value)
    except Exception:
        return f"<unrepresentable: {type(value).__name__}>"


def _json_data(value: Any, within: frozenset[int]) -> Any:
    """`value` (inside the containers `within`, by id) as data `json.dumps` takes: a key it
    does not by its text, a container inside itself by its text, any other object `json_form`."""
    if value is None or isinstance(value, str | int | float):
        return value
    if not isinstance(value, dict | list | tuple):
        return json_form(value)
    if id(value) in within:
        return _text(value)
    within |= {id(value)}
    if isinstance(value, dict):
        return {_json_key(k): _json_data(v, within) for k, v in value.items()}
    return [_json_data(v, within) for v in value]


def _json_key(key: Any) -> Any:
    return key if key is None or isinstance(key, str | int | float) else _text(key)


def shown_input(tool: Any, raw: Any) -> Any:
    """The input `raw` a model proposed for `tool` (None: the agent has none of that name) as a
    span shows it: validated, by its JSON form, as the call's body gets it. Input that fails
    validation is shown as sent; but if a parameter's type holds a secret, that parameter's value
    and that of any key naming no parameter (arguments the provider could not parse, say) are
    masked, and input that is no JSON object is masked whole."""
    if tool is None:
        return raw
    try:
        return json_form(tool.validate(raw))
    except Exception:  # `validate` raises `ValidationError`; a tracer must not fail the turn
        pass
    secret, plain = _keys(tool.input_model)
    if not secret:
        return raw
    if not isinstance(raw, dict):
        return MASK
    return {k: v if k in plain and k not in secret else MASK for k, v in raw.items()}


def shown_data(kind: str, data: dict[str, Any], tools: Mapping[str, Any] | None) -> dict[str, Any]:
    """The `data` of an event of type `kind` as a view of the log shows it: a `model.completed`'s
    tool calls with each `input` as `shown_input` shows it for the tool of its name in `tools`
    (the session's agent's), or `MASK` whole when `tools` is None (the viewer lacks the agent,
    so which parameter holds a secret is unknown). Other data is as recorded: no other event
    holds a tool's input as the model gave it (an edit holding a secret is refused unrecorded,
    and a request holds the input it asks about masked). `data` itself is left as it is."""
    calls = data.get("tool_calls") if kind == "model.completed" else None
    if not isinstance(calls, list) or not calls:
        return data
    shown: list[Any] = []
    for call in calls:
        if not isinstance(call, dict) or "input" not in call:
            shown.append(call)  # no input to show (a log edited by hand)
            continue
        name = call.get("name")
        tool = tools.get(name) if tools is not None and isinstance(name, str) else None
        shown.append({**call, "input": MASK if tools is None else shown_input(tool, call["input"])})
    return {**data, "tool_calls": shown}


def _keys(model: type[BaseModel]) -> tuple[frozenset[str], frozenset[str]]:
    """The keys under which input of `model` may give a parameter whose type holds a secret,
    and those of the other parameters: their names, aliases and validation aliases."""
    secret: set[str] = set()
    plain: set[str] = set()
    for name, field in model.model_fields.items():
        keys = secret if _holds_secret(field.annotation, set()) else plain
        keys.update(k for k in (name, field.alias) if k is not None)
        choices = field.validation_alias
        for choice in choices.choices if isinstance(choices, AliasChoices) else [choices]:
            if isinstance(choice, str):
                keys.add(choice)
            elif isinstance(choice, AliasPath) and isinstance(choice.path[0], str):
                keys.add(choice.path[0])
    return frozenset(secret), frozenset(plain)


def _holds_secret(kind: Any, seen: set[Any]) -> bool:
    """Whether a value of type `kind` may hold a pydantic secret: is one, or contains one (in
    a container, a union, a model, a dataclass or a typed dict)."""
    origin = get_origin(kind)
    for cls in (kind, origin):
        if isinstance(cls, type) and issubclass(cls, _SECRETS):
            return True
    if type(kind).__name__ == "TypeAliasType":  # `type X = ...`, or typing_extensions' on 3.11
        if kind in seen:  # an alias may refer to itself (`type JSON = dict[str, JSON] | ...`)
            return False
        seen.add(kind)
        return _holds_secret(kind.__value__, seen)
    if isinstance(kind, type) and kind not in seen:
        seen.add(kind)  # a model may refer to itself
        if issubclass(kind, BaseModel):
            parts = [f.annotation for f in kind.model_fields.values()]
        elif dataclasses.is_dataclass(kind) or is_typeddict(kind):
            try:
                parts = list(typing.get_type_hints(kind).values())
            except Exception:  # hints that do not resolve: pydantic could not have built it
                parts = []
        else:
            parts = []
        if any(_holds_secret(part, seen) for part in parts):
            return True
    return any(_holds_secret(arg, seen) for arg in get_args(kind))


class ShownInputs:
    """`shown_input` of tool calls, kept by call object while it lives: a conversation's calls,
    sent again with each model call, are validated once in a process, not at every call."""

    __slots__ = ("_shown",)

    def __init__(self) -> None:
        self._shown: dict[int, tuple[weakref.ref[ToolCall], Any, Any]] = {}

    def of(self, call: ToolCall, tools: Mapping[str, Any]) -> Any:
        """`call`'s input as `shown_input` gives it, for the tool of its name in `tools`."""
        tool = tools.get(call.name)
        key = id(call)
        kept = self._shown.get(key)
        if kept is not None and kept[0]() is call and kept[1] is tool:
            return kept[2]
        shown = shown_input(tool, call.input)
        # Dropped when the call is: its id may then name another.
        gone = self._shown.pop
        self._shown[key] = (weakref.ref(call, lambda _: gone(key, None)), tool, shown)
        return shown


def messages_json(messages: Sequence[Any], inputs: Callable[[ToolCall], Any]) -> str:
    """The conversation as JSON text for `gen_ai.input.messages`, each tool call's input as
    `inputs` shows it: whole if it fits in `MESSAGES_MAX` bytes; else `{"kind": "omitted",
    "messages": n}` for the `n` oldest, then the newest that fit whole, or the newest alone cut
    (`_cut_message`). Only what is kept is written out, newest first, so a long conversation
    costs no more than a short one."""
    kept: list[str] = []  # newest first
    size = 2  # the brackets
    newest = ""
    for message in reversed(messages):
        text = _message_json(message, inputs)
        newest = newest or text
        grown = size + _utf8_size(text) + (2 if kept else 0)
        if grown > MESSAGES_MAX:
            break
        kept.append(text)
        size = grown
    else:
        return "[" + ", ".join(reversed(kept)) + "]"
    # Some are left out: the marker needs room too, taken from the oldest kept.
    room = MESSAGES_MAX - len(_omitted(len(messages))) - 2  # the marker and the ", " after it
    while kept and size > room:
        size -= _utf8_size(kept.pop()) + (2 if kept else 0)
    if not kept:
        kept.append(_cut_message(newest, room - 2))
    return "[" + ", ".join([_omitted(len(messages) - len(kept)), *reversed(kept)]) + "]"


def _message_json(message: Any, inputs: Callable[[ToolCall], Any]) -> str:
    calls = getattr(message, "tool_calls", None)
    if not calls:
        return json_text(message)
    form = json_form(message)
    for part, call in zip(form["tool_calls"], calls, strict=True):
        part["input"] = inputs(call)
    return json_text(form)


def _omitted(count: int) -> str:
    return json_text({"kind": "omitted", "messages": count})


def _cut_message(text: str, room: int) -> str:
    """A message whose JSON `text` is over `room` bytes alone, as `{"kind": "cut", "bytes":
    its size, "json": the start of its text}` in at most `room` bytes."""
    total = _utf8_size(text)
    chars = room
    while True:
        shown = json_text({"kind": "cut", "bytes": total, "json": cut(text, chars)})
        size = _utf8_size(shown)
        if size <= room or chars == 0:
            return shown
        # Escapes and characters past ASCII take more than a byte each: shrink in proportion.
        chars = max(0, min(chars - 1, chars * room // size - 8))


def _utf8_size(text: str) -> int:
    """How many bytes `text` (from `json_text`, so holding no lone surrogate) takes as UTF-8."""
    return len(text) if text.isascii() else len(text.encode())
