"""A gated tool with a lazy input (`_tool_calls`): an `Iterable[...]` parameter, which pydantic
validates to a one-shot iterator. Each reader of the input (the policy, a guardrail, an `auto()`
review, the form a reviewer is shown, the trace, the body) gets its own validation of it: one
validation shared used it up, so the body got nothing (a refund of nothing, silently), and an
approval of such a call could never be asked. So too an iterator a validator makes, with no
`Iterable` declared."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import pydantic
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import AfterValidator, BaseModel, Field, PlainSerializer, model_validator

import signoff as so
import signoff._tools
from signoff._tool_json import holds_iterator
from signoff.models import ModelRequest
from signoff.testing import (
    Capture,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)

from ._approved_elsewhere import approved_elsewhere
from ._tracing import _by_name, exporter, provider

__all__ = ["exporter", "provider"]  # the fixtures, used by name

ALICE = so.Principal(authenticator="test", principal_id="alice")
AMOUNTS = [10.0, 20.0, 30.0]
Rounded = Annotated[float, PlainSerializer(round)]  # module level: tool hints are resolved here
# No `Iterable` declared (`Tool.lazy` is False), but the value a validator makes is an iterator.
MadeIterator = Annotated[Any, AfterValidator(iter)]


class Batch(BaseModel):
    amounts: Iterable[float]


def refunds(
    approval: Any, got: list[list[float]], *, nested: bool = False, made: bool = False
) -> so.Tool:
    """A tool refunding a batch of amounts, given as a parameter or inside a model's field, or
    (`made`) as a parameter a validator makes an iterator of."""
    if made:

        @so.tool(approval=approval, name="refund_batch")
        async def refund_made(amounts: MadeIterator) -> dict[str, Any]:
            """Refund several amounts."""
            got.append(list(amounts))
            return {"refunded": got[-1]}

        return refund_made
    if nested:

        @so.tool(approval=approval, name="refund_batch")
        async def refund_nested(batch: Batch) -> dict[str, Any]:
            """Refund several amounts."""
            got.append(list(batch.amounts))
            return {"refunded": got[-1]}

        return refund_nested

    @so.tool(approval=approval)
    async def refund_batch(amounts: Iterable[float]) -> dict[str, Any]:
        """Refund several amounts."""
        got.append(list(amounts))
        return {"refunded": got[-1]}

    return refund_batch


def given(nested: bool) -> dict[str, Any]:
    return {"batch": {"amounts": AMOUNTS}} if nested else {"amounts": AMOUNTS}


async def run(
    tmp_path: Path, tool: so.Tool, input: dict[str, Any], **agent: Any
) -> tuple[so.GenerateResult, Capture]:
    """Propose one call of `tool`; approve it if a person is asked. The result, and what the
    model read after it."""
    seen = Capture(reply("done"))
    proposal = call_tools(so.ToolCall(id="c1", name=tool.name, input=input))
    a = scripted_agent("a", [proposal, seen], tools=[tool], **agent)
    async with sqlite_runtime(tmp_path, a) as rt:
        r = await rt.generate("a", prompt="refund", auth=ALICE)
        if r.pending:
            [req] = r.pending
            assert req.input == input, req.input  # shown whole
            approve = so.Decision(id=req.id, approved=True)
            r = await rt.generate(session_id=r.session_id, approvals=[approve], auth=ALICE)
    return r, seen


@pytest.mark.parametrize("nested", [False, True], ids=["parameter", "nested"])
@pytest.mark.parametrize("limit", [100, 1000], ids=["asks", "runs"])
async def test_a_predicate_reading_a_lazy_input_leaves_the_body_all_of_it(
    tmp_path: Path, nested: bool, limit: int
) -> None:
    """`approval=lambda input: sum(input.amounts) > limit`: the predicate read the iterator the
    body then got, and the body refunded nothing, whether it ran at once or once approved."""
    got: list[list[float]] = []
    read: list[float] = []

    def big(input: Any) -> bool:
        total = float(sum(input.batch.amounts if nested else input.amounts))
        read.append(total)
        return total > limit

    r, seen = await run(tmp_path, refunds(big, got, nested=nested), given(nested))
    assert r.status == "completed"
    assert read == [60.0]
    assert got == [AMOUNTS]
    assert [m.content for m in tool_results(seen.last)] == [{"refunded": AMOUNTS}]


@pytest.mark.parametrize("nested", [False, True], ids=["parameter", "nested"])
async def test_an_always_gated_lazy_input_is_shown_approved_and_run_whole(
    tmp_path: Path, nested: bool
) -> None:
    """Its form used up the iterator, and validated again did not compare as the input (two
    iterators): the call could never be asked about ("cannot be shown to a reviewer")."""
    got: list[list[float]] = []
    r, seen = await run(tmp_path, refunds(so.always(), got, nested=nested), given(nested))
    assert r.status == "completed"
    assert got == [AMOUNTS]
    assert [m.content for m in tool_results(seen.last)] == [{"refunded": AMOUNTS}]


async def test_an_edit_of_a_lazy_input_is_taken_and_runs_whole(tmp_path: Path) -> None:
    """The edit's form used up its iterator, and validated again did not compare as the edit:
    every edit of such a call was refused ("cannot be edited")."""
    got: list[list[float]] = []
    seen = Capture(reply("done"))
    proposal = call_tools(so.ToolCall(id="c1", name="refund_batch", input=given(False)))
    agent = scripted_agent("a", [proposal, seen], tools=[refunds(so.always(), got)])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="refund", auth=ALICE)
        [req] = r.pending
        edit = so.Decision(id=req.id, approved=True, edited_input={"amounts": [1, 2]})
        done = await rt.generate(session_id=r.session_id, approvals=[edit], auth=ALICE)
    assert done.status == "completed"
    assert got == [[1.0, 2.0]]
    [result] = tool_results(seen.last)
    assert result.content["result"] == {"refunded": [1.0, 2.0]}


async def test_the_policy_and_each_guardrail_read_a_lazy_input_of_their_own(
    tmp_path: Path,
) -> None:
    read: list[tuple[str, list[float]]] = []

    def policy(ctx: so.ApprovalContext) -> str:
        read.append(("policy", list(ctx.tool_input.amounts)))
        return "approved"

    class Watch(so.Guardrail):
        def __init__(self, name: str) -> None:
            self.name = name

        async def decide(self, ctx: so.ApprovalContext) -> so.Verdict | None:
            read.append((self.name, list(ctx.tool_input.amounts)))
            return None

    got: list[list[float]] = []
    tool = refunds(policy, got)
    r, _ = await run(tmp_path, tool, given(False), guardrails=[Watch("g1"), Watch("g2")])
    assert r.status == "completed"
    assert read == [("policy", AMOUNTS), ("g1", AMOUNTS), ("g2", AMOUNTS)]
    assert got == [AMOUNTS]


async def test_a_guardrail_asked_again_as_an_approved_lazy_call_starts_leaves_it_whole(
    tmp_path: Path,
) -> None:
    """An approved call's guardrails are asked again as its body would start (a deploy may
    have added one since): each reads a lazy input of its own there too, not the body's."""
    read: list[list[float]] = []

    class Watch(so.Guardrail):
        async def decide(self, ctx: so.ApprovalContext) -> so.Verdict | None:
            read.append(list(ctx.tool_input.amounts))
            return None

    got: list[list[float]] = []
    r, seen = await run(tmp_path, refunds(so.always(), got), given(False), guardrails=[Watch()])
    assert r.status == "completed"
    assert read == [AMOUNTS, AMOUNTS]  # as proposed, then as the approved call starts
    assert got == [AMOUNTS]
    assert [m.content for m in tool_results(seen.last)] == [{"refunded": AMOUNTS}]


async def test_auto_reviews_a_lazy_input_whole_and_a_clear_runs_it(tmp_path: Path) -> None:
    """The review's form used up the body's iterator; and validated again, the form did not
    compare as the input, so no lazy input could ever be reviewed."""
    prompts: list[str] = []

    def clear(request: ModelRequest) -> so.ModelResponse:
        [message] = request.messages
        assert isinstance(message, so.UserMessage)
        prompts.append(message.text)
        return so.ModelResponse(text=json.dumps({"verdict": "clear", "reason": "small"}))

    class Reviewer:
        async def complete(self, request: ModelRequest) -> so.ModelResponse:
            return clear(request)

    got: list[list[float]] = []
    r, seen = await run(tmp_path, refunds(so.auto(Reviewer()), got), given(False))
    assert r.status == "completed"
    assert got == [AMOUNTS]
    [prompt] = prompts
    assert 'Input (JSON): {"amounts": [10.0, 20.0, 30.0]}' in prompt


async def test_a_lazy_item_shown_otherwise_than_it_runs_cannot_be_approved(
    tmp_path: Path,
) -> None:
    """The iterators' items are compared as any input's: one whose form shows less than its
    value (a serializer that rounds) would run unseen input if approved."""
    ran: list[list[float]] = []

    @so.tool(approval=so.always())
    async def pay(amounts: Iterable[Rounded]) -> str:
        """Pay."""
        ran.append(list(amounts))
        return "paid"

    seen = Capture(reply("sorry"))
    proposal = call_tools(call("pay", amounts=[1.4, 2.0]))
    async with sqlite_runtime(tmp_path, scripted_agent("a", [proposal, seen], tools=[pay])) as rt:
        r = await rt.generate("a", prompt="pay", auth=ALICE)
        assert r.status == "completed" and r.pending == []
    [result] = tool_results(seen.last)
    assert result.is_error and "cannot be shown to a reviewer" in result.content["error"]
    assert "'amounts.0'" in result.content["error"]
    assert ran == []


async def test_a_lazy_tool_asking_approval_in_its_body_shows_its_whole_input(
    tmp_path: Path,
) -> None:
    """`ctx.request_approval()` after the body read its input: the body's used-up input was
    checked for the form, which could not be shown at all."""
    got: list[list[float]] = []

    @so.tool
    async def refund_batch(ctx: so.ToolContext, amounts: Iterable[float]) -> dict[str, Any]:
        """Refund several amounts."""
        got.append(list(amounts))
        ctx.request_approval({"total": sum(got[-1])})

    r, seen = await run(tmp_path, refund_batch, given(False))  # asserts the request's input
    assert r.status == "completed"
    assert got == [AMOUNTS]
    [result] = tool_results(seen.last)
    assert not result.is_error and result.content["approved"] is True, result.content


@pytest.mark.parametrize("made", [False, True], ids=["iterable", "validator"])
async def test_a_traced_lazy_input_leaves_the_body_all_of_it(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider, made: bool
) -> None:
    """`trace_content=True` put the input on the tool's span by its JSON form, which used up
    the iterator the body then read."""
    got: list[list[float]] = []
    tool = refunds(so.never(), got, made=made)
    seen = Capture(reply("done"))
    proposal = call_tools(so.ToolCall(id="c1", name=tool.name, input=given(False)))
    agent = scripted_agent("a", [proposal, seen], tools=[tool])
    async with sqlite_runtime(tmp_path, agent, tracer_provider=provider, trace_content=True) as rt:
        r = await rt.generate("a", prompt="refund", auth=ALICE)
    assert r.status == "completed" and got == [AMOUNTS]
    [span] = _by_name(exporter.get_finished_spans())["execute_tool refund_batch"]
    shown = (span.attributes or {})["gen_ai.tool.call.arguments"]
    assert json.loads(str(shown)) == given(False)


@pytest.mark.parametrize("approval", ["auto", "predicate", "always"])
async def test_an_iterator_a_validator_makes_is_read_by_each_reader_on_its_own(
    tmp_path: Path, approval: str
) -> None:
    """No `Iterable` parameter (`Tool.lazy` is False), but a validator makes the value an
    iterator: `auto()`'s form of the body's own input used it up, and its clear ran the body
    with nothing (a refund of nothing); a predicate or a guardrail reading it did the same.
    Laziness is told from the value too, so each reader validates an input of its own."""
    read: list[list[float]] = []

    class Watch(so.Guardrail):
        async def decide(self, ctx: so.ApprovalContext) -> so.Verdict | None:
            read.append(list(ctx.tool_input.amounts))
            return None

    class Reviewer:
        async def complete(self, request: ModelRequest) -> so.ModelResponse:
            return so.ModelResponse(text=json.dumps({"verdict": "clear", "reason": "small"}))

    def big(input: Any) -> bool:
        return float(sum(input.amounts)) > 50

    policy = {"auto": so.auto(Reviewer()), "predicate": big, "always": so.always()}[approval]
    got: list[list[float]] = []
    tool = refunds(policy, got, made=True)
    assert not tool.lazy
    r, seen = await run(tmp_path, tool, given(False), guardrails=[Watch()])
    assert r.status == "completed"
    assert got == [AMOUNTS]
    assert [m.content for m in tool_results(seen.last)] == [{"refunded": AMOUNTS}]
    # As proposed, and again as the approved call starts (an auto() clear asks nobody).
    assert read == [AMOUNTS] * (1 if approval == "auto" else 2)


async def test_a_lazy_input_a_validator_makes_asking_in_its_body_shows_it_whole(
    tmp_path: Path,
) -> None:
    """`ctx.request_approval()` after the body read an iterator a validator made: its form is
    taken of an input validated anew, as of an `Iterable` parameter's."""
    got: list[list[float]] = []

    @so.tool
    async def refund_batch(ctx: so.ToolContext, amounts: MadeIterator) -> dict[str, Any]:
        """Refund several amounts."""
        got.append(list(amounts))
        ctx.request_approval({"total": sum(got[-1])})

    r, seen = await run(tmp_path, refund_batch, given(False))  # asserts the request's input
    assert r.status == "completed"
    assert got == [AMOUNTS]
    [result] = tool_results(seen.last)
    assert not result.is_error and result.content["approved"] is True, result.content


_refs = iter(f"ref{n}" for n in range(1000))


async def test_an_approved_lazy_call_is_read_as_the_input_it_runs_with(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """A value validation makes anew each time (a `default_factory`'s id): an approved call's
    body runs with the one the reviewer saw (the model's input filled in from the form), but
    the guardrail asked again at its start, and its trace, validated the model's own input
    again: they read another id than the one that ran."""
    seen_by: dict[str, list[str]] = {"guardrail": [], "body": []}
    got: list[list[float]] = []

    class Watch(so.Guardrail):
        async def decide(self, ctx: so.ApprovalContext) -> so.Verdict | None:
            seen_by["guardrail"].append(ctx.tool_input.ref)
            return None

    @so.tool(approval=so.always())
    async def refund_batch(
        amounts: Iterable[float], ref: str = Field(default_factory=lambda: next(_refs))
    ) -> dict[str, Any]:
        """Refund several amounts."""
        seen_by["body"].append(ref)
        got.append(list(amounts))
        return {"ref": ref, "refunded": got[-1]}

    proposal = call_tools(so.ToolCall(id="c1", name="refund_batch", input=given(False)))
    agent = scripted_agent(
        "a", [proposal, reply("done")], tools=[refund_batch], guardrails=[Watch()]
    )
    async with sqlite_runtime(tmp_path, agent, tracer_provider=provider, trace_content=True) as rt:
        r = await rt.generate("a", prompt="refund", auth=ALICE)
        [req] = r.pending
        shown = req.input["ref"]
        approve = so.Decision(id=req.id, approved=True)
        r = await rt.generate(session_id=r.session_id, approvals=[approve], auth=ALICE)
    assert r.status == "completed"
    assert seen_by["body"] == [shown]
    assert got == [AMOUNTS]  # whole: no reader used it up
    [_, at_start] = seen_by["guardrail"]  # as proposed (a validation of its own), then:
    assert at_start == shown  # asked again as the approved call starts
    [span] = _by_name(exporter.get_finished_spans())["execute_tool refund_batch"]
    traced = json.loads(str((span.attributes or {})["gen_ai.tool.call.arguments"]))
    assert traced == {**given(False), "ref": shown}


@so.tool(approval=so.always())
async def refund_batch(amounts: Iterable[float]) -> dict[str, Any]:
    """Refund several amounts."""
    return {"refunded": list(amounts)}


def test_an_approved_lazy_call_runs_whole_in_another_process(tmp_path: Path) -> None:
    """Resumed by another process (a worker, a server restarted since), the approved call is
    validated again from the log, checked against its approval and run on validations of
    their own: the check used up what the body got."""
    url = f"sqlite:///{tmp_path}/state.db"
    ran = approved_elsewhere(url, __name__, "refund_batch", {"amounts": AMOUNTS})
    assert ran == "ok {'refunded': [10.0, 20.0, 30.0]}"


class _Counter(BaseModel):
    """A model that is an iterator itself: validation makes one with no validator."""

    left: int = 2

    def __iter__(self) -> _Counter:  # type: ignore[override]
        return self

    def __next__(self) -> int:
        if self.left <= 0:
            raise StopIteration
        self.left -= 1
        return self.left


class _MadeAfter(BaseModel):
    amounts: list[float]
    lazy: Any = None

    @model_validator(mode="after")
    def _lazy(self) -> _MadeAfter:
        self.lazy = iter(self.amounts)
        return self


class _PostInit(BaseModel):
    amounts: list[float]
    lazy: Any = None

    def model_post_init(self, context: Any, /) -> None:
        self.lazy = iter(self.amounts)


@pydantic.dataclasses.dataclass
class _DataPostInit:
    amounts: list[float]
    lazy: Any = None

    def __post_init__(self) -> None:
        self.lazy = iter(self.amounts)


def _factory(x: Annotated[Any, Field(default_factory=lambda: iter(AMOUNTS))]) -> None:
    """Take x."""


def _validator(x: MadeIterator) -> None:
    """Take x."""


def _after(x: _MadeAfter) -> None:
    """Take x."""


def _post_init(x: _PostInit) -> None:
    """Take x."""


def _data_post_init(x: _DataPostInit) -> None:
    """Take x."""


def _iterator_model(x: _Counter) -> None:
    """Take x."""


_MAKERS: dict[str, tuple[Any, dict[str, Any]]] = {
    "default_factory": (_factory, {}),
    "validator": (_validator, {"x": AMOUNTS}),
    "model_validator": (_after, {"x": {"amounts": AMOUNTS}}),
    "model_post_init": (_post_init, {"x": {"amounts": AMOUNTS}}),
    "dataclass_post_init": (_data_post_init, {"x": {"amounts": AMOUNTS}}),
    "iterator_model": (_iterator_model, {"x": {}}),
}


class _Row(BaseModel):
    path: Path
    secret: pydantic.SecretStr
    amounts: list[float] = Field(default_factory=list)


def _plain(rows: list[_Row], note: str = "") -> None:
    """Take rows."""


@pytest.mark.parametrize("maker", sorted(_MAKERS))
def test_each_way_code_makes_an_iterator_is_told_from_the_value(maker: str) -> None:
    """Only a tool whose input may hold an iterator JSON alone does not make (a validator's,
    a factory's, a model's own `model_post_init`, a model that is an iterator) is walked for
    one at each call (`Tool.holds_lazy`); each of those ways is found, none declared lazy."""
    fn, raw = _MAKERS[maker]
    tool = so.tool(fn)
    assert not tool.lazy
    assert tool.holds_lazy(tool.validate(raw))


def test_a_tool_no_code_can_give_an_iterator_is_not_walked_for_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tool with no `Iterable`, no code of its own and only pydantic's own validators
    (`SecretStr`, `Path`) cannot get an iterator from JSON: its input is not walked at each
    call (a walk read every item of a 50,000-row input, several times a call)."""
    tool, made = so.tool(_plain), refunds(so.always(), [], made=True)
    raw = {"rows": [{"path": "/tmp/a", "secret": "s", "amounts": AMOUNTS}]}
    assert not tool.holds_lazy(tool.validate(raw))  # each tool's schema is looked at once
    assert made.holds_lazy(made.validate({"amounts": AMOUNTS}))
    walked: list[Any] = []

    def counted(value: Any) -> bool:
        walked.append(value)
        return holds_iterator(value)

    monkeypatch.setattr(signoff._tools, "holds_iterator", counted)
    assert not tool.holds_lazy(tool.validate(raw))
    assert walked == []
    assert made.holds_lazy(made.validate({"amounts": AMOUNTS}))
    assert len(walked) == 1
