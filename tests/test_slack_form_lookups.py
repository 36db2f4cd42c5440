"""A form's press (Deny, free text) with `identify=`: Slack's `trigger_id` lasts three seconds,
so the form never waits on a slow first `users.info` lookup of who pressed. A check done within
`FORM_WAIT` comes first, as before (someone who may not answer is told, no form opens); a slower
one goes on after the form opened, and a form it refuses is turned into the reason, with no
submit button. Before, the form opened only once the lookup ended: a lookup of 2 s opened it
over 2 s after the press, past what is left of a trigger once Slack's delivery took its part."""

from __future__ import annotations

import time
from pathlib import Path

import signoff as so
from signoff.channels.slack import _clicks as clicks

from ._slack import FakeSlack, fake
from .test_slack_identity import U_ALICE, U_BOB, asked, notes, people, press

__all__ = ["fake", "people"]  # the fixtures, used by name

SLOW = 2.0  # seconds users.info takes: past FORM_WAIT, within LOOKUP_WITHIN


def _opened_after(fake: FakeSlack, pressed: float) -> float:
    """Seconds from the press to the views.open call."""
    (at,) = [t for (m, _), t in zip(fake.calls, fake.called_at, strict=True) if m == "views.open"]
    return at - pressed


async def test_a_slow_lookup_does_not_hold_the_form(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    """Bob, never looked up, presses Deny while users.info takes 2 s: the form opens within
    FORM_WAIT of the press, and stays open (four eyes: he may answer Alice's call)."""
    fake.slow["users.info"] = SLOW
    approval = so.always(exclude_requester=True)
    async with asked(store_url, tmp_path, fake, [], approval) as (_rt, req, slack, _hub):
        pressed = time.monotonic()
        await press(slack, req.id, U_BOB, action_id="signoff.deny", trigger="t1")
    assert _opened_after(fake, pressed) < clicks.FORM_WAIT + 0.5 < SLOW
    assert len(fake.of("users.info")) == 1  # the lookup still ran, once
    assert fake.of("views.update") == [] and notes(fake) == []


async def test_a_form_a_slow_check_refuses_becomes_the_reason(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    """Alice asked (four eyes) and presses Deny on her own call while users.info is slow: the
    form opens at once, then turns into the refusal (no submit button), and she is told in a
    note too."""
    fake.slow["users.info"] = SLOW
    approval = so.always(exclude_requester=True)
    async with asked(store_url, tmp_path, fake, [], approval) as (rt, req, slack, _hub):
        pressed = time.monotonic()
        await press(slack, req.id, U_ALICE, action_id="signoff.deny", trigger="t1")
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
    assert _opened_after(fake, pressed) < clicks.FORM_WAIT + 0.5
    why = f"You may not answer this request: request {req.id}: the requester may not approve"
    (update,) = fake.of("views.update")
    assert update["view_id"] == "V1" and "submit" not in update["view"]
    assert update["view"]["blocks"][0]["text"]["text"].startswith(why)
    (note,) = notes(fake)
    assert note.startswith(why)


async def test_a_quick_check_still_refuses_before_any_form_opens(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    """A lookup within FORM_WAIT: Alice is refused at once, and no form opens."""
    approval = so.always(exclude_requester=True)
    async with asked(store_url, tmp_path, fake, [], approval) as (_rt, req, slack, _hub):
        await press(slack, req.id, U_ALICE, action_id="signoff.deny", trigger="t1")
    assert fake.of("views.open") == [] and fake.of("views.update") == []
    (note,) = notes(fake)
    assert note.startswith(f"You may not answer this request: request {req.id}")
