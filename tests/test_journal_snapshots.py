"""A call's journal and the session's snapshots (`_recording.snapshot_after`, `load_journal`):
snapshots taken while a workflow steps leave its journal out (a step costs the same however
many came before it), the one that parks the turn keeps it, and a journal a snapshot left out
is read back from its events, exactly as it was, on either store and in any runtime."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import signoff as so
from signoff._recording import SNAPSHOT_EVERY, load_journal
from signoff._state import fold
from signoff.stores._codec import pack_bytes
from signoff.testing import call, call_tools, reply, scripted_agent

from ._procs import query

STEPS = 2 * SNAPSHOT_EVERY + 20
"""Steps of the workflow: two snapshots are taken while it steps."""


def workflow(ran: list[int], seen: dict[str, Any] | None = None) -> so.Agent:
    """A tool of `STEPS` journaled steps (each noted in `ran` when it really runs) that then
    asks; its result is the sum of the steps' results and the answer. With `seen`, the stored
    snapshot as the step at `SNAPSHOT_EVERY + 10` runs is kept there."""

    @so.tool
    async def tally(ctx: so.ToolContext) -> list[Any]:
        """Step many times, then ask."""

        async def count(i: int) -> int:
            ran.append(i)
            if seen is not None and i == SNAPSHOT_EVERY + 10:
                loaded = await seen["store"].load(ctx.session.id)
                seen["snapshot"] = loaded.snapshot
            return i

        total = 0
        for i in range(STEPS):
            total += await ctx.step(f"s{i % 3}", count, i)
        answer = await ctx.ask("Keep it?", options=["yes", "no"])
        return [total, answer.value]

    return scripted_agent(
        "clerk", [call_tools(call("tally", call_id="t1")), reply("done")], tools=[tally]
    )


def stored_snapshot(url: str, session_id: str) -> tuple[int, dict[str, Any]]:
    """The session's stored snapshot, read from its row."""
    from signoff.stores._codec import unpack_snapshot

    [(seq, data)] = query(
        url,
        "SELECT n.seq, n.data FROM {t}snapshots n JOIN {t}sessions s ON s.sk = n.sk "
        "WHERE s.id = {p}",
        session_id,
    )
    return int(seq), unpack_snapshot(bytes(data), session_id, int(seq))


def put_snapshot(url: str, session_id: str, snapshot: dict[str, Any]) -> None:
    """Write `snapshot` over the session's stored one, as an older signoff would have left it."""
    sql = (
        "UPDATE {t}snapshots SET data = {p} WHERE sk = (SELECT sk FROM {t}sessions WHERE id = {p})"
    )
    if url.startswith("sqlite:///"):
        import sqlite3

        conn = sqlite3.connect(url[len("sqlite:///") :])
        with conn:
            conn.execute(sql.format(t="", p="?"), (pack_bytes(snapshot), session_id))
        conn.close()
        return
    query(url, sql + " RETURNING 1", pack_bytes(snapshot), session_id)


async def parked(url: str, ran: list[int], seen: dict[str, Any] | None = None) -> tuple[str, Any]:
    """Run the workflow to its question in one runtime: the session and its call's journal."""
    async with so.Runtime([workflow(ran, seen)], store=url) as rt:
        if seen is not None:
            seen["store"] = rt.store
        r = await rt.generate("clerk", prompt="go")
        assert r.status == "waiting", r
        state = await rt.state(r.session_id)
        assert state.turn is not None
        journal = state.turn.calls["t1"].journal
    assert journal is not None and len([e for e in journal if e]) == STEPS + 1
    return r.session_id, journal


async def resumed(url: str, session_id: str, ran: list[int]) -> tuple[Any, Any]:
    """The call's journal as a new runtime reads it (from the snapshot or back from the
    events), and its result once another new runtime (as another process would) answered."""
    async with so.Runtime([workflow(ran)], store=url) as rt:
        state = await rt.state(session_id)
        assert state.turn is not None
        call = state.turn.calls["t1"]
        if call.journal is None:
            await load_journal(rt.store, state, call)
        journal = call.journal
    async with so.Runtime([workflow(ran)], store=url) as rt:
        r = await rt.send(session_id, "yes")
        assert r.status == "completed", r
        events = [e async for e in rt.events(session_id, follow=False)]
    [result] = [e.data["result"] for e in events if e.type == "tool.completed"]
    return journal, result


async def test_snapshots_leave_a_stepping_journal_out_and_the_park_keeps_it(
    store_url: str,
) -> None:
    """The snapshots taken while the tool steps hold none of its journal (re-encoding it whole
    every `SNAPSHOT_EVERY` events made a step's cost grow with the steps before it); the one
    that parks the turn on its question holds it whole, so a resume reads it with the
    snapshot. A new runtime replays every step from it and runs none again."""
    ran: list[int] = []
    seen: dict[str, Any] = {}
    sid, journal = await parked(store_url, ran, seen)
    stepping = seen["snapshot"]
    assert stepping["v"] == 2 and stepping["seq"] >= SNAPSHOT_EVERY
    [during] = stepping["turn"]["calls"]
    assert "journal" not in during and during["journaled"] and during["keyed"]
    assert during["since"] == stepping["turn"]["model_seq"]
    seq, snapshot = stored_snapshot(store_url, sid)
    [kept] = snapshot["turn"]["calls"]
    assert snapshot["turn"]["status"] == "waiting" and kept["journal"] == journal
    assert ran == list(range(STEPS))
    again, result = await resumed(store_url, sid, ran)
    assert again == journal
    assert ran == list(range(STEPS))  # none ran again
    assert result == [sum(range(STEPS)), "yes"]


async def test_a_journal_a_snapshot_left_out_is_read_back_from_its_events(
    store_url: str,
) -> None:
    """A session whose latest snapshot holds no journal (taken as the tool stepped, then the
    process died; here the park's, written so) is resumed from its events: the journal read
    back is the one the live state held, entry for entry, and no step runs again."""
    ran: list[int] = []
    sid, journal = await parked(store_url, ran)
    _, snapshot = stored_snapshot(store_url, sid)
    for c in snapshot["turn"]["calls"]:
        del c["journal"]
    put_snapshot(store_url, sid, snapshot)
    again, result = await resumed(store_url, sid, ran)
    assert again == journal
    assert ran == list(range(STEPS))
    assert result == [sum(range(STEPS)), "yes"]


async def test_an_older_snapshot_holding_the_journal_whole_still_loads(store_url: str) -> None:
    """A snapshot of an older signoff (version 1: each journal whole, nothing kept beside it)
    loads as before: the call replays its steps from it, and what is kept beside the journal
    (whether it has entries, its children) is read from the journal itself."""
    ran: list[int] = []
    sid, journal = await parked(store_url, ran)
    _, snapshot = stored_snapshot(store_url, sid)
    snapshot["v"] = 1
    for c in snapshot["turn"]["calls"]:
        for key in ("since", "journaled", "kids"):
            c.pop(key, None)
    put_snapshot(store_url, sid, snapshot)
    restored = so.SessionState.from_snapshot(snapshot)
    assert restored.turn is not None
    older = restored.turn.calls["t1"]
    assert older.journal == journal and older.journaled and older.keyed
    assert older.since == snapshot["turn"]["model_seq"]
    again, result = await resumed(store_url, sid, ran)
    assert again == journal
    assert ran == list(range(STEPS))
    assert result == [sum(range(STEPS)), "yes"]


def test_a_snapshot_of_a_newer_form_is_refused_by_its_version() -> None:
    """A snapshot this signoff cannot read is refused by name, not read as having no journal
    (an older signoff refuses this one's, of version 2, alike)."""
    state = so.SessionState(id="ses_1")
    snapshot = {**state.to_snapshot(), "v": 3}
    with pytest.raises(so.SchemaVersionError, match="schema version 3"):
        so.SessionState.from_snapshot(snapshot)


async def test_a_reload_while_the_body_steps_keeps_its_journal(store_url: str) -> None:
    """Another runtime records a message while the body steps (queued for the turn's end), so
    the next step's commit finds the session moved on and the drive reads the state again,
    from a snapshot without the journal: the journal is read back before the body goes on,
    which replays nothing and runs every step once."""
    ran: list[int] = []
    box: dict[str, Any] = {}

    @so.tool
    async def tally(ctx: so.ToolContext) -> int:
        """Step many times."""

        async def count(i: int) -> int:
            ran.append(i)
            if i == SNAPSHOT_EVERY + 10:
                await box["other"].send(ctx.session.id, "after this", turn_policy="queue")
            return i

        total = 0
        for i in range(STEPS):
            total += await ctx.step(f"s{i % 3}", count, i)
        return total

    agent = scripted_agent(
        "clerk",
        [call_tools(call("tally", call_id="t1")), reply("done"), reply("noted")],
        tools=[tally],
    )
    async with (
        so.Runtime([agent], store=store_url) as rt,
        so.Runtime([agent], store=store_url, inline=False) as other,
    ):
        box["other"] = other
        r = await rt.generate("clerk", prompt="go")
        for _ in range(100):
            if (await rt.state(r.session_id)).status == "idle":
                break
            await asyncio.sleep(0.05)
        events = [e async for e in rt.events(r.session_id, follow=False)]
    assert ran == list(range(STEPS))
    steps = [e for e in events if e.type == "tool.step"]
    queued = next(e for e in events if e.type == "turn.message")
    assert steps[0].seq < queued.seq < steps[-1].seq  # between two steps: the commit after it
    assert [e.data["index"] for e in steps] == [i // 3 for i in range(STEPS)]
    [result] = [e.data["result"] for e in events if e.type == "tool.completed"]
    assert result == sum(range(STEPS))


class _Log:
    """Just enough of a store for `load_journal`: a session's events, read a page at a time."""

    def __init__(self, events: list[so.Event]) -> None:
        self.events = events

    async def read_events(
        self, session_id: str, after: int = 0, *, limit: int | None = None, **_: Any
    ) -> list[so.Event]:
        out = [e for e in self.events if e.seq > after]
        return out[:limit] if limit is not None else out


async def test_a_position_no_signoff_writes_is_refused_as_the_journal_is_read_back() -> None:
    """A state without the journal cannot check a positional step against the journal's end:
    the damaged step folds into what is kept beside it, and is refused by name (a `StoreError`)
    when the journal is read back, not obeyed by filling memory with empty places."""
    specs: list[tuple[str, str | None, dict[str, Any]]] = [
        ("session.created", None, {"agent": "a"}),
        ("turn.started", "t", {"message": "hi"}),
        ("model.completed", "t", {"tool_calls": [{"id": "c", "name": "x", "input": {}}]}),
        ("tool.started", "t", {"call_id": "c"}),
        ("tool.step", "t", {"call_id": "c", "name": "a", "index": 0, "result": 1}),
    ]
    events = [
        so.Event(session_id="s", seq=i, type=t, at=1.0, turn_id=turn, data=data)  # type: ignore[arg-type]
        for i, (t, turn, data) in enumerate(specs, start=1)
    ]
    state = so.SessionState.from_snapshot(fold(events).to_snapshot())
    damaged = so.Event(
        session_id="s",
        seq=6,
        type="tool.step",
        at=1.0,
        turn_id="t",
        data={"call_id": "c", "name": "b", "index": 10**12, "result": 2},
    )
    state.apply(damaged)
    assert state.turn is not None
    call = state.turn.calls["c"]
    assert call.journal is None and call.journaled
    with pytest.raises(so.StoreError, match="malformed"):
        await load_journal(_Log([*events, damaged]), state, call)  # type: ignore[arg-type]
    assert call.journal is None


@pytest.mark.parametrize(
    "damage",
    [{"index": [0]}, {"name": {"not": "a name"}}, {"name": None, "index": None}],
    ids=["unhashable index", "unhashable name", "no key"],
)
async def test_a_damaged_keyed_step_is_refused_as_the_journal_is_read_back(
    damage: dict[str, Any],
) -> None:
    """A keyed step whose stored row was damaged after the snapshot folded it (a hand edit) is
    refused by name as the journal is read back, and no journal is kept."""
    step = {"call_id": "c", "name": "a", "index": 0, "result": 1, "keyed": True}
    specs: list[tuple[str, str | None, dict[str, Any]]] = [
        ("session.created", None, {"agent": "a"}),
        ("turn.started", "t", {"message": "hi"}),
        ("model.completed", "t", {"tool_calls": [{"id": "c", "name": "x", "input": {}}]}),
        ("tool.started", "t", {"call_id": "c"}),
        ("tool.step", "t", step),
        ("tool.step", "t", {**step, "index": 1, "result": 2}),
    ]
    events = [
        so.Event(session_id="s", seq=i, type=t, at=1.0, turn_id=turn, data=data)  # type: ignore[arg-type]
        for i, (t, turn, data) in enumerate(specs, start=1)
    ]
    state = so.SessionState.from_snapshot(fold(events).to_snapshot())
    assert state.turn is not None
    call = state.turn.calls["c"]
    assert call.journal is None and call.keyed
    good = list(events)
    data = {k: v for k, v in step.items() if damage.get(k, 0) is not None}
    data.update({k: v for k, v in damage.items() if v is not None})
    events[4] = so.Event(session_id="s", seq=5, type="tool.step", at=1.0, turn_id="t", data=data)
    with pytest.raises(so.StoreError, match="malformed"):
        await load_journal(_Log(events), state, call)  # type: ignore[arg-type]
    assert call.journal is None
    await load_journal(_Log(good), state, call)  # type: ignore[arg-type]
    assert call.journal is not None
    entries = [e for e in call.journal if e is not None]
    assert [(e["name"], e["n"], e["result"]) for e in entries] == [("a", 0, 1), ("a", 1, 2)]
