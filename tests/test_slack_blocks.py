"""What a request's Slack message shows as the request changes (`_blocks`): a quorum's
progress, a deadline, an escalation, an expiry or withdrawal, input edited elsewhere, and
options longer than Slack allows.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Literal

import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels.slack import slack_principal
from signoff.testing import call, call_tools, reply, scripted_agent

from ._slack import (
    ALICE,
    APPROVERS,
    TEAM,
    FakeSlack,
    approval_blocks,
    channel,
    click,
    date,
    deleting_agent,
    manual,
    refund_runtime,
    resolved_at,
    sign,
    slack_api,
)

__all__ = ["slack_api"]  # the fixture, used by name


def _approve_click(request_id: str, user: str, action_ts: str) -> bytes:
    """The form body of `user` clicking the request's Approve button at `action_ts`."""
    return click(
        {
            "action_id": "signoff.approve",
            "block_id": f"signoff:{request_id}",
            "value": request_id,
            "type": "button",
            "action_ts": action_ts,
        },
        user=user,
    )


async def test_a_quorum_shows_its_progress_until_it_is_met(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    runs: list[str] = []

    agent = deleting_agent(runs)
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("admin", prompt="Delete acct_7", auth=ALICE)
        (req,) = r.pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            for i, user in enumerate(("U1", "U1", "U2")):  # the same person twice counts once
                body = _approve_click(req.id, user, f"1700000100.00000{i}")
                await slack.handle(body, sign(body, int(time.time())))
                await slack.idle()
                await hub.poll()
        first, last = slack_api.of("chat.update")
        assert first["blocks"][2]["elements"][0]["text"] == (
            f"request `{req.id}` · session `{req.session_id}` · "
            "needs 2 approvals (1 of 2: slack:T012AB3CD:U1)"
        )
        assert first["blocks"][3]["type"] == "actions"  # still open: the buttons stay
        assert last["blocks"][3]["block_id"] == "signoff.resolution"
        assert last["blocks"][3]["elements"][0]["text"].startswith(
            ":white_check_mark: *Approved* by <@U2> "
        )
        assert [e["text"] for e in slack_api.of("chat.postEphemeral")] == [
            "Your approval was counted (1 of 2).",
            "You approved this request before (already counted: 1 of 2).",
        ]
        assert runs == ["acct_7"]


async def test_expired_and_withdrawn_requests_stay_visible_as_records(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    from signoff.testing import ManualClock

    @so.tool(approval=so.always(expires_in=60))
    async def wipe_cache(region: str) -> str:
        """Wipe a cache."""
        return "wiped"

    agent = scripted_agent(
        "ops",
        [call_tools(call("wipe_cache", region="eu")), reply("Done.")],
        tools=[wipe_cache],
        repeat_last=True,
    )
    clock = ManualClock()
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt:
        first = await rt.generate("ops", prompt="Wipe eu")
        (expiring,) = first.pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], clock=clock)) as hub:
            await hub.poll()
            posted = slack_api.of("chat.postMessage")[0]["blocks"]
            assert posted[2]["elements"][0]["text"].endswith(
                f" · expires {date(expiring.expires_at or 0)}"
            )
            clock.advance(61)
            assert await rt.expire_due() == 1
            second = await rt.generate("ops", prompt="Wipe eu again")
            (withdrawn,) = second.pending
            await hub.poll()
            await rt.cancel(second.session_id)
            await hub.poll()
        cancelled_at = await resolved_at(rt, withdrawn.id)
        first_update, second_update = slack_api.of("chat.update")
        stored = await rt.store.get_request(expiring.id)
        assert stored is not None and stored.resolution is not None
        assert first_update["blocks"][-1]["elements"][0]["text"] == (
            # at its deadline, not when the lapse was recorded (a second later here)
            f":hourglass: *Expired* {date(expiring.expires_at or 0)}: "
            f"“{stored.resolution['reason']}”"
        )
        assert second_update["blocks"][-1]["elements"][0]["text"] == (
            f":no_entry_sign: *Withdrawn* {date(cancelled_at)}: “turn cancelled”"
        )
        assert first_update["blocks"][1] == posted[1]  # the exact input is still shown


def _wiping(on_timeout: Literal["deny", "approve"], runs: list[str]) -> so.Agent:
    """An agent whose `wipe_cache` call (each run's region added to `runs`) asks an approval
    that its 60 s deadline closes as `on_timeout` says."""

    @so.tool(approval=so.always(expires_in=60, on_timeout=on_timeout))
    async def wipe_cache(region: str) -> str:
        """Wipe a cache."""
        runs.append(region)
        return "wiped"

    return scripted_agent(
        "ops", [call_tools(call("wipe_cache", region="eu")), reply("Done.")], tools=[wipe_cache]
    )


async def test_a_call_its_deadline_approved_reads_approved_automatically_not_expired(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """`on_timeout="approve"`: the open message says what its deadline does, and once it passed
    the call ran. Before, the message said only "expires <date>", then "Expired … no one
    decided" (and its text "Expired: …"), as for a call that never ran."""
    from signoff.testing import ManualClock

    runs: list[str] = []
    agent = _wiping("approve", runs)
    clock = ManualClock()
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt:
        (req,) = (await rt.generate("ops", prompt="Wipe eu")).pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], clock=clock)) as hub:
            await hub.poll()
            (posted,) = slack_api.of("chat.postMessage")
            assert posted["blocks"][2]["elements"][0]["text"] == (
                f"request `{req.id}` · session `{req.session_id}` · "
                f"expires {date(req.expires_at or 0)}, then it is approved automatically"
            )
            clock.advance(61)
            assert await rt.expire_due() == 1
            await hub.poll()
        assert runs == ["eu"]
        (closed,) = slack_api.of("chat.update")
        assert closed["text"] == "Approved automatically: ops wants to run wipe_cache"
        assert closed["blocks"][-1]["elements"][0]["text"] == (
            ":white_check_mark: *Approved automatically* when the deadline passed "
            f"{date(req.expires_at or 0)}: “no one decided before the deadline”"  # not recorded
        )


@pytest.mark.parametrize(
    ("on_timeout", "closed"),
    [
        ("deny", ":hourglass: *Expired* {}"),
        ("approve", ":white_check_mark: *Approved automatically* when the deadline passed {}"),
    ],
    ids=["deny", "approve"],
)
async def test_a_lapse_recorded_late_reads_closed_at_its_deadline(
    tmp_path: Path, slack_api: FakeSlack, on_timeout: Literal["deny", "approve"], closed: str
) -> None:
    """No worker recorded the lapse for three hours: the message read "Expired" (or "Approved
    automatically when the deadline passed") at that recording, three hours after the deadline
    it had shown. It reads the deadline."""
    from signoff.testing import ManualClock

    agent = _wiping(on_timeout, [])
    clock = ManualClock()
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt:
        (req,) = (await rt.generate("ops", prompt="Wipe eu")).pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], clock=clock)) as hub:
            await hub.poll()
            clock.advance(3 * 3600)
            assert await rt.expire_due() == 1
            await hub.poll()
        assert req.expires_at is not None and await resolved_at(rt, req.id) > req.expires_at + 3600
        (update,) = slack_api.of("chat.update")
        assert update["blocks"][-1]["elements"][0]["text"] == (
            f"{closed.format(date(req.expires_at))}: “no one decided before the deadline”"
        )


async def test_an_escalated_request_says_where_it_went_and_its_group_answers_from_slack(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """The deadline passed and a worker escalated the request: its message is updated in place
    (the group instead of the passed deadline, the buttons kept), and a click by a member of the
    group settles it; the closed message still says it was escalated."""
    from signoff.testing import ManualClock

    def finance_once_escalated(ctx: so.ResponseContext) -> Literal["allowed", "rejected"]:
        who = ctx.response.principal
        member = who is not None and who.principal_id in APPROVERS
        return "allowed" if ctx.request.escalated_to == "finance" and member else "rejected"

    spec = so.ApprovalSpec(
        request=so.always(),
        response=finance_once_escalated,
        expires_in=60,
        on_timeout="escalate",
        escalate_to="finance",
    )

    @so.tool(approval=spec)
    async def wipe_cache(region: str) -> str:
        """Wipe a cache."""
        return "wiped"

    agent = scripted_agent(
        "ops", [call_tools(call("wipe_cache", region="eu")), reply("Done.")], tools=[wipe_cache]
    )
    clock = ManualClock()
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt:
        r = await rt.generate("ops", prompt="Wipe eu", auth=ALICE)
        (req,) = r.pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], clock=clock)) as hub:
            await hub.poll()
            (posted,) = slack_api.of("chat.postMessage")
            facts = f"request `{req.id}` · session `{req.session_id}`"
            assert posted["blocks"][2]["elements"][0]["text"] == (
                f"{facts} · expires {date(req.expires_at or 0)}, then it is escalated to *finance*"
            )
            clock.advance(61)
            assert await rt.expire_due() == 1
            await hub.poll()
            await hub.poll()
            (escalated,) = slack_api.of("chat.update")
            assert (escalated["channel"], escalated["ts"]) == ("C42", "1700000000.000001")
            assert escalated["blocks"][2]["elements"][0]["text"] == (
                f"{facts} · :arrow_up: escalated to *finance*: no one decided before the deadline"
            )
            assert escalated["blocks"][:2] == posted["blocks"][:2]
            assert escalated["blocks"][3] == posted["blocks"][3]  # Approve / Deny stay
            body = click(
                {
                    "action_id": "signoff.approve",
                    "block_id": f"signoff:{req.id}",
                    "value": req.id,
                    "type": "button",
                }
            )
            await slack.handle(body, sign(body, int(time.time())))
            await slack.idle()
            await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "approved"
        _, closed = slack_api.of("chat.update")
        assert closed["blocks"][2] == escalated["blocks"][2]
        assert closed["blocks"][3]["elements"][0]["text"].startswith(
            ":white_check_mark: *Approved* by <@U045EF6GH> "
        )


def _menu(posted: dict[str, Any]) -> dict[str, Any]:
    """The one select menu of a posted message."""
    (select,) = [
        e
        for b in posted["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
        if e["type"] == "static_select"
    ]
    assert isinstance(select, dict)
    return select


async def _choose(slack: Any, request_id: str, option: dict[str, Any]) -> None:
    """Choose `option` of a request's menu as user U5 would, and wait for it to settle."""
    body = click(
        {
            "type": "static_select",
            "action_id": "signoff.option",
            "block_id": f"signoff:{request_id}",
            "selected_option": option,
        },
        user="U5",
    )
    await slack.handle(body, sign(body, int(time.time())))
    await slack.idle()


async def test_options_longer_than_slack_allows_are_chosen_by_position(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """Slack refuses a select option whose value is over 150 characters (and text over 75): an
    option id that long is sent as its position, and choosing it answers with the real id."""
    plan = "Enterprise plan with " + "dedicated support, " * 10
    assert len(plan) > 150

    @so.tool
    async def choose_plan(ctx: so.ToolContext) -> str:
        """Ask which plan to buy."""
        answer = await ctx.ask("Which plan?", options=[plan, "Basic"], allow_text=False)
        return str(answer.option_id)

    agent = scripted_agent(
        "shop", [call_tools(call("choose_plan")), reply("Bought.")], tools=[choose_plan]
    )
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Buy a plan")
        (req,) = r.pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            (posted,) = slack_api.of("chat.postMessage")
            select = _menu(posted)
            for o in select["options"]:
                assert len(o["value"]) <= 150 and len(o["text"]["text"]) <= 75, o
            await _choose(slack, req.id, select["options"][0])
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["answer"]["option_id"] == plan


async def test_a_request_posted_late_shows_the_approvals_counted_meanwhile(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """An open request Slack's rate limit held back at start is posted as it is then, with
    the approvals counted while it waited, not as it was when the hub started."""

    agent = deleting_agent()
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("admin", prompt="Delete acct_7", auth=ALICE)
        (req,) = r.pending
        slack_api.limited["chat.postMessage"] = 1
        async with manual(ChannelHub(rt, [channel(slack_api)])) as hub:
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="approve")],
                principal=slack_principal(TEAM, "U1"),
            )
            await asyncio.sleep(1.05)
            await hub.poll()
        _, posted = slack_api.of("chat.postMessage")
        assert posted["blocks"][-2]["elements"][0]["text"].endswith(
            "needs 2 approvals (1 of 2: slack:T012AB3CD:U1)"
        )


async def test_an_approval_with_edited_input_from_elsewhere_shows_the_input_that_ran(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """Approved elsewhere (the API, the dashboard) with edited input: the closed message shows
    the input the call ran with beside the proposed one, not only the proposal."""
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        async with manual(ChannelHub(rt, [channel(slack_api)])) as hub:
            await hub.poll()
            edit = {"order_id": "1042", "amount": 150, "reason": "arrived broken"}
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="approve", edited_input=edit)],
                principal=slack_principal(TEAM, "U078JK9LM"),
            )
            await hub.poll()
        assert log == [("1042", 150.0)]
        (update,) = slack_api.of("chat.update")
        assert update["blocks"][:2] == approval_blocks(req)[:2]  # the proposal stays readable
        assert update["blocks"][3] == {
            "type": "section",
            "block_id": "signoff.edited",
            "text": {
                "type": "mrkdwn",
                "text": 'Approved with edited input:\n```{\n  "order_id": "1042",\n'
                '  "amount": 150.0,\n  "reason": "arrived broken"\n}```',
                "verbatim": True,
            },
        }
        assert update["blocks"][-1]["elements"][0]["text"].startswith(
            ":white_check_mark: *Approved* by <@U078JK9LM> "
        )


async def test_a_deadline_past_the_year_9999_is_posted_not_raised(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """`expires_in=1e12` is a valid deadline past what a datetime holds: formatting it raised
    "year out of range" and the request was never posted; it reads as after 9999-12-31."""
    runs: list[str] = []

    @so.tool(approval=so.always(expires_in=1e12))
    async def wipe_cache(region: str) -> str:
        """Wipe a cache."""
        runs.append(region)
        return "wiped"

    agent = scripted_agent(
        "ops", [call_tools(call("wipe_cache", region="eu")), reply("Done.")], tools=[wipe_cache]
    )
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("ops", prompt="Wipe eu")
        (req,) = r.pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            (posted,) = slack_api.of("chat.postMessage")
            assert posted["blocks"][2]["elements"][0]["text"].endswith(
                " · expires after 9999-12-31"
            )
            body = _approve_click(req.id, "U1", "1700000100.000001")
            await slack.handle(body, sign(body, int(time.time())))
            await slack.idle()
            await hub.poll()
        assert runs == ["eu"]


async def test_a_closed_requests_message_text_says_how_it_closed_not_approve_or_deny(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """The message's `text` (what notifications, search and screen readers read in place of
    the blocks) is rewritten with the blocks: a closed request no longer asks to be decided."""

    @so.tool(approval=so.always())
    async def wipe_cache(region: str) -> str:
        """Wipe a cache."""
        return "wiped"

    agent = scripted_agent(
        "ops",
        [call_tools(call("wipe_cache", region="eu")), reply("Done.")],
        tools=[wipe_cache],
        repeat_last=True,
    )
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            for answer in ("approve", "cancel", None):
                r = await rt.generate("ops", prompt="Wipe eu", auth=ALICE)
                (req,) = r.pending
                await hub.poll()
                if answer is None:
                    await rt.cancel(r.session_id)
                else:
                    response = so.InputResponse(request_id=req.id, option_id=answer)
                    await rt.respond(r.session_id, [response], principal=ALICE)
                await hub.poll()
        (posted, *_) = slack_api.of("chat.postMessage")
        assert posted["text"] == "ops wants to run wipe_cache: approve or deny"
        assert [u["text"] for u in slack_api.of("chat.update")] == [
            "Approved: ops wants to run wipe_cache",
            "Denied: ops wants to run wipe_cache",
            "Withdrawn: ops wants to run wipe_cache",
        ]


async def test_an_id_that_reads_as_a_position_does_not_answer_for_the_option_there(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """An option id too long for Slack is sent as its position, `signoff.option#0`, and an
    option whose id is `signoff.option#0` was sent as it is: the menu gave both one value, and
    choosing "Delete everything" recorded "Keep" (the id was read first). An id beginning so is
    sent as its position too, and choosing each answers with its own id."""
    options = [
        so.Option(id="x" * 200, label="Delete everything"),
        so.Option(id="signoff.option#0", label="Keep"),
    ]

    @so.tool
    async def clean_up(ctx: so.ToolContext) -> str:
        """Ask what to do."""
        return str((await ctx.ask("What now?", options=options)).option_id)

    agent = scripted_agent("ops", [call_tools(call("clean_up")), reply("Done.")], tools=[clean_up])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("ops", prompt="Clean up")
        (req,) = r.pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            (posted,) = slack_api.of("chat.postMessage")
            select = _menu(posted)
            values = [o["value"] for o in select["options"]]
            assert values == ["signoff.option#0", "signoff.option#1"]
            await _choose(slack, req.id, select["options"][0])
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["answer"]["option_id"] == "x" * 200
