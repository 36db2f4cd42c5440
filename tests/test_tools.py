"""Tool definitions: schema from hints, description from the docstring, errors in tools and
agents, and the testing helpers' execution log. Running tools is tests/test_tools_calls.py, their
size limits tests/test_tools_limits.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from pydantic import AfterValidator, BaseModel, Field, ValidationError, field_validator
from pydantic.json_schema import GenerateJsonSchema

import signoff as so
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)


@so.tool
async def issue_refund(order_id: str, amount: float, reason: str = "none given") -> dict[str, Any]:
    """Refund an order in full or in part.

    Amounts over 100 need a person to approve.
    """
    return {"refunded": amount}


def test_schema_from_type_hints() -> None:
    schema = issue_refund.json_schema()
    assert schema["type"] == "object"
    assert schema["properties"]["order_id"]["type"] == "string"
    assert schema["properties"]["amount"]["type"] == "number"
    assert schema["properties"]["reason"]["default"] == "none given"
    assert sorted(schema["required"]) == ["amount", "order_id"]
    assert schema.get("additionalProperties") is False
    assert "title" not in schema


def test_description_from_the_docstring_up_to_its_sections() -> None:
    # Its first paragraph only was the description: a rule in the second never reached the
    # model. Sections for the code's readers (Args:, :param:) stay out.
    assert issue_refund.name == "issue_refund"
    assert issue_refund.description == (
        "Refund an order in full or in part.\n\nAmounts over 100 need a person to approve."
    )

    @so.tool
    async def refund(amount: int) -> int:
        """Refund an order.

        `amount` is in cents, not dollars.

        Args:
            amount: what to refund.
        """
        return amount

    @so.tool
    async def refund_rest(amount: int) -> int:
        """Refund an order.
        :param amount: in cents.
        """
        return amount

    assert refund.description == "Refund an order.\n\n`amount` is in cents, not dollars."
    assert refund_rest.description == "Refund an order."

    @so.tool(name="refund-v2", description="Explicit description.")
    async def other(x: int) -> int:
        """Ignored."""
        return x

    assert other.name == "refund-v2"
    assert other.description == "Explicit description."


class Address(BaseModel):
    street: str
    zip: str


def test_rich_types_in_the_schema() -> None:
    @so.tool
    def ship(to: Address, speed: Literal["slow", "fast"], items: list[str]) -> str:
        """Ship items."""
        return "shipped"

    schema = ship.json_schema()
    assert schema["properties"]["speed"]["enum"] == ["slow", "fast"]
    assert schema["properties"]["items"]["type"] == "array"
    assert "Address" in str(schema)
    validated = ship.validate({"to": {"street": "s", "zip": "1"}, "speed": "fast", "items": []})
    assert validated.to == Address(street="s", zip="1")  # type: ignore[attr-defined]


def test_bad_definitions_are_usage_errors() -> None:
    def no_hint(x):
        """No hint."""

    def var_args(*args: int) -> None:
        """Var args."""

    def var_kwargs(**kwargs: int) -> None:
        """Var kwargs."""

    def positional_only(x: int, /) -> None:
        """Positional only."""

    for fn in (no_hint, var_args, var_kwargs, positional_only):
        with pytest.raises(so.UsageError, match=fn.__name__):
            so.tool(fn)
    with pytest.raises(so.UsageError):
        so.Tool("not a function")  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="name"):
        so.tool(name="has spaces")(var_kwargs)
    with pytest.raises(so.UsageError, match="run_as"):
        so.tool(run_as="root")(positional_only)  # type: ignore[call-overload]


def test_a_tool_name_the_model_apis_refuse_is_a_usage_error() -> None:
    # OpenAI and Anthropic take tool names of [a-zA-Z0-9_-]{1,64} only: any other name made
    # every model request of the agent fail with a 400, at run time.
    def réserver(x: int) -> int:
        """Book."""
        return x

    with pytest.raises(so.UsageError, match="name"):
        so.tool(réserver)
    for bad in ("x" * 65, "n²", "ｘ"):
        with pytest.raises(so.UsageError, match="name"):
            so.tool(name=bad)(réserver)
    assert so.tool(name="x" * 64)(réserver).name == "x" * 64


def test_agent_definition_errors() -> None:
    model = so.models.Scripted([reply("x")])

    @so.tool
    async def t(x: int) -> int:
        """T."""
        return x

    with pytest.raises(so.UsageError, match="name"):
        so.Agent(name="", model=model)
    with pytest.raises(so.UsageError, match="two tools"):
        so.Agent(name="a", model=model, tools=[t, t])
    with pytest.raises(so.UsageError, match="not a Tool"):
        so.Agent(name="a", model=model, tools=[lambda x: x])  # type: ignore[list-item]
    with pytest.raises(so.UsageError, match="unknown tool"):
        so.Agent(name="a", model=model, tools=[t], guardrails=[so.tool_policy(deny=["nope"])])
    with pytest.raises(so.UsageError, match="two agents"):
        so.Runtime([so.Agent(name="a", model=model), so.Agent(name="a", model=model)])


def test_an_agent_named_with_a_lone_surrogate_is_refused_when_made() -> None:
    """No store can hold such a name (the session's agent, its tools' audit streams): the agent
    was made, and opening its runtime raised a bare UnicodeEncodeError from the driver."""

    @so.tool(approval=so.always())
    async def t(x: int) -> int:
        """T."""
        return x

    with pytest.raises(so.UsageError, match="lone surrogate"):
        so.Agent(name="a\ud800", model=so.models.Scripted([reply("x")]), tools=[t])


def test_an_agent_named_with_a_nul_is_refused_when_made() -> None:
    """PostgreSQL holds no NUL in text: the agent was made (and ran on SQLite), and on a
    PostgreSQL store each `generate` then failed with a StoreError creating its session."""
    with pytest.raises(so.UsageError, match=r"NUL character .*name the agent without it"):
        so.Agent(name="a\x00b", model=so.models.Scripted([reply("x")]))


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"model": "gpt-4o"}, "model must be a signoff model"),
        ({"model": None}, "model must be a signoff model"),
        ({"model": so.models.Scripted}, r"model is the class Scripted, .*Scripted\(\.\.\.\)"),
        ({"instructions": 5}, "instructions must be text"),
        ({"limits": {"max_steps": 3}}, "limits must be a so.Limits"),
        ({"name": 5}, "name"),
        ({"tools": so.ask_question()}, "tools must be a list of tools, not Tool"),
        ({"guardrails": so.tool_policy(deny=["x"])}, "guardrails must be a list of guardrails"),
    ],
)
def test_an_agent_refuses_a_model_instructions_or_limits_it_cannot_use(
    setting: dict[str, Any], message: str
) -> None:
    """`Agent(model="gpt-4o")` was accepted and then every turn failed with a model_error naming
    an AttributeError; `limits={...}` made `generate` a bare AttributeError. Both, and
    instructions that are not text, are refused where the agent is defined."""
    kwargs: dict[str, Any] = {"name": "a", "model": so.models.Scripted([reply("x")]), **setting}
    with pytest.raises(so.UsageError, match=message):
        so.Agent(**kwargs)


async def test_unknown_agent_name(tmp_path: Path) -> None:
    async with sqlite_runtime(tmp_path, scripted_agent("a", [reply("x")])) as rt:
        with pytest.raises(so.UsageError, match="unknown agent 'b'"):
            await rt.generate("b", prompt="hi")
        with pytest.raises(so.UsageError):
            await rt.generate("a")  # a new session needs a prompt
        with pytest.raises(so.UsageError):
            await rt.generate(prompt="hi")  # and an agent


# -- the testing helpers themselves ---------------------------------------------------------------


async def test_execution_log_records_each_execution(tmp_path: Path) -> None:
    log = ExecutionLog()

    @log.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund."""
        return "ok"

    @log.tool
    def lookup(order_id: str) -> str:
        """Look up."""
        return "found"

    assert isinstance(refund, so.Tool) and refund.approval.describe() == "Always"
    agent = scripted_agent(
        "a",
        [call_tools(call("lookup", order_id="1"), call("refund", order_id="1")), reply("ok")],
        tools=[refund, lookup],
    )
    alice = so.Principal(authenticator="t", principal_id="alice")
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=alice)
        assert log.count() == 1 and log.count("refund") == 0
        await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=True)],
            auth=alice,
        )
    assert [e.tool_name for e in log.executions] == ["lookup", "refund"]
    (run,) = log.of("refund")
    assert run.session_id == r.session_id
    assert run.call_id == r.pending[0].call_id
    assert run.idempotency_key.startswith(f"{r.session_id}:")
    assert run.idempotency_key.endswith(f":{run.call_id}")
    assert run.input == {"order_id": "1"}
    assert run.principal_id == "alice"
    assert log.keys("refund") == [run.idempotency_key]
    log.clear()
    assert log.count() == 0


def test_file_backed_execution_log_is_shared(tmp_path: Path) -> None:
    from signoff.testing import Execution

    path = tmp_path / "executions.jsonl"
    writer, reader = ExecutionLog(path), ExecutionLog(path)
    assert reader.executions == []
    e = Execution(tool_name="t", session_id="s", call_id="c", idempotency_key="s:c", input={"a": 1})
    writer.record(e)
    writer.record(e)
    assert reader.executions == [e, e]
    assert reader.count("t") == 2
    reader.clear()
    assert writer.count() == 0


class _Opaque:
    """A class pydantic cannot describe as JSON."""


def test_a_tool_definition_mistake_is_a_usage_error_naming_the_tool() -> None:
    """A `ToolContext` after other parameters, or a parameter of a type with no JSON schema,
    raised pydantic's own schema error, which told the author to change a model config they
    do not have; both are a `UsageError` naming the tool and what to change."""

    async def late(order_id: str, ctx: so.ToolContext) -> str:
        return order_id

    with pytest.raises(so.UsageError) as refused:
        so.tool(late)
    assert (
        str(refused.value) == "tool 'late': the ToolContext parameter 'ctx' must be the first one"
    )

    async def opaque(thing: _Opaque) -> str:
        return "x"

    with pytest.raises(so.UsageError) as refused:
        so.tool(opaque)
    assert str(refused.value).startswith(
        "tool 'opaque': its parameters must be JSON types (str, int, float, bool, lists, dicts, "
        "pydantic models...): Unable to generate pydantic-core schema for "
    )
    assert "arbitrary_types_allowed" not in str(refused.value)


def test_a_parameter_with_no_json_schema_is_a_usage_error_when_defined() -> None:
    """A type pydantic validates but cannot describe as JSON (a callable) was accepted, and
    every model call of its agent then raised pydantic's schema error, leaving the session
    running for good: it is refused when the tool is made."""

    async def later(then: Callable[[], int]) -> str:
        return "x"

    with pytest.raises(so.UsageError) as refused:
        so.tool(later)
    assert str(refused.value).startswith(
        "tool 'later': its parameters must be JSON types (str, int, float, bool, lists, dicts, "
        "pydantic models...): Cannot generate a JsonSchema for core_schema.CallableSchema"
    )


def _shout(value: Any) -> str:
    return str(value.upper())  # an AttributeError for anything but text


@so.tool
async def shout(text: Annotated[Any, AfterValidator(_shout)]) -> str:
    """Shout."""
    return str(text)


def test_a_validator_raising_another_error_is_a_validation_error() -> None:
    """pydantic turns only a validator's ValueError into a ValidationError: any other error it
    raises on the model's input is one too, naming it."""
    with pytest.raises(ValidationError, match="AttributeError: 'int' object has no attribute"):
        shout.validate({"text": 5})
    assert shout.validate({"text": "hi"}).model_dump() == {"text": "HI"}


async def test_a_validator_crashing_on_the_models_input_fails_the_call_not_the_session(
    tmp_path: Path,
) -> None:
    """A call whose input a validator crashes on gets an error result the model reads, and the
    turn goes on; it left the session running for good, each message raising the error again."""
    seen = Capture(reply("sorry"))
    proposal = call_tools(so.ToolCall(id="c1", name="shout", input={"text": 5}))
    agent = scripted_agent("a", [proposal, seen, reply("again")], tools=[shout])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed" and r.text.endswith("sorry")
        [result] = tool_results(seen.last)
        assert result.is_error and "AttributeError" in str(result.content)
        assert (await rt.generate(session_id=r.session_id, prompt="more")).status == "completed"


class Line(BaseModel):
    sku: str
    qty: int


def test_a_tools_input_schema_is_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Making the tool built its input schema (to refuse a type JSON cannot describe) and threw
    it away, and the first `json_schema()` built it again: one build now, for an input model
    of nested pydantic models as for a flat one."""
    built: list[str] = []
    generate = GenerateJsonSchema.generate

    def counted(self: GenerateJsonSchema, *args: Any, **kwargs: Any) -> Any:
        built.append(type(self).__name__)
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(GenerateJsonSchema, "generate", counted)

    @so.tool
    def order(lines: list[Line], note: str = "") -> str:
        """Place an order."""
        return "ok"

    schema = order.json_schema()
    assert order.json_schema() is schema and "title" not in schema
    assert schema["required"] == ["lines"] and "Line" in schema["$defs"]
    assert len(built) == 1, built


def test_tool_called_with_the_function_keeps_its_options() -> None:
    # `so.tool(fn, approval=...)` dropped every option: the tool never asked for approval.
    def remove(path: str) -> str:
        """Remove a file."""
        return path

    t = so.tool(remove, approval=so.always(), name="rm", description="Delete.", max_result_bytes=9)
    assert (t.name, t.description, t.max_result_bytes) == ("rm", "Delete.", 9)
    assert t.approval.describe() == so.always().describe() != so.never().describe()
    t = so.tool(remove, run_as="approver")
    assert t.run_as == "approver"


async def _at_most_100(value: int) -> int:
    if value > 100:
        raise ValueError("over 100")
    return value


def _plain_100(value: int) -> int:
    return value


class _Order(BaseModel):
    quantity: int

    @field_validator("quantity")
    @classmethod
    async def positive(cls, value: int) -> int:
        return value


def test_an_async_validator_of_the_input_is_refused_when_the_tool_is_made() -> None:
    """pydantic calls a validator without awaiting it: an async one's coroutine became the
    value, so `amount > 100` was never checked and the body ran with a coroutine for `amount`
    (a tool needing approval failed instead, its input having no JSON form to show)."""

    def refund(amount: Annotated[int, AfterValidator(_at_most_100)]) -> int:
        """Refund."""
        return amount

    def place(order: _Order) -> int:
        """Place an order."""
        return order.quantity

    def kept(amount: Annotated[int, AfterValidator(_plain_100)]) -> int:
        """Refund."""
        return amount

    with pytest.raises(so.UsageError, match=r"'refund': the validator _at_most_100 is async"):
        so.tool(refund)
    with pytest.raises(so.UsageError, match=r"'place': the validator _Order.positive is async"):
        so.tool(place)
    assert so.tool(kept).validate({"amount": 5}).model_dump() == {"amount": 5}


class _Refunder:
    """Refund an order from the till."""

    def __init__(self, till: str) -> None:
        self.till = till
        self.calls: list[str] = []

    async def __call__(self, order_id: str, amount: float = 1.0) -> str:
        self.calls.append(order_id)
        return f"{self.till}:{order_id}:{amount}"


def _refund_at(till: str, order_id: str, note: str = "") -> str:
    """Refund at a till."""
    return f"{till}:{order_id}:{note}"


async def test_a_callable_object_or_a_partial_is_a_tool(tmp_path: Path) -> None:
    """An instance with a `__call__` and a `functools.partial` take their schema from what they
    are called with; both were refused ("is not a module, class, method, or function"). A
    partial's keywords are bound: the model is not shown them and cannot change them."""
    import functools

    refunder = _Refunder("t1")
    by_object = so.tool(refunder, name="refund", approval=so.always())
    assert by_object.is_async
    assert by_object.description == "Refund an order from the till."
    assert set(by_object.json_schema()["properties"]) == {"order_id", "amount"}
    by_partial = so.tool(functools.partial(_refund_at, note="fixed"), name="refund_at")
    assert set(by_partial.json_schema()["properties"]) == {"till", "order_id"}
    with pytest.raises(ValidationError):
        by_partial.validate({"till": "t", "order_id": "1", "note": "changed"})
    proposal = call_tools(
        so.ToolCall(id="c1", name="refund", input={"order_id": "42"}),
        so.ToolCall(id="c2", name="refund_at", input={"till": "t2", "order_id": "7"}),
    )
    seen = Capture(reply("done"))
    agent = scripted_agent("a", [proposal, seen], tools=[by_object, by_partial])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "waiting" and refunder.calls == []
        r = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=True)],
        )
        assert r.status == "completed"
    assert refunder.calls == ["42"]
    results = {res.call_id: res.content for res in tool_results(seen.last)}
    assert results == {"c1": "t1:42:1.0", "c2": "t2:7:fixed"}


def test_a_class_given_for_a_tool_is_refused_naming_it() -> None:
    """A class was read as a function: its calls made instances, and its parameters' error spoke
    of type hints of its constructor."""
    with pytest.raises(so.UsageError, match="class _Refunder is not a tool"):
        so.tool(_Refunder)


def test_a_tuple_parameters_array_has_items_as_openai_requires() -> None:
    # pydantic describes a tuple with `prefixItems` alone; OpenAI refused every call of the
    # agent: "array schema missing items".
    @so.tool
    async def locate(
        point: tuple[float, float], path: list[tuple[int, str]], none: tuple[()]
    ) -> str:
        """Locate a point."""
        return "here"

    props = locate.json_schema()["properties"]
    assert props["point"]["items"] == {"type": "number"}
    assert props["point"]["prefixItems"] == [{"type": "number"}, {"type": "number"}]
    pair = props["path"]["items"]
    assert pair["items"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert props["none"]["items"] == {}
    checked: Any = locate.validate({"point": [1, 2], "path": [[1, "a"]], "none": []})
    assert checked.point == (1.0, 2.0)


def test_a_parameter_name_providers_refuse_is_refused_when_the_tool_is_made() -> None:
    # Anthropic refuses a request whose tool input has such a property: every call failed.
    async def sized(größe: int) -> int:
        """Set a size."""
        return größe

    with pytest.raises(so.UsageError, match="parameter 'größe' is a name providers refuse"):
        so.tool(sized)

    async def aliased(order_id: Annotated[str, Field(alias="order id")]) -> str:
        """Look an order up."""
        return order_id

    with pytest.raises(so.UsageError, match="parameter 'order id' is a name providers refuse"):
        so.tool(aliased)


class _Nested(BaseModel):
    limit: float = float("inf")


class _Extra(BaseModel):
    model_config = {"json_schema_extra": {"example": object()}}  # type: ignore[dict-item]
    name: str = "x"


@pytest.mark.parametrize("kind", [_Nested, _Extra], ids=["nested infinity", "object in extra"])
def test_a_schema_that_is_not_json_is_refused_when_the_tool_is_made(kind: type) -> None:
    """A nested model's default of infinity (a top-level one was refused already) was kept in
    the tool's schema: every request of the agent then failed before it was sent, on both
    providers, each turn recorded failed, the tool unnamed."""

    async def setlim(inner: Any) -> str:
        """Set a limit."""
        return "ok"

    setlim.__annotations__["inner"] = kind
    with pytest.raises(so.UsageError, match=r"^tool 'setlim': its input schema is not JSON"):
        so.tool(setlim)
