"""Verifying the audit trail while sessions are deleted: a session another process deletes (or
prunes) between two of verification's reads is no tampering, while a chain cut short of a
session still there, and a session erased by hand with no deletion recorded, are still named.
"""

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._events import dumps
from signoff.stores._audit import chain_hash
from signoff.stores._deletions import DELETIONS_STREAM, SESSION_DELETED
from signoff.testing import ManualClock

from ._audit import ALICE, agent, alter, run_scenario
from ._procs import query

_TABLES = ("events", "snapshots", "requests", "leases", "audit")


def _meanwhile(
    monkeypatch: pytest.MonkeyPatch, rt: so.Runtime, read: str, act: Callable[[], Awaitable[Any]]
) -> list[bool]:
    """Run `act` the first time `rt`'s store makes the verification read `read`, before it:
    another process's commit landing between two of verification's reads. The list returned
    holds True once it ran."""
    store, done = rt.store, [False]
    real = getattr(store, read)

    async def first_act_then_read(*args: Any, **kwargs: Any) -> Any:
        if not done[0]:
            done[0] = True
            await act()
        return await real(*args, **kwargs)

    monkeypatch.setattr(store, read, first_act_then_read)
    return done


def _erase_by_hand(url: str, session_id: str) -> None:
    """Delete a session's rows behind signoff's back, with no deletion recorded."""
    ((sk,),) = query(url, "SELECT sk FROM {t}sessions WHERE id={p}", session_id)
    for table in _TABLES:
        alter(url, f"DELETE FROM {{t}}{table} WHERE sk={{p}}", sk)
    alter(url, "DELETE FROM {t}sessions WHERE sk={p}", sk)


@pytest.mark.parametrize("read", ["stored_requests", "audited_events"])
async def test_a_session_deleted_while_verifying_is_not_named(
    store_url: str, read: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process prunes a finished session after verification read its chain's head and
    before it read its entries: the head then has no entries. That was named as entries missing
    from the end of its chain (a false alarm whenever a scheduled prune overlapped a periodic
    verification); the deletion is recorded in `store:deletions`, so it is not. A session cut
    short by hand meanwhile is still named, and verifying one session deleted meanwhile is
    `UnknownSession`, as it is for one deleted before."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        deleted, cut, single = [await run_scenario(rt, clock) for _ in range(3)]
        assert await rt.verify_audit() == []
        last = (await rt.audit(cut))[-1]
    alter(store_url, "DELETE FROM {t}audit WHERE id={p}", last.id)
    cut_short = (cut, last.n, f"entry {last.n} is missing from the end of the session's chain")
    async with (
        so.Runtime([agent()], store=store_url, clock=clock) as verifier,
        so.Runtime([agent()], store=store_url, clock=clock) as deleter,
    ):
        done = _meanwhile(
            monkeypatch,
            verifier,
            read,
            lambda: deleter.prune(older_than=0, by=ALICE, reason="retention", limit=1),
        )
        problems = await verifier.verify_audit()
        assert done == [True]
        assert [(p.stream, p.n, p.reason) for p in problems] == [cut_short]
        with pytest.raises(so.UnknownSession):
            await verifier.audit(deleted)  # the oldest, which the prune deleted
        monkeypatch.undo()
        done = _meanwhile(
            monkeypatch,
            verifier,
            read,
            lambda: deleter.delete_session(single, by=ALICE, reason="erasure"),
        )
        with pytest.raises(so.UnknownSession, match=single):
            await verifier.verify_audit(single)
        assert done == [True]
        monkeypatch.undo()
        # The one cut short by hand is still named alone, and the deletions check out.
        problems = await verifier.verify_audit()
        assert [(p.stream, p.n, p.reason) for p in problems] == [cut_short]


async def test_a_session_erased_by_hand_while_verifying_is_still_named(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session's rows deleted by hand between two of verification's reads, with no deletion
    recorded in `store:deletions`, is tampering, named as before: the check that spares a
    session deleted meanwhile finds no entry of the deletions chain that deleted it."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        whole, single = [await run_scenario(rt, clock) for _ in range(2)]
        count = len(await rt.audit(whole))
        assert count == len(await rt.audit(single))
        assert await rt.verify_audit() == []
    missing = (1, f"entries 1 to {count} are missing from the end of the session's chain")

    async def erase(session_id: str) -> None:
        _erase_by_hand(store_url, session_id)

    async with so.Runtime([agent()], store=store_url, clock=clock) as verifier:
        _meanwhile(monkeypatch, verifier, "stored_requests", lambda: erase(whole))
        problems = await verifier.verify_audit()
        assert [(p.stream, p.n, p.reason) for p in problems] == [(whole, *missing)]
        monkeypatch.undo()
        _meanwhile(monkeypatch, verifier, "stored_requests", lambda: erase(single))
        problems = await verifier.verify_audit(single)
        assert [(p.stream, p.n, p.reason) for p in problems] == [(single, *missing)]


async def test_a_deletion_forged_past_the_head_of_the_deletions_chain_spares_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session erased by hand while it is verified, with a deletion entry appended by hand
    that names it, its hash computed on the chain, but the head the store keeps for the stream
    left as it was: no deletion committed it, so the session is still named."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    clock = ManualClock()
    async with so.Runtime([agent()], store=url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        count = len(await rt.audit(sid))

    async def erase_and_forge() -> None:
        _erase_by_hand(url, sid)
        data = {"session_id": sid, "by": None, "reason": "forged", "sessions": [{"id": sid}]}
        digest = chain_hash(
            None, stream=DELETIONS_STREAM, n=1, type=SESSION_DELETED, at=1.0, seq=None, data=data
        )
        alter(
            url,
            "INSERT INTO audit (stream, n, type, at, data, hash) VALUES (?,?,?,?,?,?)",
            DELETIONS_STREAM,
            1,
            SESSION_DELETED,
            1.0,
            dumps(data),
            bytes.fromhex(digest),
        )

    async with so.Runtime([agent()], store=url, clock=clock) as verifier:
        _meanwhile(monkeypatch, verifier, "stored_requests", erase_and_forge)
        problems = await verifier.verify_audit(sid)
        assert [(p.stream, p.n, p.reason) for p in problems] == [
            (sid, 1, f"entries 1 to {count} are missing from the end of the session's chain")
        ]
        monkeypatch.undo()
        forged = await verifier.audit(stream=DELETIONS_STREAM)
        assert [(e.n, e.data["reason"]) for e in forged] == [(1, "forged")]
