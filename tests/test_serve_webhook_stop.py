"""How `signoff serve` stops with a webhook delivery unsent: a graceful stop waits for it (up to
the channel's `timeout`), a second signal stops serve at once, and the delivery, kept in the
channel state, is sent when the hub next starts."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub, WebhookChannel, verify_webhook
from tests._cli import ROOT, _free_port
from tests._hanging_receiver import receiving
from tests._serve_lines import ended, line, started
from tests._webhook_serve_child import SECRET, refunder


@contextlib.asynccontextmanager
async def _serving(
    tmp_path: Path, url: str, receiver: str
) -> AsyncIterator[asyncio.subprocess.Process]:
    """`serve` (`_webhook_serve_child`) on `url` posting to `receiver`, started; killed at the
    end if it still runs."""
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests._webhook_serve_child",
        url,
        str(tmp_path / "hub.db"),
        receiver,
        str(_free_port()),
        cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as at a shell
    )
    try:
        await started(child)
        yield child
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
async def test_a_second_signal_stops_serve_at_once_and_the_next_start_sends_the_delivery(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """A request opens while serve runs and its receiver hangs: the first signal waits for the
    delivery (its attempt bounded by a minute), the second stops serve at once, where its hub's
    stop went on waiting; the delivery stays kept, and the hub's next start on the same state
    sends it, once, under the same delivery id."""
    url = f"sqlite:///{tmp_path}/state.db"
    async with receiving() as receiver, so.Runtime([refunder], store=url) as rt:
        async with _serving(tmp_path, url, receiver.url) as child:
            parked = await rt.generate("refunder", prompt="Refund order 1042")
            (request,) = parked.pending
            await asyncio.wait_for(receiver.reached.wait(), 30)
            child.send_signal(sig)
            await line(child, "Waiting for application shutdown")
            child.send_signal(sig)
            rest = await ended(child)
            assert rest is not None, "serve still ran 10 s after its second signal"
        assert child.returncode == (130 if sig == signal.SIGINT else -signal.SIGTERM), rest
        assert "Traceback" not in rest and "CancelledError" not in rest, rest
        assert (
            "1 deliveries were not sent as the stop was forced and are sent when the hub " in rest
        )
        receiver.hangs = False
        hooks = WebhookChannel(receiver.url, SECRET)
        hub = ChannelHub(rt, [hooks], state=tmp_path / "hub.db")
        await hub.start(follow=False)
        try:
            await asyncio.wait_for(hooks.drain(), 30)
        finally:
            await hub.stop()
    ((headers, body),) = receiver.accepted
    sent: dict[str, Any] = verify_webhook(SECRET, headers, body)
    assert (sent["type"], sent["request"]["id"]) == ("request.opened", request.id)
    assert headers["signoff-delivery"] == receiver.hung[0]["signoff-delivery"] == sent["id"]
