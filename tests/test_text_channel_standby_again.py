"""A text channel of a hub that stood by (its claim lapsed while it stalled and another hub took
it) and later takes delivery back shows only what is open then. Before, its queue kept the
requests it held when it stood by, including those the other hub saw closed: once the request
shown was answered it showed a closed one, which every later reply answered again (a no-op),
and the open one behind it was never shown."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

import signoff as so
from signoff.channels import ChannelHub, _claims

from ._channels import Texts, three_refunds

BOB = so.Principal(authenticator="sms", principal_id="+15550100")


@asynccontextmanager
async def two_hubs(
    rt: so.Runtime,
) -> AsyncIterator[tuple[Texts, Texts, ChannelHub, ChannelHub]]:
    """Two started hubs on `rt`'s store, each with a text channel, claims lapsing in 0.5 s."""
    first, second = Texts(), Texts()
    one = ChannelHub(rt, [first], claim_ttl=0.5)
    two = ChannelHub(rt, [second], claim_ttl=0.5)
    await one.start(follow=False)
    await two.start(follow=False)
    try:
        yield first, second, one, two
    finally:
        await one.stop()
        await two.stop()


async def test_a_hub_taking_delivery_back_forgets_what_closed_while_it_stood_by(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_claims, "TRY_EVERY", 0.0)  # a standby tries at every poll
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        async with two_hubs(rt) as (first, second, one, two):
            a, b, c = (await rt.generate("support", prompt="Refund A, B and C")).pending
            await one.poll()
            assert first.sent == [first.render(a)]
            await asyncio.sleep(0.6)  # one is frozen: its claim lapses
            await two.poll()
            assert two.active
            outcome = await second.reply("yes", BOB)  # A, which the person was shown
            assert outcome is not None and outcome.request_id == a.id
            await two.poll()
            assert second.sent[-1] == second.render(b)
            await one.poll()  # wakes up: the claim is two's, it stands by
            assert not one.active
            await two.stop()  # gives the claim back: one takes delivery back
            await one.poll()
            assert one.active
            assert [r.id for r in first.waiting] == [b.id, c.id]
            outcome = await first.reply("yes", BOB)
            assert outcome is not None and outcome.request_id == b.id
            await one.poll()
            assert first.sent[-1] == first.render(c)  # C is shown next, not A again
            outcome = await first.reply("yes", BOB)
            assert outcome is not None and (outcome.request_id, outcome.applied) == (c.id, True)
        assert runs == ["A-1", "B-2", "C-3"]


async def test_a_reply_reaching_a_hub_that_lost_its_claim_answers_what_is_shown(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hub whose claim lapsed stands by with the queue it held then: a reply reaching its
    process answered the first of that queue (a request answered since, so the reply was
    refused or lost), sent the person a closed request, and wrote over the store's memo of
    what is shown. It answers what the delivering hub shows, and sends and writes nothing."""
    from signoff.channels._text_shown import shown_in_store

    monkeypatch.setattr(_claims, "TRY_EVERY", 0.0)
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        async with two_hubs(rt) as (first, second, one, two):
            a, b, c = (await rt.generate("support", prompt="Refund A, B and C")).pending
            await one.poll()
            await asyncio.sleep(0.6)  # one stalls: its claim lapses
            await two.poll()
            for _ in (a, b):
                await second.reply("yes", BOB)
                await two.poll()
            assert second.current is not None and second.current.id == c.id
            await one.poll()  # one wakes, and stands by
            assert not one.active
            sent = len(first.sent)
            outcome = await first.reply("yes", BOB)  # C, which the person sees
            assert outcome is not None and (outcome.request_id, outcome.applied) == (c.id, True)
            assert first.sent[sent:] == []
            assert (await shown_in_store(second))[1] == c.id


async def test_a_standby_answering_the_head_of_its_stale_queue_shows_nothing_next(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request the delivering hub shows was also the head of the standby's stale queue: the
    reply answered it, then the standby showed the next of its queue (one closed meanwhile) and
    wrote the store's memo. The delivering hub shows what comes next; the standby sends nothing."""
    from signoff.channels._text_shown import shown_in_store

    monkeypatch.setattr(_claims, "TRY_EVERY", 0.0)
    runs: list[str] = []
    async with so.Runtime([three_refunds(runs)], store=store_url) as rt:
        async with two_hubs(rt) as (first, second, one, two):
            a, b, _ = (await rt.generate("support", prompt="Refund A, B and C")).pending
            await one.poll()
            await asyncio.sleep(0.6)  # one stalls: its claim lapses
            await two.poll()
            assert second.current is not None and second.current.id == a.id
            deny = so.InputResponse(request_id=b.id, option_id="cancel")
            await rt.respond(a.session_id, [deny], resume=False)  # B closes elsewhere
            await two.poll()
            await one.poll()  # one wakes and stands by, its queue still A, B, C
            assert not one.active
            sent = len(first.sent)
            outcome = await first.reply("yes", BOB)  # A, which two shows
            assert outcome is not None and (outcome.request_id, outcome.applied) == (a.id, True)
            assert first.sent[sent:] == []
            assert (await shown_in_store(second))[1] != b.id
