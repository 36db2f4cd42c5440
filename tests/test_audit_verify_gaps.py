"""Verifying that each session's event log holds every event up to its last: one deleted from
the middle (of a type the trail does not audit, no snapshot taken after it) breaks no chain and
leaves the log ending where its session says, so only counting the log's rows can name it.
"""

from pathlib import Path
from typing import Any, cast

import signoff as so
from signoff._audit_trail import verify as verify_trail
from signoff.stores import Store
from signoff.stores._audit import AuditEntry
from signoff.testing import ManualClock, reply, scripted_agent

from ._audit import agent, alter, run_scenario
from ._procs import query


async def _parked(url: str) -> tuple[str, int, list[AuditEntry], list[so.Event]]:
    """The audit scenario's session, its sk, its trail and its events: nothing is wrong yet."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        trail = list(await rt.audit(sid))
        events = [e async for e in rt.events(sid, follow=False)]
        assert await rt.verify_audit() == []
    assert query(url, "SELECT count(*) FROM {t}snapshots") == [(0,)]  # none after any event
    ((sk,),) = query(url, "SELECT sk FROM {t}sessions WHERE id={p}", sid)
    return sid, sk, trail, events


def _delete(url: str, sk: int, *seqs: int) -> None:
    for seq in seqs:
        alter(url, "DELETE FROM {t}events WHERE sk={p} AND seq={p}", sk, seq)


async def _found(url: str, sid: str) -> list[tuple[int, str, int, str]]:
    """What verifying the session finds, the same alone as with the whole store."""
    async with so.Runtime([agent()], store=url) as rt:
        alone, whole = await rt.verify_audit(sid), await rt.verify_audit()
    found = [(p.id, p.stream, p.n, p.reason) for p in alone]
    assert [(p.id, p.stream, p.n, p.reason) for p in whole] == found
    return found


async def test_an_event_deleted_from_the_middle_of_a_log_is_named(store_url: str) -> None:
    """No entry stands for the turn parking between a request and its first vote: deleted,
    every chain still checks out and the log still ends at its session's head, yet the event
    is gone. Named by its seq, after the last entry before it; two gone, by how many there
    are for how many seqs."""
    sid, sk, trail, events = await _parked(store_url)
    waiting = [e.seq for e in events if e.type == "turn.waiting"]
    before = [e for e in trail if e.seq is not None and e.seq < waiting[0]][-1]
    _delete(store_url, sk, waiting[0])
    assert await _found(store_url, sid) == [
        (before.id, sid, before.n, f"event {waiting[0]} is missing from the event log")
    ]
    _delete(store_url, sk, waiting[1])
    head = events[-1].seq
    reason = f"the event log has {head - 2} events for seqs 1 to {head}"
    assert await _found(store_url, sid) == [(0, sid, 0, reason)]


async def test_the_first_events_of_a_log_deleted_are_named(store_url: str) -> None:
    """The session's creation deleted: no entry comes before it. Then the turn's start too:
    the log has fewer events than seqs, and starts past 1."""
    sid, sk, _, events = await _parked(store_url)
    assert [e.type for e in events[:2]] == ["session.created", "turn.started"]
    _delete(store_url, sk, 1)
    assert await _found(store_url, sid) == [(0, sid, 0, "event 1 is missing from the event log")]
    _delete(store_url, sk, 2)
    head = events[-1].seq
    reason = f"the event log has {head - 2} events for seqs 1 to {head}, the first at seq 3"
    assert await _found(store_url, sid) == [(0, sid, 0, reason)]


async def test_the_last_event_of_a_log_deleted_is_named_once(store_url: str) -> None:
    """The last event deleted leaves no gap in the events before it: it is named as the log
    ending short of its session's head, once; with one from the middle gone as well, still
    once, as that (the log is named already: it is not counted for gaps)."""
    sid, sk, trail, events = await _parked(store_url)
    head = events[-1].seq
    assert trail[-1].seq is not None and trail[-1].seq < head
    _delete(store_url, sk, head)
    ends = f"the event log ends at event {head - 1}, but its session keeps {head} as its last"
    named = [(trail[-1].id, sid, trail[-1].n + 1, ends)]
    assert await _found(store_url, sid) == named
    _delete(store_url, sk, next(e.seq for e in events if e.type == "turn.waiting"))
    assert await _found(store_url, sid) == named


async def test_a_gap_in_a_log_of_no_audited_event_is_named_and_others_stay_clean(
    store_url: str,
) -> None:
    """A session that only chatted has no entry at all: its gap is named all the same, by no
    entry, and another session's log, whole, is not named."""
    quiet = scripted_agent("quiet", [reply("hello")], repeat_last=True)
    async with so.Runtime([quiet], store=store_url) as rt:
        sid = (await rt.generate("quiet", "hi")).session_id
        await rt.generate(session_id=sid, prompt="again")
        other = (await rt.generate("quiet", "hi")).session_id
        head = (await rt.state(sid)).seq
        assert await rt.audit(sid) == [] and await rt.verify_audit() == []
    ((sk,),) = query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", sid)
    _delete(store_url, sk, head - 2)
    async with so.Runtime([quiet], store=store_url) as rt:
        named = [(0, sid, 0, f"event {head - 2} is missing from the event log")]
        for problems in (await rt.verify_audit(sid), await rt.verify_audit()):
            assert [(p.id, p.stream, p.n, p.reason) for p in problems] == named
        assert await rt.verify_audit(other) == []


class _EarlierStore:
    """A store as written for an earlier signoff: `log_ends`, but no `log_shapes`."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        if name == "log_shapes":
            raise AttributeError(name)
        return getattr(self._store, name)


async def test_a_store_without_log_shapes_is_still_verified_by_where_its_logs_end(
    store_url: str,
) -> None:
    """A store that cannot count its logs (written for an earlier signoff) still verifies: its
    gaps go unseen, but a log ending short of its session's head is named as before."""
    sid, sk, trail, events = await _parked(store_url)
    _delete(store_url, sk, next(e.seq for e in events if e.type == "turn.waiting"))
    async with so.Runtime([agent()], store=store_url) as rt:
        earlier = cast(Store, _EarlierStore(rt.store))
        assert await verify_trail(earlier) == await verify_trail(earlier, stream=sid) == []
        head = events[-1].seq
        _delete(store_url, sk, head)
        ends = f"the event log ends at event {head - 1}, but its session keeps {head} as its last"
        for problems in (await verify_trail(earlier), await verify_trail(earlier, stream=sid)):
            assert [(p.id, p.stream, p.n, p.reason) for p in problems] == [
                (trail[-1].id, sid, trail[-1].n + 1, ends)
            ]


async def test_a_seq_past_what_a_sum_holds_is_named_not_a_failed_verification(
    store_url: str,
) -> None:
    """The last event's seq edited to the largest integer: SQLite's `sum` of the seqs failed
    the whole verification ("integer overflow"); it is named as where the log ends, once."""
    sid, sk, _, events = await _parked(store_url)
    head, huge = events[-1].seq, 2**63 - 1
    alter(store_url, "UPDATE {t}events SET seq={p} WHERE sk={p} AND seq={p}", huge, sk, head)
    found = await _found(store_url, sid)
    assert [(stream, reason) for _, stream, _, reason in found] == [
        (sid, f"the event log ends at event {huge}, but its session keeps {head} as its last")
    ]


async def test_a_seq_that_is_no_whole_number_is_named(tmp_path: Path) -> None:
    """SQLite keeps a hand edit's 5.5 as a seq: as many rows as seqs, from 1 to the last, and
    the log looked whole to a count; the sum of its seqs tells it is not."""
    url = f"sqlite:///{tmp_path}/gaps.db"
    sid, sk, _, events = await _parked(url)
    waiting = next(e.seq for e in events if e.type == "turn.waiting")
    alter(url, "UPDATE {t}events SET seq={p} WHERE sk={p} AND seq={p}", waiting + 0.5, sk, waiting)
    head = events[-1].seq
    reason = f"the event log holds a seq that is not a whole number of 1 to {head}"
    assert await _found(url, sid) == [(0, sid, 0, reason)]
