"""Webhook deliveries survive a SIGKILL at every write to the channel state (the hub's saved
position, a delivery kept in the outbox or dropped from it once sent), right before it and right
after it: once restarted on the same state, the receiver has had each event at least once,
under its one delivery id, the opening before the close, and nothing is left unsent."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub, ChannelState, WebhookChannel, verify_webhook

from . import _proof
from ._forks import Forks
from ._procs import lapse_leases
from ._webhook_child import CHANNEL_WRITES, SECRET, make_agent


class Receiver:
    """A loopback endpoint in this process (the child is killed, not it) that keeps every
    delivery it verified, in arrival order, and answers 204."""

    def __init__(self) -> None:
        got: list[dict[str, Any]] = []
        self.got = got
        self.status = 204  # a 404 refuses every delivery
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                got.append(verify_webhook(SECRET, dict(self.headers), body))
                self.send_response(receiver.status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(scope="module")
def children(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forks]:
    """One process that imported signoff, forking a child per run, for all the file's tests."""
    forks = Forks("tests._webhook_child", tmp_path_factory.mktemp("children"))
    try:
        yield forks
    finally:
        forks.close()


def run(
    children: Forks,
    tmp: Path,
    receiver: Receiver,
    kill_at: int = 0,
    when: str = "before",
    backfill: bool = False,
    kill_name: str = "",
) -> tuple[int, dict[str, Any] | None]:
    url = f"sqlite:///{tmp / 's.db'}"
    args = [url, str(tmp / "channels.db"), str(tmp / "session"), receiver.url]
    args += ["--kill-at", str(kill_at), "--when", when, "--kill-name", kill_name]
    args += ["--backfill"] if backfill else []
    return children.run(*args)


def first_arrivals(got: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Each delivery `(type, id)` in the order it first arrived."""
    seen: dict[str, str] = {}
    for payload in got:
        seen.setdefault(payload["id"], payload["type"])
    return [(kind, delivery) for delivery, kind in seen.items()]


@pytest.mark.parametrize("backfill", [False, True], ids=["live", "backfill"])
@pytest.mark.parametrize("when", ["before", "after"])
def test_sigkill_at_every_channel_state_write(
    tmp_path: Path, receiver: Receiver, children: Forks, when: str, backfill: bool
) -> None:
    """`backfill`: the request was open before the hub first started, and the channel's first
    start announces it (and notes that it did)."""
    rc, baseline = run(children, tmp_path, receiver, backfill=backfill)
    assert rc == 0 and baseline is not None, children.stderr()
    assert baseline["status"] == "completed" and baseline["unsent"] == 0
    expected = first_arrivals(receiver.got)
    assert [kind for kind, _ in expected] == ["request.opened", "request.resolved"]
    assert len(receiver.got) == 2  # uninterrupted, each is delivered once
    # the hub's first position, each delivery kept and dropped, the position moved twice
    assert baseline["writes"] >= 6

    for point in range(1, baseline["writes"] + 1):
        tmp = tmp_path / f"{when}-{point}"
        tmp.mkdir()
        receiver.got.clear()
        rc, _ = run(children, tmp, receiver, kill_at=point, when=when, backfill=backfill)
        assert rc == -signal.SIGKILL, (point, children.stderr())
        _proof.record("crash-outside:kills")
        lapse_leases(f"sqlite:///{tmp / 's.db'}")  # as its TTL passing would
        rc, result = run(children, tmp, receiver, backfill=backfill)
        assert rc == 0 and result is not None, (point, children.stderr())
        assert result["status"] == "completed" and result["unsent"] == 0, point
        arrived = first_arrivals(receiver.got)
        # Ids are made of the event and the request's id, which differs per run.
        assert [kind for kind, _ in arrived] == [k for k, _ in expected], point
        # At least once; twice only for the one caught between its 2xx and dropping its memo.
        twice = len(receiver.got) - len(arrived)
        assert twice <= 1, (point, [(p["type"], p["id"]) for p in receiver.got])


async def test_a_delivery_kept_before_a_crash_is_sent_once_by_the_restart(
    tmp_path: Path, receiver: Receiver, children: Forks
) -> None:
    """Killed right after the opening was kept in the outbox, before the hub saved its position
    past the entry: the restart sends the kept delivery, and the entry, read again, is not sent
    a second time (whether or not it reached the receiver before the crash)."""
    (tmp_path / "baseline").mkdir()
    rc, baseline = run(children, tmp_path / "baseline", receiver)
    assert rc == 0 and baseline is not None, children.stderr()
    kept = baseline["names"].index("remember") + 1  # after the hub claimed and placed itself
    receiver.got.clear()
    rc, _ = run(children, tmp_path, receiver, kill_at=kept, when="after")
    assert rc == -signal.SIGKILL, children.stderr()
    _proof.record("crash-outside:kills")
    path = tmp_path / "channels.db"
    state = ChannelState(path)
    try:
        assert len(state.memos("webhooks", "outbox:", hub="ops")) == 1
        behind = state.position("ops:webhooks")
    finally:
        state.close()
    receiver.got.clear()

    url = f"sqlite:///{tmp_path / 's.db'}"
    async with so.Runtime([make_agent()], store=url) as rt:
        (entry,) = [e for e in await rt.audit(limit=100) if e.type == "input.requested"]
        assert behind is not None and behind < entry.id  # the hub reads the entry again
        hooks = WebhookChannel(receiver.url, SECRET, backoff=0.01)
        hub = ChannelHub(rt, [hooks], state=path, name="ops")
        await hub.start(follow=False)
        try:
            await hooks.drain()  # the kept delivery goes first
            await hub.poll()
            await hooks.drain()
            assert hooks.memos("outbox:") == []
        finally:
            await hub.stop()
    assert [p["type"] for p in receiver.got] == ["request.opened"]


@pytest.mark.parametrize("when", ["refusal recorded", "state's copy dropped"])
def test_sigkill_after_a_refusal_is_recorded_sends_it_no_more(
    tmp_path: Path, receiver: Receiver, children: Forks, when: str
) -> None:
    """The receiver refuses every delivery (404) and the hub is SIGKILLed right after the
    state's write recording the first refusal, or the next one dropping the state's copy,
    before the store's copy is dropped: the restart on the same state sends the refused
    delivery no more (only the close, which it had not sent), and no copy of it is left in
    the state or the store. Before, the store's copy was read as unsent and sent again."""
    receiver.status = 404
    (tmp_path / "baseline").mkdir()
    rc, baseline = run(children, tmp_path / "baseline", receiver)
    assert rc == 0 and baseline is not None, children.stderr()
    # The refusal's writes: recorded (the state's second `remember`, after the delivery's
    # copy), the state's copy dropped (its first `forget`), then the store's; the hub's claim
    # renewals land among them as timing has it, so the kill counts writes of its name only.
    names = [n for n in baseline["names"] if n != CHANNEL_WRITES[0]]
    first = names.index("remember", names.index("remember") + 1)
    assert names[first : first + 3] == ["remember", "forget", CHANNEL_WRITES[2]], names
    receiver.got.clear()
    kill = (2, "remember") if when == "refusal recorded" else (1, "forget")
    rc, _ = run(children, tmp_path, receiver, kill_at=kill[0], when="after", kill_name=kill[1])
    assert rc == -signal.SIGKILL, children.stderr()
    _proof.record("crash-outside:kills")
    (refused,) = [p["id"] for p in receiver.got]
    lapse_leases(f"sqlite:///{tmp_path / 's.db'}")
    rc, result = run(children, tmp_path, receiver)
    assert rc == 0 and result is not None, children.stderr()
    assert [p["id"] for p in receiver.got].count(refused) == 1, receiver.got
    assert [p["type"] for p in receiver.got] == ["request.opened", "request.resolved"]
    assert result["unsent"] == 0
    state = ChannelState(tmp_path / "channels.db")
    try:
        kept = state.memos("webhooks", "refused:", hub="ops")
    finally:
        state.close()
    assert [r["delivery"] for _, rs in kept for r in rs] == [refused, receiver.got[1]["id"]]
    with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as db:
        names = [n for (n,) in db.execute("SELECT name FROM channel_claims")]
    assert [n for n in names if ":outbox:" in n] == []
