"""A turn Anthropic paused (`stop_reason: "pause_turn"`, a long server-tool loop) survives its
process: each paused part is journaled (`model.paused`) as it arrives, so a process SIGKILLed
(or closed) while a continuation is under way resumes from the last part journaled instead of
asking again from the first, which would run the server tools and bill them again. What every
billed part cost is counted once, and the budgets see it. A real child process on the real
`anthropic` client against the loopback fake, on both stores.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

import signoff as so
from signoff.channels import ChannelHub

from ._channels import Texts, manual
from ._pause_child import FINAL, PARTS, PROMPT, PausingLLM, pause_agent
from ._procs import Child, lapse_leases, query
from .fakes.llm import FakeLLM, anthropic_message
from .test_docs_events import rows

ANSWER = "".join(text for text, _, _ in PARTS) + FINAL[0]


def _spawn(tmp: Path, url: str, base_url: str, max_tokens: int = 0, retry: str = "") -> Child:
    argv = [url, base_url, str(max_tokens), *([retry] if retry else [])]
    return Child(argv, tmp / "pause-child.err", module="tests._pause_child")


def _kill_at_the_held_continuation(
    tmp: Path, url: str, fake: FakeLLM, llm: PausingLLM, max_tokens: int = 0, retry: str = ""
) -> str:
    """Start the turn in a child (or the retry of session `retry`'s failed turn), SIGKILL it
    while the fake holds the continuation it was told to (`PausingLLM.hold`), and return the
    session's id."""
    child = _spawn(tmp, url, fake.base_url, max_tokens, retry)
    try:
        child.expect("ready", timeout=60)  # a bound on a hang: 8 jobs on 2 CPUs took over 30 s
        assert llm.held.wait(30), f"no continuation held; stderr:\n{child.stderr()}"
        child.sigkill()
        assert child.proc.returncode == -signal.SIGKILL
    finally:
        llm.release.set()
        child.close()
    lapse_leases(url)
    [(session_id,)] = query(url, "SELECT id FROM {t}sessions")
    return str(session_id)


async def _uninterrupted(tmp: Path) -> tuple[str, so.Usage]:
    """The answer and usage of the same turn run in one go."""
    llm = PausingLLM()
    with FakeLLM("anthropic", strict=True) as fake:
        fake.queue(*[llm] * 3)
        agent = pause_agent(fake.base_url)
        async with so.Runtime([agent], store=f"sqlite:///{tmp / 'whole.db'}") as rt:
            r = await rt.generate("support", prompt=PROMPT)
            usage = (await rt.state(r.session_id)).usage
        await agent.model.aclose()  # type: ignore[attr-defined]
    assert len(fake.received) == 3
    return r.text, usage


@pytest.mark.parametrize("held", [1, 2])
async def test_a_turn_killed_mid_continuation_resumes_from_its_last_part(
    tmp_path: Path, store_url: str, held: int
) -> None:
    """Killed while the fake holds the 1st or 2nd continuation. Before, nothing of a paused
    turn was journaled: the resumed turn asked from the first part again (held at the 2nd: 6
    requests in all for 3, the server tools ran twice, replies billing 552/112 tokens of which
    351/71 were recorded)."""
    text, whole = await _uninterrupted(tmp_path)
    assert text == ANSWER
    llm = PausingLLM(hold=held)
    with FakeLLM("anthropic", strict=True) as fake:
        fake.queue(*[llm] * 8)
        session_id = _kill_at_the_held_continuation(tmp_path, store_url, fake, llm)
        assert llm.parts_sent_back == list(range(held + 1))
        agent = pause_agent(fake.base_url)
        async with so.Runtime([agent], store=store_url) as rt:
            paused = [e for e in await _events(rt, session_id) if e.type == "model.paused"]
            assert len(paused) == held  # the parts made before the kill are journaled
            r = await rt.generate(session_id=session_id)
            state = await rt.state(session_id)
            events = await _events(rt, session_id)
            sms = Texts()  # a channel reading the whole trail is told nothing of the parts
            async with manual(ChannelHub(rt, [sms])) as hub:
                await hub.poll()
            assert sms.sent == []
        await agent.model.aclose()  # type: ignore[attr-defined]
    # The resumed turn continued from the last part journaled: no part asked for twice.
    assert llm.parts_sent_back == [*range(held + 1), *range(held, len(PARTS) + 1)]
    assert len(fake.received) == len(PARTS) + 2  # the one killed, and one more
    last = fake.bodies[-1]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant"]
    assert [b.get("text") for b in last[1]["content"]] == ["Searching. ", None, "Reading. ", None]
    assert (r.status, r.text) == ("completed", ANSWER)
    # What was billed is what is recorded, counted once, as in a turn run in one go.
    billed_in, billed_out, billed_cost = llm.billed_usage
    assert (billed_in, billed_out) == (351, 71)
    assert (state.usage.input_tokens, state.usage.output_tokens) == (billed_in, billed_out)
    assert state.usage.cost_usd == pytest.approx(billed_cost)
    assert (whole.input_tokens, whole.output_tokens) == (billed_in, billed_out)
    assert whole.cost_usd == pytest.approx(billed_cost)
    types = [e.type for e in events]
    assert types.count("model.paused") == 2 and types.count("model.completed") == 1
    documented = rows()["model.paused"]
    for e in events:
        if e.type == "model.paused":
            assert all(f"`{key}`" in documented for key in e.data), e.data
    # The paused parts are the model's, never a message to anyone: the answer is the turn's.
    assert state.turn is not None and state.turn.text == ANSWER


async def test_the_budgets_count_the_parts_journaled_before_a_crash(
    tmp_path: Path, store_url: str
) -> None:
    """The two parts spent 242 tokens, made under max_tokens=1000, of the max_tokens=240 the
    resumed runtime's agent has (a redeploy lowered it): the resumed turn asks the person to
    raise the budget instead of calling the model. Before, the budget saw none of them and the
    turn asked from the first part again. (Under 240 from the start, the first process asks
    once the second part is counted, and no third request is made to kill it in.)"""
    llm = PausingLLM(hold=2)
    with FakeLLM("anthropic", strict=True) as fake:
        fake.queue(*[llm] * 8)
        session_id = _kill_at_the_held_continuation(tmp_path, store_url, fake, llm, 1000)
        agent = pause_agent(fake.base_url, max_tokens=240)
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate(session_id=session_id)
            state = await rt.state(session_id)
        await agent.model.aclose()  # type: ignore[attr-defined]
    assert len(fake.received) == 3
    assert r.status == "waiting"
    assert [p.kind for p in r.pending] == ["session-limit"]
    assert "used 242 of max_tokens=240" in (r.pending[0].question or "")
    assert (state.usage.input_tokens, state.usage.output_tokens) == (201, 41)


async def test_a_runtime_closed_mid_continuation_resumes_from_its_last_part(
    tmp_path: Path, store_url: str
) -> None:
    """`Runtime.close()` while the fake holds the last continuation: the parts journaled stay,
    and the next runtime makes the one request left."""
    llm = PausingLLM(hold=2)
    with FakeLLM("anthropic", strict=True) as fake:
        fake.queue(*[llm] * 8)
        agent = pause_agent(fake.base_url)
        rt = so.Runtime([agent], store=store_url)
        await rt.open()
        turn = asyncio.ensure_future(rt.generate("support", prompt=PROMPT))
        while not llm.held.is_set():
            await asyncio.sleep(0.01)
        await rt.close()
        llm.release.set()
        with pytest.raises(so.UsageError, match="closed while this call ran"):
            await turn
        [(session_id,)] = query(store_url, "SELECT id FROM {t}sessions")
        agent = pause_agent(fake.base_url)
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate(session_id=str(session_id))
            state = await rt.state(str(session_id))
        await agent.model.aclose()  # type: ignore[attr-defined]
    assert llm.parts_sent_back == [0, 1, 2, 2]
    assert (r.status, r.text) == ("completed", ANSWER)
    assert (state.usage.input_tokens, state.usage.output_tokens) == llm.billed_usage[:2]


async def test_a_retry_killed_after_the_ninth_pause_resumes_from_its_new_reply_alone(
    tmp_path: Path, store_url: str
) -> None:
    """The turn failed on the ninth pause; its retry, in a child, asks the model afresh,
    journals the new reply's first part and is SIGKILLed in its continuation: the next drive
    goes on from that one part, not from the nine dropped (which no request could go on from).
    Before, the retry failed on the nine parts without a request, again and again."""
    nine = []
    for i in range(9):
        body = anthropic_message(f"Part {i}. ", usage={"input_tokens": 90, "output_tokens": 10})
        nine.append({**body, "stop_reason": "pause_turn"})
    llm = PausingLLM(hold=1)
    with FakeLLM("anthropic", strict=True) as fake:
        fake.queue(*nine, *[llm] * 8)
        agent = pause_agent(fake.base_url)
        async with so.Runtime([agent], store=store_url) as rt:
            failed = await rt.generate("support", prompt=PROMPT)
        await agent.model.aclose()  # type: ignore[attr-defined]
        assert (failed.status, failed.retryable, len(fake.received)) == ("failed", True, 9)
        sid = failed.session_id
        assert _kill_at_the_held_continuation(tmp_path, store_url, fake, llm, retry=sid) == sid
        assert llm.parts_sent_back == [0, 1]  # asked afresh, then the new part sent back
        agent = pause_agent(fake.base_url)
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate(session_id=sid)
            state = await rt.state(sid)
        await agent.model.aclose()  # type: ignore[attr-defined]
    assert (r.status, r.turn_id, r.text) == ("completed", failed.turn_id, ANSWER)
    assert llm.parts_sent_back == [0, 1, 1, 2]
    assert fake.bodies[-1]["messages"][:-1] == fake.bodies[0]["messages"]  # only the new parts
    billed_in, billed_out, _ = llm.billed_usage
    assert (state.usage.input_tokens, state.usage.output_tokens) == (
        9 * 90 + billed_in,
        9 * 10 + billed_out,
    )


async def _events(rt: so.Runtime, session_id: str) -> list[so.Event]:
    return [e async for e in rt.events(session_id, follow=False)]
