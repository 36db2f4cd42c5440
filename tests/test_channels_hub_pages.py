"""A hub hands its channels every open request though it reads them in pages: one closed on an
earlier page between two page reads shifts no later request out of the listing."""

from __future__ import annotations

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
