"""Hostile calls through signoff's HTTP client: each raises the named exception the runtime would
and changes nothing; a reviewer the response policy refuses settles nothing.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import signoff as so
from signoff._client import AsyncClient

from ._security import (
    BIG,
    DEEP,
    STALE_HASH,
    Served,
    World,
    forged,
    nested,
    served,
    snapshot,
    world,
)
from .test_server_common import ALICE

__all__ = ["served", "world"]  # the fixtures, used by name


# -- the HTTP client ------------------------------------------------------------------------------

CLIENT_ATTACKS: dict[
    str, tuple[Callable[[AsyncClient, World], Awaitable[Any]], type[Exception]]
] = {
    "forged-id": (
        lambda c, w: c.respond(w.a, [{"request_id": forged(), "option_id": "approve"}]),
        so.UnknownRequest,
    ),
    "stale-hash": (
        lambda c, w: c.respond(
            w.a, [{"request_id": w.ra, "option_id": "approve", "input_hash": STALE_HASH}]
        ),
        so.StaleAnswer,
    ),
    "after-cancel": (
        lambda c, w: c.generate(session_id=w.c, approvals=[so.Decision(id=w.rc, approved=True)]),
        so.RequestClosed,
    ),
    "value-nan": (
        lambda c, w: c.respond(
            w.a, [{"request_id": w.ra, "option_id": "approve", "value": math.nan}]
        ),
        so.InvalidAnswer,
    ),
    "value-deeply-nested": (
        lambda c, w: c.respond(
            w.a, [{"request_id": w.ra, "option_id": "approve", "value": nested(DEEP)}]
        ),
        so.InvalidAnswer,
    ),
    "reason-lone-surrogate": (
        lambda c, w: c.generate(
            session_id=w.a, approvals=[so.Decision(id=w.ra, approved=True, reason="\ud800")]
        ),
        so.InvalidAnswer,
    ),
    "prompt-lone-surrogate": (lambda c, w: c.generate("support", "hi \udfff"), so.UsageError),
    # a session id is one path segment: what it holds must not reach another session
    "session-id-with-a-query": (
        lambda c, w: c.respond(f"{w.a}?x=1", [{"request_id": w.ra, "option_id": "approve"}]),
        so.UnknownSession,
    ),
    "session-id-with-a-fragment": (
        lambda c, w: c.generate(
            session_id=f"{w.a}#x", approvals=[so.Decision(id=w.ra, approved=True)]
        ),
        so.UnknownSession,
    ),
    "session-id-climbing": (
        lambda c, w: c.respond(f"{w.s}/../{w.a}", [{"request_id": w.ra, "option_id": "approve"}]),
        so.UnknownSession,
    ),
    "session-id-dot-dot": (lambda c, w: c.cancel(".."), so.UnknownSession),
    "session-id-empty": (lambda c, w: c.send("", "approve"), so.UnknownSession),
    # as in process (the runtime refuses such a prompt with `TooLarge` too)
    "huge-prompt": (lambda c, w: c.generate("support", "x" * BIG), so.TooLarge),
}


@pytest.mark.parametrize("name", sorted(CLIENT_ATTACKS))
async def test_the_client_raises_named_errors(served: Served, name: str) -> None:
    attack, error = CLIENT_ATTACKS[name]
    async with AsyncClient(  # the same app, through signoff's own client
        "http://signoff.test", token="alice-token", transport=served.transport
    ) as client:
        before = await snapshot(served.world.rt)
        with pytest.raises(error) as caught:
            await attack(client, served.world)
        assert type(caught.value) is error, f"{name}: {type(caught.value).__name__}"
        if isinstance(caught.value, so.TooLarge):
            assert caught.value.code == "payload_too_large"
        assert await snapshot(served.world.rt) == before, f"{name} changed the store"


async def test_a_reviewer_the_policy_refuses_settles_nothing(world: World) -> None:
    """A responder the tool's response policy refuses (here: not a manager) settles nothing; the
    attempt is kept on record (`approval.candidate`), by design, and nothing else changes."""
    rt = world.rt
    started = await rt.generate("finance", prompt="pay it", auth=ALICE)
    sid, rid = started.session_id, started.pending[0].id
    before = await snapshot(rt)
    reply = so.InputResponse(request_id=rid, option_id="approve")
    r = await rt.respond(sid, [reply], principal=ALICE)
    assert [(o.outcome, o.applied) for o in r.outcomes] == [("rejected", False)]
    assert r.status == "waiting"
    after = await snapshot(rt)
    assert after["requests"] == before["requests"]
    assert after["pending"] == before["pending"]
    assert {k: v for k, v in after["events"].items() if k != sid} == {
        k: v for k, v in before["events"].items() if k != sid
    }
    added = after["events"][sid][len(before["events"][sid]) :]
    assert after["events"][sid][: len(before["events"][sid])] == before["events"][sid]
    assert {e["type"] for e in added} <= {"approval.candidate", "turn.waiting"}, added
    assert not any(e["type"].startswith("tool.") for e in added)
