"""The model step's guard: a response that cannot be recorded as plain JSON fails the turn,
retryably, before anything of it is stored or run (any `Model`, not only the shipped ones)."""

from __future__ import annotations

import asyncio
import gc
import types
import warnings
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._model_step import ModelStep
from signoff.testing import Capture, reply, scripted_agent

from ._replaced import ALICE, assert_only_the_new_turn, assert_told_cancelled, replace_turn
from .fakes.llm import API_KEY, FakeLLM, openai_completion, openai_tool_call

ran: list[object] = []


@so.tool(approval=lambda input: input.amount > 100)
async def refund(order_id: str, amount: float) -> dict[str, object]:
    """Refund an order."""
    ran.append(amount)
    return {"refunded": amount}


def call(**input: object) -> so.ModelResponse:
    return so.ModelResponse(tool_calls=[so.ToolCall(name="refund", input=input, id="call_1")])


def unchecked(**fields: Any) -> so.ModelResponse:
    """A response built without validation, as a custom model might."""
    base: dict[str, Any] = {"text": "", "tool_calls": [], "usage": so.Usage(), "reasoning": []}
    return so.ModelResponse.model_construct(**{**base, **fields})


NAMELESS = so.ToolCall.model_construct(name=None, input={})  # type: ignore[arg-type]
NUMBERED = so.ToolCall.model_construct(name="refund", id=5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (call(order_id="1", amount=float("nan")), "not plain JSON"),
        (call(order_id="1", amount=float("inf")), "not plain JSON"),
        (call(order_id=object(), amount=1), "not plain JSON"),
        (so.ModelResponse(text="x", usage=so.Usage(cost_usd=float("nan"))), "not plain JSON"),
        (so.ModelResponse(text="x", usage=so.Usage(input_tokens=-5)), "negative usage"),
        (so.ModelResponse(text="x", usage=so.Usage(cost_usd=-0.5)), "negative usage"),
        (so.ModelResponse(text="x", usage=so.Usage(cost_usd=1.7e308)), "usage too large"),
        (so.ModelResponse(text="x", usage=so.Usage(output_tokens=2**53)), "usage too large"),
        (so.ModelResponse(text="x" * 2_000_000), "over the limit of 1048576 bytes"),
        (call(order_id="1" * 2_000_000, amount=1), "over the limit of 1048576 bytes"),
        # Built past validation (model_construct, or a list appended to): recorded, such a
        # response made every later read of the session fail with a StoreError.
        (unchecked(text=None), "malformed"),
        (unchecked(text=5), "malformed"),
        (unchecked(usage=None), "malformed"),
        (unchecked(tool_calls=[{"name": "refund", "input": {}}]), "malformed"),
        (unchecked(tool_calls=[NAMELESS]), "malformed"),
        (unchecked(tool_calls=[NUMBERED]), "malformed"),
    ],
    ids=[
        "nan",
        "infinity",
        "object",
        "nan-cost",
        "negative-tokens",
        "negative-cost",
        "huge-cost",
        "huge-count",
        "huge-text",
        "huge-input",
        "text-none",
        "text-int",
        "usage-none",
        "call-as-dict",
        "call-name-none",
        "call-id-int",
    ],
)
async def test_a_response_that_cannot_be_recorded_fails_the_turn_retryably(
    tmp_path: Path, bad: so.ModelResponse, match: str
) -> None:
    ran.clear()
    model = so.models.Scripted([bad])
    agent = so.Agent(name="a", model=model, tools=[refund])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("a", prompt="refund order 1")
        assert (r.status, r.retryable, r.pending) == ("failed", True, [])
        assert r.error is not None and r.error["code"] == "model_error"
        assert match in r.error["message"]
        types = [e.type async for e in rt.events(r.session_id, follow=False)]
        assert "model.completed" not in types and types[-2:] == ["turn.failed", "session.waiting"]
        state = await rt.state(r.session_id)
        assert (state.usage.input_tokens, state.usage.cost_usd) == (0, 0.0)

        model.steps = [so.ModelResponse(text="Sorry, which amount?")]  # the retry gets a good one
        r = await rt.generate(session_id=r.session_id)
        assert (r.status, r.text) == ("completed", "Sorry, which amount?")
    assert ran == []


async def test_a_model_raising_cancelled_error_itself_fails_the_turn_retryably(
    tmp_path: Path,
) -> None:
    # A model client that raises CancelledError without the turn being cancelled: the turn
    # fails retryably like any model error instead of escaping with the session left running.
    def cancelled(conversation: list[so.Message]) -> so.ModelResponse:
        raise asyncio.CancelledError("the stream was cancelled")

    model = so.models.Scripted([cancelled])
    agent = so.Agent(name="a", model=model, tools=[refund])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("a", prompt="refund order 1")
        assert (r.status, r.retryable) == ("failed", True)
        assert r.error is not None and "CancelledError" in r.error["message"]
        [summary] = await rt.sessions()
        assert summary.status == "failed"
        model.steps = [so.ModelResponse(text="Back again.")]
        r = await rt.generate(session_id=r.session_id)
        assert (r.status, r.text) == ("completed", "Back again.")


class PlainModel:
    """A model of one's own whose `complete` is a plain `def`, not the protocol's coroutine."""

    def complete(self, request: Any) -> so.ModelResponse:
        return so.ModelResponse(text="hello")


PLAIN_REPLY = (
    "ModelError: the model's complete() returned ModelResponse, not an awaitable: a model's "
    "complete is an async def (the Model protocol's)"
)


async def test_a_model_whose_complete_is_no_coroutine_fails_the_turn_saying_so(
    tmp_path: Path,
) -> None:
    """Every turn failed with "TypeError: object ModelResponse can't be used in 'await'
    expression", which named neither the model nor what to change."""
    agent = so.Agent(name="a", model=PlainModel(), tools=[refund])  # type: ignore[arg-type]
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("a", prompt="hi")
        assert (r.status, r.retryable) == ("failed", True)
        assert r.error == {"code": "model_error", "message": PLAIN_REPLY}


async def test_a_model_error_of_megabytes_is_cut_not_stored_whole(tmp_path: Path) -> None:
    # Any model's exception went whole into the turn's failure: megabytes in the log per retry.
    model = so.models.Scripted([so.ModelError("x" * 3_000_000)])
    agent = so.Agent(name="a", model=model, tools=[refund])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("a", prompt="refund order 1")
        assert (r.status, r.retryable) == ("failed", True)
        assert r.error is not None and r.error["code"] == "model_error"
        message = r.error["message"]
        assert message.startswith("ModelError: xxx") and message.endswith(" [cut]")
        assert len(message) <= agent.limits.max_response_bytes // 4 + len(" [cut]")


async def test_a_response_whose_turn_was_replaced_meanwhile_is_not_recorded(
    store_url: str,
) -> None:
    """While the model answers, another process cancels the turn and starts a new one (left
    running: this process holds the lease). The response is not recorded, nothing of the old
    turn lands in the new one, and the new turn runs normally."""
    new_turn: list[str] = []
    sid = ""

    async def answer(conversation: list[so.Message]) -> so.ModelResponse:
        if not new_turn:
            new_turn.append(await replace_turn(other, sid))
            return so.ModelResponse(text="The old answer.")
        return so.ModelResponse(text="Tried again.")

    def agent() -> so.Agent:
        return so.Agent(name="desk", model=so.models.Scripted([answer]))

    async with (
        so.Runtime([agent()], store=store_url) as rt,
        so.Runtime([agent()], store=store_url, lease_wait=0) as other,
    ):
        sid = await rt.create_session("desk", auth=ALICE)
        first = await rt.generate(session_id=sid, prompt="Hello", auth=ALICE)
        await assert_told_cancelled(rt, sid, first, new_turn[0], "Tried again.")
        await assert_only_the_new_turn(rt, sid, new_turn[0])
        texts = [e.data.get("text") async for e in rt.events(sid, follow=False)]
        assert "The old answer." not in texts


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


async def test_a_model_raising_an_exception_whose_message_cannot_be_read_fails_the_turn(
    tmp_path: Path,
) -> None:
    agent = so.Agent(
        name="a", model=so.models.Scripted([Unprintable(), so.ModelResponse(text="hi")])
    )
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 'state.db'}") as rt:
        r = await rt.generate("a", prompt="go")
        assert (r.status, r.retryable) == ("failed", True)
        assert r.error is not None and "Unprintable" in r.error["message"]


# 3,000 + 2,500 tokens: the budget of 5,000 is spent by the one response it was paid for.
SPENT = so.Usage(input_tokens=3000, output_tokens=2500, cost_usd=0.25)


def _cut_off_call(fake: FakeLLM) -> so.models.OpenAIChat:
    """OpenAIChat answered with a tool call cut off at the token limit: billed, never run."""
    body = openai_completion(
        tool_calls=[openai_tool_call("call_1", "refund", '{"order_id": "1", "amo')],
        usage=(SPENT.input_tokens, SPENT.output_tokens),
    )
    body["choices"][0]["finish_reason"] = "length"
    fake.queue(body)
    # Its own max_tokens, below the budget's 5,000: the call is cut at the model's limit, not
    # at what the budget left (which asks a person at once: test_models_budget.py).
    return so.models.OpenAIChat(
        "m",
        base_url=fake.base_url,
        api_key=API_KEY,
        max_retries=0,
        price_per_mtok=(50, 40),
        max_tokens=SPENT.output_tokens,
    )


@pytest.mark.parametrize("how", ["too-large", "cut-off"])
async def test_a_paid_response_that_fails_the_turn_counts_against_the_budgets(
    store_url: str, how: str
) -> None:
    """A response the turn cannot use (over max_response_bytes, or a call cut off at the token
    limit) fails it retryably, yet the provider billed it: its usage counts against the
    session's budgets, so retries cannot spend past them without a person raising them."""
    ran.clear()
    with FakeLLM("openai") as fake:
        model: so.models.OpenAIChat | so.models.Scripted
        if how == "cut-off":
            model = _cut_off_call(fake)
        else:
            model = so.models.Scripted([so.ModelResponse(text="x" * 2_000_000, usage=SPENT)])
        try:
            await _spend_once(model, store_url)
        finally:
            if isinstance(model, so.models.OpenAIChat):
                await model.aclose()
        asked = len(fake.received) if isinstance(model, so.models.OpenAIChat) else model.calls
        assert asked == 1  # the model was not asked again
    assert ran == []


async def _spend_once(model: so.models.Model, store_url: str) -> None:
    """One turn whose only response fails it but spends the budget; the retry asks a person."""
    agent = so.Agent(name="a", model=model, tools=[refund], limits=so.Limits(max_tokens=5000))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="refund order 1", auth=ALICE)
        assert (r.status, r.retryable) == ("failed", True)
        log = [e async for e in rt.events(r.session_id, follow=False)]
        [failed] = [e for e in log if e.type == "turn.failed"]
        assert failed.data["usage"] == SPENT.model_dump()
    async with so.Runtime([agent], store=store_url) as rt:  # read back from the store
        assert (await rt.state(r.session_id)).usage == SPENT
        again = await rt.generate(session_id=r.session_id, auth=ALICE)
        assert again.status == "waiting"
        assert [p.kind for p in again.pending] == ["session-limit"]


@pytest.mark.parametrize(
    "usage",
    [
        so.Usage.model_construct(input_tokens=-5, output_tokens=0, cost_usd=0.0),
        so.Usage.model_construct(input_tokens=1, output_tokens=1, cost_usd=float("nan")),
        so.Usage.model_construct(input_tokens="9", output_tokens=1, cost_usd=0.0),  # type: ignore[arg-type]
        so.Usage(),
        {"input_tokens": 5},
        # Counted, two of them made the session's cost infinite: no JSON reply could show it.
        so.Usage(input_tokens=1, output_tokens=1, cost_usd=1.7e308),
        so.Usage(input_tokens=2**53, output_tokens=1, cost_usd=0.0),
    ],
    ids=["negative", "nan-cost", "text-count", "zero", "dict", "huge-cost", "huge-count"],
)
async def test_a_model_errors_usage_counts_only_when_it_is_a_plain_count(
    tmp_path: Path, usage: Any
) -> None:
    model = so.models.Scripted([so.ModelError("refused", usage=usage)])
    agent = so.Agent(name="a", model=model, tools=[refund])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("a", prompt="refund order 1")
        assert (r.status, r.retryable) == ("failed", True)
        log = [e async for e in rt.events(r.session_id, follow=False)]
        [failed] = [e for e in log if e.type == "turn.failed"]
        assert "usage" not in failed.data
        assert (await rt.state(r.session_id)).usage == so.Usage()


def _refunds(n: int, amount: float = 500) -> so.ModelResponse:
    """A response of `n` refund calls (gated ones unless `amount` is 100 or less)."""
    calls = [
        so.ToolCall(name="refund", input={"order_id": str(i), "amount": amount}, id=f"c{i}")
        for i in range(n)
    ]
    return so.ModelResponse(tool_calls=calls, usage=SPENT)


async def test_more_calls_than_max_calls_per_response_fail_the_turn_retryably(
    store_url: str,
) -> None:
    """A response of thousands of gated calls opened as many approval requests (a notification
    each, more than one `generate(approvals=)` settles): past `max_calls_per_response` (128 by
    default) the turn fails retryably, before anything of the response is recorded, the reply's
    usage counted as the provider billed it."""
    ran.clear()
    model = so.models.Scripted([_refunds(129)])
    agent = so.Agent(name="a", model=model, tools=[refund])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="refund everything", auth=ALICE)
        assert (r.status, r.retryable, r.pending) == ("failed", True, [])
        assert r.error is not None and r.error["code"] == "model_error"
        why = "129 tool calls, over the limit of 128 (max_calls_per_response)"
        assert why in r.error["message"]
        log = [e async for e in rt.events(r.session_id, follow=False)]
        types = [e.type for e in log]
        assert "model.completed" not in types and "input.requested" not in types
        assert types[-2:] == ["turn.failed", "session.waiting"]
        assert log[-2].data["usage"] == SPENT.model_dump()
        assert await rt.pending() == []
        assert (await rt.state(r.session_id)).usage == SPENT

        model.steps = [_refunds(128)]  # the retry gets 128 calls: at the limit
        r = await rt.generate(session_id=r.session_id, auth=ALICE)
        assert r.status == "waiting" and len(r.pending) == 128
    assert ran == []


async def test_max_calls_per_response_is_set_per_agent_or_lifted(tmp_path: Path) -> None:
    ran.clear()
    model = so.models.Scripted([_refunds(4, 5)])
    few = so.Agent(
        name="few", model=model, tools=[refund], limits=so.Limits(max_calls_per_response=3)
    )
    many = so.models.Scripted([_refunds(300, 5), so.ModelResponse(text="all done")])
    lifted = so.Agent(
        name="lifted", model=many, tools=[refund], limits=so.Limits(max_calls_per_response=None)
    )
    async with so.Runtime([few, lifted], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("few", prompt="go")
        assert r.status == "failed" and r.error is not None
        assert "4 tool calls, over the limit of 3 (max_calls_per_response)" in r.error["message"]
        model.steps = [_refunds(3, 5), so.ModelResponse(text="ok")]
        r = await rt.generate(session_id=r.session_id)
        assert (r.status, r.text) == ("completed", "ok")
        assert len(ran) == 3
        r = await rt.generate("lifted", prompt="go")
        assert (r.status, r.text) == ("completed", "all done")
        assert len(ran) == 303


async def test_a_drive_cancelled_as_it_starts_the_model_call_leaves_no_coroutine_unawaited() -> (
    None
):
    """A close at the moment the step had scheduled the model call, before that call ran,
    cancelled it unstarted: the model's coroutine, made eagerly, was never awaited (Python
    warned at collection, an error where warnings are)."""
    started: list[so.models.ModelRequest] = []

    async def complete(request: so.models.ModelRequest) -> so.ModelResponse:
        started.append(request)
        return so.ModelResponse(text="hi")

    lease = types.SimpleNamespace(lost=False, body=None)
    step = types.SimpleNamespace(
        held=lease,
        state=types.SimpleNamespace(id="s1"),
        agent=types.SimpleNamespace(model=types.SimpleNamespace(complete=complete)),
    )
    request = so.models.ModelRequest(
        session_id="s1", agent="a", instructions="", messages=[], tools=[], response_index=0
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        drive = asyncio.ensure_future(ModelStep._complete(step, request))  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the drive scheduled the call, which has not run yet
        drive.cancel()
        with pytest.raises(asyncio.CancelledError):
            await drive
        gc.collect()
    assert started == []
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []


class _CachedUsage(so.Usage):
    """A model's own usage type, with a field of its own."""

    cached_tokens: int = 0


async def test_a_models_own_usage_type_is_recorded_as_a_plain_usage(tmp_path: Path) -> None:
    # Recorded with its own field, it could not be read back: the session stayed running.
    mine = _CachedUsage(input_tokens=10, output_tokens=3, cost_usd=0.5, cached_tokens=8)
    model = so.models.Scripted([so.ModelError("refused", usage=mine)])
    agent = so.Agent(name="a", model=model, tools=[refund])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("a", prompt="hi")
        assert (r.status, r.retryable) == ("failed", True)
        model.steps = [so.ModelResponse(text="hello", usage=mine)]
        r = await rt.generate(session_id=r.session_id)
        assert (r.status, r.text, r.error) == ("completed", "hello", None)
        log = [e async for e in rt.events(r.session_id, follow=False)]
        usages = [e.data["usage"] for e in log if e.type in ("turn.failed", "model.completed")]
        plain = {"input_tokens": 10, "output_tokens": 3, "cost_usd": 0.5}
        assert usages == [plain, plain]
        state = await rt.state(r.session_id)
        assert (state.status, state.usage) == ("idle", so.Usage(**plain) + so.Usage(**plain))


@pytest.mark.parametrize("kept", [None, 10**9, float("nan"), "3", -1, True], ids=str)
async def test_a_model_errors_context_tokens_counts_only_as_a_whole_number_within_its_input(
    tmp_path: Path, kept: Any
) -> None:
    """One built without it (an older signoff's, rebuilt from a journal) made the failure's own
    record raise AttributeError, the session left running; one of 10**9 held every later call
    back, NaN went into the log, an object failed the record. Each says nothing now, or at most
    its input."""
    from signoff._exceptions import rebuild_error

    usage = so.Usage(input_tokens=10, output_tokens=5)
    if kept is None:
        error = rebuild_error(so.ModelError, ("upstream failed",), {"usage": usage})
    else:
        error = so.ModelError("upstream failed", usage=usage, context_tokens=kept)
    agent = so.Agent(name="a", model=so.models.Scripted([error]), tools=[refund])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("a", prompt="refund order 1")
        assert (r.status, r.retryable) == ("failed", True)
        log = [e async for e in rt.events(r.session_id, follow=False)]
        [failed] = [e for e in log if e.type == "turn.failed"]
        # At most its input: 10**9 is 10, the rest nothing.
        assert failed.data.get("context_tokens") == (10 if kept == 10**9 else None)
        assert (await rt.state(r.session_id)).last_input_tokens == 10


async def test_max_calls_per_response_is_at_most_what_one_answer_call_settles(
    tmp_path: Path,
) -> None:
    """Lifted (None) or set past it, the bound was taken as given: a response of 1,001 gated
    calls opened 1,001 requests, which `generate(approvals=)` could never settle (all of them
    are over the 1,000 answers of a call, fewer leave some open). It counts as 1,000."""
    assert so.Limits(max_calls_per_response=None).max_calls_per_response == 1000
    assert so.Limits(max_calls_per_response=10**9).max_calls_per_response == 1000
    assert so.Limits(max_calls_per_response=999).max_calls_per_response == 999
    ran.clear()
    model = so.models.Scripted([_refunds(1001)])
    lifted = so.Limits(max_calls_per_response=None)
    agent = so.Agent(name="a", model=model, tools=[refund], limits=lifted)
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("a", prompt="refund everything", auth=ALICE)
        assert (r.status, r.retryable, r.pending) == ("failed", True, [])
        assert r.error is not None
        why = "1001 tool calls, over the limit of 1000 (max_calls_per_response)"
        assert why in r.error["message"]
        model.steps = [_refunds(1000), so.ModelResponse(text="all done")]
        r = await rt.generate(session_id=r.session_id, auth=ALICE)
        assert r.status == "waiting" and len(r.pending) == 1000
        approvals = [so.Decision(id=p.id, approved=True) for p in r.pending]
        r = await rt.generate(session_id=r.session_id, approvals=approvals, auth=ALICE)
        assert (r.status, r.text) == ("completed", "all done")
    assert len(ran) == 1000


async def test_a_window_past_any_log_reads_the_whole_conversation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`max_messages=sys.maxsize` (no window, as `max_tokens` says of itself): a session loaded
    from a snapshot in another runtime read its window with a bound no store takes, and every
    drive of it raised a bare OverflowError, its session left `running`."""
    import sys

    import signoff._recording

    monkeypatch.setattr(signoff._recording, "SNAPSHOT_EVERY", 1)
    seen = Capture(reply("two"))

    def agent() -> so.Agent:
        return scripted_agent("a", [reply("one"), seen], limits=so.Limits(max_messages=sys.maxsize))

    url = f"sqlite:///{tmp_path}/s.db"
    async with so.Runtime([agent()], store=url) as rt:
        first = await rt.generate("a", prompt="go")
    async with so.Runtime([agent()], store=url) as rt:
        again = await rt.generate(session_id=first.session_id, prompt="again")
        assert (again.status, again.text) == ("completed", "two")
        assert (await rt.state(first.session_id)).status == "idle"
    assert [getattr(m, "text", None) for m in seen.last] == ["go", "one", "again"]
