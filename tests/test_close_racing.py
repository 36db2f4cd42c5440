"""Calls made while `Runtime.close` is under way (it waits for a drive to unwind): they are
refused with `UsageError` rather than run on a store being closed under them, so nothing is left
half written and no lease is left held until it lapses."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent

from ._procs import query
from .conftest import make_store
from .test_runtime_close import _store_open


async def test_a_call_begun_while_close_waits_is_refused_and_holds_no_lease(
    store_url: str,
) -> None:
    """Before, the late call ran its whole turn on the store being closed and its writes opened
    it again once closed (a SQLite connection, a PostgreSQL pool), left open with the runtime
    marked closed; a slower one would have lost its store mid-turn, its lease left to lapse."""
    release = threading.Event()
    entered = threading.Event()

    def charge(card: str) -> str:
        entered.set()
        release.wait(20)
        return f"charged {card}"

    @so.tool
    async def pay(ctx: so.ToolContext, card: str) -> str:
        """Charge the card."""
        return str(await ctx.step("charge", charge, card))

    async def greet(conversation: list[so.Message]) -> so.ModelResponse:
        return reply("Hello.")

    script = [call_tools(call("pay", card="4242")), reply("Paid.")]
    shop = scripted_agent("shop", script, tools=[pay])
    rt = so.Runtime([shop, scripted_agent("greeter", [greet])], store=store_url, lease_ttl=600)
    first = asyncio.create_task(rt.generate("shop", "pay"))
    await asyncio.to_thread(entered.wait, 20)
    closing = asyncio.create_task(rt.close())
    deadline = time.monotonic() + 20
    while not first.cancelling():  # close has cancelled the drive; it waits for the step
        assert time.monotonic() < deadline, "close did not cancel the call"
        await asyncio.sleep(0.01)
    late = asyncio.create_task(rt.generate("greeter", "hello"))
    await asyncio.wait({late}, timeout=0.5)  # as far as it gets while close waits: bounds only
    release.set()
    await asyncio.wait_for(closing, 20)
    with pytest.raises(so.UsageError):
        await first
    with pytest.raises(so.UsageError, match="being closed: this call was not run"):
        await asyncio.wait_for(late, 20)
    assert not _store_open(rt)  # it was: the late call's writes had opened it again
    store = make_store(store_url)
    try:
        (row,) = await store.sessions()  # the late call stored nothing
        assert row.status == "running"
    finally:
        await store.close()
    assert query(store_url, "SELECT COUNT(*) FROM {t}leases WHERE owner <> ''") == [(0,)]
    # Once close has returned, a call opens the store again, as before.
    try:
        assert (await rt.generate("greeter", "hello")).text == "Hello."
    finally:
        await rt.close()
