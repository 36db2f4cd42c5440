"""Tool input as spans show it with `trace_content=True`: validated, secrets masked; input that
fails validation as sent but for what may hold a secret; and a conversation's calls validated
once while they are in memory, not again at every model call."""

from __future__ import annotations

import gc
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, BaseModel, Field, PlainSerializer, Secret, SecretStr
from typing_extensions import TypeAliasType

import signoff as so
from signoff._trace_content import (
    MASK,
    ShownInputs,
    json_form,
    json_text,
    messages_json,
    shown_input,
)
from signoff._types import AssistantMessage, ToolCall, UserMessage


class _Credentials(BaseModel):
    user: str
    password: SecretStr


@dataclass
class _Key:
    name: str
    value: Secret[int]


@so.tool
async def connect(
    host: str,
    login: _Credentials,
    token: Annotated[SecretStr | None, Field(alias="apiToken")] = None,
    pins: list[Secret[int]] = [],  # noqa: B006 - pydantic copies it
    key: _Key | None = None,
    port: int = 443,
) -> str:
    """Connect."""
    return host


@so.tool
async def plain(order: str) -> str:
    """No secret here."""
    return order


def test_valid_input_is_shown_validated_with_its_secrets_masked() -> None:
    raw = {
        "host": "db",
        "login": {"user": "bob", "password": "pw1"},
        "apiToken": "tok",
        "pins": [1234],
        "key": {"name": "k", "value": 99},
    }
    assert shown_input(connect, raw) == {
        "host": "db",
        "login": {"user": "bob", "password": MASK},
        "token": MASK,
        "pins": [MASK],
        "key": {"name": "k", "value": MASK},
        "port": 443,
    }


def test_input_failing_validation_is_shown_as_sent_but_for_what_may_hold_a_secret() -> None:
    raw = {
        "host": "db",
        "login": {"user": "bob", "password": "pw1"},
        "apiToken": "tok",
        "pins": [1234],
        "key": {"name": "k", "value": 99},
        "port": "not a port",
        "passwrod": "pw2",  # no parameter's: a misspelt secret, maybe
    }
    assert shown_input(connect, raw) == {
        "host": "db",
        "login": MASK,
        "apiToken": MASK,
        "pins": MASK,
        "key": MASK,
        "port": "not a port",
        "passwrod": MASK,
    }
    unparsed = {"_unparsed_arguments": '{"host": "db", "login": {"password": "pw1"'}
    assert shown_input(connect, unparsed) == {"_unparsed_arguments": MASK}
    assert shown_input(connect, ["pw1"]) == MASK


def test_input_of_a_tool_without_secrets_or_of_no_tool_is_shown_as_sent_when_it_fails() -> None:
    assert shown_input(plain, {"order": 7, "extra": "x"}) == {"order": 7, "extra": "x"}
    assert shown_input(plain, "text") == "text"
    assert shown_input(None, {"password": "pw1"}) == {"password": "pw1"}


_validated: list[str] = []


def _seen(value: str) -> str:
    _validated.append(value)
    return value


@so.tool
async def login(user: Annotated[str, AfterValidator(_seen)], password: SecretStr) -> str:
    """Log in."""
    return user


def test_a_conversations_calls_are_validated_once_while_they_live() -> None:
    validated = _validated
    validated.clear()
    inputs = ShownInputs()
    tools = {"login": login}
    calls = [ToolCall(id="c1", name="login", input={"user": "bob", "password": "pw1"})]
    conversation: list[Any] = [UserMessage(text="log in"), AssistantMessage(tool_calls=calls)]

    def shown(call: ToolCall) -> Any:
        return inputs.of(call, tools)

    for _ in range(3):  # one model call after another, the conversation sent again each time
        sent = json.loads(messages_json(conversation, shown))
        assert sent[1]["tool_calls"] == [
            {"name": "login", "input": {"user": "bob", "password": MASK}, "id": "c1"}
        ]
    assert validated == ["bob"]
    # An equal call read again from the log is another object: validated for itself.
    again = ToolCall(id="c1", name="login", input={"user": "bob", "password": "pw1"})
    assert inputs.of(again, tools) == {"user": "bob", "password": MASK}
    assert validated == ["bob", "bob"]
    del conversation, calls, again
    gc.collect()
    assert inputs._shown == {}  # forgotten with their calls


_Token = TypeAliasType("_Token", SecretStr)


@so.tool
async def _aliased(user: str, password: _Token) -> str:
    """Log in."""
    return "ok"


def test_a_secret_behind_a_type_alias_is_found_and_an_alias_of_itself_ends() -> None:
    """`typing_extensions.TypeAliasType` (the 3.11 spelling of `type X = ...`) was not looked
    through, so a secret behind one was shown in clear on input that failed validation; and an
    alias referring to itself (`type JSON = dict[str, JSON] | ...`, which 3.12 writes plainly)
    recursed until RecursionError, failing the turn at every model call."""
    from signoff._trace_content import _holds_secret

    assert shown_input(_aliased, {"user": 7, "password": "pw"}) == {"user": 7, "password": MASK}
    nested = TypeAliasType("nested", int)
    object.__setattr__(nested, "__value__", dict[str, nested] | list[nested] | int)
    assert _holds_secret(nested, set()) is False
    object.__setattr__(nested, "__value__", dict[str, nested] | SecretStr)
    assert _holds_secret(nested, set()) is True


async def test_a_tracer_that_cannot_show_the_conversation_fails_no_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Showing a model call's messages validates its tool calls with the app's tools: what
    raised there (a recursion, a validator's bug) escaped the unguarded span's start and failed
    the turn at every resume, leaving it running."""
    from opentelemetry.sdk.trace import TracerProvider

    from signoff import _tracing
    from signoff.testing import call, call_tools, reply, scripted_agent, sqlite_runtime

    def broken(*args: Any, **kwargs: Any) -> str:
        raise RecursionError("maximum recursion depth exceeded")

    @so.tool
    async def login(user: str, password: SecretStr) -> str:
        """Log in."""
        return "ok"

    monkeypatch.setattr(_tracing, "messages_json", broken)
    steps = [call_tools(call("login", user="bob", password="pw")), reply("done")]
    rt = sqlite_runtime(
        tmp_path,
        scripted_agent("a", steps, tools=[login]),
        tracer_provider=TracerProvider(),
        trace_content=True,
    )
    with caplog.at_level(logging.WARNING, logger="signoff.runtime"):
        assert (await rt.generate("a", "go")).status == "completed"
    await rt.close()
    assert "tracing failed to show a model call's messages" in caplog.text


def _in_itself(value: Any) -> dict[str, Any]:
    made: dict[str, Any] = {"v": value}
    made["me"] = made
    return made


def _raising(value: Any) -> Any:
    raise RuntimeError("the serializer's bug")


class _Unshown:
    def __repr__(self) -> str:
        raise RuntimeError("no text either")


class _Cyclic(BaseModel):
    x: Annotated[Any, AfterValidator(_in_itself)]


class _Keyed(BaseModel):
    x: Annotated[Any, AfterValidator(lambda v: {frozenset([1]): v})]
    pin: SecretStr


class _Serialized(BaseModel):
    x: Annotated[Any, PlainSerializer(_raising)]


class _Unshowable(BaseModel):
    x: Annotated[Any, AfterValidator(lambda v: _Unshown()), PlainSerializer(_raising)]


def test_a_value_json_has_no_form_for_is_shown_by_its_text_or_a_placeholder() -> None:
    """`json_text` raised on a model whose Python form `json.dumps` rejects too (a key, a dict
    that holds itself) or whose serializer raises, and on a value whose `str` raises: spans of
    tool input and results, failing the turn. What has no JSON form is shown by its text, and
    what has none either by a placeholder."""
    keyed = json.loads(json_text(_Keyed(x=7, pin=SecretStr("4321"))))
    assert keyed == {"x": {"frozenset({1})": 7}, "pin": MASK}
    cyclic = json_text(_Cyclic(x=7))
    assert json.loads(cyclic)["x"]["v"] == 7 and "'me': {...}" in cyclic
    assert json.loads(json_text(_Serialized(x=7))) == "x=7"  # the model's `str`
    assert json.loads(json_text(_Unshowable(x=7))) == "<unrepresentable: _Unshowable>"
    # Outside any model as well: a tool's result, say.
    itself = _in_itself(7)
    assert json.loads(json_text(itself)) == {"v": 7, "me": "{'v': 7, 'me': {...}}"}
    assert json.loads(json_text([{(1, 2): _Unshown()}])) == [
        {"(1, 2)": "<unrepresentable: _Unshown>"}
    ]
    assert json_form(_Serialized(x=7)) == "x=7"


async def test_a_tracer_that_cannot_show_a_tools_input_fails_no_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The tool's span starts after `tool.started` is recorded: what raised building its
    attributes left the turn running, to fail the same at every retry."""
    from opentelemetry.sdk.trace import TracerProvider

    from signoff import _tracing
    from signoff.testing import call, call_tools, reply, scripted_agent, sqlite_runtime

    def broken(*args: Any, **kwargs: Any) -> str:
        raise RecursionError("maximum recursion depth exceeded")

    ran: list[str] = []

    @so.tool
    async def look(order: str) -> str:
        """Look an order up."""
        ran.append(order)
        return "found"

    monkeypatch.setattr(_tracing, "json_text", broken)
    steps = [call_tools(call("look", order="A1")), reply("done")]
    rt = sqlite_runtime(
        tmp_path,
        scripted_agent("a", steps, tools=[look]),
        tracer_provider=TracerProvider(),
        trace_content=True,
    )
    with caplog.at_level(logging.WARNING, logger="signoff.runtime"):
        assert (await rt.generate("a", "go")).status == "completed"
    await rt.close()
    assert ran == ["A1"]
    assert "tracing failed to show a tool's input" in caplog.text
