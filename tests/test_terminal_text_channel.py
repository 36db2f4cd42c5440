"""`TerminalTextChannel` in a hub: a prompt is asked again by a process started anew, the
terminal is read by one prompt at a time, also when the request asked closes elsewhere or is
dropped, a line typed for a dropped one is not applied, and
Ctrl-C at a prompt ends the program at once."""

from __future__ import annotations

import asyncio
import io
import os
import queue
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pexpect
import pytest
from rich.console import Console

import signoff as so
from signoff.channels import ChannelHub, TerminalChannel, TerminalTextChannel
from signoff.testing import ManualClock

from ._channels import (
    BOB,
    escalating_refund,
    manual,
    slowly_escalating_refund,
    status,
    three_refunds,
)


def _prompts(read: Callable[[str], str | None]) -> tuple[TerminalTextChannel, io.StringIO]:
    out = io.StringIO()
    terminal = TerminalChannel(Console(file=out, width=200, highlight=False), read=read)
    return TerminalTextChannel(terminal, principal=BOB), out


async def test_a_prompt_left_open_is_asked_again_when_the_hub_starts_again(
    store_url: str, tmp_path: Path
) -> None:
    """The memo of the request on show outlives the process, its prompt does not: a hub started
    again on the same state asks it again, else the terminal stays silent and all wait."""
    runs: list[str] = []
    state = tmp_path / "channels.db"
    asked: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        a, b, c = r.pending

        def leave(prompt: str) -> str | None:
            asked.append(prompt)
            return None  # end of input: the request stays pending

        first, _ = _prompts(leave)
        async with manual(ChannelHub(rt, [first], state=state)) as hub:
            await hub.poll()
            await first.idle()
        assert len(asked) == 1 and await status(rt, a.id) == ("pending", None)

        lines = iter(["y", "y", "y"])
        again, _ = _prompts(lambda prompt: next(lines, None))
        async with manual(ChannelHub(rt, [again], state=state)) as hub:
            await hub.poll()
            await again.idle()
        assert [await status(rt, x.id) for x in (a, b, c)] == [("settled", "approved")] * 3
        assert runs == ["A-1", "B-2", "C-3"]


async def test_a_prompt_closed_while_no_hub_ran_is_told_not_asked_again(tmp_path: Path) -> None:
    """A's prompt was left open; A was approved elsewhere before a hub started again (a new
    process): the person is told how A closed and asked B, not asked A, which no answer can
    close."""
    runs: list[str] = []
    state = tmp_path / "channels.db"
    async with so.Runtime([three_refunds(runs)], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        a, b, _ = r.pending
        first, _ = _prompts(lambda prompt: None)
        async with manual(ChannelHub(rt, [first], state=state)) as hub:
            await hub.poll()
            await first.idle()
        await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="approve")])
        asked: list[str] = []

        def leave(prompt: str) -> str | None:
            asked.append(prompt)
            return None

        again, out = _prompts(leave)
        async with manual(ChannelHub(rt, [again], state=state)) as hub:
            await hub.poll()
            await again.idle()
        assert "issue_refund was approved by the policy" in out.getvalue()
        assert len(asked) == 1 and "B-2" in asked[0]
        assert await status(rt, b.id) == ("pending", None)


async def test_an_answer_the_deadline_escalated_meanwhile_is_asked_again(tmp_path: Path) -> None:
    """Bob's `y` is spent as the deadline escalates the request while the policy judges it: he
    is told his answer was not accepted and why, and the request is asked again, now for the
    group, whose policy takes his second `y`. It used to say the request "was already settled
    by the policy" and ask nothing more, the request left open."""
    clock = ManualClock()
    lines = iter(["y", "y"])
    asked: list[str] = []

    def read(prompt: str) -> str | None:
        asked.append(prompt)
        return next(lines, None)

    agent = slowly_escalating_refund(clock)
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt:
        (a,) = (await rt.generate("support", prompt="Refund A-1")).pending
        prompts, out = _prompts(read)
        async with manual(ChannelHub(rt, [prompts], clock=clock)) as hub:
            await hub.poll()
            await prompts.idle()
        told = out.getvalue()
        assert "Your answer was not accepted (stale: the deadline passed" in told
        assert "already settled" not in told
        assert len(asked) == 2
        assert await status(rt, a.id) == ("settled", "approved")


@pytest.mark.parametrize(
    ("error", "asked_again"),
    [
        (so.StoreBusy("database is locked"), True),
        (so.InvalidAnswer("an answer of the wrong shape"), True),
        (so.NotAllowed("only finance may answer"), False),
    ],
)
async def test_an_answer_an_error_refused_for_now_is_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, asked_again: bool
) -> None:
    """A's answer met a busy store once: the person was told it was not accepted, and A was
    never asked again (no prompt out, none for B and C either) until the hub started anew. It
    is asked again, as chat asks again what it could not take; a refusal (`NotAllowed`) leaves
    it shown, no prompt out, as before: the same answer would be refused again."""
    runs: list[str] = []
    lines = iter(["y", "y", "y", "y"])
    asked: list[str] = []

    def read(prompt: str) -> str | None:
        asked.append(prompt)
        return next(lines, None)

    async with so.Runtime([three_refunds(runs)], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        a = r.pending[0]
        respond = rt.respond
        failed: list[Exception] = []

        async def once_refused(*args: Any, **kwargs: Any) -> so.GenerateResult:
            if not failed:
                failed.append(error)
                raise error
            return await respond(*args, **kwargs)

        monkeypatch.setattr(rt, "respond", once_refused)
        prompts, out = _prompts(read)
        async with manual(ChannelHub(rt, [prompts], state=tmp_path / "ch.db")) as hub:
            await hub.poll()
            await prompts.idle()
        assert str(error) in out.getvalue()
        if asked_again:
            assert len(asked) == 4 and "A-1" in asked[0] and "A-1" in asked[1]
            assert runs == ["A-1", "B-2", "C-3"]
            assert await status(rt, a.id) == ("settled", "approved")
        else:
            assert len(asked) == 1 and runs == []
            assert await status(rt, a.id) == ("pending", None)


async def _reading(readers: Callable[[], int]) -> None:
    """Until a prompt reads the terminal (its thread started): 10 s at most, however busy the
    machine; it used to go on after 0.5 s, and `most` was then 0."""
    async with asyncio.timeout(10):
        while not readers():
            await asyncio.sleep(0.01)


async def test_a_request_closed_elsewhere_leaves_one_prompt_reading_the_terminal(
    tmp_path: Path,
) -> None:
    """A closed elsewhere while its prompt waits for a line: B is not asked in a second read of
    the same terminal at once (which of the two took a line was luck). The line typed goes to
    A's prompt, is not applied (A was settled already, the person is told), and only then is B
    asked."""
    runs: list[str] = []
    typed: queue.Queue[str | None] = queue.Queue()
    reading, most = 0, 0
    lock = threading.Lock()

    def read(prompt: str) -> str | None:
        nonlocal reading, most
        with lock:
            reading += 1
            most = max(most, reading)
        try:
            return typed.get(timeout=10)
        finally:
            with lock:
                reading -= 1

    async with so.Runtime([three_refunds(runs)], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        a, b, c = r.pending
        prompts, out = _prompts(read)
        async with manual(ChannelHub(rt, [prompts])) as hub:
            await hub.poll()
            await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="approve")])
            await hub.poll()  # A closed: the person is told, while A's prompt still reads
            await _reading(lambda: reading)
            await asyncio.sleep(0.1)
            assert most == 1
            assert "issue_refund was approved by the policy" in out.getvalue()
            await prompts.on_requested(c)  # the hub's retry, say: the person is told once
            assert out.getvalue().count("no longer counts") == 1
            for line in ("y", "y", "n", "", None):  # A (too late), B, C denied, no reason
                typed.put(line)
            await prompts.idle()
        assert "issue_refund was already approved by the policy." in out.getvalue()
        assert most == 1
        assert [await status(rt, x.id) for x in (a, b, c)] == [
            ("settled", "approved"),
            ("settled", "approved"),
            ("settled", "cancelled"),
        ]
        assert runs == ["A-1", "B-2"]


def _store_fails_once_in(rt: so.Runtime, monkeypatch: pytest.MonkeyPatch, where: str) -> list[str]:
    """Have the store's `get_request` raise `StoreBusy` once, when the channel's `where` reads
    it (as "database is locked" with several processes); the failures, for the test to see."""
    get_request = rt.store.get_request
    failed: list[str] = []

    async def flaky(request_id: str) -> Any:
        if not failed and sys._getframe(1).f_code.co_name == where:
            failed.append(request_id)
            raise so.StoreBusy("database is locked")
        return await get_request(request_id)

    monkeypatch.setattr(rt.store, "get_request", flaky)
    return failed


@pytest.mark.parametrize("where", ["_still_shown", "_settled_before"])
async def test_a_store_read_that_fails_for_now_does_not_end_the_prompts(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    where: str,
) -> None:
    """A closed elsewhere while its prompt waits; the store read the line typed at it makes
    (is A shown still? how did it close?) met a busy store: that was logged and the prompts
    ended there, B and C never asked until the hub started anew. After a short pause the one
    shown then is asked (A again, if it still is, the person told why); the failure is logged
    once."""
    monkeypatch.setattr("signoff.channels._terminal_text.PAUSE", 0.01, raising=False)
    runs: list[str] = []
    typed: queue.Queue[str | None] = queue.Queue()
    asked: list[str] = []

    def read(prompt: str) -> str | None:
        asked.append(prompt)
        return typed.get(timeout=10)

    async with so.Runtime([three_refunds(runs)], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        a, b, c = r.pending
        prompts, out = _prompts(read)
        async with manual(ChannelHub(rt, [prompts])) as hub:
            await hub.poll()
            await _reading(lambda: len(asked))
            await rt.respond(r.session_id, [so.InputResponse(request_id=a.id, option_id="approve")])
            if where == "_still_shown":
                await hub.poll()  # A closed: dropped from the queue, B shown
            failed = _store_fails_once_in(rt, monkeypatch, where)
            for line in ("y", "y", "y", "y", None):
                typed.put(line)
            await prompts.idle()
        assert failed == [a.id]
        assert [await status(rt, x.id) for x in (b, c)] == [("settled", "approved")] * 2
        assert runs == ["A-1", "B-2", "C-3"]
        told = [m for m in caplog.messages if "for now" in m]
        assert len(told) == 1 and "database is locked" in told[0]
        if where == "_settled_before":  # A shown still: asked again, the person told why
            assert "A-1" in asked[1] and "asked again" in out.getvalue()
            assert "issue_refund was already approved by the policy." in out.getvalue()
        else:
            assert "B-2" in asked[1]


async def test_a_hub_stopped_while_the_store_keeps_failing_ends_the_pause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The store stays busy: the prompts wait to ask again, and a hub stopped meanwhile ends
    that wait at once, not after the pause."""
    monkeypatch.setattr("signoff.channels._terminal_text.PAUSE", 60.0)
    typed: queue.Queue[str | None] = queue.Queue()
    asked: list[str] = []

    def read(prompt: str) -> str | None:
        asked.append(prompt)
        return typed.get(timeout=10)

    async def busy(request_id: str) -> Any:
        raise so.StoreBusy("database is locked")

    async with so.Runtime([three_refunds([])], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        prompts, _ = _prompts(read)
        async with manual(ChannelHub(rt, [prompts])) as hub:
            await hub.poll()
            await _reading(lambda: len(asked))
            await rt.respond(
                r.session_id, [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
            )
            await hub.poll()  # A closed: its line makes the store read that fails
            monkeypatch.setattr(rt.store, "get_request", busy)
            typed.put("y")
            async with asyncio.timeout(10):
                while not any("for now" in m for m in caplog.messages):
                    await asyncio.sleep(0.01)
            monkeypatch.undo()
        async with asyncio.timeout(5):
            await prompts.idle()
        assert len(asked) == 1


async def test_a_line_typed_for_a_request_the_channel_dropped_is_not_applied(
    tmp_path: Path,
) -> None:
    """A escalated to finance while its prompt waits, and this terminal takes no escalated
    request: the person is told A is no longer shown here and what they type no longer counts,
    yet their `y` approved A (which the group's policy let them) and the refund ran. It is not
    applied, they are told so, and the next request is asked after it."""
    runs: list[str] = []
    typed: queue.Queue[str | None] = queue.Queue()
    asked: list[str] = []

    def read(prompt: str) -> str | None:
        asked.append(prompt)
        return typed.get(timeout=10)

    clock = ManualClock()
    agents = [escalating_refund("billing"), three_refunds(runs)]
    async with so.Runtime(agents, store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt:
        (a,) = (await rt.generate("billing", prompt="Refund A")).pending
        clock.advance(1)
        others = (await rt.generate("support", prompt="Refund three orders")).pending
        out = io.StringIO()
        terminal = TerminalChannel(Console(file=out, width=200, highlight=False), read=read)
        prompts = TerminalTextChannel(
            terminal, principal=BOB, accepts=lambda r: r.escalated_to is None
        )
        async with manual(ChannelHub(rt, [prompts])) as hub:
            await hub.poll()
            await _reading(lambda: len(asked))
            clock.advance(60)
            await rt.pending()  # a listing records the passed deadline: A goes to finance
            await hub.poll()
            assert "it is no longer shown here" in out.getvalue()
            typed.put("y")  # typed at A's prompt
            typed.put(None)  # at the next prompt: the input ends
            await prompts.idle()
        assert await status(rt, a.id) == ("pending", None)
        assert "what you typed was not applied: issue_refund is no longer shown here" in (
            out.getvalue()
        )
        assert len(asked) == 2 and '"amount":' in asked[1]  # one of the others
        assert [await status(rt, x.id) for x in others] == [("pending", None)] * 3
        assert runs == []


async def test_a_hub_stopped_and_started_again_in_the_process_keeps_the_prompt_out(
    tmp_path: Path,
) -> None:
    """Stopping the hub cannot end a read blocked in its thread: started again, the channel
    neither stays silent (its request counted as asked) nor asks in a second read, which
    would leave the person's next line to the first, whose answer went nowhere."""
    runs: list[str] = []
    typed: queue.Queue[str | None] = queue.Queue()
    reading, most = 0, 0
    lock = threading.Lock()

    def read(prompt: str) -> str | None:
        nonlocal reading, most
        with lock:
            reading += 1
            most = max(most, reading)
        try:
            return typed.get(timeout=10)
        finally:
            with lock:
                reading -= 1

    async with so.Runtime([three_refunds(runs)], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("support", prompt="Refund A, B and C")
        a, b, c = r.pending
        prompts, _ = _prompts(read)
        hub = ChannelHub(rt, [prompts])
        async with manual(hub):
            await hub.poll()
            await _reading(lambda: reading)
        async with manual(hub):
            await hub.poll()
            await asyncio.sleep(0.1)
            assert most == 1
            for line in ("y", "y", "y"):
                typed.put(line)
            for _ in range(300):
                if runs == ["A-1", "B-2", "C-3"]:
                    break
                await asyncio.sleep(0.02)
            await prompts.idle()
        assert most == 1
        assert [await status(rt, x.id) for x in (a, b, c)] == [("settled", "approved")] * 3


_HUB = textwrap.dedent(
    """
    import asyncio, sys
    import signoff as so
    from signoff.channels import ChannelHub, TerminalTextChannel
    from signoff.testing import call, call_tools, reply, scripted_agent

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        "Refund an order."
        return "refunded"

    agent = scripted_agent(
        "support", [call_tools(call("issue_refund", order_id="A-1")), reply("Done.")],
        tools=[issue_refund],
    )

    async def main() -> None:
        async with so.Runtime([agent], store=sys.argv[1]) as rt:
            await rt.generate("support", prompt="Refund A")
            who = so.Principal(authenticator="local", principal_id="bob")
            hub = ChannelHub(rt, [TerminalTextChannel(principal=who)])
            await hub.start()
            try:
                await asyncio.sleep(3600)
            finally:
                await hub.stop()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        print("interrupted")
        sys.exit(130)
    """
)


def test_ctrl_c_at_a_prompt_ends_the_program_at_once(tmp_path: Path) -> None:
    """The prompt's read, blocked in a thread, held up the event loop's shutdown (and the
    interpreter's exit) until Enter was pressed: Ctrl-C left the program hanging."""
    script = tmp_path / "hub.py"
    script.write_text(_HUB)
    url = f"sqlite:///{tmp_path / 's.db'}"
    src = str(Path(so.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=src, TERM="xterm-256color")
    child = pexpect.spawn(sys.executable, [str(script), url], env=env, encoding="utf-8", timeout=30)
    try:
        child.expect_exact("Run issue_refund")
        child.expect_exact("(y/N)")
        child.sendintr()
        child.expect_exact("interrupted", timeout=10)
        child.expect(pexpect.EOF, timeout=10)
    finally:
        child.close(force=True)
    assert child.exitstatus == 130

    async def pending() -> list[str]:
        async with so.Runtime([], store=url) as rt:
            return [p.tool_name or "" for p in await rt.pending()]

    assert asyncio.run(pending()) == ["issue_refund"]  # the store as it was: nothing answered


def test_it_is_still_imported_from_the_text_module() -> None:
    """It moved to `_terminal_text`; code importing it from `signoff.channels.text`, where it
    was, gets the same class."""
    from signoff.channels import TerminalTextChannel as listed
    from signoff.channels.text import TerminalTextChannel

    assert TerminalTextChannel is listed
