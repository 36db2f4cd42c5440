"""The entries a hub gave a channel up on (it failed on each `max_attempts` times) are delivered
again while the hub runs, every `REDO_EVERY` seconds, not only when it next starts: a service
down for a few minutes must not leave the approvals opened meanwhile unshown until a restart.
A round stops at the first entry that fails again (the service is still down) rather than
holding the hub's poll, and the other channels, through one failure per entry; one that never
goes through holds back none of the others, tried in turn behind it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels import _given_up as given_up
from signoff.channels.slack import SlackChannel, slack_principal
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._channels import escalating_refund, manual, three_refunds
from ._slack import ALICE, SECRET, TEAM, FakeSlack, channel, date, deleting_agent, slack_api
from .test_channels_hub import Flaky

__all__ = ["slack_api"]  # the fixture, used by name


def _refund(runs: list[str]) -> so.Agent:
    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> dict[str, Any]:
        """Refund an order."""
        runs.append(order_id)
        return {"refunded": order_id}

    return scripted_agent(
        "support",
        [call_tools(call("issue_refund", order_id="A-1")), reply("Done.")],
        tools=[issue_refund],
    )


async def test_entries_given_up_on_are_delivered_again_while_the_hub_runs(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "hub.db"
    async with so.Runtime([_refund([])], store=store_url) as rt:
        down = Flaky(3)
        async with manual(ChannelHub(rt, [down], state=state, max_attempts=1)) as hub:
            first = (await rt.generate("support", prompt="Refund A")).pending[0]
            second = (await rt.generate("support", prompt="Refund B")).pending[0]
            await hub.poll()  # both given up on
            assert (down.attempts, down.seen) == (2, [])
            await hub.poll()
            assert down.attempts == 2  # not before `REDO_EVERY` has passed
            monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
            await hub.poll()  # still down: the round stops at the first entry
            assert (down.attempts, down.seen) == (3, [])
            await hub.poll()  # back
            assert down.seen == [("requested", first.id), ("requested", second.id)]
            await hub.poll()
            assert down.attempts == 5  # nothing twice
        again = Flaky(0)
        async with manual(ChannelHub(rt, [again], state=state)) as hub:
            await hub.poll()
        assert again.seen == []  # not at the next start either


async def test_a_slack_post_given_up_on_is_posted_once_slack_is_back_without_a_restart(
    tmp_path: Path, slack_api: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the approval stayed unposted (nobody in Slack could see it) until the hub's next
    start, however long the server ran on."""
    monkeypatch.setattr(given_up, "REDO_EVERY", 0.2)
    async with so.Runtime([_refund([])], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack], state=tmp_path / "hub.db", max_attempts=1)
        async with manual(hub):
            slack_api.down["chat.postMessage"] = 1  # a 503: Slack took nothing
            req = (await rt.generate("support", prompt="Refund A", auth=ALICE)).pending[0]
            await hub.poll()
            assert slack.recall(f"msg:{req.id}") is None
            await asyncio.sleep(0.3)
            await hub.poll()
            assert slack.recall(f"msg:{req.id}") is not None
            (_, post) = slack_api.of("chat.postMessage")
            assert post["metadata"]["event_payload"]["request_id"] == req.id
            await hub.poll()
        assert len(slack_api.of("chat.postMessage")) == 2


def _facts(posted: dict[str, Any]) -> str:
    """The line of facts of a posted message (its request, session, progress, deadline)."""
    (facts,) = [b for b in posted["blocks"] if b["block_id"] == "signoff.facts"]
    text = facts["elements"][0]["text"]
    assert isinstance(text, str)
    return text


async def test_a_post_given_up_on_shows_the_votes_counted_before_it_went_through(
    tmp_path: Path, slack_api: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A vote counted while Slack was down was told to no message (none was posted yet). Before,
    the post delivered again showed the request as it opened, "0 of 2" with one vote counted,
    and nothing updated it until the next vote or the close."""

    agent = deleting_agent()
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack], state=tmp_path / "hub.db", max_attempts=1)
        async with manual(hub):
            slack_api.down["chat.postMessage"] = 1
            req = (await rt.generate("admin", prompt="Delete acct_7", auth=ALICE)).pending[0]
            await hub.poll()  # its post given up on
            voter = slack_principal(TEAM, "U0BOB")
            vote = so.InputResponse(request_id=req.id, option_id="approve")
            (counted,) = (await rt.respond(req.session_id, [vote], principal=voter)).outcomes
            assert counted.outcome == "counted"
            await hub.poll()  # the count: no message to update yet
            monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
            await hub.poll()
            _, posted = slack_api.of("chat.postMessage")
            assert _facts(posted) == (
                f"request `{req.id}` · session `{req.session_id}` · "
                f"needs 2 approvals (1 of 2: {voter.principal_id})"
            )
            await hub.poll()
        assert len(slack_api.of("chat.postMessage")) == 2


async def test_a_post_given_up_on_names_the_group_it_was_escalated_to_meanwhile(
    tmp_path: Path, slack_api: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its deadline passed and it was escalated while Slack was down. Before, the post delivered
    again showed the passed deadline and never named the group (the escalation had been told to
    no message)."""
    clock = ManualClock()
    store = f"sqlite:///{tmp_path / 's.db'}"
    async with so.Runtime([escalating_refund()], store=store, clock=clock) as rt:
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack], state=tmp_path / "hub.db", max_attempts=1, clock=clock)
        async with manual(hub):
            slack_api.down["chat.postMessage"] = 1
            req = (await rt.generate("support", prompt="Refund A-1", auth=ALICE)).pending[0]
            await hub.poll()  # its post given up on
            clock.advance(61)
            assert await rt.expire_due() == 1
            await hub.poll()  # the escalation: no message to update yet
            monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
            await hub.poll()
            _, posted = slack_api.of("chat.postMessage")
            facts = _facts(posted)
            assert facts == (
                f"request `{req.id}` · session `{req.session_id}` · "
                ":arrow_up: escalated to *finance*: no one decided before the deadline"
            )
            assert date(req.expires_at or 0) not in facts
            assert posted["blocks"][-1]["type"] == "actions"  # the group answers it there


class _Refusing(Flaky):
    """Fails on every request whose id it `refuses` (a delivery no retry can make), and on the
    others while it is `down`."""

    def __init__(self, refuses: set[str]) -> None:
        super().__init__(0)
        self.refuses = refuses
        self.down = False

    async def on_requested(self, request: so.InputRequest) -> None:
        self.attempts += 1
        if self.down or request.id in self.refuses:
            raise ConnectionError("refused")
        self.seen.append(("requested", request.id))


async def test_an_entry_that_fails_every_round_holds_back_none_given_up_on_after_it(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round stops at the first entry that fails again; when the oldest failed first in the
    round before too, one other is tried, in turn, and once it goes through the rest follow.
    Before, one entry that could never be delivered was the only one tried each round, and
    the others waited for the next start."""
    async with so.Runtime([_refund([])], store=store_url) as rt:
        ch = _Refusing(set())
        async with manual(ChannelHub(rt, [ch], state=tmp_path / "hub.db", max_attempts=1)) as hub:
            stuck = (await rt.generate("support", prompt="Refund A")).pending[0]
            ch.refuses.add(stuck.id)
            await hub.poll()  # given up on
            ch.down = True
            later = [(await rt.generate("support", prompt=p)).pending[0] for p in "BC"]
            await hub.poll()  # both given up on too
            assert (ch.attempts, ch.seen) == (3, [])
            monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
            await hub.poll()  # still down: the round stops at the first entry
            assert ch.attempts == 4
            ch.down = False
            await hub.poll()  # the oldest fails first again: the next goes through, and the rest
            assert ch.seen == [("requested", r.id) for r in later]
            assert ch.attempts == 7
            await hub.poll()  # only the one that never goes through is left
            assert ch.attempts == 8


async def test_each_entry_given_up_on_is_tried_in_turn_behind_ones_that_never_go_through(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two entries that never go through, then one that would: the rounds try the others in
    turn behind the oldest, so the third is delivered by the third round, not never."""
    monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
    async with so.Runtime([_refund([])], store=store_url) as rt:
        ch = _Refusing(set())
        async with manual(ChannelHub(rt, [ch], state=tmp_path / "hub.db", max_attempts=1)) as hub:
            opened = [(await rt.generate("support", prompt=p)).pending[0] for p in "ABC"]
            ch.refuses.update(r.id for r in opened)
            await hub.poll()  # all three given up on
            ch.refuses.discard(opened[2].id)
            tried = []
            for _ in range(3):
                before = ch.attempts
                await hub.poll()
                tried.append(ch.attempts - before)
            assert tried == [1, 2, 3]  # A; A and B; A, C (delivered) and B, the rest
            assert ch.seen == [("requested", opened[2].id)]


async def test_an_update_in_an_archived_old_channel_holds_back_no_post_given_up_on(
    tmp_path: Path, slack_api: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The close of a request whose message is in the conversation the app posted to before
    `channel` changed, archived since, fails every round (not the channel's own: not waited
    out). Before, each round tried it first and stopped there, so a request whose post was
    given up on in a short outage meanwhile was not posted until the hub's next start."""
    state = tmp_path / "hub.db"
    async with so.Runtime([_refund([])], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        async with manual(ChannelHub(rt, [channel(slack_api)], state=state)) as hub:
            first = await rt.generate("support", prompt="Refund A", auth=ALICE)
            await hub.poll()
        slack_api.messages["C99"] = []
        moved = SlackChannel(
            "C99", token="xoxb-test", base_url=slack_api.url, signing_secret=SECRET
        )
        async with manual(ChannelHub(rt, [moved], state=state, max_attempts=1)) as hub:
            slack_api.failing["chat.update"] = "is_archived"  # only the message in C42 is updated
            answer = so.InputResponse(request_id=first.pending[0].id, option_id="approve")
            await rt.respond(first.session_id, [answer], principal=ALICE)
            await hub.poll()  # its update given up on
            slack_api.failing["chat.postMessage"] = "internal_error"
            req = (await rt.generate("support", prompt="Refund B", auth=ALICE)).pending[0]
            await hub.poll()  # its post given up on
            del slack_api.failing["chat.postMessage"]
            monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
            for _ in range(2):
                await hub.poll()
            assert moved.recall(f"msg:{req.id}") == {"channel": "C99", "ts": ANY}
        assert len(slack_api.of("chat.postMessage")) == 3


class Refusing(Flaky):
    """Fails for good on the requests named in `refused`, and tells the others."""

    refused: set[str]

    async def on_requested(self, request: so.InputRequest) -> None:
        self.attempts += 1
        if request.id in self.refused:
            raise ValueError("refused for good")
        self.seen.append(("requested", request.id))


async def test_a_request_a_channel_never_takes_holds_back_none_beside_it_in_its_entry(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three requests opened together, the channel failing for good on the middle one: each
    attempt stopped there, so the last was never shown, neither by the attempts nor by the
    rounds delivering it again, and the first was shown again by every one of them. Delivered
    again once given up on, the entry shows the others; no request is shown twice."""
    monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
    async with so.Runtime([three_refunds([])], store=store_url) as rt:
        picky = Refusing(0)
        async with manual(ChannelHub(rt, [picky], max_attempts=3, retry_backoff=0)) as hub:
            a = (await rt.generate("support", prompt="Refund A")).pending
            picky.refused = {a[1].id}
            b = (await rt.generate("support", prompt="Refund B")).pending
            for _ in range(3):  # its three attempts, each stopping at the refused one
                await hub.poll()
            assert picky.seen == [("requested", r.id) for r in [a[0], *b]]
            assert picky.attempts == 4 + 3
            await hub.poll()  # a round delivering it again: past the refused one
            shown = [("requested", r.id) for r in [a[0], *b, a[2]]]
            assert picky.seen == shown
            await hub.poll()  # the next: the refused one alone
            assert picky.seen == shown
            assert picky.attempts == 4 + 3 + 2 + 1


async def test_a_damaged_memo_of_entries_given_up_on_keeps_its_ids_and_the_hub_polling(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """A hand-damaged memo (ids that are not entry ids beside those that are) failed every poll
    of the hub with a bare ValueError (`int("x")`): the ids it holds are delivered again, the
    rest left out and logged, as a memo that is not JSON is read as absent."""
    state = tmp_path / "hub.db"
    async with so.Runtime([_refund([])], store=store_url) as rt:
        down = Flaky(1)
        hub = ChannelHub(rt, [down], state=state, max_attempts=1)
        async with manual(hub):
            first = (await rt.generate("support", prompt="Refund A")).pending[0]
            await hub.poll()  # given up on
            key = hub._key(down)
            [kept] = hub.state.recall(key, "skipped")
            hub.state.remember(key, "skipped", ["x", kept, True, {"a": 1}, -2])
            monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
            await hub.poll()
            assert down.seen == [("requested", first.id)]
            second = (await rt.generate("support", prompt="Refund B")).pending[0]
            await hub.poll()
            assert down.seen == [("requested", first.id), ("requested", second.id)]
            hub.state.remember(key, "skipped", {"a": 1})  # no list: no ids, the new one kept
            given_up._note(hub.state, key, 9)
            assert hub.state.recall(key, "skipped") == [9]
    assert "holds what is no entry id ('x', True, {'a': 1}, -2): left out" in caplog.text


async def test_a_damaged_memo_of_entries_given_up_on_is_cleaned_and_logged_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """A hand-damaged memo whose entries keep failing is written back cleaned at the first
    round: its warning is logged once, not at every round for as long as the hub runs. One
    holding no entry id at all is dropped."""
    async with so.Runtime([_refund([])], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        down = Flaky(100)
        hub = ChannelHub(rt, [down], state=tmp_path / "hub.db", max_attempts=1)
        async with manual(hub):
            await rt.generate("support", prompt="Refund A")
            await hub.poll()  # given up on
            key = hub._key(down)
            [kept] = hub.state.recall(key, "skipped")
            hub.state.remember(key, "skipped", ["x", kept])
            monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
            for _ in range(4):
                await hub.poll()  # a round each, failing again
            assert hub.state.recall(key, "skipped") == [kept]
            assert caplog.text.count("holds what is no entry id") == 1
            hub.state.remember(key, "skipped", ["x"])
            await hub._redeliver(down)
            assert hub.state.recall(key, "skipped") is None
            await hub._redeliver(down)
            assert caplog.text.count("holds what is no entry id") == 2
