"""`Deletion._deletion_refusal`, which `signoff delete` asks before asking a person whether to
delete: on both stores, what `delete_session` then does (the same refusal, or the deletion, a
passed TTL recorded first where that frees the tree), found with nothing recorded or deleted."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

import signoff as so
from signoff.testing import ManualClock

from .test_deletion import ALICE, OPS
from .test_deletion_expired_tree import nested_desks


async def _waiting(rt: so.Runtime) -> str:
    """A session waiting on a person (`desk`, no TTL): refused, unless forced."""
    r = await rt.generate("desk", prompt="refund 5", auth=ALICE)
    assert r.status == "waiting"
    return r.session_id


async def _finished(rt: so.Runtime) -> str:
    r = await rt.generate("desk", prompt="ask:where is order 3?", auth=ALICE)
    assert r.status == "completed"
    return r.session_id


async def _subagents(rt: so.Runtime) -> str:
    """A subagent's session whose parent exists: refused, forced too."""
    await _finished(rt)
    [helper] = [s.id for s in await rt.sessions(agent="helper")]
    return helper


async def _own_turn_waits(rt: so.Runtime) -> str:
    """A finished session whose subagent's own turn (a message to it) waits on a person: the
    session itself reads idle, and is refused all the same."""
    desk = await _finished(rt)
    [helper] = [s.id for s in await rt.sessions(agent="helper")]
    assert (await rt.generate(session_id=helper, prompt="refund 6", auth=ALICE)).pending
    return desk


async def _expired_tree(rt: so.Runtime) -> str:
    """`front` (TTL 60 s, passed) waits on `desk`, which waits on `helper`, which waits on a
    person: deleted, its expiry recorded first."""
    r = await rt.generate("front", prompt="go", auth=ALICE)
    assert r.status == "waiting"
    return r.session_id


async def _expired_under_a_live_turn(rt: so.Runtime) -> str:
    """`desk` (no TTL) waits on `helper` (TTL 60 s, passed), which waits on a person: refused,
    as the helper's expiry would let the desk's turn go on."""
    r = await rt.generate("desk", prompt="ask:refund 4", auth=ALICE)
    assert r.status == "waiting"
    return r.session_id


CASES: dict[str, tuple[str, Callable[[so.Runtime], Awaitable[str]], bool, str | None]] = {
    # name: (whose TTL is 60 s, the session made, force, the refusal or None)
    "waiting": ("front", _waiting, False, "SessionWaiting"),
    "waiting-forced": ("front", _waiting, True, None),
    "finished": ("front", _finished, False, None),
    "subagent": ("front", _subagents, False, "SubagentSession"),
    "subagent-forced": ("front", _subagents, True, "SubagentSession"),
    "own-turn-waits": ("front", _own_turn_waits, False, "SessionWaiting"),
    "expired-tree": ("front", _expired_tree, False, None),
    "expired-under-a-live-turn": ("helper", _expired_under_a_live_turn, False, "SessionWaiting"),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("loaded", [False, True])
async def test_the_refusal_found_first_is_the_deletions_and_records_nothing(
    store_url: str, case: str, loaded: bool
) -> None:
    ttl_of, make, force, refusal = CASES[case]
    clock = ManualClock()
    agents = nested_desks(ttl_of)
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        session_id = await make(rt)
        ids = [s.id for s in await rt.sessions()]
    clock.advance(120)
    async with so.Runtime(agents if loaded else [], store=store_url, clock=clock) as rt:
        heads = [await rt.store.head(s) for s in ids]
        found = await rt._deletion_refusal(session_id, force=force)
        assert [await rt.store.head(s) for s in ids] == heads  # nothing recorded
        assert (None if found is None else type(found).__name__) == refusal
        if found is None:
            deleted = await rt.delete_session(session_id, by=OPS, force=force)
            assert deleted[0] == session_id
            return
        with pytest.raises(type(found)) as refused:
            await rt.delete_session(session_id, by=OPS, force=force)
        assert str(refused.value) == str(found)
        assert [await rt.store.head(s) for s in ids] == heads


async def test_a_store_that_cannot_tell_beforehand_finds_no_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store without `check_deletion` (one written for an earlier signoff): the deletion
    itself says."""
    async with so.Runtime(nested_desks("front"), store="sqlite:///:memory:") as rt:
        session_id = await _waiting(rt)
        monkeypatch.setattr(type(rt.store), "check_deletion", None, raising=True)
        assert await rt._deletion_refusal(session_id) is None
        with pytest.raises(so.SessionWaiting):
            await rt.delete_session(session_id, by=OPS)
