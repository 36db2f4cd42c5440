"""How `signoff serve` stops a turn a Slack click resumed: the click is settled, and its turn
driven, in the Slack channel's background, not in a request of the server's. A second signal
cuts that turn short at once, its lease given back, as it does a request's."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

import signoff as so
from signoff.stores import SQLiteStore
from tests._cli import ROOT, _free_port
from tests._serve_lines import ended, line, started
from tests._slack import FakeSlack, click, fake, sign
from tests._slack_serve_child import napper

__all__ = ["fake"]  # the fixture, used by name


async def _park(rt: so.Runtime) -> tuple[str, str]:
    """A turn of `napper` waiting for its nap's approval: its session and the request."""
    parked = await rt.generate("napper", prompt="Take a nap")
    (request,) = parked.pending
    return parked.session_id, request.id


@contextlib.asynccontextmanager
async def _serving(
    tmp_path: Path, url: str, fake: FakeSlack
) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    """`serve` (`_slack_serve_child`) on `url` with Slack on `fake`, started: it and its port.
    Killed at the end if it still runs."""
    port = _free_port()
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests._slack_serve_child",
        url,
        str(tmp_path / "hub.db"),
        fake.url,
        str(port),
        cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as at a shell
    )
    try:
        await started(child)
        yield child, port
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()


async def _press_approve(port: int, request_id: str) -> None:
    """Approve `request_id` in Slack: the interaction Slack posts to the server."""
    body = click({"action_id": "signoff.approve", "value": request_id, "type": "button"})
    async with httpx.AsyncClient() as http:
        answered = await http.post(
            f"http://127.0.0.1:{port}/channels/slack/interactivity",
            content=body,
            headers=sign(body, int(time.time())),
        )
    assert answered.status_code == 200, answered.text


async def _napping(rt: so.Runtime, *session_ids: str) -> None:
    """Wait until the naps of `session_ids` have all begun."""
    deadline = time.monotonic() + 30
    for session_id in session_ids:
        while "tool.started" not in await _types(rt, session_id):
            assert time.monotonic() < deadline, f"the nap of {session_id} never began"
            await asyncio.sleep(0.05)


async def _types(rt: so.Runtime, session_id: str) -> list[str]:
    return [e.type async for e in rt.events(session_id, follow=False)]


async def _lease_free(url: str, session_id: str) -> bool:
    """Whether another worker can take the session's lease now (the last holder gave it back)."""
    store = SQLiteStore(url)
    try:
        return (
            await store.acquire_lease(session_id, "another-worker", 30.0, time.time()) is not None
        )
    finally:
        await store.close()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
async def test_a_second_signal_cuts_short_the_turn_a_slack_click_resumed(
    tmp_path: Path, fake: FakeSlack, sig: signal.Signals
) -> None:
    """Approve pressed in Slack resumes a turn whose tool naps a minute. The first signal waits
    for it (a graceful stop); the second stops serve at once, the call cut short and the lease
    given back, where the stop waited for the nap to end, however long it ran."""
    url = f"sqlite:///{tmp_path}/state.db"
    async with so.Runtime([napper], store=url) as rt:
        session_id, request_id = await _park(rt)
        async with _serving(tmp_path, url, fake) as (child, port):
            await _press_approve(port, request_id)
            await _napping(rt, session_id)
            child.send_signal(sig)
            await line(child, "Waiting for application shutdown")
            child.send_signal(sig)
            rest = await ended(child)
            assert rest is not None, "serve still ran 10 s after its second signal"
        assert child.returncode == (130 if sig == signal.SIGINT else -signal.SIGTERM), rest
        assert "Traceback" not in rest and "CancelledError" not in rest, rest
        stored = await rt.store.get_request(request_id)
        assert stored is not None and stored.status != "pending"  # the click was taken
        assert "tool.completed" not in await _types(rt, session_id)
    assert await _lease_free(url, session_id)


async def test_a_second_signal_while_a_request_runs_cuts_short_the_turn_a_click_resumed_too(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """A second SIGTERM while the stop still waits for a request (an approval over HTTP whose
    turn naps) ends serve without its app's shutdown, where the hub's stop would wait for the
    Slack click's turn: that turn is cut short too, its lease given back as the request's is,
    not left held until it lapses."""
    url = f"sqlite:///{tmp_path}/state.db"
    async with so.Runtime([napper], store=url) as rt:
        clicked, click_request = await _park(rt)
        posted, post_request = await _park(rt)
        async with _serving(tmp_path, url, fake) as (child, port):
            await _press_approve(port, click_request)
            await _napping(rt, clicked)
            answer = {"inputResponses": [{"requestId": post_request, "optionId": "approve"}]}
            async with httpx.AsyncClient(timeout=60) as http:
                approving = asyncio.ensure_future(
                    http.post(
                        f"http://127.0.0.1:{port}/v1/sessions/{posted}/responses", json=answer
                    )
                )
                try:
                    await _napping(rt, posted)
                    child.send_signal(signal.SIGTERM)
                    await line(child, "Waiting for connections to close")
                    child.send_signal(signal.SIGTERM)
                    rest = await ended(child)
                finally:
                    with contextlib.suppress(httpx.HTTPError):
                        await approving  # cut off with the server
            assert rest is not None, "serve still ran 10 s after its second signal"
        assert child.returncode == -signal.SIGTERM, rest
        assert "Traceback" not in rest and "CancelledError" not in rest, rest
        for session_id in (clicked, posted):
            assert "tool.completed" not in await _types(rt, session_id)
    assert await _lease_free(url, posted)
    assert await _lease_free(url, clicked), "the turn the Slack click resumed kept its lease"
