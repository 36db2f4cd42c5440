"""Webhook deliveries kept in the channel state: sent again after a restart, never dropped by
another hub, carried over an upgrade, and backfilled once."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import (
    ChannelHub,
    ChannelState,
    WebhookChannel,
    verify_webhook,
)
from signoff.testing import ManualClock

from .test_webhooks import SECRET, Receiver, manual, refund_agent


async def test_a_delivery_given_up_on_is_sent_again_when_the_hub_next_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Like Slack's posts: a delivery that ran out of attempts is logged as an error and kept in
    the hub's state, sent again (same delivery id) on the next start, and then forgotten."""

    async def sleep(seconds: float) -> None:
        return None

    state = tmp_path / "hub.db"
    async with (
        Receiver([503, 503]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, max_attempts=2, sleep=sleep)
        async with manual(ChannelHub(rt, [hooks], state=state)) as hub:
            r = await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
        assert (hooks.delivered, hooks.failed, receiver.accepted) == (0, 1, [])
        assert "gave up on" in caplog.text
        for _ in range(2):  # sent on the first start after, not again on the second
            again = WebhookChannel(receiver.url, SECRET, sleep=sleep)
            async with manual(ChannelHub(rt, [again], state=state)):
                await asyncio.wait_for(again.drain(), 10)
        ((headers, body),) = receiver.accepted
        payload = verify_webhook(SECRET, headers, body)
        assert payload["request"]["id"] == r.pending[0].id
        assert {h["Signoff-Delivery"] for h, _ in receiver.attempts} == {payload["id"]}


async def test_deliveries_kept_are_sent_by_a_later_poll_when_reading_them_failed_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The channel state fails once (locked too long) as the hub starts and reads the
    deliveries an earlier run kept: no start is left to send them, so a later poll reads them
    again, rather than leaving them until the process next starts."""

    async def sleep(seconds: float) -> None:
        return None

    state = tmp_path / "hub.db"
    async with (
        Receiver([503, 503]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, max_attempts=2, sleep=sleep)
        async with manual(ChannelHub(rt, [hooks], state=state)) as hub:
            r = await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
        assert receiver.accepted == []
        again = WebhookChannel(receiver.url, SECRET, sleep=sleep)
        hub = ChannelHub(rt, [again], state=state)
        read = hub.state.memos
        failed: list[str] = []

        def memos(channel: str, prefix: str = "", **hub: str) -> list[tuple[str, Any]]:
            if prefix == "outbox:" and not failed:
                failed.append(prefix)
                raise so.StoreError("channel state: database is locked")
            return read(channel, prefix, **hub)

        monkeypatch.setattr(hub.state, "memos", memos)
        async with manual(hub):
            assert failed  # the start failed (logged by the hub)
            await hub.poll()
            await asyncio.wait_for(again.drain(), 10)
            ((headers, body),) = receiver.accepted
            assert verify_webhook(SECRET, headers, body)["request"]["id"] == r.pending[0].id
            await hub.poll()  # read once
            await asyncio.wait_for(again.drain(), 10)
            assert len(receiver.accepted) == 1


async def test_reading_kept_deliveries_that_keeps_failing_is_logged_once_not_at_every_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The state fails each time the hub reads the deliveries an earlier run kept: each poll
    tries again, but the failure is logged when it starts, again when its error changes, and
    once it works (then the delivery goes), not every `poll_interval`."""

    async def sleep(seconds: float) -> None:
        return None

    state = tmp_path / "hub.db"
    async with (
        Receiver([503]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, max_attempts=1, sleep=sleep)
        async with manual(ChannelHub(rt, [hooks], state=state)) as hub:
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
        again = WebhookChannel(receiver.url, SECRET, sleep=sleep)
        hub = ChannelHub(rt, [again], state=state)
        read = hub.state.memos
        error = ["database is locked"]

        def memos(channel: str, prefix: str = "", **hub: str) -> list[tuple[str, Any]]:
            if prefix == "outbox:" and error:
                raise so.StoreError(f"channel state: {error[0]}")
            return read(channel, prefix, **hub)

        monkeypatch.setattr(hub.state, "memos", memos)
        caplog.clear()
        caplog.set_level(logging.INFO, logger="signoff.channels")
        async with manual(hub):
            for _ in range(5):
                await hub.poll()
            error[0] = "disk I/O error"
            for _ in range(5):
                await hub.poll()
            assert receiver.accepted == []
            error.clear()
            await hub.poll()
            await asyncio.wait_for(again.drain(), 10)
            assert len(receiver.accepted) == 1
            for _ in range(3):
                await hub.poll()
        logged = [
            (r.levelname, r.getMessage())
            for r in caplog.records
            if r.levelname != "DEBUG" and "it keeps" in r.getMessage()
        ]
        assert len(logged) == 3, logged
        assert "database is locked" in logged[0][1] and logged[0][0] == "WARNING"
        assert "disk I/O error" in logged[1][1] and logged[1][0] == "WARNING"
        assert logged[2][0] == "INFO" and "works again" in logged[2][1]
        failures = [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
        assert len(failures) == 2, [r.getMessage() for r in failures]


async def test_a_deadline_open_at_start_is_warned_of_though_reading_the_state_failed_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the kept deliveries failed as the hub started: the deadlines of the requests
    open then were not taken either, so none of them was warned of."""
    clock = ManualClock()
    state = tmp_path / "hub.db"
    async with (
        Receiver([]) as receiver,
        so.Runtime(
            [refund_agent(expires_in=3600)], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock
        ) as rt,
    ):
        await rt.generate("support", prompt="Refund 1042")
        hooks = WebhookChannel(receiver.url, SECRET, expiring_within=600, clock=clock)
        hub = ChannelHub(rt, [hooks], state=state, clock=clock)
        read = hub.state.memos
        failed: list[str] = []

        def memos(channel: str, prefix: str = "", **hub: str) -> list[tuple[str, Any]]:
            if prefix == "outbox:" and not failed:
                failed.append(prefix)
                raise so.StoreError("channel state: database is locked")
            return read(channel, prefix, **hub)

        monkeypatch.setattr(hub.state, "memos", memos)
        async with manual(hub):
            assert failed
            clock.advance(3100)
            await hub.poll()
            await asyncio.wait_for(hooks.drain(), 10)
        ((headers, body),) = receiver.accepted
        payload = verify_webhook(SECRET, headers, body, now=clock.now, tolerance=4000)
        assert payload["type"] == "request.expiring"


async def test_a_refused_delivery_is_not_kept(tmp_path: Path) -> None:
    """A 4xx is the receiver's final word: it is not sent again on the next start."""
    async with (
        Receiver([400]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [hooks], state=tmp_path / "hub.db")) as hub:
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
        again = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [again], state=tmp_path / "hub.db")):
            await asyncio.wait_for(again.drain(), 10)
        assert len(receiver.attempts) == 1 and receiver.accepted == []


async def test_an_unsent_delivery_to_a_url_with_a_space_is_sent_on_the_next_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A URL may hold a space (in its query, say): the kept delivery still names that URL, so
    the next start sends it rather than dropping it as no longer configured."""

    async def sleep(seconds: float) -> None:
        return None

    state = tmp_path / "hub.db"
    async with (
        Receiver([503]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        url = receiver.url + "?team=ops desk"
        hooks = WebhookChannel(url, SECRET, max_attempts=1, sleep=sleep)
        async with manual(ChannelHub(rt, [hooks], state=state)) as hub:
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
        assert receiver.accepted == []
        again = WebhookChannel(url, SECRET, sleep=sleep)
        async with manual(ChannelHub(rt, [again], state=state)):
            await asyncio.wait_for(again.drain(), 10)
    assert "no longer configured" not in caplog.text
    ((headers, body),) = receiver.accepted
    assert verify_webhook(SECRET, headers, body)["type"] == "request.opened"


async def test_an_expiry_warning_the_state_could_not_keep_is_sent_on_the_next_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A channel state that fails once (locked too long) while a warning is queued: the
    warning was marked sent and its deadline dropped first, so it was never sent."""
    clock = ManualClock()
    async with (
        Receiver([]) as receiver,
        so.Runtime(
            [refund_agent(expires_in=3600)], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock
        ) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, expiring_within=600, clock=clock)
        async with manual(ChannelHub(rt, [hooks], state=tmp_path / "hub.db", clock=clock)) as hub:
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
            clock.advance(3100)
            keep = hooks.state.remember
            failed: list[str] = []

            def remember(channel: str, key: str, value: Any, **hub: str) -> None:
                if key.startswith("outbox:") and not failed:
                    failed.append(key)
                    raise so.StoreError("channel state: database is locked")
                keep(channel, key, value, **hub)

            monkeypatch.setattr(hooks.state, "remember", remember)
            await hub.poll()  # the tick fails (logged by the hub)
            assert failed
            await hub.poll()
            await hooks.drain()
        payloads = [
            verify_webhook(SECRET, h, b, now=clock.now, tolerance=4000)
            for h, b in receiver.accepted
        ]
        assert [p["type"] for p in payloads] == ["request.opened", "request.expiring"]


async def test_an_opening_the_state_could_not_keep_is_sent_when_the_hub_retries_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delivery was marked queued before it was kept: when keeping it failed, the hub's
    retry of the entry found it "already queued", and the receiver never heard of it."""
    async with (
        Receiver([]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET)
        hub = ChannelHub(rt, [hooks], state=tmp_path / "hub.db", retry_backoff=0)
        async with manual(hub):
            keep = hooks.state.remember
            failed: list[str] = []

            def remember(channel: str, key: str, value: Any, **hub: str) -> None:
                if key.startswith("outbox:") and not failed:
                    failed.append(key)
                    raise so.StoreError("channel state: database is locked")
                keep(channel, key, value, **hub)

            monkeypatch.setattr(hooks.state, "remember", remember)
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()  # on_requested fails: the hub retries the entry
            assert failed
            await hub.poll()
            await asyncio.wait_for(hooks.drain(), 10)
        ((headers, body),) = receiver.accepted
        assert verify_webhook(SECRET, headers, body)["type"] == "request.opened"


async def test_a_delivery_posted_but_not_recorded_is_posted_again_with_the_same_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash between the receiver's 2xx and forgetting the kept delivery (here: forgetting
    fails) posts it again on the next start: the same `Signoff-Delivery` and payload `id`, a
    body that verifies, so the receiver can drop the duplicate."""
    state = tmp_path / "hub.db"
    async with (
        Receiver([]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [hooks], state=state)) as hub:
            keep = hooks.state.forget

            def forget(channel: str, key: str, **hub: str) -> None:
                if key.startswith("outbox:"):
                    raise so.StoreError("channel state: disk I/O error")
                keep(channel, key, **hub)

            monkeypatch.setattr(hooks.state, "forget", forget)
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
        monkeypatch.undo()
        again = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [again], state=state)):
            await asyncio.wait_for(again.drain(), 10)
    kept = ChannelState(state)
    assert kept.memos("webhooks", "outbox:") == []  # sent the second time, and forgotten
    kept.close()
    first, second = receiver.accepted
    assert first[0]["Signoff-Delivery"] == second[0]["Signoff-Delivery"]
    ids = {verify_webhook(SECRET, h, b)["id"] for h, b in receiver.accepted}
    assert ids == {first[0]["Signoff-Delivery"]}


async def test_a_delivery_not_recorded_is_logged_as_delivered_not_as_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The receiver's 2xx came and only forgetting the kept delivery failed (the state's disk):
    the error says it was delivered and is sent again on the next start, not that delivering
    it failed (which had the operator look at a receiver that took it)."""
    async with (
        Receiver([]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [hooks], state=tmp_path / "hub.db")) as hub:
            keep = hooks.state.forget

            def forget(channel: str, key: str, **hub: str) -> None:
                if key.startswith("outbox:"):
                    raise so.StoreError("channel state: disk I/O error")
                keep(channel, key, **hub)

            monkeypatch.setattr(hooks.state, "forget", forget)
            with caplog.at_level("ERROR", logger="signoff.channels"):
                await rt.generate("support", prompt="Refund 1042")
                await hub.poll()
                await hooks.drain()
            monkeypatch.undo()
        (delivery,) = {h["Signoff-Delivery"] for h, _ in receiver.accepted}
    lines = [r.getMessage() for r in caplog.records if delivery in r.getMessage()]
    assert lines == [
        f"webhook {receiver.url}: {delivery} was delivered, but the hub's state or the store "
        "could not record it; it is sent again when the hub next starts"
    ]


class DownOnOpening(WebhookChannel):
    """A webhook channel whose first `on_requested` fails (its state was locked, say)."""

    def __init__(self, *args: Any, down: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.down = down

    async def on_requested(self, request: so.InputRequest) -> None:
        if self.down:
            self.down = False
            raise RuntimeError("down")
        await super().on_requested(request)


async def test_an_opening_delivered_again_after_the_close_is_not_warned_about(
    tmp_path: Path, store_url: str
) -> None:
    """The hub gives up on a request's opening, and delivers it again at its next start, after
    its close: no `request.expiring` for the closed request, and no `warned:` memo that nothing
    would ever drop (the close was delivered before)."""
    clock = ManualClock()
    state = tmp_path / "channels.db"
    async with (
        Receiver([]) as receiver,
        so.Runtime([refund_agent(expires_in=3600)], store=store_url, clock=clock) as rt,
    ):
        hooks = DownOnOpening(receiver.url, SECRET, expiring_within=600, clock=clock, down=True)
        hub = ChannelHub(rt, [hooks], state=state, clock=clock, max_attempts=1)
        async with manual(hub):
            r = await rt.generate("support", prompt="Refund 1042")
            (req,) = r.pending
            await hub.poll()  # the opening is given up on
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="cancel")],
                principal=so.Principal(authenticator="web", principal_id="bob"),
            )
            await hub.poll()
        clock.advance(3100)  # within `expiring_within` of the deadline the request had
        again = DownOnOpening(receiver.url, SECRET, expiring_within=600, clock=clock, down=False)
        async with manual(ChannelHub(rt, [again], state=state, clock=clock)) as hub:
            await hub.poll()  # the opening again, then a tick
            await hub.poll()
            await again.drain()
            assert again.recall(f"warned:{req.id}") is None
    types = [json.loads(b)["type"] for _, b in receiver.accepted]
    assert sorted(types) == ["request.opened", "request.resolved"]


# -- hubs of different names on one state file -------------------------------------------------


async def test_a_hub_never_drops_the_unsent_deliveries_of_another_hub_sharing_its_state(
    store_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two hubs (different names) on one file, each with a webhook channel named `webhooks`
    posting to its own URL: the other's start dropped the first's kept delivery as "no longer
    configured", and the first's next start had nothing left to send."""

    async def sleep(seconds: float) -> None:
        return None

    state = tmp_path / "hub.db"
    async with (
        Receiver([503]) as ours,
        Receiver([]) as theirs,
        so.Runtime([refund_agent()], store=store_url) as rt,
    ):
        hooks = WebhookChannel(ours.url, SECRET, max_attempts=1, sleep=sleep)
        async with manual(ChannelHub(rt, [hooks], state=state, name="ops")) as hub:
            r = await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
        assert ours.accepted == []  # given up on: kept for the next start of `ops`
        others = WebhookChannel(theirs.url, SECRET, sleep=sleep)
        async with manual(ChannelHub(rt, [others], state=state, name="audit")) as hub:
            assert others.memos("outbox:") == []  # `ops`'s delivery is not this hub's
            await hub.poll()
            await asyncio.wait_for(others.drain(), 10)
        assert "no longer configured" not in caplog.text and theirs.attempts == []
        again = WebhookChannel(ours.url, SECRET, sleep=sleep)
        async with manual(ChannelHub(rt, [again], state=state, name="ops")):
            await asyncio.wait_for(again.drain(), 10)
            assert again.memos("outbox:") == []
    ((headers, body),) = ours.accepted
    payload = verify_webhook(SECRET, headers, body)
    assert (payload["type"], payload["request"]["id"]) == ("request.opened", r.pending[0].id)


async def test_same_named_webhook_channels_of_two_hubs_each_warn_their_receiver(
    tmp_path: Path,
) -> None:
    """The `warned:` memo of one hub's channel kept the other's receiver from ever hearing that
    the request was about to expire."""
    clock = ManualClock()
    state = tmp_path / "hub.db"
    async with (
        Receiver([]) as ours,
        Receiver([]) as theirs,
        so.Runtime(
            [refund_agent(expires_in=3600)], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock
        ) as rt,
    ):
        mine = WebhookChannel(ours.url, SECRET, expiring_within=600, clock=clock)
        others = WebhookChannel(theirs.url, SECRET, expiring_within=600, clock=clock)
        async with (
            manual(ChannelHub(rt, [mine], state=state, name="ops", clock=clock)) as one,
            manual(ChannelHub(rt, [others], state=state, name="audit", clock=clock)) as two,
        ):
            assert one.active and two.active  # each delivers to its own channel
            (req,) = (await rt.generate("support", prompt="Refund 1042")).pending
            await one.poll()
            await two.poll()
            clock.advance(3100)
            await one.poll()
            assert mine.recall(f"warned:{req.id}") is True
            assert others.recall(f"warned:{req.id}") is None
            await two.poll()
            await mine.drain()
            await others.drain()
    for receiver in (ours, theirs):
        types = [
            verify_webhook(SECRET, h, b, now=clock.now, tolerance=4000)["type"]
            for h, b in receiver.accepted
        ]
        assert types == ["request.opened", "request.expiring"]


async def test_an_old_state_files_unsent_delivery_is_sent_after_the_upgrade(
    tmp_path: Path,
) -> None:
    """A file the previous signoff wrote (memos under the channel's name alone) on which two
    hubs ran a `webhooks` channel: the delivery it kept goes to both hubs, the one without its
    URL drops only its own copy, and the one with it sends it."""
    from ._channel_state import old_state_file

    async def sleep(seconds: float) -> None:
        return None

    state = tmp_path / "hub.db"
    async with (
        Receiver([]) as ours,
        Receiver([]) as theirs,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        raw = json.dumps({"id": "whd_kept", "type": "request.opened"})
        kept = {"event": "request.opened", "body": raw}
        memos = [("webhooks", f"outbox:{ours.url} whd_kept", kept)]
        old_state_file(state, {"ops:webhooks": 0, "audit:webhooks": 0}, memos)
        others = WebhookChannel(theirs.url, SECRET, sleep=sleep)
        async with manual(ChannelHub(rt, [others], state=state, name="audit")):
            await asyncio.wait_for(others.drain(), 10)
        hooks = WebhookChannel(ours.url, SECRET, sleep=sleep)
        async with manual(ChannelHub(rt, [hooks], state=state, name="ops")):
            await asyncio.wait_for(hooks.drain(), 10)
            assert hooks.memos("outbox:") == []
    assert theirs.attempts == []
    ((headers, body),) = ours.accepted
    assert body == raw.encode() and verify_webhook(SECRET, headers, body)["id"] == "whd_kept"


# -- requests open before a channel first started ------------------------------------------------


async def test_a_new_channel_starts_from_now_unless_it_backfills_the_open_requests_once(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests opened before a webhook channel first started are not announced by default: it
    starts from now, as the hub does. With `backfill=True` its first start on a state sends
    `request.opened` for each still open (oldest first, not the closed one), once: a restart on
    that state sends none again, and a request opened as the hub began (on the trail past its
    start and open at start) is announced once."""
    async with Receiver([]) as receiver, so.Runtime([refund_agent()], store=store_url) as rt:
        older = [(await rt.generate("support", prompt=f"Refund {n}")).pending[0] for n in "AB"]
        closed = await rt.generate("support", prompt="Refund C")
        await rt.respond(
            closed.session_id,
            [so.InputResponse(request_id=closed.pending[0].id, option_id="cancel")],
        )

        def opened() -> list[str]:
            bodies = [json.loads(b) for _, b in receiver.accepted]
            return [b["request"]["id"] for b in bodies if b["type"] == "request.opened"]

        plain = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [plain], state=tmp_path / "plain.db")) as hub:
            await hub.poll()
            await plain.drain()
            assert opened() == []
            fresh = (await rt.generate("support", prompt="Refund D")).pending[0]
            await hub.poll()
            await plain.drain()
        assert opened() == [fresh.id]
        receiver.accepted.clear()

        state = tmp_path / "backfill.db"
        hooks = WebhookChannel(receiver.url, SECRET, backfill=True)
        hub = ChannelHub(rt, [hooks], state=state)
        reading = hub._open_requests
        during: list[so.InputRequest] = []

        async def opening_meanwhile() -> list[so.InputRequest]:
            # past the position the hub just took, and open when the channel starts
            during.append((await rt.generate("support", prompt="Refund E")).pending[0])
            return await reading()

        monkeypatch.setattr(hub, "_open_requests", opening_meanwhile)
        async with manual(hub):
            await hub.poll()
            await hooks.drain()
        assert opened() == [older[0].id, older[1].id, fresh.id, during[0].id]
        again = WebhookChannel(receiver.url, SECRET, backfill=True)
        async with manual(ChannelHub(rt, [again], state=state)) as hub:
            await hub.poll()
            later = (await rt.generate("support", prompt="Refund F")).pending[0]
            await hub.poll()
            await again.drain()
        assert opened() == [older[0].id, older[1].id, fresh.id, during[0].id, later.id]
    with pytest.raises(so.UsageError, match="backfill must be True or False"):
        WebhookChannel("https://example.com/hook", SECRET, backfill="yes")  # type: ignore[arg-type]
