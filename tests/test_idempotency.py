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
from signoff._idempotency import KEPT, MAX_KEY, _digest, keyed, session_for
from signoff.testing import call, call_tools, reply, scripted_agent, sqlite_runtime

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
        [call_tools(call("pick_plan", call_id="p1")), reply("done")],
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


@pytest.mark.parametrize("key", ["", " ", " k", "k ", "é", "a\nb", "x" * 201, 7, b"k"])
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


async def test_a_key_of_up_to_the_longest_length_is_taken_and_acts_once(tmp_path: Path) -> None:
    """The bounds of a key are taken: one character, `MAX_KEY` characters, any printable
    ASCII inside (spaces too)."""
    async with so.Runtime([chat_agent()], store=f"sqlite:///{tmp_path}/s.db") as rt:
        for key in ["k", "x" * MAX_KEY, "a b~!"]:
            first = await rt.generate("chat", prompt="hello", auth=ALICE, idempotency_key=key)
            again = await rt.generate("chat", prompt="hello", auth=ALICE, idempotency_key=key)
            assert not first.replayed and again.replayed
            assert again.session_id == first.session_id
        assert len(await rt.sessions()) == 3


async def test_a_key_is_scoped_to_all_of_who_gives_it(tmp_path: Path) -> None:
    """Callers who differ only in issuer or principal type never share a key, nor do two whose
    id and key run together into the same text: each starts a conversation of its own."""
    callers = [
        (ALICE, "key-1"),
        (ALICE.model_copy(update={"issuer": "https://idp.example"}), "key-1"),
        (ALICE.model_copy(update={"principal_type": "service"}), "key-1"),
        (so.Principal(authenticator="okta", principal_id="ali"), "cekey-1"),
    ]
    async with so.Runtime([chat_agent()], store=f"sqlite:///{tmp_path}/s.db") as rt:
        results = [
            await rt.generate("chat", prompt="hello", auth=who, idempotency_key=key)
            for who, key in callers
        ]
        assert not any(r.replayed for r in results)
        assert len({r.session_id for r in results}) == len(callers)


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


async def test_a_key_is_remembered_by_the_session_it_went_to_only(store_url: str) -> None:
    """As the docs say: a key covers calls to the session it went to (a new conversation's
    key, the session it derives from); the same key on a call to another session is another
    call there, neither a repeat nor refused."""
    async with so.Runtime([chat_agent()], store=store_url) as rt:
        one = (await rt.generate("chat", prompt="hello", auth=ALICE)).session_id
        two = (await rt.generate("chat", prompt="hello", auth=ALICE)).session_id
        sent = await rt.send(one, "more", principal=ALICE, idempotency_key="s-1")
        elsewhere = await rt.send(two, "more", principal=ALICE, idempotency_key="s-1")
        assert not sent.replayed and not elsewhere.replayed
        assert await messages(rt, one) == ["hello", "more"]
        assert await messages(rt, two) == ["hello", "more"]
        assert (await rt.send(two, "more", principal=ALICE, idempotency_key="s-1")).replayed
        started = await rt.generate("chat", prompt="more", auth=ALICE, idempotency_key="s-1")
        assert not started.replayed and started.session_id not in (one, two)
        assert await messages(rt, two) == ["hello", "more"]


async def test_a_key_given_again_with_another_turn_policy_is_refused(store_url: str) -> None:
    """The policy is part of what a keyed message asks: the same key and text sent with the
    other one is another call, refused as a key reused, with nothing stored."""
    async with so.Runtime([chat_agent()], store=store_url) as rt:
        sid = (await rt.generate("chat", prompt="hello", auth=ALICE)).session_id
        await rt.send(sid, "more", principal=ALICE, idempotency_key="p-1")
        await rt.send(sid, "later", principal=ALICE, turn_policy="queue", idempotency_key="p-2")
        before = await counts(rt)
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, "more", principal=ALICE, turn_policy="queue", idempotency_key="p-1")
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, "later", principal=ALICE, idempotency_key="p-2")
        with pytest.raises(so.IdempotencyKeyReused):  # generate continues as `steer` does
            await rt.generate(session_id=sid, prompt="later", auth=ALICE, idempotency_key="p-2")
        again = await rt.send(
            sid, "later", principal=ALICE, turn_policy="queue", idempotency_key="p-2"
        )
        assert again.replayed
        assert await counts(rt) == before
        assert await messages(rt, sid) == ["hello", "more", "later"]


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


async def test_two_runtimes_racing_one_key_with_two_prompts_start_one(store_url: str) -> None:
    """Two processes starting a conversation under one key with different prompts: one
    creates the session, the other is refused (`IdempotencyKeyReused`), never a second
    session or a second message."""
    async with (
        so.Runtime([chat_agent()], store=store_url) as one,
        so.Runtime([chat_agent()], store=store_url) as two,
    ):
        results = await asyncio.gather(
            one.generate("chat", prompt="hello", auth=ALICE, idempotency_key="rp-1"),
            two.generate("chat", prompt="goodbye", auth=ALICE, idempotency_key="rp-1"),
            return_exceptions=True,
        )
        won = [r for r in results if isinstance(r, so.GenerateResult)]
        lost = [r for r in results if isinstance(r, so.IdempotencyKeyReused)]
        assert len(won) == 1 and len(lost) == 1, results
        assert not won[0].replayed and lost[0].session_id == won[0].session_id
        assert await messages(one, won[0].session_id) in (["hello"], ["goodbye"])
        assert (await counts(one))[0] == 1


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


# -- what a repeat answers ---------------------------------------------------------------------


def two_answers() -> so.Agent:
    """Each turn answers differently, so a repeat shows which turn it read."""
    return scripted_agent("chat", [reply("answer A"), reply("answer B"), reply("answer C")])


def approving_agent() -> so.Agent:
    """The first turn parks on an approval; later turns just answer."""

    @so.tool(approval=so.always())
    async def refund(amount: int) -> str:
        """Refund an amount."""
        return f"refunded {amount}"

    return scripted_agent(
        "shop",
        [call_tools(call("refund", amount=5)), reply("refund done"), reply("anything else?")],
        tools=[refund],
        repeat_last=True,
    )


async def turn_ids(rt: so.Runtime, session_id: str) -> list[str]:
    return [
        e.turn_id or ""
        async for e in rt.events(session_id, follow=False)
        if e.type == "turn.started"
    ]


async def test_a_repeat_answers_with_its_own_turn_not_a_later_one(store_url: str) -> None:
    """Message A ran turn 1, message B turn 2: A repeated reads turn 1's answer, not B's."""
    async with so.Runtime([two_answers()], store=store_url) as rt:
        a = await rt.generate("chat", prompt="A", auth=ALICE, idempotency_key="a")
        b = await rt.send(a.session_id, "B", principal=ALICE, idempotency_key="b")
        assert (a.text, b.text) == ("answer A", "answer B") and a.turn_id != b.turn_id
        before = await counts(rt)
        again = await rt.generate("chat", prompt="A", auth=ALICE, idempotency_key="a")
        assert again.replayed and again.session_id == a.session_id
        assert (again.turn_id, again.status, again.text) == (a.turn_id, "completed", "answer A")
        assert again.pending == [] and again.error is None
        assert await counts(rt) == before
        c = await rt.send(a.session_id, "C", principal=ALICE, idempotency_key="c")
        assert c.text == "answer C"
        before = await counts(rt)
        b_again = await rt.send(a.session_id, "B", principal=ALICE, idempotency_key="b")
        assert b_again.replayed and (b_again.turn_id, b_again.text) == (b.turn_id, "answer B")
        same = await rt.generate(
            session_id=a.session_id, prompt="B", auth=ALICE, idempotency_key="b"
        )
        assert same.replayed and same.turn_id == b.turn_id
        assert await counts(rt) == before


async def test_a_scheduled_run_repeated_answers_with_its_own_turn(store_url: str) -> None:
    async with so.Runtime([two_answers()], store=store_url) as rt:
        job = await rt.schedule("chat", "report", idempotency_key="run-1")
        later = await rt.schedule("chat", "report 2", session_id=job.session_id)
        again = await rt.schedule("chat", "report", idempotency_key="run-1")
        assert again.replayed and (again.turn_id, again.text) == (job.turn_id, "answer A")
        assert later.turn_id != job.turn_id


async def test_a_repeat_while_its_turn_waits_on_an_approval_returns_the_request(
    store_url: str,
) -> None:
    async with so.Runtime([approving_agent()], store=store_url) as rt:
        first = await rt.generate("shop", prompt="refund me", auth=ALICE, idempotency_key="r")
        assert first.status == "waiting" and len(first.pending) == 1
        before = await counts(rt)
        again = await rt.generate("shop", prompt="refund me", auth=ALICE, idempotency_key="r")
        assert again.replayed and (again.status, again.turn_id) == ("waiting", first.turn_id)
        assert [p.id for p in again.pending] == [first.pending[0].id]
        assert await counts(rt) == before
        done = await rt.generate(
            session_id=first.session_id,
            approvals=[{"id": first.pending[0].id, "approved": True}],
            auth=ALICE,
        )
        assert done.status == "completed" and done.text == "refund done"
        after = await rt.send(first.session_id, "thanks", principal=ALICE, idempotency_key="t")
        assert after.turn_id != first.turn_id
        settled = await rt.generate("shop", prompt="refund me", auth=ALICE, idempotency_key="r")
        assert settled.replayed and settled.turn_id == first.turn_id
        assert (settled.status, settled.text, settled.pending) == ("completed", "refund done", [])


async def test_a_keyed_queued_or_steered_message_repeats_its_turn(store_url: str) -> None:
    """A message that waited in the queue and one steered into the turn: each repeat answers
    with the turn the message went to, also once later turns followed."""
    async with so.Runtime([asking_agent()], store=store_url) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        sid = r.session_id
        queued = await rt.send(sid, "bob here", principal=BOB, idempotency_key="q")
        assert queued.turn_id == r.turn_id and queued.status == "waiting"
        # still in the queue: what its first call answered, the turn it waits behind
        waiting = await rt.send(sid, "bob here", principal=BOB, idempotency_key="q")
        assert waiting.replayed and (waiting.turn_id, waiting.status) == (r.turn_id, "waiting")
        # steering ends the turn, and bob's message then runs as the next one
        await rt.send(sid, "hold on", principal=ALICE, idempotency_key="s")
        first, bobs = await turn_ids(rt, sid)
        assert first == r.turn_id
        later = await rt.send(sid, "thanks", principal=ALICE, idempotency_key="later")
        assert later.turn_id not in (first, bobs)
        before = await counts(rt)
        q = await rt.send(sid, "bob here", principal=BOB, idempotency_key="q")
        assert q.replayed and (q.turn_id, q.status, q.text) == (bobs, "completed", "done")
        s = await rt.send(sid, "hold on", principal=ALICE, idempotency_key="s")
        assert s.replayed and (s.turn_id, s.status, s.text) == (first, "completed", "done")
        assert await counts(rt) == before


async def test_a_keyed_answer_repeats_the_turn_it_answered(store_url: str) -> None:
    async with so.Runtime([asking_agent()], store=store_url) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        answered = await rt.send(r.session_id, "pro", principal=ALICE, idempotency_key="a")
        assert (answered.turn_id, answered.status) == (r.turn_id, "completed")
        later = await rt.send(r.session_id, "thanks", principal=ALICE)
        assert later.turn_id != r.turn_id
        again = await rt.send(r.session_id, "pro", principal=ALICE, idempotency_key="a")
        assert again.replayed and (again.turn_id, again.status) == (r.turn_id, "completed")
        assert again.text == answered.text and again.pending == []


async def test_a_repeat_after_a_restart_answers_with_its_own_turn(store_url: str) -> None:
    async with so.Runtime([two_answers()], store=store_url) as rt:
        a = await rt.generate("chat", prompt="A", auth=ALICE, idempotency_key="a")
        b = await rt.send(a.session_id, "B", principal=ALICE, idempotency_key="b")
    async with so.Runtime([two_answers()], store=store_url) as rt:
        again = await rt.generate("chat", prompt="A", auth=ALICE, idempotency_key="a")
        assert again.replayed and (again.turn_id, again.text) == (a.turn_id, "answer A")
        b_again = await rt.send(a.session_id, "B", principal=ALICE, idempotency_key="b")
        assert b_again.replayed and (b_again.turn_id, b_again.text) == (b.turn_id, "answer B")


async def test_a_creation_key_pushed_out_of_the_state_repeats_the_first_turn(
    store_url: str,
) -> None:
    async with so.Runtime([chat_agent()], store=store_url) as rt:
        first = await rt.generate("chat", prompt="hello", auth=ALICE, idempotency_key="start")
        for i in range(KEPT):
            await rt.send(first.session_id, f"m{i}", principal=ALICE, idempotency_key=f"m{i}")
        again = await rt.generate("chat", prompt="hello", auth=ALICE, idempotency_key="start")
        assert again.replayed and again.turn_id == first.turn_id


async def test_a_repeat_while_another_process_runs_its_turn_says_so(store_url: str) -> None:
    """The turn is still running in another runtime: the repeat answers with its state now."""
    called, release = asyncio.Event(), asyncio.Event()

    class Slow:
        async def complete(self, request: so.models.ModelRequest) -> so.ModelResponse:
            called.set()
            await release.wait()
            return so.ModelResponse(text="slow answer")

    async with (
        so.Runtime([so.Agent(name="chat", model=Slow())], store=store_url) as one,
        # `two` does not wait out `lease_wait` for the turn `one` holds: it answers what it finds
        so.Runtime([chat_agent()], store=store_url, lease_wait=0) as two,
    ):
        task = asyncio.create_task(
            one.generate("chat", prompt="hello", auth=ALICE, idempotency_key="slow")
        )
        await called.wait()
        running = await two.generate("chat", prompt="hello", auth=ALICE, idempotency_key="slow")
        release.set()
        first = await task
        assert running.replayed and running.status == "running" and running.text == ""
        assert running.turn_id == first.turn_id and first.text == "slow answer"
        done = await two.generate("chat", prompt="hello", auth=ALICE, idempotency_key="slow")
        assert done.replayed and (done.status, done.text) == ("completed", "slow answer")


async def test_a_key_is_scoped_to_the_callers_exact_identity(tmp_path: Path) -> None:
    """An issuer of None and one of "" are two people (`Principal.same_as`), but their keys
    were scoped alike: the second got the first's session replayed, its requests and all. A
    key given by a principal with no issuer is scoped as before, so it still replays."""
    none = so.Principal(authenticator="oidc", principal_id="alice", issuer=None)
    empty = so.Principal(authenticator="oidc", principal_id="alice", issuer="")
    joined = so.Principal(authenticator="oidc\0alice", principal_id="", issuer=None)
    assert keyed("k", none) == (
        _digest("signoff-key", "oidc", "", "user", "alice", "k"),
        _digest("signoff-asked"),
    )
    assert len({keyed("k", p) for p in (none, empty, joined)}) == 3
    async with sqlite_runtime(tmp_path, scripted_agent("a", [reply("hi")], repeat_last=True)) as rt:
        first = await rt.generate("a", prompt="hello", auth=none, idempotency_key="k")
        second = await rt.generate("a", prompt="hello", auth=empty, idempotency_key="k")
        assert second.session_id != first.session_id and not second.replayed


@pytest.mark.parametrize("keyed_call", [False, True], ids=["unkeyed", "keyed"])
async def test_a_keyed_call_with_a_wrong_typed_agent_or_prompt_is_a_usage_error(
    store_url: str, keyed_call: bool
) -> None:
    """The key was made of the agent and prompt before either was checked: with a key, a
    `None` agent or an int prompt raised a bare TypeError from the key's hashing, where the
    same call without one was a UsageError. Each is a UsageError either way, nothing stored."""
    key: dict[str, Any] = {"idempotency_key": "k1"} if keyed_call else {}
    async with so.Runtime([chat_agent()], store=store_url) as rt:
        sid = (await rt.generate("chat", prompt="hi")).session_id
        before = await so.testing.store_contents(rt.store, sid)
        with pytest.raises(so.UsageError, match="agent must be text"):
            await rt.schedule(None, "x", **key)  # type: ignore[arg-type]
        with pytest.raises(so.UsageError, match="prompt must be a string"):
            await rt.schedule("chat", 5, session_id=sid, **key)  # type: ignore[arg-type]
        with pytest.raises(so.UsageError, match="prompt must be a string"):
            await rt.generate("chat", 5, session_id=sid, **key)  # type: ignore[arg-type]
        assert await so.testing.store_contents(rt.store, sid) == before
        assert [s.id for s in await rt.sessions()] == [sid]
