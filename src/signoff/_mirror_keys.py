"""The idempotency keys of messages whose answers went through a mirror (a subagent's request
asked again in its parent). The subagent's session records the key with the answer, marked as
given through the mirror (`via`, `Via`), and the parent by a commit of its own after it
(`keep_vote_key`). A process killed between the two leaves the key in the subagent's session
alone, where the parent's calls stop looking once its next turn drops the mirror: the parent's
commit that closes or withdraws the mirror keeps it (`kept`), and a cancel or a steering
message looks again once recorded (`keep_late`), for a vote counted while it was recorded."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ._exceptions import StoreBusy, StoreError, StoreGone, StoreUnavailable, UnknownSession
from ._idempotency import KEPT, Keyed, free_for, key_fields, same_ask, seen
from ._recording import Batch, EventSpec
from ._state import SessionState
from ._state_parts import load_principal
from ._types import ChildRef, InputRequest, Principal

if TYPE_CHECKING:
    from ._answering import Answering
    from ._session_cache import SessionCache

__all__ = [
    "MAX_HOPS",
    "keep_late",
    "keep_vote_key",
    "kept",
    "keeping",
    "mirrored_keys",
    "voted_below",
    "voted_through",
    "voter",
]

MAX_HOPS = 100
"""How far down a chain of subagents a mirrored request is followed to the one it stands for."""


async def keep_vote_key(
    rt: Answering, parent: str, mirror: InputRequest, mark: Keyed, principal: Principal | None
) -> None:
    """Record in `parent` the key `mark` of the message whose answer to `mirror` the subagent's
    session recorded: on a `turn.waiting` of the turn still waiting on the mirror, or else on
    an `input.repeated` of the mirror's turn, however the mirror closed meanwhile (another
    answer made the quorum, a cancel or a steering message withdrew it) and the turn went on,
    as long as it is the session's. The parent, where the message was sent, then judges it sent
    again (`send`), as the child does. Nothing if the child does not hold the key, the parent
    records it (a hold for this message, `held_idem`, is recorded over), or a next turn started
    (the commit that closed or withdrew the mirror kept it). Either names its sender (`by`)."""
    ref = mirror.child
    assert ref is not None
    child = await rt._state(ref.session_id)
    if not same_ask((child.keys.get(mark[0]) or [None])[0], mark):
        return
    key = key_fields(mark)
    who = None if principal is None else principal.model_dump()

    def build(st: SessionState) -> Batch:
        turn = st.turn
        if not free_for(st.keys, mark) or turn is None or turn.id != mirror.turn_id:
            return Batch(specs=[])
        live = st.requests.get(mirror.id)
        if live is not None and live.status == "pending" and turn.status == "waiting":
            ids = [r.id for r in st.pending_requests()]
            data = {"on": "input", "request_ids": ids, "by": who, **key}
            return Batch(specs=[("turn.waiting", data)])
        # Closed, or the turn runs on: a `turn.waiting` would park it.
        return Batch(specs=[("input.repeated", {"request_id": mirror.id, "by": who, **key})])

    await rt._append(parent, build, durable=True, turn_id=mirror.turn_id)


async def voted_through(
    rt: Answering, state: SessionState, idem: Keyed, whose: Principal | None = None
) -> InputRequest | None:
    """The mirror of `state` (open or closed in its turn) through which the message keyed
    `idem` gave an answer that only a session down its way records, as given through it
    (`via`), or with no `via` (a signoff before fold 9 recorded it, marking none: taken as such
    an answer, as that signoff took it): a process died before `state`'s own record of the key,
    or the mirror closed in between. None if there is none: a key sent to a subagent's session
    itself (`via` 0) is another call here. `IdempotencyKeyReused`, naming `state`'s session,
    if the key came with another message through it. With `whose`, `idem` is a key in the
    scope an older signoff gave it (`Before.scope`), which was another person's as well: taken
    only where that session names `whose` as the sender (`voter`)."""
    for live in list(state.requests.values()):
        ref, hops = live.request.child, 1
        while ref is not None and hops <= MAX_HOPS:
            try:
                child = await rt._state(ref.session_id)
            except UnknownSession:
                break  # a subagent's session gone: it holds no key
            known = child.keys.get(idem[0])
            if (
                known is not None
                and (len(known) < 4 or known[3] >= hops)
                and (whose is None or _named(await voter(rt, ref, idem[0]), whose))
                and seen(child.keys, idem, state.id)
            ):
                return live.request
            below = child.requests.get(ref.request_id)
            ref, hops = None if below is None else below.request.child, hops + 1
    return None


def _voted_keys(child: SessionState, request: InputRequest, hops: int) -> list[list[Any]]:
    """The keys (their `kept` form) that `child`, a subagent's session, recorded in the turn
    that asked `request` for messages sent to the session `hops` mirrors above it, or further
    up (`Via`, its count from there on beside the key): not those sent to a session below,
    which are another call there, nor those a signoff before fold 9 recorded with no `via`."""
    return [
        [key, known[0], *([known[3] - hops] if known[3] > hops else [])]
        for key, known in child.keys.items()
        if known[1:2] == [request.turn_id] and len(known) > 3 and known[3] >= hops
    ]


_TRANSIENT = (StoreUnavailable, StoreBusy, StoreGone)


def _named(by: dict[str, Any] | None, whose: Principal) -> bool:
    """Whether `by`, a principal as an event records it, is `whose`."""
    return by is not None and whose.same_as(load_principal(by))


async def _below(rt: SessionCache, ref: ChildRef) -> tuple[SessionState, InputRequest] | None:
    """The session `ref` names and its request there; None if there is none, or if the store
    cannot read them (damaged, malformed, of a newer schema): such a session holds no key that
    can be kept, and a commit reading it first goes on as before. A store that cannot answer
    now raises."""
    try:
        child = await rt._state(ref.session_id)
        asked = await _asked(rt, child, ref)
    except UnknownSession:
        return None  # deleted
    except StoreError as exc:
        if isinstance(exc, _TRANSIENT):
            raise
        return None
    return None if asked is None else (child, asked)


async def mirrored_keys(
    rt: Answering, requests: Iterable[InputRequest]
) -> dict[str, list[list[Any]]]:
    """The keys the subagents' sessions recorded for each mirror among `requests` (by its id:
    `voted_below`), read before a commit that withdraws them (a cancel, a steering message),
    for it to keep (`keeping`), or after it (`keep_late`). A subagent's session the store
    cannot read holds none that can be kept (`_below`): the commit goes on as before."""
    out: dict[str, list[list[Any]]] = {}
    for r in requests:
        found = None if r.child is None else await _below(rt, r.child)
        if found is not None:
            out[r.id] = await voted_below(rt, *found)
    return out


async def voted_below(rt: Answering, child: SessionState, asked: InputRequest) -> list[list[Any]]:
    """`_voted_keys` of `child` for its request `asked`, and of each session further down the
    way `asked` mirrors: a vote through a chain of mirrors is recorded at its end first."""
    keys = _voted_keys(child, asked, 1)
    for hops in range(2, MAX_HOPS + 2):
        found = None if asked.child is None else await _below(rt, asked.child)
        if found is None:
            break
        child, asked = found
        known = {k[0] for k in keys}
        keys += [k for k in _voted_keys(child, asked, hops) if k[0] not in known]
    return keys


async def _asked(rt: SessionCache, child: SessionState, ref: ChildRef) -> InputRequest | None:
    """The request `ref` names in `child`, its session (read from the store once the session's
    next turn dropped it); None if there is none."""
    live = child.requests.get(ref.request_id)
    if live is not None:
        return live.request
    stored = await rt.store.get_request(ref.request_id)
    return None if stored is None else stored.request


def keeping(
    st: SessionState, specs: Sequence[EventSpec], voted: dict[str, list[list[Any]]]
) -> list[EventSpec]:
    """`specs`, a commit on `st`, with each `input.resolved` of a mirror keeping the keys
    `mirrored_keys` read for it (`kept`)."""
    out = list(specs)
    for i, (type_, data) in enumerate(specs):
        keys = voted.get(data.get("request_id", "")) if type_ == "input.resolved" else None
        more = kept(st, keys or [], data.get("idem"))
        if more:
            out[i] = (type_, {**data, **more})
    return out


def kept(st: SessionState, voted: list[list[Any]], mark: Sequence[str] | None) -> dict[str, Any]:
    """The `kept` field of the event that closes a mirror in `st`: the keys of `voted` that `st`
    does not hold (or holds only for their message, its answer gone down: `held_idem`), but the
    closing message's own (`mark`, its `idem`); the newest `KEPT`."""
    keys = [
        k for k in voted if free_for(st.keys, (k[0], k[1])) and (mark is None or k[0] != mark[0])
    ]
    return {"kept": keys[-KEPT:]} if keys else {}


_VOTES = ["approval.candidate", "approval.settled", "input.resolved", "input.repeated"]
"""The events that record a message's key with its answer, and who sent it (`by`)."""


async def voter(rt: SessionCache, ref: ChildRef, key: str) -> dict[str, Any] | None:
    """Who sent the message keyed `key` (its digest) whose answer a session down `ref`'s way
    recorded: the `by` of the event that recorded it there, in the turn that took it."""
    at: ChildRef | None = ref
    for _ in range(MAX_HOPS):
        found = None if at is None else await _below(rt, at)
        if at is None or found is None:
            return None
        child, asked = found
        known = child.keys.get(key)
        if known is not None:
            first = known[2] if len(known) > 2 and type(known[2]) is int else 1
            for e in await rt.store.read_events(at.session_id, first - 1, types=_VOTES):
                if (e.data.get("idem") or [None])[0] == key and e.data.get("by") is not None:
                    return dict(e.data["by"])
        at = asked.child
    return None


async def keep_late(
    rt: Answering,
    parent: str,
    mirrors: Sequence[InputRequest],
    before: dict[str, list[list[Any]]],
) -> None:
    """After a cancel or a steering message withdrew `mirrors` in `parent`, keeping the keys
    `mirrored_keys` read `before` its commit: record those their subagents' sessions recorded
    since, each on an `input.repeated` of the mirror's turn while it is the session's, by the
    person whose vote there recorded it (`voter`). A vote counted between that read and the
    commit, whose process died before its own commit here (`keep_vote_key`), would leave its
    key in the subagent's session alone."""
    mirrors = [r for r in mirrors if r.child is not None]
    if not mirrors:
        return
    now = await mirrored_keys(rt, mirrors)
    late = []
    for r in mirrors:
        had = {k[0] for k in before.get(r.id, [])}
        for k in now.get(r.id, []):
            if k[0] not in had:
                assert r.child is not None
                late.append((r, k, await voter(rt, r.child, k[0])))
    if not late:
        return

    def build(st: SessionState) -> list[EventSpec]:
        specs: list[EventSpec] = []
        done: set[str] = set()
        for r, k, by in late:
            if (
                st.turn is not None
                and st.turn.id == r.turn_id
                and k[0] not in done
                and free_for(st.keys, (k[0], k[1]))
            ):
                done.add(k[0])
                via = {"via": k[2]} if len(k) > 2 else {}
                specs.append(
                    ("input.repeated", {"request_id": r.id, "by": by, "idem": k[:2], **via})
                )
        return specs

    await rt._append(parent, build, durable=True, turn_id=late[0][0].turn_id)
