"""A request nearing its deadline is warned about (`request.expiring`) once: a hub started
again on the same state, the request still open, does not warn again. A delivery's `at` is on
the runtime's clock, as the request's own times and the warning's timing are: on PostgreSQL
the database's, however far this machine's clock (which signs deliveries) is off it."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub, WebhookChannel, verify_webhook
from signoff.channels import _given_up as given_up
from signoff.testing import ManualClock

from .test_webhooks import SECRET, Receiver, manual, refund_agent


async def test_a_restarted_hub_does_not_warn_of_an_expiry_again(tmp_path: Path) -> None:
    clock = ManualClock()
    state = tmp_path / "hub.db"
    async with (
        Receiver([]) as receiver,
        so.Runtime(
            [refund_agent(expires_in=3600)], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock
        ) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, expiring_within=600, clock=clock)
        async with manual(ChannelHub(rt, [hooks], state=state, clock=clock)) as hub:
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            clock.advance(3100)  # within 600 s of the deadline
            await hub.poll()
            await hooks.drain()
        clock.advance(60)
        again = WebhookChannel(receiver.url, SECRET, expiring_within=600, clock=clock)
        async with manual(ChannelHub(rt, [again], state=state, clock=clock)) as hub:
            await hub.poll()
            clock.advance(60)
            await hub.poll()
            await again.drain()
        payloads = [
            verify_webhook(SECRET, h, b, now=clock.now, tolerance=4000)
            for h, b in receiver.accepted
        ]
        assert [p["type"] for p in payloads] == ["request.opened", "request.expiring"]


SKEWS = [pytest.param(3600.0, id="an-hour-ahead"), pytest.param(-3600.0, id="an-hour-behind")]


@pytest.mark.parametrize("skew", SKEWS)
async def test_a_warning_is_timed_by_a_clock_given_to_the_runtime(
    store_url: str, skew: float
) -> None:
    """The runtime keeps a clock an hour off this machine's: the warning comes 500 s before
    the deadline by that clock, and says so (`expires_at - at`); it said the request had
    expired an hour ago, or had an hour and more left. Deliveries are signed by this machine's
    clock, which the receiver's is compared with."""
    clock = ManualClock(time.time() + skew)
    async with (
        Receiver([]) as receiver,
        so.Runtime([refund_agent(expires_in=3600)], store=store_url, clock=clock) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, expiring_within=600)
        async with manual(ChannelHub(rt, [hooks])) as hub:
            r = await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            clock.advance(3100)  # within 600 s of the deadline
            await hub.poll()
            await hooks.drain()
        opened, expiring = [verify_webhook(SECRET, h, b) for h, b in receiver.accepted]
    (req,) = r.pending
    assert (opened["type"], expiring["type"]) == ("request.opened", "request.expiring")
    assert opened["at"] == req.created_at == clock.now - 3100
    assert expiring["at"] == clock.now
    assert expiring["request"]["expires_at"] - expiring["at"] == 500


@pytest.mark.parametrize("skew", SKEWS)
async def test_a_warning_is_timed_by_the_database_clock(pg_store_url: str, skew: float) -> None:
    """On PostgreSQL, a process whose machine's clock is an hour off the database's: the
    warning's `at` is the database's time, seconds before the deadline it warns of."""
    wall = time.time

    def off() -> float:
        return wall() + skew

    async with (
        Receiver([]) as receiver,
        so.Runtime([refund_agent(expires_in=600)], store=pg_store_url) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, expiring_within=900, clock=off)
        async with manual(ChannelHub(rt, [hooks])) as hub:
            before = wall()
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()  # opened, and within 900 s of its deadline at once
            after = wall()
            await hooks.drain()
        payloads: list[dict[str, Any]] = [
            verify_webhook(SECRET, h, b, now=off()) for h, b in receiver.accepted
        ]
    assert [p["type"] for p in payloads] == ["request.opened", "request.expiring"]
    for p in payloads:
        assert before - 1 <= p["at"] <= after + 1, (p["at"] - before, skew)
    left = payloads[1]["request"]["expires_at"] - payloads[1]["at"]
    assert 600 - (after - before) - 1 <= left <= 600


async def test_a_warning_the_state_keeps_failing_is_logged_once_and_sent_once_it_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The state fails at each tick that checks whether a request was warned of: the tick is
    tried again at each poll, but logged when it starts failing and once it works (then the
    warning goes), not with a traceback every `poll_interval`."""
    clock = ManualClock()
    async with (
        Receiver([]) as receiver,
        so.Runtime(
            [refund_agent(expires_in=3600)], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock
        ) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, expiring_within=600, clock=clock)
        hub = ChannelHub(rt, [hooks], state=tmp_path / "hub.db", clock=clock)
        broken = _warned_failing(hub, monkeypatch)
        async with manual(hub):
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            clock.advance(3100)  # within 600 s of the deadline
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="signoff.channels"):
                for _ in range(5):
                    await hub.poll()
                broken.clear()
                await hub.poll()
                await hub.poll()
            await hooks.drain()
        types = [json.loads(b)["type"] for _, b in receiver.accepted]
        assert types == ["request.opened", "request.expiring"]
        logged = [(r.levelname, r.getMessage()) for r in caplog.records]
        assert len(logged) == 2, logged
        assert logged[0][0] == "WARNING" and "malformed" in logged[0][1]
        assert logged[1][0] == "INFO" and "works again" in logged[1][1]


async def test_a_request_row_the_store_cannot_read_holds_back_no_warning_nor_redelivery(
    store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A's row is damaged (`StoreDamaged` when read) while it waits to be warned of: each tick
    failed on it, so B (open, and due) was never warned of, and C's opening (given up on) was
    not sent again, until A's deadline passed. A is passed, logged once naming it and its
    session; B and C are warned of and C's opening is sent again."""
    from .test_store_edited_rows import edit

    clock = ManualClock()
    async with (
        Receiver([]) as receiver,
        so.Runtime([refund_agent(expires_in=3600)], store=store_url, clock=clock) as rt,
    ):
        hooks = WebhookChannel(
            receiver.url, SECRET, expiring_within=600, clock=clock, max_attempts=1, sleep=_instantly
        )
        async with manual(ChannelHub(rt, [hooks], clock=clock)) as hub:
            a = (await rt.generate("support", prompt="Refund A")).pending[0]
            b = (await rt.generate("support", prompt="Refund B")).pending[0]
            await hub.poll()
            await hooks.drain()
            receiver.statuses = [503]  # C's opening is given up on
            c = (await rt.generate("support", prompt="Refund C")).pending[0]
            await hub.poll()
            await hooks.drain()
            edit(store_url, "UPDATE {t}requests SET data = {p} WHERE id = {p}", b"{broken", a.id)
            monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
            clock.advance(3100)  # within 600 s of every deadline
            with caplog.at_level(logging.WARNING, logger="signoff.channels"):
                for _ in range(3):
                    await hub.poll()
                    await hooks.drain()
            stored = await rt.store.get_request(b.id)
            assert stored is not None and stored.status == "pending"  # B is still due
        names = {a.id: "A", b.id: "B", c.id: "C"}
        got = [json.loads(body) for _, body in receiver.accepted]
        sent = sorted((p["type"], names[p["request"]["id"]]) for p in got)
        assert sent == [
            ("request.expiring", "B"),
            ("request.expiring", "C"),
            ("request.opened", "A"),
            ("request.opened", "B"),
            ("request.opened", "C"),
        ]
        passed = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
        assert len(passed) == 1, passed
        assert a.id in passed[0] and a.session_id in passed[0]


def _warned_failing(hub: ChannelHub, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Make `hub`'s state fail each read of whether a request was warned of, while the list
    returned holds an item (empty it: the state works again)."""
    read = hub.state.recall
    broken = [True]

    def recall(channel: str, key: str, **hub: str) -> Any:
        if key.startswith("warned:") and broken:
            raise so.StoreError("channel state: database disk image is malformed")
        return read(channel, key, **hub)

    monkeypatch.setattr(hub.state, "recall", recall)
    return broken


async def _instantly(seconds: float) -> None:
    return None


async def test_a_warning_that_fails_holds_back_no_round_of_redelivery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state fails to read whether a request was warned of, at every tick: the tick
    stopped there, before its round of the deliveries given up on, so B's opening was not sent
    again while the warning failed. It is; the warning goes once the state works."""
    clock = ManualClock()
    async with (
        Receiver([]) as receiver,
        so.Runtime(
            [refund_agent(expires_in=3600)], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock
        ) as rt,
    ):
        hooks = WebhookChannel(
            receiver.url, SECRET, expiring_within=600, clock=clock, max_attempts=1, sleep=_instantly
        )
        hub = ChannelHub(rt, [hooks], state=tmp_path / "hub.db", clock=clock)
        broken = _warned_failing(hub, monkeypatch)
        async with manual(hub):
            await rt.generate("support", prompt="Refund A")
            await hub.poll()
            await hooks.drain()
            receiver.statuses = [503]  # B's opening is given up on
            await rt.generate("support", prompt="Refund B")
            await hub.poll()
            await hooks.drain()
            monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
            clock.advance(3100)  # within 600 s of the deadlines: each warning fails
            for _ in range(2):
                await hub.poll()
                await hooks.drain()
            types = [json.loads(b)["type"] for _, b in receiver.accepted]
            assert types == ["request.opened", "request.opened"]
            broken.clear()
            await hub.poll()
            await hooks.drain()
        types = [json.loads(b)["type"] for _, b in receiver.accepted]
        assert types == ["request.opened"] * 2 + ["request.expiring"] * 2


async def test_a_warning_given_up_on_is_not_sent_once_its_deadline_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warning given up on while its receiver was down was sent again by a later round after
    the request's deadline passed, as long as no sweep had recorded the expiry (the request still
    `pending` with that deadline): "expires in 200 s" of a request 200 s past it. Dropped now,
    as one whose request closed is."""
    clock = ManualClock()
    async with (
        Receiver([204, 500]) as receiver,  # the opening taken; the warning's one attempt fails
        so.Runtime(
            [refund_agent(expires_in=600)], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock
        ) as rt,
    ):
        hooks = WebhookChannel(
            receiver.url, SECRET, expiring_within=300, clock=clock, max_attempts=1, sleep=_instantly
        )
        async with manual(ChannelHub(rt, [hooks], state=tmp_path / "hub.db", clock=clock)) as hub:
            r = await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
            clock.advance(400)  # within 300 s of the deadline: warned, and given up on
            await hub.poll()
            await hooks.drain()
            clock.advance(400)  # the deadline passed 200 s ago, unrecorded; the receiver is back
            monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
            for _ in range(3):
                await hub.poll()
                await hooks.drain()
            (req,) = r.pending
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.status == "pending"  # nothing recorded it
        sent = [json.loads(b)["type"] for _, b in receiver.attempts]
        assert sent == ["request.opened", "request.expiring"]  # the one failed attempt, no more


@pytest.mark.parametrize("sent_by", ["round", "restart"])
async def test_a_warning_given_up_on_is_not_sent_after_its_request_closed(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sent_by: str
) -> None:
    """The receiver is down as a request with a close deadline opens: its opening and its
    warning are given up on. Back up, it gets the request's close, then (a round, or a start
    on the state) the opening kept: the warning kept goes unsent, from the state and the store
    alike, as README says it is sent only while the request is open with that deadline. It
    was sent after the close, warning of a deadline the request no longer had."""
    state = tmp_path / "hub.db"
    async with (
        Receiver([503] * 4) as receiver,
        so.Runtime([refund_agent(expires_in=120)], store=store_url) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, max_attempts=2, sleep=_instantly)
        async with manual(ChannelHub(rt, [hooks], state=state)) as hub:
            r = await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
            await hub.poll()
            await hooks.drain()
            assert [json.loads(b)["type"] for _, b in receiver.attempts] == [
                "request.opened",
                "request.opened",
                "request.expiring",
                "request.expiring",
            ]  # both given up on
            (req,) = r.pending
            await rt.respond(
                r.session_id, [so.InputResponse(request_id=req.id, option_id="approve")]
            )
            await hub.poll()
            await hooks.drain()
            if sent_by == "round":
                monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
                for _ in range(4):
                    await hub.poll()
                    await hooks.drain()
        for fresh in (state, None):  # the same state, then one taking the store's copies over
            again = WebhookChannel(receiver.url, SECRET, sleep=_instantly)
            async with manual(ChannelHub(rt, [again], state=fresh)) as hub:
                await hub.poll()
                await again.drain()
        sent = [
            (json.loads(b)["type"], json.loads(b)["request"]["status"])
            for _, b in receiver.accepted
        ]
        assert sent == [("request.resolved", "settled"), ("request.opened", "pending")]
