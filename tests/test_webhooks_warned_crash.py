"""A hub SIGKILLed right before or right after the store's commit of the memo that its webhook
channel warned of a request's deadline (`<hub>.<channel>:warned:<request>`), restarted on its
state file or on another (a machine lost). The warning is queued (kept in the outbox) before
that memo: killed before it, the restart sends the warning kept and keeps the memo; killed
after it, the restart sends the warning kept and queues no other. Either way the receiver gets
`request.expiring` once, and the request's close drops the memo."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import verify_webhook

from . import _proof
from ._channels import caught_up, manual
from ._forks import Scripts
from ._procs import ROOT
from ._webhook_warned_crash import CLAIM_TTL, SECRET, hooks, hub
from .test_sqlite_upgrade import _child_env
from .test_webhooks import Receiver, refund_agent

_CHILD = "import sys\nfrom tests._webhook_warned_crash import main\nmain(sys.argv[1:])\n"


def expiring(receiver: Receiver) -> list[str]:
    """The delivery ids of the `request.expiring` the receiver took (each verified)."""
    bodies = [verify_webhook(SECRET, h, body) for h, body in receiver.accepted]
    return [b["id"] for b in bodies if b["type"] == "request.expiring"]


@pytest.mark.parametrize("restart", ["same state", "another state"])
@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_warning_is_sent_once_whether_killed_before_or_after_its_memo_was_kept(
    store_url: str, tmp_path: Path, scripts: Scripts, when: str, restart: str
) -> None:
    """The request is open (an hour left) when a child hub on a.db starts; its receiver answers
    503 while the child runs, so nothing reaches it before the kill; a hub restarted on a.db,
    or on b.db, goes on once the receiver is back."""
    async with (
        Receiver([503] * 100_000) as receiver,
        so.Runtime([refund_agent(expires_in=3600)], store=store_url) as rt,
    ):
        store: Any = rt.store  # the memos are not part of the `Store` protocol
        (req,) = (await rt.generate("support", prompt="Refund 1042")).pending
        memo = f"hub.webhooks:warned:{req.id}"
        env = {**_child_env(), "PYTHONPATH": f"{_child_env()['PYTHONPATH']}:{ROOT}"}
        args = [store_url, str(tmp_path / "a.db"), receiver.url, when]
        # In a thread: the receiver the child posts to answers on this loop.
        done = await asyncio.to_thread(scripts.run, _CHILD, *args, env=env)
        assert done.returncode == -signal.SIGKILL, (done.returncode, done.stderr)
        _proof.record("crash-outside:kills")
        assert await store.channel_memo(memo) == (None if when == "before" else "true")
        tried = {h["Signoff-Delivery"] for h, _ in receiver.attempts}
        assert receiver.accepted == []
        receiver.statuses.clear()  # the receiver is back

        channel = hooks(receiver.url)
        restarted = hub(
            rt, channel, str(tmp_path / ("a.db" if restart == "same state" else "b.db"))
        )
        async with manual(restarted):
            await caught_up(restarted, CLAIM_TTL)
            await channel.drain()
            assert len(expiring(receiver)) == 1, receiver.accepted
            assert await store.channel_memo(memo) == "true"
            # Killed before, the restart kept the memo; killed after, the store's says it.
            assert channel.recall(f"warned:{req.id}") is (True if when == "before" else None)
        (delivery,) = expiring(receiver)
        assert tried <= {delivery}  # the delivery the child tried, if it got that far

        again = hooks(receiver.url)
        last = hub(rt, again, str(tmp_path / "b.db"))
        async with manual(last):  # one more restart (on b.db): nothing more is sent
            await caught_up(last, CLAIM_TTL)
            await again.drain()
            assert expiring(receiver) == [delivery]
            reply = so.InputResponse(request_id=req.id, option_id="approve")
            assert (await rt.respond(req.session_id, [reply])).outcomes[0].outcome == "approved"
            await last.poll()
            await again.drain()
        assert expiring(receiver) == [delivery]
        assert await store.channel_memo(memo) is None  # dropped with the close
    kinds = [json.loads(body)["type"] for _, body in receiver.accepted]
    assert kinds == ["request.expiring", "request.resolved"]
