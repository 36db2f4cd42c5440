"""The chaos test's checks of issue 8's invariants, read from the store and the tools' records
once every session finished.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import signoff as so
from signoff.stores import StoredRequest

from ._chaos import Ledger, _root
from ._chaos_logs import lost_leases, story, timed_records
from ._chaos_procs import CHILD
from ._chaos_subagents import check_subagents
from ._worker_procs import check_logs, read_records

__all__ = ["_check"]


async def _check(
    front: so.Runtime,
    url: str,
    records: Path,
    killed: set[int],
    ledger: Ledger,
    seed: int,
    logs: dict[int, list[str]],
) -> tuple[int, int]:
    """The invariants of issue 8, read from the store and the tools' records; returns how many
    bodies ran again after a kill or a lost lease interrupted them, and how many leases
    processes that were never killed lost (`logs`: what each process logged, by pid)."""
    heads = check_logs(url)  # every session's seq is 1..head: no gap, no fork
    sessions = await front.sessions(limit=1000)
    assert sorted(s.id for s in sessions) == sorted(heads)
    runs: dict[str, list[tuple[str, int]]] = {}
    for what, key, pid in read_records(records):
        runs.setdefault(key, []).append((what, pid))
    must_run: set[str] = set()  # keys of calls whose result says their body ran
    acked_roots = {_root(req) for req in ledger.acknowledged.values()}
    for s in sessions:
        events = [e async for e in front.events(s.id, follow=False)]
        requested = [r for e in events if e.type == "input.requested" for r in e.data["requests"]]
        resolved = Counter(e.data["request_id"] for e in events if e.type == "input.resolved")
        settled = Counter(e.data["request_id"] for e in events if e.type == "approval.settled")
        keys = {
            (e.turn_id, e.data["call_id"]): e.data["idempotency_key"]
            for e in events
            if e.type == "tool.started"
        }
        for r in requested:
            rid = r["id"]
            root = r["child"]["request_id"] if r.get("child") else rid
            assert resolved[rid] == 1, (seed, s.id, rid, "lost or resolved twice")
            assert settled[rid] <= 1, (seed, s.id, rid, "applied twice")
            assert ledger.applied[root] <= 1, (seed, rid, "two answers were told applied")
            row, chosen = await _closed(front, rid, seed)
            # An acknowledged answer is the one that counts: on the child's request, and on a
            # mirror unless a steer or cancel of the parent withdrew that first.
            if root in acked_roots and (rid == root or row.status != "withdrawn"):
                assert row.status == "settled" and chosen == ledger.decisions[root], (
                    seed,
                    rid,
                    row.status,
                    row.resolution,
                )
            if rid != root:  # a mirror: settled as the child's request was
                child_row, child_chosen = await _closed(front, root, seed)
                if row.status == "settled":
                    assert (row.outcome, chosen) == (child_row.outcome, child_chosen), (
                        seed,
                        rid,
                        row,
                        child_row,
                    )
                    assert child_row.status == "settled", (seed, rid, row, child_row)
                # Withdrawn by a steer or cancel of the parent, the child's request with it
                # (or answered on the child just before: the call's result says, see below).
                continue
            if r["kind"] == "tool-approval" and chosen != "approve":
                key = f"{s.id}:{_turn_number(events, r['turn_id'])}:{r['action']['call_id']}"
                assert key not in runs, (seed, key, "a call not approved ran", runs[key])
        completed = [e for e in events if e.type == "tool.completed"]
        per_call = Counter((e.turn_id, e.data["call_id"]) for e in completed)
        assert set(per_call.values()) <= {1}, (seed, s.id, per_call)
        for e in completed:
            if e.data["status"] == "ok" and e.data["tool_name"] in ("refund", "ship"):
                must_run.add(keys[(e.turn_id, e.data["call_id"])])
        for e in events:
            if e.type == "tool.step" and e.data["name"] == "quote":
                key = keys[(e.turn_id, e.data["call_id"])]
                must_run.add(f"{key}:{e.data['name']}")
        delivered = Counter(
            str(e.data.get("message"))
            for e in events
            if (e.type == "turn.message" and not e.data.get("queued")) or e.type == "turn.started"
        )
        # A message sent while `plan` asks its question is the answer (the question takes free
        # text): it is delivered as that answer.
        delivered.update(
            str(e.data["answer"].get("text"))
            for e in events
            if e.type == "input.resolved" and isinstance(e.data.get("answer"), dict)
        )
        for text, acked in ledger.messages.items():
            if text.endswith(f" for {s.id}"):
                # An acknowledged message exactly once; one whose reply was lost at most once.
                want = 1 if acked else delivered[text]
                assert delivered[text] == want <= 1, (seed, text, acked, delivered[text])
        state = await front.state(s.id)
        assert state.queued == [], (seed, s.id, state.queued)
        if s.id in ledger.cancelled:  # later messages may have started turns since
            ended = [e.turn_id for e in events if e.type == "turn.cancelled"]
            assert ledger.cancelled[s.id] in ended, (seed, s.id, ended)
    assert await front.verify_audit() == [], seed
    assert await front.pending(limit=1000) == []
    await check_subagents(front, sessions, ledger.swept, seed)
    for root, options in ledger.acked_options.items():  # mirror and child told the same
        assert len(options) == 1, (seed, root, options)
    for rid in ledger.beaten_by_text:  # a message sent while the question was open answered it
        row, chosen = await _closed(front, rid, seed)
        said = ((row.resolution or {}).get("answer") or {}).get("text")
        assert chosen is None and said in ledger.messages, (seed, rid, "the same answer refused")
    for key in must_run:
        assert any(what == "done" for what, _ in runs.get(key, [])), (seed, key, "never ran")
    # Each body ran once; more only in place of runs a SIGKILL interrupted, or a drive that
    # stalled past its lease (an overloaded machine): its process logged the lease (of the
    # session, or of the parent whose drive ran the child's) lost after the run began, and the
    # process that took it over ran the call again (at-least-once, as test_leasing_frozen
    # shows). Same key either way.
    lost = lost_leases(logs)
    timed = timed_records(records)
    parents = {s.id: (await front.state(s.id)).parent for s in sessions if s.agent == CHILD}
    reruns = 0
    for key, entries in runs.items():
        sid = key.split(":")[0]
        parent = parents.get(sid)
        owners = {sid} if parent is None else {sid, parent}
        runs_of = [(what, pid, at) for what, k, pid, at in timed if k == key]

        def excused(pid: int, at: float, owners: set[str] = owners) -> bool:
            return pid in killed or any(
                s in owners and when >= at - 0.01 for s, when in lost.get(pid, [])
            )

        starts = [(pid, at) for what, pid, at in runs_of if what == "start"]
        done = [(pid, at) for what, pid, at in runs_of if what == "done"]
        why = (seed, key, entries, killed, story(key, timed, logs, owners))
        assert all(excused(pid, at) for pid, at in starts[:-1]), why
        assert len([p for p, at in done if not excused(p, at)]) <= 1, why
        reruns += len(starts) - 1
    stalled = len({(pid, s) for pid, found in lost.items() if pid not in killed for s, _ in found})
    return reruns, stalled


async def _closed(front: so.Runtime, rid: str, seed: int) -> tuple[StoredRequest, str | None]:
    """The request's stored row, which must be closed, and the option it was closed with."""
    row = await front.store.get_request(rid)
    assert row is not None and row.status != "pending", (seed, rid, row)
    resolution = row.resolution or {}
    chosen = resolution.get("decision") or (resolution.get("answer") or {}).get("option_id")
    return row, chosen


def _turn_number(events: list[so.Event], turn_id: str) -> int:
    """The 1-based number of the turn `turn_id` in the session (as in idempotency keys)."""
    turns = [e.turn_id for e in events if e.type == "turn.started"]
    return turns.index(turn_id) + 1
