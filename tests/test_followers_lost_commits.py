"""A follower of a session's events whose store lost commits it had shown (a PostgreSQL server
that crashed before flushing them, a restored copy) and then ran the session on from before them:
it stops with `EventsRewritten` instead of reading on after the seq it had reached, which skipped
the events written anew. Each test takes a copy of the store after a first turn, follows a
second, puts the copy back, and has another runtime (another process) run a longer turn."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

import signoff as so
from signoff import stores
from signoff.server import AsyncClient, TokenAuth, create_app
from signoff.testing import call, call_tools, reply, scripted_agent

from .test_engine_lost_commits import _copy
from .test_server_common import TOKENS, auth, running


@so.tool
async def noop() -> str:
    """Nothing."""
    return "ok"


def _last(shown: list[so.Event]) -> int:
    return shown[-1].seq if shown else 0


def _agents(steps: list[so.ModelResponse]) -> list[so.Agent]:
    return [scripted_agent("a", steps, tools=[noop])]


async def _rewritten(
    store_url: str, follower: so.Runtime, sid: str, shown: Callable[[], int]
) -> tuple[int, int]:
    """Run a second turn (followed: `shown` says the last seq shown), put back the store copied
    before it, and run a longer one from another runtime: the seq the store kept, and the one
    the follower had reached."""
    kept = await follower.store.head(sid)
    assert kept is not None
    put_back = await _copy(store_url)
    await follower.generate(session_id=sid, prompt="two")
    reached = await follower.store.head(sid)
    assert reached is not None
    for _ in range(500):
        if shown() == reached:
            break
        await asyncio.sleep(0.02)
    assert shown() == reached
    await put_back()
    other = [call_tools(call("noop")), call_tools(call("noop")), reply("Other.")]
    async with so.Runtime(_agents(other), store=store_url) as rt2:
        await rt2.generate(session_id=sid, prompt="another two")
        assert (await rt2.store.head(sid) or 0) > reached + 2
    return kept, reached


async def test_a_follower_across_lost_commits_stops_instead_of_skipping_the_rewritten(
    store_url: str,
) -> None:
    """`Runtime.events` kept only the seq it had reached: after the put-back and the longer
    turn it went on after that seq, yielding events that follow ones it never showed (and
    standing on a second turn that never happened). It raises `EventsRewritten` at that seq."""
    async with so.Runtime(
        _agents([reply("One."), reply("Two.")]), store=store_url, poll_interval=0.05
    ) as rt:
        sid = (await rt.generate("a", "one")).session_id
        shown: list[so.Event] = []

        async def follow() -> None:
            async for event in rt.events(sid):
                shown.append(event)

        following = asyncio.create_task(follow())
        try:
            kept, reached = await _rewritten(store_url, rt, sid, lambda: _last(shown))
            for _ in range(1000):  # until it ends, or shows an event past the seq it reached
                if following.done() or shown[-1].seq > reached:
                    break
                await asyncio.sleep(0.02)
            assert [e.seq for e in shown] == list(range(1, reached + 1))  # none past it
            with pytest.raises(so.EventsRewritten) as rewritten:
                await asyncio.wait_for(following, 5)
        finally:
            following.cancel()
        assert (rewritten.value.session_id, rewritten.value.seq) == (sid, reached)
        assert isinstance(rewritten.value, so.StoreError)
        # Read again from the start, the session is the one the store kept.
        again = [e async for e in rt.events(sid, follow=False)]
        assert [e.seq for e in again] == list(range(1, len(again) + 1))
        assert again[:kept] == shown[:kept] and again[kept:reached] != shown[kept:]
        messages = [e.data.get("message") for e in again if e.type == "turn.started"]
        assert messages[-1] == "another two"


async def test_a_read_given_the_event_it_showed_checks_it_in_the_same_read(
    store_url: str,
) -> None:
    """The store's check (`read_events(shown=)`): the same event passes, one written anew at its
    seq or one gone (the store went back behind it) raises `EventsRewritten`, and a read whose
    check passes costs about what one without it does."""
    async with so.Runtime(_agents([reply("One."), reply("Two.")]), store=store_url) as rt:
        sid = (await rt.generate("a", "one")).session_id
        put_back = await _copy(store_url)
        await rt.generate(session_id=sid, prompt="two")
        events = await rt.store.read_events(sid)
        last = events[-1]
        assert await rt.store.read_events(sid, after=last.seq, shown=last) == []
        middle = events[len(events) // 2]
        assert await rt.store.read_events(
            sid, after=middle.seq, shown=middle, limit=500, max_bytes=stores.READ_BYTES
        ) == [e for e in events if e.seq > middle.seq]
        await put_back()
        with pytest.raises(so.EventsRewritten) as gone:
            await rt.store.read_events(sid, after=last.seq, shown=last)
        assert (gone.value.session_id, gone.value.seq) == (sid, last.seq)
    other = [call_tools(call("noop")), reply("Other.")]
    async with so.Runtime(_agents(other), store=store_url) as rt2:
        await rt2.generate(session_id=sid, prompt="another two")
        with pytest.raises(so.EventsRewritten, match=f"event {last.seq} "):
            await rt2.store.read_events(sid, after=last.seq, shown=last, limit=500)
        kept = (await rt2.store.read_events(sid))[:3]
        assert await rt2.store.read_events(sid, after=3, shown=kept[-1], limit=1)


async def test_a_follower_whose_shown_events_were_lost_stops_before_the_session_runs_again(
    tmp_path: Path,
) -> None:
    """Lost and not yet written anew (the session does not run again): the follower stops too,
    at its next read, rather than wait in silence on events that never happened."""
    url = f"sqlite:///{tmp_path}/state.db"
    async with so.Runtime(
        _agents([reply("One."), reply("Two.")]), store=url, poll_interval=0.05
    ) as rt:
        sid = (await rt.generate("a", "one")).session_id
        put_back = await _copy(url)
        await rt.generate(session_id=sid, prompt="two")
        head = await rt.store.head(sid)
        events = rt.events(sid)
        shown = [await anext(events) for _ in range(head or 0)]
        waiting = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        began = time.monotonic()
        await put_back()
        with pytest.raises(so.EventsRewritten):
            await asyncio.wait_for(waiting, 10)
        assert time.monotonic() - began < 2
        assert shown[-1].seq == head


async def _raw_stream(
    base: str, sid: str, messages: list[dict[str, Any]], last: int | None = None
) -> None:
    """The session's followed HTTP stream (resumed after `last`, its `Last-Event-ID`, if
    given), each message's event type, id and data kept."""
    headers = auth("admin-token") | ({} if last is None else {"Last-Event-ID": str(last)})
    async with (
        httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as http,
        http.stream("GET", f"/v1/sessions/{sid}/events") as response,
    ):
        assert response.status_code == 200, await response.aread()
        message: dict[str, Any] = {}
        async for line in response.aiter_lines():
            if not line:
                if "data" in message:
                    messages.append(message)
                message = {}
            elif line.startswith(("id:", "event:", "data:")):
                key, _, value = line.partition(":")
                message[key] = json.loads(value) if key == "data" else value.strip()


def _raw_last(messages: list[dict[str, Any]]) -> int:
    """The last event seq a raw stream sent (0 before any)."""
    ids = [int(m["id"]) for m in messages if "id" in m]
    return ids[-1] if ids else 0


async def test_an_event_stream_across_lost_commits_ends_with_events_rewritten(
    store_url: str,
) -> None:
    """The HTTP stream (and so `AsyncClient.events()`) kept only the seq it had sent: it went on
    after it with the events of the longer turn, skipping those written anew before them. It
    ends with `stream.end` (409 `events_rewritten`, naming the session and the seq), which the
    client raises as `EventsRewritten`."""
    async with so.Runtime(
        _agents([reply("One."), reply("Two.")]), store=store_url, poll_interval=0.05
    ) as rt:
        sid = (await rt.generate("a", "one")).session_id
        server = so.Runtime(_agents([]), store=store_url, poll_interval=0.05)
        app = create_app(server, auth=TokenAuth(TOKENS), poll_interval=0.05, heartbeat=0.5)
        with running(app) as base:
            async with AsyncClient(base, token="admin-token") as client:
                shown: list[so.Event] = []
                raw: list[dict[str, Any]] = []

                async def follow() -> None:
                    async for event in client.events(sid):
                        shown.append(event)

                following = asyncio.create_task(follow())
                streaming = asyncio.create_task(_raw_stream(base, sid, raw))
                try:
                    for _ in range(500):  # both streams opened and sent what there is
                        if shown and len([m for m in raw if "id" in m]) == len(shown):
                            break
                        await asyncio.sleep(0.02)
                    # Put back once both streams sent the second turn: a stream still behind
                    # then would see no rewrite (nothing it sent was lost) and go on.
                    kept, reached = await _rewritten(
                        store_url, rt, sid, lambda: min(_last(shown), _raw_last(raw))
                    )
                    for _ in range(1000):
                        if following.done() or shown[-1].seq > reached:
                            break
                        await asyncio.sleep(0.02)
                    assert [e.seq for e in shown] == list(range(1, reached + 1))  # none past it
                    with pytest.raises(so.EventsRewritten) as rewritten:
                        await asyncio.wait_for(following, 10)
                    await asyncio.wait_for(streaming, 10)
                finally:
                    following.cancel()
                    streaming.cancel()
    assert (rewritten.value.session_id, rewritten.value.seq) == (sid, reached)
    assert [int(m["id"]) for m in raw if "id" in m] == list(range(1, reached + 1))
    assert raw[-1]["event"] == "stream.end" and "id" not in raw[-1]
    end = raw[-1]["data"]
    assert end["status"] == 409, end
    assert end["error"]["code"] == "events_rewritten", end
    assert (end["error"]["session_id"], end["error"]["seq"]) == (sid, reached)
    assert kept < reached


async def _delete(store_url: str, sid: str) -> None:
    """Remove the session's rows from every table that has them, as an operator would."""
    if store_url.startswith("sqlite://"):
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as db:
            (sk,) = db.execute("SELECT sk FROM sessions WHERE id=?", (sid,)).fetchone()
            tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            for t in tables:
                if any(c[1] == "sk" for c in db.execute(f'PRAGMA table_info("{t}")')):
                    db.execute(f'DELETE FROM "{t}" WHERE sk=?', (sk,))
        db.close()
        return
    async with await psycopg.AsyncConnection.connect(store_url) as conn:  # one transaction
        await conn.execute("SET session_replication_role = replica")  # no foreign key checks
        cur = await conn.execute("SELECT sk FROM signoff.sessions WHERE id=%s", (sid,))
        (sk,) = await cur.fetchone() or (None,)
        cur = await conn.execute(
            "SELECT table_name FROM information_schema.columns "
            "WHERE table_schema = 'signoff' AND column_name = 'sk'"
        )
        for (t,) in await cur.fetchall():
            await conn.execute(f'DELETE FROM signoff."{t}" WHERE sk=%s'.encode(), (sk,))


async def test_an_event_stream_of_a_session_deleted_under_it_ends_on_both_stores(
    store_url: str,
) -> None:
    """A session deleted under a followed stream still ends it with `stream.end` (404
    `unknown_session`) now that a read checking the last event sent finds the session by its
    id, and raises `UnknownSession` where it read no events before (SQLite)."""
    async with so.Runtime(_agents([reply("One.")]), store=store_url) as rt:
        sid = (await rt.generate("a", "one")).session_id
        head = await rt.store.head(sid)
    server = so.Runtime(_agents([]), store=store_url, poll_interval=0.05)
    app = create_app(server, auth=TokenAuth(TOKENS), poll_interval=0.05, heartbeat=0.5)
    with running(app) as base:
        raw: list[dict[str, Any]] = []
        streaming = asyncio.create_task(_raw_stream(base, sid, raw))
        try:
            for _ in range(500):
                if len(raw) == head:
                    break
                await asyncio.sleep(0.02)
            assert len(raw) == head
            await _delete(store_url, sid)
            await asyncio.wait_for(streaming, 10)
        finally:
            streaming.cancel()
    assert raw[-1]["event"] == "stream.end", raw[-1]
    assert raw[-1]["data"]["status"] == 404, raw[-1]
    assert raw[-1]["data"]["error"]["code"] == "unknown_session", raw[-1]


async def test_a_read_resumed_from_an_event_read_before_checks_it(store_url: str) -> None:
    """A follower that resumes later from an event it read before (`rt.events(after=, shown=)`,
    `AsyncClient.events(after=, shown=)`, and so a `LiveSession`'s next `sync()`) started after
    that seq unchecked: a `LiveSession` synced before the put-back folded the longer turn's
    events onto a second turn that never happened. Each raises `EventsRewritten`, and the
    `LiveSession` folds nothing."""
    async with so.Runtime(_agents([reply("One."), reply("Two.")]), store=store_url) as rt:
        sid = (await rt.generate("a", "one")).session_id
        put_back = await _copy(store_url)
        await rt.generate(session_id=sid, prompt="two")
        events = await rt.store.read_events(sid)
        first, last = events[0], events[-1]
        server = so.Runtime(_agents([]), store=store_url, poll_interval=0.05)
        app = create_app(server, auth=TokenAuth(TOKENS), poll_interval=0.05, heartbeat=0.5)
        with running(app) as base:
            async with AsyncClient(base, token="admin-token") as client:
                live = await client.session(sid)
                assert live.seq == last.seq
                await put_back()
                other = [call_tools(call("noop")), call_tools(call("noop")), reply("Other.")]
                async with so.Runtime(_agents(other), store=store_url) as rt2:
                    await rt2.generate(session_id=sid, prompt="another two")
                    assert (await rt2.store.head(sid) or 0) > last.seq + 2
                with pytest.raises(so.EventsRewritten) as rewritten:
                    await live.sync()
                assert (rewritten.value.session_id, rewritten.value.seq) == (sid, last.seq)
                assert live.seq == last.seq  # nothing of the rewritten log folded
                with pytest.raises(so.EventsRewritten):
                    [e async for e in client.events(sid, last.seq, follow=False, shown=last)]
                again = [e async for e in client.events(sid, 1, follow=False, shown=first)]
                assert again[0].seq == 2  # still the store's: read on after it
        with pytest.raises(so.EventsRewritten):
            [e async for e in rt.events(sid, last.seq, follow=False, shown=last)]
        assert [e async for e in rt.events(sid, 1, follow=False, shown=first)][0].seq == 2
        head = await rt.store.head(sid)
        at_head = (await rt.store.read_events(sid, after=(head or 0) - 1))[0]
        assert [e async for e in rt.events(sid, head or 0, follow=False, shown=at_head)] == []
        with pytest.raises(so.UsageError, match="shown must be"):
            [e async for e in rt.events(sid, 2, follow=False, shown=first)]


async def test_a_read_checking_the_one_event_a_store_lost_raises(store_url: str) -> None:
    """A client that read event N asks from N - 1 to check it: a store put back to N - 1 had
    that start, so the read was merely empty (and a followed one waited), the lost event never
    told; a `LiveSession` synced on as if nothing was lost. `?shown=N` is refused past the
    head, and the client raises `EventsRewritten`, followed or not, as `rt.events` does."""
    async with so.Runtime(_agents([reply("One."), reply("Two.")]), store=store_url) as rt:
        sid = (await rt.generate("a", "one")).session_id
        kept = await rt.store.head(sid)
        assert kept is not None
        put_back = await _copy(store_url)
        await rt.generate(session_id=sid, prompt="two")
        lost = (await rt.store.read_events(sid, after=kept))[0]
        await put_back()
        assert await rt.store.head(sid) == lost.seq - 1
        server = so.Runtime(_agents([]), store=store_url, poll_interval=0.05)
        app = create_app(server, auth=TokenAuth(TOKENS), poll_interval=0.05, heartbeat=0.5)
        with running(app) as base:
            async with AsyncClient(base, token="admin-token", timeout=5) as client:
                for follow in (False, True):
                    with pytest.raises(so.EventsRewritten) as rewritten:
                        async with asyncio.timeout(10):
                            read = client.events(sid, lost.seq, follow=follow, shown=lost)
                            [e async for e in read]
                    assert (rewritten.value.session_id, rewritten.value.seq) == (sid, lost.seq)
                async with httpx.AsyncClient(base_url=base, headers=auth("admin-token")) as raw:
                    path = f"/v1/sessions/{sid}/events"
                    asked: dict[str, int | str] = {"after": kept, "shown": lost.seq}
                    asked["follow"] = "false"
                    refused = await raw.get(path, params=asked)
                    assert refused.status_code == 422, refused.text
                    assert refused.json()["error"]["code"] == "invalid_request"
                    asked = {"after": kept - 1, "shown": kept, "follow": "false"}
                    ok = await raw.get(path, params=asked)
                    assert ok.status_code == 200, ok.text
        with pytest.raises(so.EventsRewritten):
            [e async for e in rt.events(sid, lost.seq, follow=False, shown=lost)]


async def test_signoff_events_follow_across_lost_commits_stops(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`signoff events --follow` tries a failing store again from the last event printed: it
    took `EventsRewritten` for such a failure and read on after that seq, unchecked, printing
    the longer turn's events after ones that never happened. It stops with it."""
    from rich.console import Console

    from signoff.cli._events import _print_log

    async with so.Runtime(
        _agents([reply("One."), reply("Two.")]), store=store_url, poll_interval=0.05
    ) as rt:
        sid = (await rt.generate("a", "one")).session_id
        printed: list[int] = []

        def seen() -> list[int]:
            lines = capsys.readouterr().out.splitlines()
            printed.extend(json.loads(line)["seq"] for line in lines if line)
            return printed

        printing = asyncio.create_task(_print_log(rt, Console(), sid, 0, True, True))
        try:
            kept, reached = await _rewritten(store_url, rt, sid, lambda: (seen() or [0])[-1])
            for _ in range(1000):
                if printing.done() or seen()[-1] > reached:
                    break
                await asyncio.sleep(0.02)
            assert seen() == list(range(1, reached + 1))  # none past it
            with pytest.raises(so.EventsRewritten):
                await asyncio.wait_for(printing, 10)
        finally:
            printing.cancel()
        assert kept < reached


async def test_an_event_stream_whose_sent_events_were_lost_ends_before_the_session_runs_again(
    store_url: str,
) -> None:
    """Lost and not written anew: a followed HTTP stream ends with `stream.end` 409
    `events_rewritten` too, within its `heartbeat` (PostgreSQL's wait is for the head to pass
    the seq sent, which it never does: the stream's check of the session sees it behind)."""
    async with so.Runtime(_agents([reply("One."), reply("Two.")]), store=store_url) as rt:
        sid = (await rt.generate("a", "one")).session_id
        put_back = await _copy(store_url)
        await rt.generate(session_id=sid, prompt="two")
        head = await rt.store.head(sid)
    server = so.Runtime(_agents([]), store=store_url, poll_interval=0.05)
    app = create_app(server, auth=TokenAuth(TOKENS), poll_interval=0.05, heartbeat=0.5)
    with running(app) as base:
        raw: list[dict[str, Any]] = []
        streaming = asyncio.create_task(_raw_stream(base, sid, raw))
        try:
            for _ in range(500):
                if len(raw) == head:
                    break
                await asyncio.sleep(0.02)
            assert len(raw) == head
            await asyncio.sleep(0.3)  # the stream waits for more
            await put_back()
            await asyncio.wait_for(streaming, 10)
        finally:
            streaming.cancel()
    end = raw[-1]["data"]
    assert raw[-1]["event"] == "stream.end" and end["error"]["code"] == "events_rewritten", end
    assert (end["status"], end["error"]["seq"]) == (409, head)
