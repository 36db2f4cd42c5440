"""Child process for the webhook crash test: runs (or resumes) one approval to its end with a
`ChannelHub` delivering to a `WebhookChannel`, whose outbox and the hub's position live in a
channel state file; with `--backfill` the request is opened before the hub first starts, and
the channel announces it then.

`python -m tests._webhook_child` serves `[STORE_URL, STATE_FILE, SESSION_FILE, RECEIVER,
"--kill-at", N, "--when", "before"|"after", "--kill-name", NAME?, "--backfill"?]` commands,
each in a child of its own (`_forks`). With `--kill-at N` that process SIGKILLs itself right
before or right after the N-th write to the channel state (a position saved, a memo kept or
dropped) or of the store's channel claims and memos (the hub's claim taken, renewed, given
back); with `--kill-name`, the N-th write of that name. A run that ends gives the session's
status, how many state writes it saw and the deliveries left unsent.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import ssl
import time
from pathlib import Path
from typing import Any

import httpx

import signoff as so
import signoff.stores.sqlite  # imported once here, not again in each child
from signoff.channels import ChannelHub, ChannelState, WebhookChannel
from signoff.stores._base import CHANNEL_CLAIMED, CHANNEL_MEMOS, CHANNEL_RELEASED, FaultHook
from signoff.testing import call, call_tools, reply, scripted_agent

from ._forks import serve

SECRET = "whsec_crash_1f2e"
TLS: list[ssl.SSLContext] = []  # made once by the server: loading CA certificates takes a while
WRITES = ("set_position", "remember", "forget")
CHANNEL_WRITES = (CHANNEL_CLAIMED, CHANNEL_RELEASED, CHANNEL_MEMOS)
"""The store's writes for a hub: its claim on the channel (taken, renewed with the position,
given back at its stop) and the channel's memos kept there."""


def count_writes(kill_at: int, when: str, only: str = "") -> tuple[list[str], FaultHook]:
    """Wrap `ChannelState`'s writes to count them and die at the `kill_at`-th (of those named
    `only`, if given: the hub's claim renewals land among the others as timing has it);
    returns the names of those made so far, and the fault hook that counts the store's writes
    of channel claims and memos with them."""
    seen: list[str] = []

    def hook(at: str, name: str) -> None:
        if at != when:
            return
        seen.append(name)
        if (seen.count(only) if only else len(seen)) == kill_at and name == (only or name):
            # In the state's worker thread: the event loop goes on a moment (a delivery under
            # way reaches the receiver) before the process dies.
            time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)

    for name in WRITES:
        write = getattr(ChannelState, name)

        def counted(
            self: ChannelState, *args: Any, _write: Any = write, _name: str = name, **kw: Any
        ) -> None:
            hook("before", _name)
            _write(self, *args, **kw)
            hook("after", _name)

        setattr(ChannelState, name, counted)

    def stored(at: str, label: str) -> None:
        if label in CHANNEL_WRITES:
            hook(at, label)

    return seen, stored


def make_agent() -> so.Agent:
    @so.tool(approval=so.always())
    async def issue_refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        return {"refunded": amount}

    return scripted_agent(
        "support",
        [call_tools(call("issue_refund", order_id="1042", amount=180)), reply("Done.")],
        tools=[issue_refund],
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    writes, stored = count_writes(args.kill_at, args.when, args.kill_name)
    # A TTL a loaded machine's stalls cannot outlast (a drive waking past its lease's expiry
    # gives the renewal a tenth of it); the parent lapses a killed child's lease (`lapse_leases`).
    rt = so.Runtime([make_agent()], store=args.store, lease_ttl=5.0)
    async with rt:
        rt.store.set_fault_hook(stored)
        if args.backfill:  # the request is open before the hub first starts
            sid, r = await start(rt, Path(args.session_file))
        client = httpx.AsyncClient(verify=TLS[0] if TLS else True)
        hooks = WebhookChannel(
            args.receiver,
            SECRET,
            backoff=0.01,
            max_attempts=3,
            client=client,
            backfill=args.backfill,
        )
        hub = ChannelHub(rt, [hooks], state=args.state, name="ops")
        await hub.start(follow=False)
        if not args.backfill:
            sid, r = await start(rt, Path(args.session_file))
        for _ in range(40):
            await hub.poll()
            await hooks.drain()
            if r.status == "completed":
                break
            if r.status == "running":  # the dead process's lease is still live
                await asyncio.sleep(0.1)
                r = await rt.generate(session_id=sid)
                continue
            assert r.status == "waiting", r
            reply_ = so.InputResponse(request_id=r.pending[0].id, option_id="approve")
            r = await rt.respond(sid, [reply_])
        unsent = await asyncio.to_thread(hooks.memos, "outbox:")
        await hub.stop()
        await client.aclose()
        return {
            "status": r.status,
            "writes": len(writes),
            "names": writes,
            "unsent": len(unsent),
            "session": sid,
        }


async def start(rt: so.Runtime, session_file: Path) -> tuple[str, so.GenerateResult]:
    """Start the session, or resume it where a crash left it."""
    if session_file.exists():
        sid = session_file.read_text().strip()
    else:
        sid = await rt.create_session("support")
        session_file.write_text(sid)
    r = await rt.generate(session_id=sid)  # resume whatever a crash interrupted
    if r.status == "idle":  # the prompt was never acknowledged: the client resends it
        r = await rt.generate(session_id=sid, prompt="Refund order 1042")
    return sid, r


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    for name in ("store", "state", "session_file", "receiver"):
        parser.add_argument(name)
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--when", choices=["before", "after"], default="before")
    parser.add_argument("--kill-name", choices=["", *WRITES, *CHANNEL_WRITES], default="")
    parser.add_argument("--backfill", action="store_true")
    return parser


async def command(argv: list[str]) -> dict[str, Any]:
    return await run(parser().parse_args(argv))


if __name__ == "__main__":
    TLS.append(httpx.create_ssl_context())
    serve(command)
