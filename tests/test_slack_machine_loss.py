"""An answer Slack had a 200 for survives the loss of the machine that took it: the work is saved
in the store too (a memo beside the channel's claim) before the 200, and the hub delivering on
another state file takes it up and settles it once. Before, it lived only in the lost machine's
state file: the person's click or reply was gone while they believed it taken."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels.slack import _inbox

from ._procs import ROOT, make_agent, read_executions
from ._slack import TEAM, FakeSlack, channel, click, fake, manual, sign, state_locked
from ._slack_replies import ALLOWED, FIRST_TS, event

__all__ = ["fake"]  # the fixture, used by name


def approve(rid: str) -> bytes:
    """A press of a request's Approve button by ALLOWED."""
    action = {"action_id": "signoff.approve", "value": rid, "type": "button"}
    return click(action, user=ALLOWED)


async def until(check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def killed_after_acknowledging(
    tmp_path: Path, fake: FakeSlack, store: str, body: bytes, *, events: bool
) -> None:
    """A hub on state a.db (claim_ttl 1 s) posts the open request, takes `body` and is
    SIGKILLed as soon as Slack would have its 200: its machine is lost, with its state."""
    (tmp_path / "body").write_bytes(body)
    argv = [store, str(tmp_path / "runs.jsonl"), str(tmp_path / "a.db"), fake.url]
    argv += ["--interaction", str(tmp_path / "body"), "--claim-ttl", "1"]
    argv += ["--events"] if events else []
    with (tmp_path / "child.err").open("w") as err:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests._slack_child",
            *argv,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
        )
        out, _ = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == -signal.SIGKILL, (out, (tmp_path / "child.err").read_text())
    assert json.loads(out) == {"event": "acknowledged", "answer": None}


@pytest.mark.parametrize("kind", ["click", "reply"])
async def test_an_answer_acknowledged_by_a_machine_lost_is_settled_by_a_hub_on_another_state(
    store_url: str,
    tmp_path: Path,
    fake: FakeSlack,
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The delivering hub (state a.db) acknowledges Approve (or an `approve` typed in the
    request's thread) and is SIGKILLed; a hub on b.db, sharing only the store, takes over once
    the claim lapses and, the work being older than `ADOPT_AFTER`, settles it as the person,
    once: the call runs once, A's message shows it, nobody gets a note, and the store keeps
    nothing of it. When machine A comes back (a hub on a.db, whose state still holds the work
    pending), it settles nothing again and tells nobody anything."""
    monkeypatch.setattr(_inbox, "ADOPT_AFTER", 2.0)
    monkeypatch.setattr(_inbox, "ADOPT_EVERY", 0.2)
    records = str(tmp_path / "runs.jsonl")
    async with so.Runtime([make_agent(records)], store=store_url) as rt:
        (req,) = (await rt.generate("support", prompt="Refund order 1042")).pending
    body = approve(req.id) if kind == "click" else event("approve", thread=FIRST_TS)
    await killed_after_acknowledging(tmp_path, fake, store_url, body, events=kind == "reply")
    prefix = "hub.slack:click:" if kind == "click" else "hub.slack:event:"
    async with so.Runtime([make_agent(records)], store=store_url) as rt:
        s: Any = rt.store
        ((name, saved, _),) = await s.channel_memos(prefix)  # saved before the 200
        assert json.loads(saved)["request_id"] == req.id
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"  # it never settled

        async def settled() -> bool:
            await hub.poll()
            await slack.idle()
            found = await rt.store.get_request(req.id)
            return found is not None and found.status == "settled"

        slack = channel(fake)
        hub = ChannelHub(rt, [slack], state=tmp_path / "b.db", claim_ttl=1.0)
        async with manual(hub):
            await until(settled)
            assert hub.active
            await until(lambda: _gone(s, prefix))  # its run dropped it from the store
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.resolution is not None
        assert stored.outcome == "approved"
        assert stored.resolution["by"]["principal_id"] == f"slack:{TEAM}:{ALLOWED}"
        assert len(read_executions(records)) == 1
        # Machine A is back: its state still has the work pending, which the store says
        # another state took up and finished.
        back = channel(fake)
        ((key, memo),) = [(k, m) for k, m in _memos(tmp_path / "a.db", prefix)]
        assert memo["state"] == "pending"
        async with manual(ChannelHub(rt, [back], state=tmp_path / "a.db", claim_ttl=1.0)) as a:
            await back.idle()
            await a.poll()
            await back.idle()
            assert back.recall(key)["state"] == "done"
        settles = [e for e in await rt.audit() if e.type == "approval.settled"]
        assert len(settles) == 1
        assert await s.channel_memos(prefix) == []
    assert len(read_executions(records)) == 1
    assert fake.of("chat.postEphemeral") == []
    assert len(fake.of("chat.postMessage")) == 1  # B adopted A's message
    (update,) = fake.of("chat.update")
    assert update["ts"] == FIRST_TS
    assert name.removeprefix("hub.slack:") == key


async def _gone(store: Any, prefix: str) -> bool:
    found: list[Any] = await store.channel_memos(prefix)
    return found == []


def _memos(path: Path, prefix: str) -> list[tuple[str, Any]]:
    """The memos of hub `hub`'s channel `slack` in the state file at `path` under `prefix`
    (`hub.slack:click:` reads `click:`)."""
    from signoff.channels import ChannelState

    state = ChannelState(path)
    try:
        return state.memos("slack", prefix.removeprefix("hub.slack:"), hub="hub")
    finally:
        state.close()


@pytest.mark.parametrize("fault", ["down", "slow"])
async def test_an_answer_the_store_cannot_keep_in_time_gets_a_503_and_is_taken_once_later(
    store_url: str,
    tmp_path: Path,
    fake: FakeSlack,
    fault: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store refuses the interaction's memo (down) or keeps it only after the bound to save
    it (slow; here half a second, not two, so the bound asserted leaves a loaded machine two
    seconds to wake): Slack is answered with the `StoreError` behind a 503 in time, and the
    state keeps nothing of a refused one. Slack's retry, once the store is back, is taken
    (down) or finds it taken (slow: the late save settles it); either way it settles once,
    with no note."""
    monkeypatch.setattr(_inbox, "ACK_WITHIN", 0.5)
    records = str(tmp_path / "runs.jsonl")
    async with so.Runtime([make_agent(records)], store=store_url) as rt:
        (req,) = (await rt.generate("support", prompt="Refund order 1042")).pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "b.db")) as hub:
            await hub.poll()
            s: Any = rt.store
            keep = s.keep_channel_memos

            async def failing(memos: dict[str, Any], now: float, **how: Any) -> None:
                if any(":click:" in name for name in memos):
                    if fault == "down":
                        raise so.StoreError("the store is down")
                    await asyncio.sleep(2.5)
                await keep(memos, now, **how)

            monkeypatch.setattr(s, "keep_channel_memos", failing)
            body = approve(req.id)
            began = time.monotonic()
            with pytest.raises(so.StoreError):
                await slack.handle(body, _signed(body))
            assert time.monotonic() - began < 2.5  # inside Slack's three seconds, as ACK_WITHIN
            if fault == "down":
                assert slack.memos("click:") == []  # nothing taken: Slack's retry is
            monkeypatch.setattr(s, "keep_channel_memos", keep)
            await slack.idle()
            assert await slack.handle(body, _signed(body, 1)) is None  # Slack's retry
            await slack.idle()
            assert [m["state"] for _, m in slack.memos("click:")] == ["done"]
            assert await s.channel_memos("hub.slack:click:") == []
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "approved"
        assert [e.type for e in await rt.audit()].count("approval.settled") == 1
    assert len(read_executions(records)) == 1
    assert fake.of("chat.postEphemeral") == []


@pytest.mark.parametrize("fault", ["refused", "locked"])
@pytest.mark.parametrize("kind", ["click", "reply"])
async def test_an_answer_the_state_cannot_keep_gets_a_503_and_leaves_nothing_to_take_up(
    store_url: str,
    tmp_path: Path,
    fake: FakeSlack,
    kind: str,
    fault: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store keeps the copy of Approve (or of an `approve` typed in the request's thread)
    but the state refuses its memo (a full disk) or is locked by another process past the two
    seconds (the memo fails after the 503): the copy is dropped again, so the delivering hub's
    scans, past `ADOPT_AFTER`, settle nothing. Before, the copy stayed and a scan settled it a
    minute after Slack had shown the person an error. Slack's retry is then taken, once."""
    monkeypatch.setattr(_inbox, "ADOPT_AFTER", 0.0)
    monkeypatch.setattr(_inbox, "ADOPT_EVERY", 0.0)
    records = str(tmp_path / "runs.jsonl")
    async with so.Runtime([make_agent(records)], store=store_url) as rt:
        (req,) = (await rt.generate("support", prompt="Refund order 1042")).pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "b.db")) as hub:
            await hub.poll()
            s: Any = rt.store
            body = approve(req.id) if kind == "click" else event("approve", thread=FIRST_TS)
            handle = slack.handle if kind == "click" else slack.handle_event
            prefix = "click:" if kind == "click" else "event:"
            if fault == "refused":
                remember = slack.remember

                def refusing(key: str, value: Any) -> None:
                    if key.startswith(prefix):
                        raise so.StoreError("database or disk is full")
                    remember(key, value)

                monkeypatch.setattr(slack, "remember", refusing)
                with pytest.raises(so.StoreError, match="disk is full"):
                    await handle(body, _signed(body))
                monkeypatch.setattr(slack, "remember", remember)
            else:
                async with state_locked(tmp_path / "b.db"):
                    with pytest.raises(so.StoreError, match="not saved within 2s"):
                        await handle(body, _signed(body))
                    await slack.idle()  # the memo fails late, the lock still held
            await slack.idle()
            await hub.poll()  # a scan of the store, past ADOPT_AFTER
            await slack.idle()
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.status == "pending"
            assert read_executions(records) == []
            assert await s.channel_memos(f"hub.slack:{prefix}") == []
            assert slack.memos(prefix) == []
            assert await handle(body, _signed(body, 1)) is None  # Slack's retry
            await slack.idle()
            assert [m["state"] for _, m in slack.memos(prefix)] == ["done"]
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "approved"
        assert [e.type for e in await rt.audit()].count("approval.settled") == 1
    assert len(read_executions(records)) == 1
    assert fake.of("chat.postEphemeral") == []


async def test_work_another_state_saved_is_left_to_it_for_a_minute(
    store_url: str, tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A click in the store from another home (a live process there may be settling it): the
    delivering hub's start and scans leave it while younger than `ADOPT_AFTER`, and take it up
    once older, settling it once."""
    records = str(tmp_path / "runs.jsonl")
    async with so.Runtime([make_agent(records)], store=store_url) as rt:
        (req,) = (await rt.generate("support", prompt="Refund order 1042")).pending
        s: Any = rt.store
        work = {
            "does": "answer",
            "request_id": req.id,
            "team": TEAM,
            "user": ALLOWED,
            "channel": "C42",
            "option_id": "approve",
            "text": None,
            "trigger_id": None,
            "home": "elsewhere|/var/lib/signoff/a.db",
        }
        await s.keep_channel_memos({"hub.slack:click:c1": json.dumps(work)}, rt.now())
        monkeypatch.setattr(_inbox, "ADOPT_EVERY", 0.0)
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "b.db")) as hub:
            await hub.poll()
            await slack.idle()
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.status == "pending"  # left to its home
            assert slack.memos("click:") == []
            monkeypatch.setattr(_inbox, "ADOPT_AFTER", 0.0)
            await hub.poll()
            await slack.idle()
            assert [m["state"] for _, m in slack.memos("click:")] == ["done"]
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "approved"
        assert stored.resolution is not None
        assert stored.resolution["by"]["principal_id"] == f"slack:{TEAM}:{ALLOWED}"
        assert await s.channel_memos("hub.slack:click:") == []
    assert len(read_executions(records)) == 1
    assert fake.of("chat.postEphemeral") == []


def _signed(body: bytes, later: int = 0) -> dict[str, str]:
    """Slack's headers for `body`, signed now (`later` seconds on: a retry signed anew)."""
    return sign(body, int(time.time()) + later)


async def test_an_answer_acknowledged_is_synced_to_disk_in_the_store(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    """The store's copy of an acknowledged click is an answer a person was told was taken, so
    it is synced before the 200 as an answer's commit is: under `synchronous=FULL` on SQLite
    (whose ordinary commits are NORMAL), flushed on a PostgreSQL server whose default
    `synchronous_commit` is off (the message's memo, not an answer, keeps that default)."""
    postgres = not store_url.startswith("sqlite")
    if postgres:
        await _watch_memo_syncs(store_url)
    records = str(tmp_path / "runs.jsonl")
    async with so.Runtime([make_agent(records)], store=store_url) as rt:
        (req,) = (await rt.generate("support", prompt="Refund order 1042")).pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "b.db")) as hub:
            await hub.poll()
            statements: list[str] = []
            if not postgres:
                rt.store.conn.set_trace_callback(statements.append)  # type: ignore[attr-defined]
            body = approve(req.id)
            assert await slack.handle(body, _signed(body)) is None
            if not postgres:
                rt.store.conn.set_trace_callback(None)  # type: ignore[attr-defined]
            await slack.idle()
    if postgres:
        seen = await _seen_memo_syncs(store_url)
        assert {s for n, s in seen if ":click:" in n} == {"on"}
        assert {s for n, s in seen if ":post:" in n} == {"off"}
    else:
        ran = [sql for sql in statements if sql.startswith(("PRAGMA synch", "COMMIT", "INSERT"))]
        assert ran[0] == "PRAGMA synchronous=FULL" and "channel_claims" in ran[1]
        assert ran[2:4] == ["COMMIT", "PRAGMA synchronous=NORMAL"]


async def _watch_memo_syncs(url: str) -> None:
    """Make `off` the database's `synchronous_commit` and note the setting each channel memo
    row is written under."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        dbname = conninfo_to_dict(url)["dbname"]
        await conn.execute(f'ALTER DATABASE "{dbname}" SET synchronous_commit = off'.encode())
        await conn.execute(
            """
            CREATE TABLE public.memo_syncs (name TEXT, setting TEXT);
            CREATE FUNCTION public.see_memo() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO public.memo_syncs
                    VALUES (NEW.name, current_setting('synchronous_commit'));
                RETURN NULL;
            END $$;
            CREATE TRIGGER see_memo AFTER INSERT OR UPDATE ON signoff.channel_claims
                FOR EACH ROW EXECUTE FUNCTION public.see_memo();
            """
        )


async def _seen_memo_syncs(url: str) -> list[tuple[str, str]]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT name, setting FROM public.memo_syncs")
        return [(str(n), str(s)) for n, s in await cur.fetchall()]


async def test_a_reply_reaching_a_process_on_another_state_answers_the_thread_it_is_in(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    """Hub A (a.db) posts the request; a reply typed in its thread reaches a process on
    another state (hub B on b.db, standing by), whose state never saw that message: the
    thread's request is read from the store, and the reply answers it, as the person, once.
    Before, the reply was acknowledged and dropped (its thread unknown there)."""
    records = str(tmp_path / "runs.jsonl")
    async with so.Runtime([make_agent(records)], store=store_url) as rt:
        (req,) = (await rt.generate("support", prompt="Refund order 1042")).pending
        first, other = channel(fake), channel(fake)
        async with manual(ChannelHub(rt, [first], state=tmp_path / "a.db")) as a:
            await a.poll()
            async with manual(ChannelHub(rt, [other], state=tmp_path / "b.db")) as b:
                assert a.active and not b.active
                assert other.memos("thread:") == []  # b.db never saw the message
                body = event("approve", thread=FIRST_TS)
                assert await other.handle_event(body, _signed(body)) is None
                await other.idle()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "approved"
        assert stored.resolution is not None
        assert stored.resolution["by"]["principal_id"] == f"slack:{TEAM}:{ALLOWED}"
    assert len(read_executions(records)) == 1
    assert fake.of("chat.postEphemeral") == []
