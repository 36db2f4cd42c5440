"""A hub hands its channels every open request though it reads them in pages: one closed on an
earlier page between two page reads shifts no later request out of the listing."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels import _hub as hub_module
from signoff.stores import PendingFilter

from ._channels import manual, three_refunds
from .test_channels_hub import Flaky
from .test_store_edited_rows import edit


class Opened(Flaky):
    """Records the open requests it is handed at its start."""

    async def start(self, open_requests: Any) -> None:
        self.seen += [("open", x.id) for x in open_requests]


async def test_a_request_closed_on_an_earlier_page_skips_none_after_it(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub_module, "_PAGE", 2)
    async with so.Runtime([three_refunds([])], store=store_url) as rt:
        for order in ("A", "B"):
            await rt.generate("support", prompt=f"Refunds {order}")
        listed = await rt.store.pending(PendingFilter(limit=100))
        assert len(listed) == 6  # three pages of two
        reading = rt.store.pending
        closed: list[str] = []

        async def closing_meanwhile(flt: PendingFilter) -> list[so.InputRequest]:
            page = await reading(flt)
            if not closed and page:  # after the first page: its first request is answered
                first = page[0]
                closed.append(first.id)
                answer = so.InputResponse(request_id=first.id, option_id="approve")
                await rt.respond(first.session_id, [answer])
            return page

        monkeypatch.setattr(rt.store, "pending", closing_meanwhile)
        watcher = Opened(0)
        async with manual(ChannelHub(rt, [watcher])) as hub:
            await hub.poll()
        assert closed == [listed[0].id]
        announced = [rid for kind, rid in watcher.seen if kind == "open"]
        # Each request still open exactly once (a channel posting one twice asks twice); the
        # one closed was open when its page was read, and the trail then tells of its close.
        assert sorted(i for i in announced if i != closed[0]) == sorted(r.id for r in listed[1:])
        assert ("approved", closed[0]) in watcher.seen


async def test_a_request_row_edited_to_list_last_is_a_store_error_not_endless_paging(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row whose `created_at` disagrees with its data would send the next page's read back
    to an earlier one, for ever (the hub's start hung, its list of open requests growing):
    it is a StoreError naming it."""
    monkeypatch.setattr(hub_module, "_PAGE", 2)
    async with so.Runtime([three_refunds([])], store=store_url) as rt:
        for order in ("A", "B"):
            await rt.generate("support", prompt=f"Refunds {order}")
        first = (await rt.store.pending(PendingFilter(limit=1)))[0]
        edit(
            store_url,
            "UPDATE {t}requests SET created_at = created_at + 1000 WHERE id = {p}",
            first.id,
        )
        hub = ChannelHub(rt, [Opened(0)])
        with pytest.raises(so.StoreError, match=f"request '{first.id}'.*edited"):
            await hub.start(follow=False)
        await hub.stop()


_DAMAGE = {
    "not-json": ("UPDATE {t}requests SET data = {p} WHERE id = {p}", b"{broken"),
    "event-gone": ("UPDATE {t}requests SET data = NULL, seq = 999 WHERE id = {p}", None),
}


@pytest.mark.parametrize("damage", sorted(_DAMAGE))
@pytest.mark.parametrize("page", [500, 2])
async def test_an_open_request_no_one_can_read_is_passed_and_the_channels_start(
    store_url: str,
    damage: str,
    page: int,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One request row the store cannot read (its data not JSON, or the event it names gone)
    failed the hub's read of the open requests, so `start()` raised: no channel started, and
    `serve --webhook` or `--slack` did not start at all (a hub standing by failed so at every
    poll). It is logged with its session and left out; the channels start with the others."""
    monkeypatch.setattr(hub_module, "_PAGE", page)
    async with so.Runtime([three_refunds([])], store=store_url) as rt:
        for order in ("A", "B"):
            await rt.generate("support", prompt=f"Refunds {order}")
        listed = await rt.store.pending(PendingFilter(limit=100))
        assert len(listed) == 6
        bad = listed[2]  # the first of the second page of two
        sql, value = _DAMAGE[damage]
        edit(store_url, sql, *((value,) if value is not None else ()), bad.id)
        with pytest.raises(so.StoreDamaged):  # the store's own listing shows the damage
            await rt.store.pending(PendingFilter(limit=100))
        # A listing people read logs it and leaves it out (test_listing_damaged_rows.py).
        assert bad.id not in {r.id for r in await rt.pending()}
        watcher = Opened(0)
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            async with manual(ChannelHub(rt, [watcher])):
                pass
        opened = [rid for kind, rid in watcher.seen if kind == "open"]
        assert opened == [r.id for r in listed if r.id != bad.id]
        assert bad.id in caplog.text and bad.session_id in caplog.text


async def test_a_subagent_request_no_one_can_read_is_passed_with_its_mirror(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A subagent's request that cannot be read is passed, and so is the mirror on its parent
    that shows it (reading it failed the same start); the other subagent's request is handed."""
    from ._subagents import ALICE, Counted, refund_agents

    async with so.Runtime(list(refund_agents([], Counted("done"))), store=store_url) as rt:
        one, two = [await rt.generate("support", prompt="Refund", auth=ALICE) for _ in "12"]
        children = [r.pending[0].child for r in (one, two)]
        assert children[0] is not None and children[1] is not None
        edit(
            store_url,
            "UPDATE {t}requests SET data = {p} WHERE id = {p}",
            b"{broken",
            children[0].request_id,
        )
        watcher = Opened(0)
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            async with manual(ChannelHub(rt, [watcher])):
                pass
        assert [rid for _, rid in watcher.seen] == [children[1].request_id]
        assert f"request {one.pending[0].id}, not handed" in caplog.text
        assert f"request {children[0].request_id}, not handed" in caplog.text
