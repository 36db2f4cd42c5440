"""`_queue_page.passing_page`: a page with a request no one can read, read again in halves, gives
every other request it listed, also when a request made meanwhile lists among them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import signoff as so
from signoff._queue_page import passing_page
from signoff.stores import PendingFilter
from signoff.testing import ExecutionLog, ManualClock

from .test_deadlines import asked, payout_agent
from .test_store_edited_rows import edit


async def test_a_request_made_during_the_reread_takes_no_listed_ones_place(
    tmp_path: Path,
) -> None:
    """Each half was read by a limit of its rows: a request made meanwhile that lists among them
    took a place, and the half's last listed request was read by none (a hub's start never
    handed it to its channels). It is read by itself."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    clock = ManualClock()
    agent = payout_agent(ExecutionLog(), so.always())
    async with so.Runtime([agent], store=url, clock=clock) as rt:
        made = []
        for _ in range(6):
            made.append((await asked(rt))[1])
            clock.advance(10)
        edit(url, "UPDATE {t}requests SET data = {p} WHERE id = {p}", b"{broken", made[4].id)
        store: Any = rt.store
        keys = store.pending_keys
        late = ManualClock()
        late.advance(made[0].created_at + 5 - late.now)  # lists between the first two

        async def keys_then_another(flt: PendingFilter) -> Any:
            rows = await keys(flt)
            async with so.Runtime([agent], store=url, clock=late) as other:
                await asked(other)
            return rows

        store.pending_keys = keys_then_another
        log = logging.getLogger("test.passing")
        page, (listed, _) = await passing_page(store, PendingFilter(limit=100), log=log, what="")
    assert [r.id for r in page] == [r.id for i, r in enumerate(made) if i != 4]
    assert listed == 6


async def test_a_request_whose_time_is_no_number_is_passed_too(tmp_path: Path) -> None:
    """A row whose `created_at` a hand edit made text (and its data broken): the keys read it
    as a number, a bare ValueError that failed the sweep or the hub's start as before. It has no
    key a cursor can hold (SQLite sorts it after every other): it is left out with the rest."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    clock = ManualClock()
    agent = payout_agent(ExecutionLog(), so.always())
    async with so.Runtime([agent], store=url, clock=clock) as rt:
        made = []
        for _ in range(3):
            made.append((await asked(rt))[1])
            clock.advance(10)
        damage = "UPDATE {t}requests SET created_at = 'x', data = {p} WHERE id = {p}"
        edit(url, damage, b"{broken", made[1].id)
        log = logging.getLogger("test.passing")
        flt = PendingFilter(limit=100)
        page, (listed, _) = await passing_page(rt.store, flt, log=log, what="")
    assert [r.id for r in page] == [made[0].id, made[2].id]
    assert listed == 2
