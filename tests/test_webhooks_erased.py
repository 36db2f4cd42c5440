"""A webhook delivery a receiver has not taken when its request is erased with its session (an
erasure request: `delete_session`) is not sent after the erasure with the request's content: its
opening is dropped and its close is sent stripped, `request` holding only its `id` and
`session_id` and the resolution no answer nor edited input, from the hub's queue, its state and
the store's copies alike, whether the hub ran through the erasure or was down then (started
again on its state, or another hub taking the store's copies). Before, the store's copy and
the state kept the request's input, and a receiver down for hours got it once it recovered."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

import signoff as so
from signoff.channels import ChannelHub, WebhookChannel, verify_webhook
from signoff.channels import _given_up as given_up

from .test_deletion import OPS, refunds
from .test_webhooks import SECRET, Receiver, manual

ALICE = so.Principal(authenticator="test", principal_id="alice")
PII = "jane.doe@example.com"
EDITED = "jane.doe@example.org"


async def _instantly(seconds: float) -> None:
    return None


def _received(receiver: Receiver) -> list[dict[str, Any]]:
    return [verify_webhook(SECRET, h, b) for h, b in receiver.accepted]


def _sent_erased(receiver: Receiver, since: int = 0) -> list[bytes]:
    """The bodies of the attempts from the `since`-th on that carried the erased input, or its
    edit."""
    sent = receiver.attempts[since:]
    return [b for _, b in sent if PII.encode() in b or EDITED.encode() in b]


async def _kept_erased(rt: so.Runtime, hooks: WebhookChannel, state: Path | None) -> list[str]:
    """What of the erased input the store's channel memos and the hub's state still hold."""
    store: Any = rt.store
    found = [n for n, raw, _ in await store.channel_memos("hub.webhooks:") if PII in raw]
    found += [n for n, raw, _ in await store.channel_memos("hub.webhooks:") if EDITED in raw]
    if state is None:
        found += [k for k, v in hooks.memos() if PII in json.dumps(v) or EDITED in json.dumps(v)]
    else:
        with contextlib.closing(sqlite3.connect(state)) as db:
            for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
                for row in db.execute(f"SELECT * FROM {table}"):
                    if PII in repr(row) or EDITED in repr(row):
                        found.append(f"{table}: {row!r:.120}")
    return found


async def _close(rt: so.Runtime, r: so.GenerateResult, told: bool) -> None:
    """Close the request: approved with its input edited (`told`: its close is delivered to
    the channel before the erasure), else cancelled."""
    if told:
        [req] = r.pending
        edit = {"order_id": EDITED}
        answer = so.InputResponse(request_id=req.id, option_id="approve", edited_input=edit)
        await rt.respond(r.session_id, [answer], principal=ALICE)
    else:
        await rt.cancel(r.session_id, principal=ALICE)


def _stub_only(receiver: Receiver, r: so.GenerateResult, told: bool) -> None:
    """The receiver took only the erased request's close, stripped."""
    [req] = r.pending
    [close] = _received(receiver)
    assert close["type"] == "request.resolved"
    assert close["request"] == {"id": req.id, "session_id": r.session_id}
    resolution = close["resolution"]
    assert resolution["outcome"] == ("approved" if told else "deleted")
    assert (resolution["answer"], resolution["edited_input"]) == (None, None)


@pytest.mark.parametrize("told", [False, True], ids=["erased-open", "erased-closed"])
async def test_a_delivery_given_up_on_is_not_sent_once_the_hub_running_reads_the_erasure(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, told: bool
) -> None:
    """The receiver is down (503): the opening is given up on (and its close too, when the
    hub read it before the erasure). The session is erased and the hub reads the deletion;
    the receiver is back and the rounds send what is kept: the stripped close alone."""
    state = tmp_path / "hub.db"
    async with (
        Receiver([503, 503] if told else [503]) as receiver,
        so.Runtime([refunds()], store=store_url) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, max_attempts=1, sleep=_instantly)
        async with manual(ChannelHub(rt, [hooks], state=state)) as hub:
            r = await rt.generate("refunds", prompt=f"refund {PII}", auth=ALICE)
            await hub.poll()
            await hooks.drain()
            await _close(rt, r, told)
            if told:
                await hub.poll()
                await hooks.drain()
            before = len(receiver.attempts)
            assert before == (2 if told else 1) and receiver.accepted == []
            await rt.delete_session(r.session_id, by=OPS, reason="GDPR erasure")
            await hub.poll()
            await hooks.drain()
            assert await _kept_erased(rt, hooks, state) == []
            monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
            for _ in range(3):
                await hub.poll()
                await hooks.drain()
        assert _sent_erased(receiver, since=before) == []
        _stub_only(receiver, r, told)
        assert await _kept_erased(rt, hooks, state) == []


class _Holding(Receiver):
    """A receiver that holds its first request until `release` is set."""

    def __init__(self) -> None:
        super().__init__([])
        self.release = asyncio.Event()
        self.holding = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        if not self.holding.is_set():
            self.holding.set()
            await self.release.wait()
        return await super().handle(request)


async def test_a_delivery_still_queued_when_the_erasure_is_read_is_not_sent(
    store_url: str,
) -> None:
    """The opening of the erased request waits behind another one the receiver is slow to
    take; the hub reads the erasure meanwhile: the worker skips it and sends the close."""
    receiver = _Holding()
    async with receiver, so.Runtime([refunds()], store=store_url) as rt:
        hooks = WebhookChannel(receiver.url, SECRET, timeout=60)
        async with manual(ChannelHub(rt, [hooks])) as hub:
            try:
                first = await rt.generate("refunds", prompt="refund 6", auth=ALICE)
                await hub.poll()
                await asyncio.wait_for(receiver.holding.wait(), 10)
                r = await rt.generate("refunds", prompt=f"refund {PII}", auth=ALICE)
                await hub.poll()  # its opening queued behind the one held
                await rt.cancel(r.session_id, principal=ALICE)
                await rt.delete_session(r.session_id, by=OPS, reason="GDPR erasure")
                await hub.poll()
                kept = await _kept_erased(rt, hooks, None)
            finally:
                receiver.release.set()
            await asyncio.wait_for(hooks.drain(), 10)
        assert kept == []
        assert _sent_erased(receiver) == []
        [opened, close] = _received(receiver)
        assert (opened["type"], opened["request"]["id"]) == ("request.opened", first.pending[0].id)
        assert close["type"] == "request.resolved"
        assert close["request"] == {"id": r.pending[0].id, "session_id": r.session_id}


@pytest.mark.parametrize("told", [False, True], ids=["erased-open", "erased-closed"])
@pytest.mark.parametrize("on", ["state", "memory"])
async def test_a_hub_down_at_the_erasure_does_not_send_what_it_kept_of_it(
    store_url: str, tmp_path: Path, told: bool, on: str
) -> None:
    """The receiver is down and the hub stops with the deliveries kept; the session is erased
    while no hub runs. Started again on its state (or in memory, taking the store's copies),
    the hub's start drops the opening and strips the close before a worker sends anything (it
    reads the deletion only after): the receiver, back, gets the stripped close alone."""
    state = tmp_path / "hub.db" if on == "state" else None
    async with (
        Receiver([503, 503] if told else [503]) as receiver,
        so.Runtime([refunds()], store=store_url) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, max_attempts=1, sleep=_instantly)
        async with manual(ChannelHub(rt, [hooks], state=state or ":memory:")) as hub:
            r = await rt.generate("refunds", prompt=f"refund {PII}", auth=ALICE)
            await hub.poll()
            await hooks.drain()
            if told:
                await _close(rt, r, told)
                await hub.poll()
                await hooks.drain()
        before = len(receiver.attempts)
        assert before == (2 if told else 1) and receiver.accepted == []
        if not told:
            await _close(rt, r, told)
        await rt.delete_session(r.session_id, by=OPS, reason="GDPR erasure")
        hooks = WebhookChannel(receiver.url, SECRET, sleep=_instantly)
        async with manual(ChannelHub(rt, [hooks], state=state or ":memory:")) as hub:
            assert await _kept_erased(rt, hooks, state) == []  # at its start, before a poll
            for _ in range(3):
                await hub.poll()
                await hooks.drain()
            kept = await _kept_erased(rt, hooks, state)
        assert kept == []
        assert _sent_erased(receiver, since=before) == []
        _stub_only(receiver, r, told)


def test_a_close_stripped_keeps_what_says_how_it_closed() -> None:
    """`stripped`: a close keeps its id, type, time, outcome, who and why, and what `clipped`
    names of those; an opening is nothing; a close stripped once is as it was."""
    from signoff.channels._webhook_erased import stripped

    close = {
        "id": "whd_1",
        "type": "request.resolved",
        "at": 5.0,
        "request": {"id": "req_1", "session_id": "ses_1", "action": {"input": {"e": PII}}},
        "resolution": {"outcome": "answered", "reason": "ok", "answer": {"text": PII}},
        "escalation": None,
        "clipped": ["request.action.input", "resolution.reason", "resolution.answer"],
    }
    left = stripped(close)
    assert left == {
        "id": "whd_1",
        "type": "request.resolved",
        "at": 5.0,
        "request": {"id": "req_1", "session_id": "ses_1"},
        "resolution": {
            "outcome": "answered",
            "reason": "ok",
            "answer": None,
            "edited_input": None,
        },
        "escalation": None,
        "clipped": ["resolution.reason"],
    }
    assert stripped(left) == left
    assert stripped({**close, "type": "request.opened"}) is None
