"""Hostile answers: forged, foreign, replayed, stale, oversized and malformed ones are refused
with a named exception (Python) or a 4xx with a stable code (HTTP), and the store is unchanged.

This file covers the Python API; test_security_http.py, test_security_client.py and
test_security_surface.py the HTTP API, the HTTP client and the rest of the HTTP surface.
Already covered elsewhere, not repeated here: the dashboard's CSRF tokens on its forms
(`test_dashboard.py::test_forms_without_the_csrf_token_are_refused`), its sign-in, and the status
codes alone of several bad bodies (`test_server_input.py`); these files add the "nothing changed"
check and the cases those tests do not reach.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import signoff as so

from ._security import (
    DEEP,
    RA,
    STALE_HASH,
    A,
    World,
    forged,
    nested,
    snapshot,
    world,
)
from .test_server_common import ALICE, BOB, MALLORY

__all__ = ["world"]  # the fixture, used by name


async def test_the_snapshot_sees_a_change(world: World) -> None:
    """The "nothing changed" check can fail: one more answer shows up in it."""
    before = await snapshot(world.rt)
    reply = so.InputResponse(request_id=world.ra, option_id="approve")
    await world.rt.respond(world.a, [reply], principal=ALICE, resume=False)
    after = await snapshot(world.rt)
    assert before["events"][world.a] != after["events"][world.a]
    assert before["requests"][world.ra] != after["requests"][world.ra]
    assert before["pending"] != after["pending"]
    assert before["audit"] != after["audit"]


# -- the Python API -------------------------------------------------------------------------------

Attack = Callable[[World], Awaitable[Any]]


def answer(
    sid: Callable[[World], str],
    rid: Callable[[World], str],
    who: so.Principal | None = ALICE,
    **extra: Any,
) -> Attack:
    async def attack(w: World) -> Any:
        reply = {"request_id": rid(w), "option_id": "approve", **extra}
        return await w.rt.respond(sid(w), [reply], principal=who)

    return attack


def decide(
    sid: Callable[[World], str],
    ids: Callable[[World], list[str]],
    who: so.Principal | None = ALICE,
    **extra: Any,
) -> Attack:
    async def attack(w: World) -> Any:
        decisions = [so.Decision(id=i, approved=True, **extra) for i in ids(w)]
        return await w.rt.generate(session_id=sid(w), approvals=decisions, auth=who)

    return attack


PY_ATTACKS: dict[str, tuple[Attack, type[Exception]]] = {
    # forged ids, well-formed and not
    "forged-id": (answer(A, lambda w: forged()), so.UnknownRequest),
    "forged-id-helix": (decide(A, lambda w: [forged()]), so.UnknownRequest),
    "malformed-id-sql": (answer(A, lambda w: "req_' OR '1'='1"), so.UnknownRequest),
    "malformed-id-path": (answer(A, lambda w: "../../req_x"), so.UnknownRequest),
    "malformed-id-nul": (answer(A, lambda w: "req_\x00"), so.UnknownRequest),
    "malformed-id-long": (answer(A, lambda w: "r" * 100_000), so.UnknownRequest),
    "malformed-id-empty": (answer(A, lambda w: ""), so.UnknownRequest),
    "forged-session": (answer(lambda w: "ses_" + uuid.uuid4().hex[:20], RA), so.UnknownSession),
    "forged-plus-real-in-one-batch": (
        decide(A, lambda w: [w.ra, forged()]),
        so.UnknownRequest,
    ),
    # a request of another session, answered through this one
    "other-session": (answer(A, lambda w: w.rb), so.UnknownRequest),
    "other-session-helix": (decide(A, lambda w: [w.rb]), so.UnknownRequest),
    "other-session-settled": (answer(A, lambda w: w.rs), so.UnknownRequest),
    # reviewers who may not settle: same tenant, other tenant, nobody
    "not-the-requester-same-tenant": (answer(A, RA, who=BOB), so.NotAllowed),
    "not-the-requester-other-tenant": (answer(A, RA, who=MALLORY), so.NotAllowed),
    "anonymous": (answer(A, RA, who=None), so.NotAllowed),
    "anonymous-helix": (decide(A, lambda w: [w.ra], who=None), so.NotAllowed),
    "anonymous-quorum-vote": (answer(lambda w: w.t, lambda w: w.rt_, who=None), so.NotAllowed),
    # replays onto closed requests
    "conflicting-replay": (
        answer(lambda w: w.s, lambda w: w.rs, option_id="cancel"),
        so.ConflictingAnswer,
    ),
    "after-cancel": (answer(lambda w: w.c, lambda w: w.rc), so.RequestClosed),
    "after-cancel-helix": (decide(lambda w: w.c, lambda w: [w.rc]), so.RequestClosed),
    "after-expiry": (answer(lambda w: w.x, lambda w: w.rx), so.RequestClosed),
    # the reviewer saw another call
    "stale-hash": (answer(A, RA, input_hash=STALE_HASH), so.StaleAnswer),
    "stale-hash-helix": (decide(A, lambda w: [w.ra], input_hash=STALE_HASH), so.StaleAnswer),
    "stale-hash-with-edit": (
        answer(
            A,
            RA,
            input_hash="md5:whatever",
            edited_input={"order_id": "1042", "amount": 1, "reason": "x"},
        ),
        so.StaleAnswer,
    ),
    "stale-hash-quorum": (
        answer(lambda w: w.t, lambda w: w.rt_, who=BOB, input_hash=STALE_HASH),
        so.StaleAnswer,
    ),
    # values that are not plain JSON
    "value-deeply-nested": (answer(A, RA, value=nested(DEEP)), so.InvalidAnswer),
    "value-nested-101": (answer(A, RA, value=nested(101)), so.InvalidAnswer),
    "value-nan": (answer(A, RA, value=math.nan), so.InvalidAnswer),
    "value-infinity": (answer(A, RA, value={"x": [math.inf]}), so.InvalidAnswer),
    "value-object": (answer(A, RA, value=object()), so.InvalidAnswer),
    "value-nested-helix": (decide(A, lambda w: [w.ra], value=nested(DEEP)), so.InvalidAnswer),
    "value-lone-surrogate": (answer(A, RA, value={"k": "\ud800"}), so.InvalidAnswer),
    "reason-lone-surrogate": (answer(A, RA, text="fine \udfff"), so.InvalidAnswer),
    "reason-lone-surrogate-helix": (
        decide(A, lambda w: [w.ra], reason="\ud800"),
        so.InvalidAnswer,
    ),
    "question-text-lone-surrogate": (
        answer(lambda w: w.q, lambda w: w.rq, option_id=None, text="\ud800"),
        so.InvalidAnswer,
    ),
    "prompt-lone-surrogate-new-session": (
        lambda w: w.rt.generate("support", prompt="hi \ud800", auth=ALICE),
        so.UsageError,
    ),
    "prompt-lone-surrogate-next-turn": (
        lambda w: w.rt.generate(session_id=w.s, prompt="\udfff", auth=ALICE),
        so.UsageError,
    ),
    "message-lone-surrogate": (
        lambda w: w.rt.send(w.a, "approve \ud800", principal=ALICE),
        so.UsageError,
    ),
    "edited-input-nan": (
        answer(A, RA, edited_input={"order_id": "1042", "amount": math.nan, "reason": "x"}),
        so.InvalidAnswer,
    ),
    "edited-input-unknown-field": (
        answer(A, RA, edited_input={"order_id": "1042", "amount": 1, "reason": "x", "admin": True}),
        so.InvalidAnswer,
    ),
    "question-with-an-approval-option": (
        answer(lambda w: w.q, lambda w: w.rq),
        so.InvalidAnswer,
    ),
}


@pytest.mark.parametrize("name", sorted(PY_ATTACKS))
async def test_python_api_refuses_and_changes_nothing(world: World, name: str) -> None:
    attack, error = PY_ATTACKS[name]
    before = await snapshot(world.rt)
    with pytest.raises(error) as caught:
        await attack(world)
    assert type(caught.value) is error, f"{name}: {type(caught.value).__name__}: {caught.value}"
    assert str(caught.value)
    assert await snapshot(world.rt) == before, f"{name} changed the store"


async def test_a_value_at_the_depth_limit_is_kept(world: World) -> None:
    """The nesting limit is a limit, not a refusal of nesting: 100 levels are recorded."""
    reply = so.InputResponse(request_id=world.ra, option_id="approve", value=nested(100))
    r = await world.rt.respond(world.a, [reply], principal=ALICE)
    assert r.status == "completed"
    stored = await world.rt.store.get_request(world.ra)
    assert stored is not None and stored.resolution is not None
    assert stored.resolution["value"] == nested(100)


REPLAYS: dict[str, Callable[[World], Awaitable[so.GenerateResult]]] = {
    "respond": lambda w: w.rt.respond(
        w.a, [so.InputResponse(request_id=w.ra, option_id="approve")], principal=ALICE
    ),
    "respond-without-resume": lambda w: w.rt.respond(
        w.a, [so.InputResponse(request_id=w.ra, option_id="approve")], principal=ALICE, resume=False
    ),
    "helix": lambda w: w.rt.generate(
        session_id=w.a, approvals=[so.Decision(id=w.ra, approved=True)], auth=ALICE
    ),
    "deny": lambda w: w.rt.respond(
        w.a, [so.InputResponse(request_id=w.ra, option_id="cancel", text="no")], principal=ALICE
    ),
}


@pytest.mark.parametrize("name", sorted(REPLAYS))
async def test_a_replayed_answer_is_a_no_op(world: World, name: str) -> None:
    first = await REPLAYS[name](world)
    assert [o.applied for o in first.outcomes] == [True]
    before = await snapshot(world.rt)
    for _ in range(2):
        again = await REPLAYS[name](world)
        assert [(o.request_id, o.applied) for o in again.outcomes] == [(world.ra, False)]
        assert again.outcomes[0].outcome == first.outcomes[0].outcome
    assert await snapshot(world.rt) == before, f"replaying {name} changed the store"
