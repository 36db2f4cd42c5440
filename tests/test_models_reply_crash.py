"""A process SIGKILLed after the provider's reply arrived and before it was journaled: a model
call is recorded only with its reply, so the resumed turn asks the model again. The provider
bills both calls; the session counts and records the one journaled, once (the README says so).
A real child process on the real `openai` client against the loopback fake, on both stores."""

from __future__ import annotations

import signal
from pathlib import Path

import signoff as so

from ._procs import Child, lapse_leases, query
from ._reply_crash_child import PROMPT, crash_agent
from .fakes.llm import FakeLLM, openai_completion


async def test_a_reply_lost_to_a_crash_before_its_journal_is_asked_for_and_billed_again(
    tmp_path: Path, store_url: str
) -> None:
    with FakeLLM("openai", strict=True) as fake:
        fake.queue(
            openai_completion("Lost with the process.", usage=(100, 20)),
            openai_completion("Refunds take 5 days.", usage=(100, 30)),
        )
        child = Child(
            [store_url, fake.base_url],
            tmp_path / "reply-crash-child.err",
            module="tests._reply_crash_child",
        )
        try:
            child.expect("ready", timeout=60)  # a bound on a hang: 8 jobs on 2 CPUs took over 30 s
            assert child.expect("replied", timeout=30)["text"] == "Lost with the process."
            child.sigkill()
            assert child.proc.returncode == -signal.SIGKILL
        finally:
            child.close()
        lapse_leases(store_url)
        [(session_id,)] = query(store_url, "SELECT id FROM {t}sessions")
        agent = crash_agent(fake.base_url)
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate(session_id=str(session_id))
            state = await rt.state(str(session_id))
            events = [e async for e in rt.events(str(session_id), follow=False)]
        await agent.model.aclose()  # type: ignore[attr-defined]
    assert (r.status, r.text) == ("completed", "Refunds take 5 days.")
    # Asked twice with the same conversation: the provider billed 200 input, 50 output tokens.
    assert len(fake.received) == 2 and fake.bodies[0]["messages"] == fake.bodies[1]["messages"]
    assert fake.bodies[0]["messages"][-1] == {"role": "user", "content": PROMPT}
    # The session counts the reply journaled, once; the lost one is in no event.
    assert [e.type for e in events].count("model.completed") == 1
    assert (state.usage.input_tokens, state.usage.output_tokens) == (100, 30)
