"""The race the replaced-turn tests share: while one runtime drives a session's turn (holding
its lease), another cancels that turn and starts a new one, which it cannot run meanwhile. The
first drive must then record nothing more into the session."""

from __future__ import annotations

import signoff as so

ALICE = so.Principal(authenticator="okta", principal_id="alice")


async def replace_turn(other: so.Runtime, session_id: str, prompt: str = "Try again") -> str:
    """Cancel the session's turn from `other` and start a new one with `prompt`; returns its id.
    `other` needs `lease_wait=0`: the first drive still holds the lease, so the new turn is left
    `running` for whoever drives the session next."""
    assert (await other.cancel(session_id, "changed my mind")).status == "cancelled"
    again = await other.generate(session_id=session_id, prompt=prompt, auth=ALICE)
    assert again.status == "running" and again.turn_id is not None, again
    return again.turn_id


async def assert_only_the_new_turn(rt: so.Runtime, session_id: str, new_turn: str) -> so.Event:
    """The session loads, every event from the new turn's start on is that turn's, and its audit
    chain verifies; returns the new turn's start."""
    await rt.state(session_id)
    log = [e async for e in rt.events(session_id, follow=False)]
    start = next(i for i, e in enumerate(log) if e.type == "turn.started" and e.turn_id == new_turn)
    strays = [(e.seq, e.type, e.turn_id) for e in log[start:] if e.turn_id != new_turn]
    assert strays == [], strays
    assert await rt.verify_audit(session_id) == []
    return log[start]


async def assert_told_cancelled(
    rt: so.Runtime, session_id: str, first: so.GenerateResult, new_turn: str, text: str
) -> None:
    """The first drive's caller is told its own turn was cancelled, not the new turn's result;
    that drive still ran the new turn (left to it) to its end, with `text`."""
    log = [e async for e in rt.events(session_id, follow=False)]
    [old] = [e.turn_id for e in log if e.type == "turn.started" and e.turn_id != new_turn]
    assert (first.status, first.turn_id, first.text, first.pending) == ("cancelled", old, "", [])
    turn = (await rt.state(session_id)).turn
    assert turn is not None
    assert (turn.id, turn.status, turn.text) == (new_turn, "completed", text)
