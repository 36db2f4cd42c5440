"""A page of the queue and its total are one read of the store: a request another process closes
or opens between the page and the count cannot set them apart. Each test closes or opens one,
on connections of its own, right before the store next counts requests (after the page a listing
read, before its total), and checks that the total is what the page holds."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

import signoff as so
from signoff._queue_page import counted_listing
from signoff.server import TokenAuth, create_app
from signoff.stores import PendingFilter, SQLiteStore, Store
from signoff.testing import ManualClock, call, call_tools, scripted_agent

from .test_server_common import TOKENS, auth

Action = Callable[[so.Runtime], Awaitable[Any]]


def _desk() -> so.Agent:
    """Each turn asks to approve a refund."""

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "ok"

    step = call_tools(call("refund", order_id="1"))
    return scripted_agent("desk", [step], tools=[refund], repeat_last=True)


def _elsewhere(url: str, action: Action) -> None:
    """Run `action` on a runtime of its own over `url`, in a thread with its own event loop
    and connections (as another process would), and wait for it; its error is raised here."""
    failed: list[BaseException] = []

    async def run() -> None:
        async with so.Runtime([_desk()], store=url) as other:
            await action(other)

    def target() -> None:
        try:
            asyncio.run(run())
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


def _counts_requests(sql: str) -> bool:
    return "COUNT(*) FROM" in sql.upper() and "REQUESTS R JOIN" in sql.upper()


@contextmanager
def _before_count(
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    do: Callable[[], object],
    counts: Callable[[str], bool] = _counts_requests,
) -> Iterator[list[BaseException | None]]:
    """Call `do` once, right before the store's next statement that counts requests (or what
    `counts` tells): from SQLite's trace of its connection, from psycopg's `execute` on
    PostgreSQL. Yields a list that holds, once it ran, None or the error it raised."""
    ran: list[BaseException | None] = []

    def fire() -> None:
        if ran:
            return
        try:
            do()
            ran.append(None)
        except BaseException as exc:  # the trace callback would swallow it
            ran.append(exc)

    if isinstance(store, SQLiteStore):
        conn = store.conn
        conn.set_trace_callback(lambda sql: fire() if counts(sql) else None)
        try:
            yield ran
        finally:
            conn.set_trace_callback(None)
        return
    execute = psycopg.AsyncConnection.execute

    async def traced(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if counts(str(query)) and threading.current_thread() is threading.main_thread():
            fire()
        return await execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncConnection, "execute", traced)
    yield ran


async def _cancel_first(other: so.Runtime) -> None:
    first = (await other.pending(limit=1))[0]
    await other.cancel(first.session_id)


async def _ask_again(other: so.Runtime) -> None:
    assert (await other.generate("desk", prompt="refund")).status == "waiting"


@pytest.mark.parametrize("action", [_cancel_first, _ask_again], ids=["closed", "opened"])
async def test_a_listing_and_its_total_are_one_read(
    store_url: str, action: Action, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`GET /v1/requests` (so `Client.pending()` and the dashboard's queue) and the store's
    `pending_counted()`: a request closed or opened by another process between the page and
    its count leaves the total what the page lists, and the next read shows the change."""
    async with so.Runtime([_desk()], store=store_url) as rt:
        for _ in range(3):
            await rt.generate("desk", prompt="refund")
        app = create_app(rt, auth=TokenAuth(TOKENS))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:

            async def listed() -> tuple[int, int]:
                got = await c.get("/v1/requests", headers=auth("admin-token"))
                body = got.json()
                return len(body["items"]), body["total"]

            step = -1 if action is _cancel_first else 1
            elsewhere = partial(_elsewhere, store_url, action)
            # SQLite's page was read before the change, PostgreSQL's one statement after it.
            with _before_count(rt.store, monkeypatch, elsewhere) as ran:
                items, total = await listed()
            assert ran == [None]
            assert items == total in (3, 3 + step)
            assert await listed() == (3 + step, 3 + step)
            with _before_count(rt.store, monkeypatch, elsewhere) as ran:
                page, counted = await rt.store.pending_counted(PendingFilter())  # type: ignore[attr-defined]
            assert ran == [None]
            assert len(page) == counted in (3 + step, 3 + 2 * step)
            assert await rt.store.count_pending(PendingFilter()) == 3 + 2 * step


def _agents() -> list[so.Agent]:
    """`desk` (the server's) and `remote` (another process's), each asking for an approval
    that closes when its 60 s deadline passes."""

    @so.tool(approval=so.always(expires_in=60))
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "ok"

    step = call_tools(call("refund", order_id="1"))
    return [scripted_agent(n, [step], tools=[refund], repeat_last=True) for n in ("desk", "remote")]


async def test_a_deadline_passing_during_a_listing_leaves_its_total_what_it_lists(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue leaves out a request past its deadline that this server cannot close (another
    process's agent); one whose deadline passes after the listing found what to leave out, but
    before its page is judged, is shown and counted alike (the page is as of that moment), and
    the next listing leaves it out of both."""
    clock = ManualClock()
    async with so.Runtime(_agents(), store=store_url, clock=clock) as rt:
        await rt.generate("remote", prompt="refund")
        clock.advance(30)
        await rt.generate("desk", prompt="refund")
    clock.advance(29.5)  # `remote`'s deadline half a second away
    async with so.Runtime(_agents()[:1], store=store_url, clock=clock) as rt:
        app = create_app(rt, auth=TokenAuth(TOKENS))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:

            async def listed() -> tuple[list[str], int]:
                got = await c.get("/v1/requests", headers=auth("admin-token"))
                body = got.json()
                return [r["agent"] for r in body["items"]], body["total"]

            with _before_count(rt.store, monkeypatch, partial(clock.advance, 1)) as ran:
                assert await listed() == (["remote", "desk"], 2)
            assert ran == [None]
            assert await listed() == (["desk"], 1)


async def test_pending_counted_reads_what_pending_and_count_pending_do(store: Store) -> None:
    """Every page, at the start, in the middle, past the end, of none, and with requests left
    out by id: the store's one read gives the page `pending()` lists and the count
    `count_pending()` gives."""
    async with so.Runtime([_desk()], store=store) as rt:
        for _ in range(5):
            await rt.generate("desk", prompt="refund")
        ids = [r.id for r in await store.pending(PendingFilter())]
        assert len(ids) == 5
        for flt in [
            PendingFilter(),
            PendingFilter(limit=2),
            PendingFilter(limit=2, offset=3),
            PendingFilter(limit=2, offset=5),
            PendingFilter(offset=9),
            PendingFilter(limit=0),
            PendingFilter(limit=0, offset=2),
            PendingFilter(excluded=tuple(ids[1:3]), limit=2, offset=1),
            PendingFilter(agent="nobody"),
            PendingFilter(agent="nobody", offset=1),
            PendingFilter(agent="\x00"),  # PostgreSQL stores no NUL: no statement runs
            PendingFilter(status="settled"),
        ]:
            page, total = await store.pending_counted(flt)  # type: ignore[attr-defined]
            assert [r.id for r in page] == [r.id for r in await store.pending(flt)], flt
            assert total == await store.count_pending(flt), flt


async def test_a_store_without_pending_counted_is_read_twice(tmp_path: Path) -> None:
    """A store of one's own that has no `pending_counted` still has its pages counted: by
    `pending()` and `count_pending()`, one after the other."""

    class TwoReads:
        def __init__(self, store: SQLiteStore) -> None:
            self.store = store
            self.calls: list[str] = []

        async def pending(self, flt: PendingFilter) -> list[so.InputRequest]:
            self.calls.append("pending")
            return await self.store.pending(flt)

        async def count_pending(self, flt: PendingFilter) -> int:
            self.calls.append("count_pending")
            return await self.store.count_pending(flt)

    async with so.Runtime([_desk()], store=f"sqlite:///{tmp_path / 'state.db'}") as rt:
        for _ in range(3):
            await rt.generate("desk", prompt="refund")
        assert isinstance(rt.store, SQLiteStore)
        own = TwoReads(rt.store)
        page, total = await counted_listing(own, PendingFilter(limit=2))  # type: ignore[arg-type]
        assert (len(page), total) == (2, 3)
        assert own.calls == ["pending", "count_pending"]
