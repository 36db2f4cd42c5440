"""Idempotency keys of the calls that start a conversation or send a message: a call repeated
with its key acts once (on both stores, across tasks, runtimes and a killed process), and a key
given again for another call is refused with nothing stored."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._idempotency import KEPT, keyed, session_for
from signoff.testing import call, call_tools, reply, scripted_agent

ALICE = so.Principal(authenticator="okta", principal_id="alice")
BOB = so.Principal(authenticator="okta", principal_id="bob")
ROOT = Path(__file__).resolve().parent.parent


def chat_agent(name: str = "chat") -> so.Agent:
    return scripted_agent(name, [reply("ok")], repeat_last=True)


def asking_agent() -> so.Agent:
    """A turn that waits on a question (options only) until someone picks a plan."""

    @so.tool
    async def pick_plan(ctx: so.ToolContext) -> str:
        """Choose a plan (options only)."""
        a = await ctx.ask("Which plan?", options=["basic", "pro"], allow_text=False)
        return a.value

    return scripted_agent(
        "sales",
        [call_tools(call("pick_plan", id="p1")), reply("done")],
        tools=[pick_plan],
        repeat_last=True,
    )


async def counts(rt: so.Runtime) -> tuple[int, int]:
    """Sessions in the store and events across them: what a repeat must leave as it was."""
    sessions = await rt.sessions(limit=1000)
    events = 0
    for s in sessions:
        events += len([e async for e in rt.events(s.id, follow=False)])
    return len(sessions), events


async def messages(rt: so.Runtime, session_id: str) -> list[str]:
    return [
        e.data["message"]
        async for e in rt.events(session_id, follow=False)
        if e.type in ("turn.started", "turn.message")
    ]


# -- starting a conversation -------------------------------------------------------------------


async def test_a_new_conversation_repeated_with_its_key_starts_once(store_url: str) -> None:
    async with so.Runtime([chat_agent()], store=store_url) as rt:
        first = await rt.generate("chat", prompt="hello", auth=ALICE, idempotency_key="k-1")
        assert first.status == "completed" and not first.replayed
        before = await counts(rt)
        again = await rt.generate("chat", prompt="hello", auth=ALICE, idempotency_key="k-1")
        assert again.replayed and again.session_id == first.session_id
        assert again.turn_id == first.turn_id and again.text == first.text
        assert await counts(rt) == before
        # the same key of another person is another call
        bobs = await rt.generate("chat", prompt="hello", auth=BOB, idempotency_key="k-1")
        assert not bobs.replayed and bobs.session_id != first.session_id


async def test_a_key_given_again_for_another_prompt_or_agent_is_refused(store_url: str) -> None:
    async with so.Runtime([chat_agent(), chat_agent("other")], store=store_url) as rt:
        first = await rt.generate("chat", prompt="hello", auth=ALICE, idempotency_key="k-2")
        before = await counts(rt)
        with pytest.raises(so.IdempotencyKeyReused) as info:
            await rt.generate("chat", prompt="goodbye", auth=ALICE, idempotency_key="k-2")
        assert info.value.session_id == first.session_id
        assert info.value.code == "idempotency_key_reused"
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.generate("other", prompt="hello", auth=ALICE, idempotency_key="k-2")
        assert await counts(rt) == before


async def test_a_repeat_after_the_session_was_created_but_not_sent_sends_it(
    store_url: str,
) -> None:
    """A call that died between creating its session and recording its message: the retry
    finds the session and sends the message, once."""
    async with so.Runtime([chat_agent()], store=store_url) as rt:
        idem = keyed("k-3", ALICE, "start", "chat", "hello")
        assert idem is not None
        sid = await rt._create(rt.agent("chat"), ALICE, idem)
        assert sid == session_for(idem)
        r = await rt.generate("chat", prompt="hello", auth=ALICE, idempotency_key="k-3")
        assert r.session_id == sid and r.status == "completed" and not r.replayed
        assert await messages(rt, sid) == ["hello"]


async def test_a_creation_key_pushed_out_of_the_state_is_still_recognised(
    store_url: str,
) -> None:
    async with so.Runtime([chat_agent()], store=store_url) as rt:
        first = await rt.generate("chat", prompt="hello", auth=ALICE, idempotency_key="start")
        for i in range(KEPT):
            await rt.send(first.session_id, f"m{i}", principal=ALICE, idempotency_key=f"m{i}")
        state = await rt.state(first.session_id)
        assert len(state.keys) == KEPT
        before = await counts(rt)
        again = await rt.generate("chat", prompt="hello", auth=ALICE, idempotency_key="start")
        assert again.replayed and again.session_id == first.session_id
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.generate("chat", prompt="other", auth=ALICE, idempotency_key="start")
        assert await counts(rt) == before


async def test_create_session_and_schedule_take_a_key(store_url: str) -> None:
    async with so.Runtime([chat_agent()], store=store_url) as rt:
        sid = await rt.create_session("chat", auth=ALICE, idempotency_key="open-1")
        assert await rt.create_session("chat", auth=ALICE, idempotency_key="open-1") == sid
        job = await rt.schedule("chat", "daily report", idempotency_key="job-2026-12-01")
        before = await counts(rt)
        again = await rt.schedule("chat", "daily report", idempotency_key="job-2026-12-01")
        assert again.replayed and again.session_id == job.session_id
        assert await counts(rt) == before
        assert len(await rt.sessions()) == 2


@pytest.mark.parametrize("key", ["", " " * 0, "é", "a\nb", "x" * 201, 7, b"k"])
async def test_a_bad_key_is_a_usage_error_and_nothing_is_stored(tmp_path: Path, key: Any) -> None:
    async with so.Runtime([chat_agent()], store=f"sqlite:///{tmp_path}/s.db") as rt:
        with pytest.raises(so.UsageError, match="idempotency_key"):
            await rt.generate("chat", prompt="hello", auth=ALICE, idempotency_key=key)
        r = await rt.generate("chat", prompt="hello", auth=ALICE)
        with pytest.raises(so.UsageError, match="idempotency_key"):
            await rt.send(r.session_id, "again", principal=ALICE, idempotency_key=key)
        assert await messages(rt, r.session_id) == ["hello"]
        with pytest.raises(so.UsageError, match="goes with a prompt"):
            await rt.generate(session_id=r.session_id, idempotency_key="k")


# -- sending a message -------------------------------------------------------------------------


async def test_a_message_repeated_with_its_key_is_sent_once(store_url: str) -> None:
    async with so.Runtime([chat_agent()], store=store_url) as rt:
        sid = (await rt.generate("chat", prompt="hello", auth=ALICE)).session_id
        sent = await rt.send(sid, "more", principal=ALICE, idempotency_key="m-1")
        assert not sent.replayed
        before = await counts(rt)
        again = await rt.send(sid, "more", principal=ALICE, idempotency_key="m-1")
        assert again.replayed and again.turn_id == sent.turn_id
        same = await rt.generate(session_id=sid, prompt="more", auth=ALICE, idempotency_key="m-1")
        assert same.replayed
        assert await counts(rt) == before
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, "other text", principal=ALICE, idempotency_key="m-1")
        assert await counts(rt) == before
        assert await messages(rt, sid) == ["hello", "more"]


async def test_a_keyed_message_that_answers_a_question_answers_once(store_url: str) -> None:
    async with so.Runtime([asking_agent()], store=store_url) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        assert r.status == "waiting"
        answered = await rt.send(r.session_id, "pro", principal=ALICE, idempotency_key="a-1")
        assert answered.status == "completed"
        before = await counts(rt)
        again = await rt.send(r.session_id, "pro", principal=ALICE, idempotency_key="a-1")
        assert again.replayed and again.status == "completed"
        assert await counts(rt) == before  # not a new turn started with "pro"


async def test_a_keyed_message_queued_or_steering_is_recorded_once(store_url: str) -> None:
    async with so.Runtime([asking_agent()], store=store_url) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        queued = await rt.send(r.session_id, "bob here", principal=BOB, idempotency_key="q")
        steered = await rt.send(r.session_id, "wait", principal=ALICE, idempotency_key="s")
        before = await counts(rt)
        assert (
            await rt.send(r.session_id, "bob here", principal=BOB, idempotency_key="q")
        ).replayed
        assert (await rt.send(r.session_id, "wait", principal=ALICE, idempotency_key="s")).replayed
        assert await counts(rt) == before
        assert not queued.replayed and not steered.replayed


async def test_keys_survive_a_restart_of_the_runtime(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    async with so.Runtime([chat_agent()], store=url) as rt:
        first = await rt.generate("chat", prompt="hello", auth=ALICE, idempotency_key="r-1")
        await rt.send(first.session_id, "more", principal=ALICE, idempotency_key="r-2")
        before = await counts(rt)
    async with so.Runtime([chat_agent()], store=url) as rt:
        assert (
            await rt.generate("chat", prompt="hello", auth=ALICE, idempotency_key="r-1")
        ).replayed
        assert (
            await rt.send(first.session_id, "more", principal=ALICE, idempotency_key="r-2")
        ).replayed
        assert await counts(rt) == before


# -- racing repeats ----------------------------------------------------------------------------


async def test_two_tasks_racing_with_one_key_act_once(store_url: str) -> None:
    async with so.Runtime([chat_agent()], store=store_url) as rt:
        results = await asyncio.gather(
            *(
                rt.generate("chat", prompt="hello", auth=ALICE, idempotency_key="race")
                for _ in range(4)
            )
        )
        assert len({r.session_id for r in results}) == 1
        sid = results[0].session_id
        assert await messages(rt, sid) == ["hello"]
        sends = await asyncio.gather(
            *(rt.send(sid, "more", principal=ALICE, idempotency_key="race-2") for _ in range(4))
        )
        assert sum(not r.replayed for r in sends) <= 1
        assert await messages(rt, sid) == ["hello", "more"]
        assert len(await rt.sessions()) == 1


async def test_two_runtimes_on_one_store_racing_with_one_key_act_once(store_url: str) -> None:
    async with (
        so.Runtime([chat_agent()], store=store_url) as one,
        so.Runtime([chat_agent()], store=store_url) as two,
    ):
        results = await asyncio.gather(
            *(
                rt.generate("chat", prompt="hello", auth=ALICE, idempotency_key="race")
                for rt in (one, two, one, two)
            )
        )
        sid = results[0].session_id
        assert {r.session_id for r in results} == {sid}
        await asyncio.gather(
            *(
                rt.send(sid, "more", principal=ALICE, idempotency_key="race-2")
                for rt in (one, two, one, two)
            )
        )
        assert await messages(one, sid) == ["hello", "more"]
        assert len(await one.sessions()) == 1


# -- a process killed after its commit ---------------------------------------------------------

_CHILD = """
import asyncio, sys
import signoff as so

class Hangs:
    async def complete(self, request):
        print("model called", flush=True)
        await asyncio.sleep(3600)

agent = so.Agent(name="chat", model=Hangs())
rt = so.Runtime([agent], store=sys.argv[1], lease_ttl=0.5)
who = so.Principal(authenticator="okta", principal_id="alice")
rt.generate_sync("chat", prompt="hello", auth=who, idempotency_key="crash-1")
"""


def test_a_call_killed_after_its_commit_is_retried_with_its_key_once(tmp_path: Path) -> None:
    """The caller never got an answer (its process was killed once the message was stored):
    the retry with the same key finds the message and starts nothing."""
    url = f"sqlite:///{tmp_path}/s.db"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, url], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "model called"  # the turn is stored by now
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
    time.sleep(0.6)  # its lease lapses
    rt = so.Runtime([chat_agent()], store=url, lease_ttl=0.5)
    try:
        again = rt.generate_sync("chat", prompt="hello", auth=ALICE, idempotency_key="crash-1")
        assert again.replayed and again.status == "completed" and again.text == "ok"
        assert rt.events_sync(again.session_id)[1].data["message"] == "hello"
        assert [e.type for e in rt.events_sync(again.session_id)].count("turn.started") == 1
        assert len(rt.sessions_sync()) == 1
    finally:
        rt.close_sync()
