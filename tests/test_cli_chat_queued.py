"""`signoff chat --session` on a session whose turn ended (completed, cancelled or failed for
good) with a message queued behind it that never started: its process died between the commit
that ended the turn and the one that starts the message. Chat runs that message's turn, as
`generate(session_id=...)` does, on reopening the session or on `/retry` when it happened while
chat was open. And one whose turn failed in a way a retry can resume, with someone else's
message queued behind it: chat shows the retried turn, not the next person's. Run on both
stores."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest
from typer.testing import CliRunner

import signoff as so
from signoff._engine import Driver
from signoff.channels.terminal import TerminalChannel
from signoff.cli import app
from signoff.testing import ExecutionLog, call, call_tools

from ._steer import ALICE, BOB, events, refund_tool

__all__ = ["clerk", "limited", "talker"]


def _echo(conversation: list[so.Message]) -> so.ModelResponse:
    """Each step after the refund's call says the last thing a person said."""
    said = [m.text for m in conversation if isinstance(m, so.UserMessage)]
    return so.ModelResponse(text=f"re: {said[-1]}")


def _clerk(*, max_steps: int | None = None) -> so.Agent:
    """Asks to refund an order (an approval parks its turn), then echoes."""
    first = call_tools(call("issue_refund", call_id="r1", order_id="1042", amount=180))
    agent = so.Agent(
        name="clerk",
        model=so.models.Scripted([first, _echo], repeat_last=True),
        tools=[refund_tool(ExecutionLog())],
    )
    if max_steps is not None:
        agent.limits = so.Limits(max_steps=max_steps)
    return agent


clerk = _clerk()
# The same agent, whose turn fails for good (`max_steps`) once its refund is approved.
limited = _clerk(max_steps=1)


async def _crashed(url: str, agent: so.Agent, ends: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Alice's turn waits on the refund's approval with Bob's message queued behind it; her turn
    ends (`ends`) and the process dies before Bob's message starts. The session's id."""
    async with so.Runtime([agent], store=url) as rt:
        r = await rt.generate("clerk", "refund order 1042", auth=ALICE)
        assert r.status == "waiting"
        assert (await rt.send(r.session_id, "bob here", principal=BOB)).queued

        async def crash(self: Driver) -> None:
            raise KeyboardInterrupt  # a dead process records nothing more

        monkeypatch.setattr(Driver, "start_queued", crash)
        with pytest.raises(KeyboardInterrupt):
            if ends == "cancelled":
                await rt.cancel(r.session_id, "never mind", principal=ALICE)
            else:
                await rt.respond(
                    r.session_id,
                    [so.InputResponse(request_id=r.pending[0].id, option_id="approve")],
                    principal=ALICE,
                )
        monkeypatch.undo()
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.id == r.turn_id
        assert state.turn.status == ends and state.turn.retryable is False
        assert [q["message"] for q in state.queued] == ["bob here"]
        return r.session_id


async def _after(url: str, session_id: str) -> tuple[so.SessionState, list[str]]:
    """The session as it stands, and the messages its turns started with."""
    async with so.Runtime([clerk], store=url) as rt:
        log = await events(rt, session_id)
        started = [e.data["message"] for e in log if e.type == "turn.started"]
        return await rt.state(session_id), started


@pytest.mark.parametrize("ends", ["completed", "cancelled", "failed"])
def test_chat_reopening_a_session_starts_the_message_queued_behind_its_ended_turn(
    store_url: str, monkeypatch: pytest.MonkeyPatch, ends: str
) -> None:
    """Chat runs Bob's turn and shows its answer; the queue is empty after. It used to find the
    turn ended and wait for the person to type: Bob's message stayed unstarted until then (and
    left at once, as here, for good)."""
    agent = limited if ends == "failed" else clerk
    sid = asyncio.run(_crashed(store_url, agent, ends, monkeypatch))
    target = f"tests.test_cli_chat_queued:{'limited' if ends == 'failed' else 'clerk'}"
    chat = CliRunner().invoke(
        app, ["chat", target, "--session", sid, "--store", store_url], input="/exit\n"
    )
    assert chat.exit_code == 0, chat.output
    assert "the last turn ended; the message queued behind it starts now" in chat.output
    assert "clerk: re: bob here" in chat.output, chat.output
    if ends == "failed":
        assert "the last turn failed: " in chat.output, chat.output
    state, started = asyncio.run(_after(store_url, sid))
    assert started == ["refund order 1042", "bob here"]
    assert state.queued == [] and state.turn is not None
    assert (state.turn.status, state.turn.text) == ("completed", "re: bob here")
    assert state.turn.principal == BOB


def _talk(conversation: list[so.Message]) -> so.ModelResponse:
    """Asks to refund an order when told to (an approval parks the turn); else echoes."""
    last = conversation[-1]
    if isinstance(last, so.UserMessage) and last.text.startswith("refund"):
        return call_tools(call("issue_refund", call_id="r1", order_id="1042", amount=180))
    return _echo(conversation)


talker = so.Agent(
    name="clerk",
    model=so.models.Scripted([_talk], repeat_last=True),
    tools=[refund_tool(ExecutionLog())],
)


async def _crash_behind(url: str, session_id: str) -> None:
    """Another process runs Alice's turn in the session, to an approval with Bob's message
    queued behind it, approves it and dies before Bob's message starts."""

    async def crash(self: Driver) -> None:
        raise KeyboardInterrupt

    async with so.Runtime([talker], store=url) as rt:
        r = await rt.generate(session_id=session_id, prompt="refund order 1042", auth=ALICE)
        assert r.status == "waiting", r
        assert (await rt.send(session_id, "bob here", principal=BOB)).queued
        approve = [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
        with pytest.MonkeyPatch.context() as patch, pytest.raises(KeyboardInterrupt):
            patch.setattr(Driver, "start_queued", crash)
            await rt.respond(session_id, approve, principal=ALICE)
        state = await rt.state(session_id)
        assert state.turn is not None and state.turn.status == "completed"
        assert [q["message"] for q in state.queued] == ["bob here"]


def test_chat_retry_starts_a_message_left_queued_behind_a_turn_that_ended(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While chat waits for the person to type, another process ends the session's turn and
    dies before the message queued behind it starts: `/retry` starts it, as reopening the
    session would. It used to say there was nothing to retry, as the last turn completed."""
    read_message = TerminalChannel.read_message
    prompts: list[int] = []

    def reading(self: TerminalChannel) -> str | None:
        prompts.append(1)
        if len(prompts) == 2:  # after "hi" was answered: the other process, meanwhile
            rt = so.Runtime([], store=store_url)
            try:
                (row,) = rt.sessions_sync()
            finally:
                rt.close_sync()
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                pool.submit(asyncio.run, _crash_behind(store_url, row.id)).result()
        return read_message(self)

    monkeypatch.setattr(TerminalChannel, "read_message", reading)
    chat = CliRunner().invoke(
        app,
        ["chat", "tests.test_cli_chat_queued:talker", "--store", store_url],
        input="hi\n/retry\n/exit\n",
    )
    assert chat.exit_code == 0, chat.output
    assert "clerk: re: hi" in chat.output, chat.output
    assert "nothing to retry" not in chat.output, chat.output
    assert "the last turn ended; the message queued behind it starts now" in chat.output
    assert "clerk: re: bob here" in chat.output, chat.output
    rt = so.Runtime([], store=store_url)
    try:
        (row,) = rt.sessions_sync()
    finally:
        rt.close_sync()
    state, started = asyncio.run(_after(store_url, row.id))
    assert started == ["hi", "refund order 1042", "bob here"]
    assert state.queued == [] and state.turn is not None
    assert (state.turn.status, state.turn.principal) == ("completed", BOB)


async def _failed_with_bob_behind(url: str) -> str:
    """Alice's first turn fails on a model error a retry can resume, and Bob's request for a
    refund is queued behind it: the session's id."""
    broken = so.Agent(name="clerk", model=so.models.Scripted([so.ModelError("provider 503")]))
    async with so.Runtime([broken], store=url) as rt:
        r = await rt.generate("clerk", "hello", auth=ALICE)
        assert (r.status, r.retryable) == ("failed", True)
        assert (await rt.send(r.session_id, "refund order 1042", principal=BOB)).queued
        return r.session_id


def test_chat_reopening_a_failed_session_shows_its_own_turn_not_the_next_persons(
    store_url: str,
) -> None:
    """`chat --session` as Alice retries her failed turn, which then drives on into Bob's,
    waiting on his approval of a refund. Chat shows her answer and leaves his approval to him:
    the retry used to return Bob's turn, so Alice was asked to approve his refund, and refused."""
    sid = asyncio.run(_failed_with_bob_behind(store_url))
    chat = CliRunner().invoke(
        app,
        [
            "chat",
            "tests.test_cli_chat_queued:talker",
            "--session",
            sid,
            "--store",
            store_url,
            "--as",
            "okta:alice",
        ],
        input="/exit\n",
    )
    assert chat.exit_code == 0, chat.output
    assert "clerk: re: hello" in chat.output, chat.output
    assert "(y/N)" not in chat.output and "NotAllowed" not in chat.output, chat.output
    state, started = asyncio.run(_after(store_url, sid))
    assert started == ["hello", "refund order 1042"]
    assert (state.status, state.turn.principal) == ("waiting", BOB)  # type: ignore[union-attr]
    [asked] = state.pending_requests()
    assert asked.requested_by == BOB
