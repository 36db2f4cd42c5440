"""Channels told of requests erased with their session (`delete_session`, `prune`) before their
hub read the close: the deletion erases the close's entry and the request's row at once, and its
own entry (`session.deleted`) names each request it erased and the entry that closed it. A text
channel tells the person and shows the next request; a webhook receiver gets `request.resolved`
once (not for closes it had); a hub started again after the deletion tells it from where it
was. Before, none was told: the text channel kept the erased request on show for good, every
reply refused, and no webhook said it closed. (Slack: `test_slack_erased.py`.)"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import Channel, ChannelHub, Erased, WebhookChannel, verify_webhook

from ._channels import Texts, manual
from .test_deletion import OPS, refunds
from .test_webhooks import SECRET, Receiver

ALICE = so.Principal(authenticator="test", principal_id="alice")


def received(receiver: Receiver) -> list[dict[str, Any]]:
    """What the receiver accepted, verified: each delivery's payload."""
    return [verify_webhook(SECRET, h, b) for h, b in receiver.accepted]


async def test_a_webhook_is_told_once_of_a_request_erased_before_its_close_was_read(
    store_url: str,
) -> None:
    """A request cancelled and its session deleted before the hub read the cancel: the receiver
    gets `request.resolved` (outcome `deleted`, status `withdrawn`, `by` and `reason` the
    deletion's; `request` holds only its ids), under the id a close of it always has. A
    session whose close the hub delivered earlier, deleted later, sends nothing more."""
    async with (
        Receiver([]) as receiver,
        so.Runtime([refunds()], store=store_url) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [hooks], gap_timeout=0)) as hub:
            told = await rt.generate("refunds", prompt="refund 6", auth=ALICE)
            await hub.poll()
            await rt.cancel(told.session_id, principal=ALICE)
            await hub.poll()  # its close delivered before the session goes
            await hooks.drain()  # (one still queued when the deletion is read is not sent)
            r = await rt.generate("refunds", prompt="refund 7", auth=ALICE)
            await hub.poll()
            await hooks.drain()
            await rt.cancel(r.session_id, principal=ALICE)
            await rt.delete_session(r.session_id, by=OPS, reason="GDPR request 12")
            await rt.delete_session(told.session_id, by=OPS)
            for _ in range(3):
                await hub.poll()
            await hooks.drain()
        [req] = r.pending
        kinds = [(p["type"], p["request"]["id"]) for p in received(receiver)]
        assert kinds == [
            ("request.opened", told.pending[0].id),
            ("request.resolved", told.pending[0].id),
            ("request.opened", req.id),
            ("request.resolved", req.id),
        ]
        gone = received(receiver)[-1]
        assert gone["request"] == {"id": req.id, "session_id": r.session_id}
        resolution = gone["resolution"]
        assert (resolution["outcome"], resolution["status"]) == ("deleted", "withdrawn")
        assert resolution["by"] == OPS.model_dump(mode="json")
        assert resolution["reason"] == "GDPR request 12"
        digest = hashlib.sha256(f"request.resolved:{req.id}".encode()).hexdigest()[:24]
        assert gone["id"] == f"whd_{digest}"


async def test_a_hub_started_again_after_the_deletion_tells_the_close(
    store_url: str, tmp_path: Path
) -> None:
    """The hub stopped (or died) after delivering the opening; meanwhile the session was
    cancelled and deleted. Started again on its state, it reads on from where it was: the
    cancel is gone from the trail, and the deletion's entry tells the receiver it closed."""
    state = tmp_path / "channels.db"
    async with (
        Receiver([]) as receiver,
        so.Runtime([refunds()], store=store_url) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [hooks], state=state)) as hub:
            r = await rt.generate("refunds", prompt="refund 7", auth=ALICE)
            await hub.poll()
            await hooks.drain()
        await rt.cancel(r.session_id, principal=ALICE)
        await rt.delete_session(r.session_id, by=OPS, reason="erasure")
        hooks = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [hooks], state=state)) as hub:
            await hub.poll()
            await hooks.drain()
        payloads = received(receiver)
        assert [p["type"] for p in payloads] == ["request.opened", "request.resolved"]
        assert payloads[1]["request"]["id"] == r.pending[0].id
        assert payloads[1]["resolution"]["outcome"] == "deleted"


async def test_a_close_read_as_its_request_was_erased_is_told_as_it_closed(
    store_url: str,
) -> None:
    """The deletion commits between the hub's read of the cancel and its read of the request:
    the request is gone. The text channel tells the person it was withdrawn (the cancel's own
    close) and shows the next request; the receiver gets that close once, and the deletion's
    entry, read next, sends it no second one."""
    async with (
        Receiver([]) as receiver,
        so.Runtime([refunds()], store=store_url) as rt,
    ):
        sms = Texts()
        hooks = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [sms, hooks], gap_timeout=0)) as hub:
            r = await rt.generate("refunds", prompt="refund 7", auth=ALICE)
            nxt = await rt.generate("refunds", prompt="refund 8", auth=ALICE)
            await hub.poll()
            assert sms.sent == [sms.render(r.pending[0])]
            await rt.cancel(r.session_id, principal=ALICE, reason="wrong order")
            read = rt.store.get_request
            raced: list[str] = []

            async def deleted_first(request_id: str) -> Any:
                if not raced:  # the first read, of the cancel's request
                    raced.append(request_id)
                    await rt.delete_session(r.session_id, by=OPS)
                return await read(request_id)

            rt.store.get_request = deleted_first  # type: ignore[method-assign]
            for _ in range(3):
                await hub.poll()
            await hooks.drain()
        assert raced == [r.pending[0].id]
        told, shown = sms.sent[1:]
        assert told.startswith("refund was withdrawn at ")
        assert told.endswith("(turn cancelled: wrong order).")
        assert shown == sms.render(nxt.pending[0])
        closes = [p for p in received(receiver) if p["type"] == "request.resolved"]
        assert [p["request"] for p in closes] == [
            {"id": r.pending[0].id, "session_id": r.session_id}
        ]
        assert closes[0]["resolution"]["outcome"] == "cancelled"
        assert closes[0]["resolution"]["status"] == "withdrawn"


async def test_a_text_channel_answered_on_a_request_erased_shows_the_next(
    store_url: str,
) -> None:
    """The session of the request shown is deleted and the person replies before the hub reads
    it: the answer is refused as the session is gone, and the next request is shown at once
    (it stayed on show, every later reply refused, until the hub read the deletion); the
    deletion's entry, read later, tells nothing more."""
    async with so.Runtime([refunds()], store=store_url) as rt:
        sms = Texts()
        async with manual(ChannelHub(rt, [sms], gap_timeout=0)) as hub:
            r = await rt.generate("refunds", prompt="refund 7", auth=ALICE)
            nxt = await rt.generate("refunds", prompt="refund 8", auth=ALICE)
            await hub.poll()
            await rt.cancel(r.session_id, principal=ALICE)
            await rt.delete_session(r.session_id, by=OPS)
            assert await sms.reply("yes", ALICE) is None
            refused, shown = sms.sent[1:]
            assert refused.startswith("Your answer was not accepted: ")
            assert r.session_id in refused
            assert shown == sms.render(nxt.pending[0])
            for _ in range(3):
                await hub.poll()
            assert sms.sent[3:] == []
            out = await sms.reply("yes", ALICE)
            assert out is not None and out.request_id == nxt.pending[0].id and out.applied


@pytest.mark.parametrize("text", ["no", "hold on"])
async def test_a_text_channel_sending_on_a_reply_to_a_request_erased_shows_the_next(
    store_url: str, text: str
) -> None:
    """As above, with `unmatched="send"`: a deny, which such a channel checks may steer the
    turn, and a message it sends on to the session, are refused as the session is gone, and
    the next request is shown. Before, the deny raised `UnknownSession` out of `reply` (an SMS
    webhook's handler failed), and the message left the erased request on show."""
    async with so.Runtime([refunds()], store=store_url) as rt:
        sms = Texts(unmatched="send")
        async with manual(ChannelHub(rt, [sms], gap_timeout=0)) as hub:
            r = await rt.generate("refunds", prompt="refund 7", auth=ALICE)
            nxt = await rt.generate("refunds", prompt="refund 8", auth=ALICE)
            await hub.poll()
            await rt.delete_session(r.session_id, by=OPS, force=True)
            assert await sms.reply(text, ALICE) is None
            refused, shown = sms.sent[1:]
            assert refused.startswith(
                "Your answer was not accepted: "
                if text == "no"
                else "Your message was not delivered: "
            )
            assert r.session_id in refused
            assert shown == sms.render(nxt.pending[0])
            for _ in range(3):
                await hub.poll()
            assert sms.sent[3:] == []
            assert sms.current is not None and sms.current.id == nxt.pending[0].id


class Closes(Channel):
    """A channel that keeps nothing of what it shows (as a webhook), recording the erased
    closes it is handed; its first opening fails, holding its feed back for a retry."""

    name = "closes"
    live_only = False

    def __init__(self) -> None:
        super().__init__()
        self.erased: list[str] = []
        self.failed = False

    async def on_requested(self, request: so.InputRequest) -> None:
        if not self.failed:
            self.failed = True
            raise RuntimeError("the service is down")

    async def on_erased(self, erased: Sequence[Erased]) -> None:
        self.erased += [e.request_id for e in erased]


async def test_a_channel_held_back_past_an_erased_close_is_told_it_from_the_deletion(
    store_url: str,
) -> None:
    """A channel failing on an entry between an erased close and its deletion: its position
    passes the close's id as a hole while it waits to retry, and once it reads the deletion it
    is still told of the close (that hole was never a close delivered to it)."""
    async with so.Runtime([refunds()], store=store_url) as rt:
        r = await rt.generate("refunds", prompt="refund 7", auth=ALICE)
        ch = Closes()
        ch.failed = True  # its first opening goes through
        async with manual(ChannelHub(rt, [ch], gap_timeout=0, retry_backoff=0)) as hub:
            await hub.poll()
            ch.failed = False
            await rt.cancel(r.session_id, principal=ALICE)
            await rt.generate("refunds", prompt="refund 8", auth=ALICE)  # fails once
            await rt.delete_session(r.session_id, by=OPS)
            await hub.poll()
            assert ch.erased == []  # held back by the failure
            await hub.poll()
            await hub.poll()
        assert ch.erased == [r.pending[0].id]


async def test_a_channel_held_back_past_an_erased_close_is_told_it_after_a_restart(
    store_url: str, tmp_path: Path
) -> None:
    """As above, but the hub stops (a restart, a standby taking over) before its retry: the
    position it saved is not past the erased close's id, so the hub started again on its state
    still tells the close from the deletion. Before, the holes it passed were kept in memory
    only, and the one started again took the close as delivered: nothing was told."""
    state = tmp_path / "channels.db"
    async with so.Runtime([refunds()], store=store_url) as rt:
        r = await rt.generate("refunds", prompt="refund 7", auth=ALICE)
        ch = Closes()
        ch.failed = True  # its first opening goes through
        async with manual(ChannelHub(rt, [ch], gap_timeout=0, retry_backoff=0, state=state)) as hub:
            await hub.poll()
            ch.failed = False
            await rt.cancel(r.session_id, principal=ALICE)
            await rt.generate("refunds", prompt="refund 8", auth=ALICE)  # fails once
            await rt.delete_session(r.session_id, by=OPS)
            await hub.poll()
            assert ch.erased == []  # held back by the failure
        again = Closes()
        again.failed = True  # the service is back
        async with manual(
            ChannelHub(rt, [again], gap_timeout=0, retry_backoff=0, state=state)
        ) as hub:
            await hub.poll()
            await hub.poll()
        assert again.erased == [r.pending[0].id]
