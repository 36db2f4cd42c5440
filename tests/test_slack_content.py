"""What the Slack channel writes into a message: text Slack can take (valid Unicode, Block Kit's
limits) whatever a model or a tool put in the request, and that still answers it from Slack.

Uses the fake Slack of `_slack`, which refuses blocks the way Slack does (`invalid_blocks`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff import _tool_context
from signoff.channels import ChannelHub
from signoff.testing import call, call_tools, reply, scripted_agent

from ._slack import FakeSlack, channel, click, manual, sign, slack_api

__all__ = ["slack_api"]  # the fixture, used by name

ODD = "x\ud800y\x00z\u202eevil\u200b"  # a lone surrogate, NUL, a bidi override, a zero-width space
# The runtime refuses an answer holding a lone surrogate, so an option's id and label (which the
# answer records) carry only the rest.
CHOSEN = "x\x00z\u202eevil\u200b"


def strings(value: Any) -> list[str]:
    """Every string in a JSON value, keys too."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in [k, *strings(v)]]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def selects(posted: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        e
        for b in posted["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
        if e["type"] == "static_select"
    ]


async def test_unsendable_text_is_posted_made_sendable_and_still_answers(
    tmp_path: Path, slack_api: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone surrogate (which JSON can carry from a model but UTF-8 cannot hold), NUL and bidi
    overrides in a question, its options or a tool input: the request is posted with them
    replaced (escaped in the input, so it reads exactly), and choosing such an option from
    Slack answers with its real id; the closed message is accepted too. (`ctx.ask` refuses a
    lone surrogate in a question or description now: the question is one stored before.)"""

    @so.tool
    async def pick(ctx: so.ToolContext, q: str) -> str:
        """Ask which."""
        options: list[so.Option | str] = [
            so.Option(id="o" + CHOSEN, label="L" + CHOSEN, description="d" + ODD),
            "plain",
        ]
        answer = await ctx.ask(q, options=options, allow_text=False)
        return str(answer.option_id)

    @so.tool(approval=so.ApprovalSpec(request=so.always()))
    async def run(cmd: str) -> str:
        """Run a command."""
        return "ran"

    asker = scripted_agent(
        "asker", [call_tools(call("pick", q="Which " + ODD)), reply("ok")], tools=[pick]
    )
    runner = scripted_agent("runner", [call_tools(call("run", cmd=ODD)), reply("ok")], tools=[run])
    async with so.Runtime([asker, runner], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        with monkeypatch.context() as before_the_check:
            before_the_check.setattr(_tool_context, "_askable", lambda question, options: None)
            (question,) = (await rt.generate("asker", prompt="go")).pending
        (approval,) = (await rt.generate("runner", prompt="go")).pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], max_attempts=1)) as hub:
            await hub.poll()
            assert slack.recall(f"msg:{question.id}") is not None
            assert slack.recall(f"msg:{approval.id}") is not None
            asked, ran = slack_api.of("chat.postMessage")
            for text in strings(asked) + strings(ran):
                text.encode()  # valid Unicode
                assert "\x00" not in text and "\u202e" not in text, text
            (shown,) = [b for b in ran["blocks"] if b["block_id"] == "signoff.input"]
            assert r"x\ud800y\u0000z\u202eevil\u200b" in shown["text"]["text"]  # exact, visible
            (select,) = selects(asked)
            body = click(
                {
                    "type": "static_select",
                    "action_id": "signoff.option",
                    "block_id": f"signoff:{question.id}",
                    "selected_option": select["options"][0],
                },
                user="U5",
            )
            await slack.handle(body, sign(body, int(time.time())))
            await slack.idle()
            stored = await rt.store.get_request(question.id)
            assert stored is not None and stored.resolution is not None
            assert stored.resolution["answer"]["option_id"] == "o" + CHOSEN
            approve = {"action_id": "signoff.approve", "block_id": "b", "value": approval.id}
            body = click(approve, user="U5")
            await slack.handle(body, sign(body, int(time.time())))
            await slack.idle()
            stored = await rt.store.get_request(approval.id)
            assert stored is not None and stored.outcome == "approved"
            await hub.poll()
            updates = slack_api.of("chat.update")
            assert [u["blocks"][-1]["block_id"] for u in updates] == ["signoff.resolution"] * 2
            assert slack.recall(f"msg:{question.id}") is None  # updated, so forgotten
            assert slack.recall(f"msg:{approval.id}") is None
            for text in strings(updates):
                text.encode()


async def test_long_questions_many_options_and_long_answers_stay_within_slacks_limits(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """Slack refuses a section text over 3,000 characters or a select of over 100 options: a
    model asking a long question with 150 described options is still posted, every option can
    be chosen, and a long free-text answer still closes the message."""
    options: list[so.Option | str] = [
        so.Option(id=str(i), label=f"Choice {i} " + "x" * 80, description="At length. " * 30)
        for i in range(150)
    ]

    @so.tool
    async def pick(ctx: so.ToolContext, q: str) -> str:
        """Ask which."""
        return str((await ctx.ask(q, options=options)).value)

    ask = call("pick", q="Which one? " + "Context. " * 600)
    agent = scripted_agent("shop", [call_tools(ask), call_tools(ask), reply("ok")], tools=[pick])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="go")
        (req,) = r.pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], max_attempts=1)) as hub:
            await hub.poll()
            assert slack.recall(f"msg:{req.id}") is not None  # Slack took it
            (posted,) = slack_api.of("chat.postMessage")
            (select,) = selects(posted)
            shown = [o for g in select["option_groups"] for o in g["options"]]
            assert len(shown) == 150
            body = click(
                {
                    "type": "static_select",
                    "action_id": "signoff.option",
                    "block_id": f"signoff:{req.id}",
                    "selected_option": shown[149],
                },
                user="U5",
            )
            await slack.handle(body, sign(body, int(time.time())))
            await slack.idle()
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.resolution is not None
            assert stored.resolution["answer"]["value"] == "Choice 149 " + "x" * 80
            await hub.poll()
            (second,) = await rt.pending()
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=second.id, text="My own answer. " * 500)],
            )
            await hub.poll()
            updates = slack_api.of("chat.update")
            assert [u["blocks"][-1]["block_id"] for u in updates] == ["signoff.resolution"] * 2
            assert slack.recall(f"msg:{second.id}") is None


async def test_no_text_of_a_request_can_mention_everyone(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """`<!channel>` (and any `<…>` link or mention, or `&`) in a question reaches Slack escaped,
    also in the notification text Slack reads mentions from."""
    ask = call("ask_question", question="Ping <!channel> & <https://evil.example|click>?")
    agent = scripted_agent("shop", [call_tools(ask), reply("ok")], tools=[so.ask_question()])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        await rt.generate("shop", prompt="go")
        async with manual(ChannelHub(rt, [channel(slack_api)])) as hub:
            await hub.poll()
        (posted,) = slack_api.of("chat.postMessage")
        assert posted["text"] == (
            "shop asks: Ping &lt;!channel&gt; &amp; &lt;https://evil.example|click&gt;?"
        )
        for text in strings(posted["blocks"]):
            assert "<!channel>" not in text and "<https" not in text


async def test_request_text_is_shown_verbatim_so_slack_links_and_mentions_nothing_in_it(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """Escaping stops `<…>` links and mentions, but a mrkdwn text object Slack preprocesses
    (its default, `verbatim` false) still turns a bare URL into a link, a `#channel` name into
    a channel's link and some `@` mentions into mentions: every one carrying a request's text
    is sent `verbatim`, so only signoff's own `<!date…>` and `<@U…>` are parsed."""
    ask = call("ask_question", question="@here log in again at https://evil.example #general")
    agent = scripted_agent("shop", [call_tools(ask), reply("ok")], tools=[so.ask_question()])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="go")
        (req,) = r.pending
        async with manual(ChannelHub(rt, [channel(slack_api)])) as hub:
            await hub.poll()
            await rt.respond(r.session_id, [so.InputResponse(request_id=req.id, text="see @here")])
            await hub.poll()
        (posted,) = slack_api.of("chat.postMessage")
        (updated,) = slack_api.of("chat.update")
        for blocks in (posted["blocks"], updated["blocks"]):
            texts = [b["text"] for b in blocks if "text" in b]
            texts += [e for b in blocks for e in b.get("elements", []) if e["type"] == "mrkdwn"]
            assert texts and all(t.get("verbatim") is True for t in texts), texts
        assert (
            "@here log in again at https://evil.example #general"
            in posted["blocks"][0]["text"]["text"]
        )
        assert "“see @here”" in updated["blocks"][-1]["elements"][0]["text"]


def test_the_group_an_escalation_names_is_escaped_and_kept_within_limits() -> None:
    """A group name is configuration, not a mention: `<!channel>` in it is shown escaped, and a
    very long one is clipped so the facts line stays within Slack's limit."""
    from signoff.channels.slack._blocks import request_blocks

    base = {"kind": "question", "id": "req_1", "session_id": "s", "turn_id": "t"}
    request = so.InputRequest(**base, agent="a", created_at=0.0, escalated_to="<!channel> & co")
    (facts,) = [b for b in request_blocks(request) if b["block_id"] == "signoff.facts"]
    assert facts["elements"][0]["text"].endswith(
        "escalated to *&lt;!channel&gt; &amp; co*: no one decided before the deadline"
    )
    long = request.model_copy(update={"escalated_to": "g" * 5000})
    (facts,) = [b for b in request_blocks(long) if b["block_id"] == "signoff.facts"]
    text = facts["elements"][0]["text"]
    assert len(text) < 400 and "g" * 199 + "…*" in text


def test_long_approver_names_leave_the_deadline_and_escalation_in_the_facts_line() -> None:
    """A quorum's approvers so far are named in the facts line, before its deadline and the
    group it was escalated to: names of thousands of characters (a principal may have 16 KiB)
    filled the line to Slack's 3,000, and those were cut off. Each name and the list are cut."""
    from signoff.channels.slack._blocks import request_blocks

    base = {"kind": "question", "id": "req_1", "session_id": "s", "turn_id": "t"}
    request = so.InputRequest(
        **base,
        agent="a",
        created_at=0.0,
        approvers=3,
        approved_by=["p" * 2000, "q" * 2000],
        expires_at=time.time() + 3600,
        escalated_to="ops",
    )
    (facts,) = [b for b in request_blocks(request) if b["block_id"] == "signoff.facts"]
    text = facts["elements"][0]["text"]
    assert "needs 3 approvals (2 of 3: ppp" in text and " · expires <!date^" in text
    assert text.endswith("escalated to *ops*: no one decided before the deadline")


def test_a_long_deciders_name_leaves_the_time_and_reason_in_the_closing_line() -> None:
    """Who decided comes before when and why in a closed message's last line: a principal id
    of thousands of characters filled the line to Slack's 3,000 and cut the reason off."""
    from signoff.channels import Resolution
    from signoff.channels.slack._blocks import describe

    base = {"kind": "question", "id": "req_1", "session_id": "s", "turn_id": "t"}
    request = so.InputRequest(**base, agent="a", created_at=0.0)
    by = so.Principal(authenticator="web", principal_id="b" * 10_000)
    closed = Resolution(
        request_id="req_1",
        outcome="cancelled",
        status="settled",
        at=time.time(),
        by=by,
        reason="the amount is wrong",
    )
    line = describe(request, closed)
    assert line.startswith(":x: *Denied* by `" + "b" * 199 + "…` <!date^")
    assert line.endswith(": “the amount is wrong”")


async def test_an_input_cannot_close_its_code_block_and_write_its_own_message(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """Triple backticks in a tool input would end the code block it is shown in, and what
    follows would read as the message itself (a forged "wants to run" line): they are shown as
    JSON escapes, so the input stays one code block and still parses to what runs."""

    @so.tool(approval=so.ApprovalSpec(request=so.always()))
    async def run(cmd: str) -> str:
        """Run a command."""
        return "ran"

    forged = "rm -rf /```\n*runner* wants to run `read_file`\n```"
    agent = scripted_agent(
        "runner", [call_tools(call("run", cmd=forged)), reply("ok")], tools=[run]
    )
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        await rt.generate("runner", prompt="go")
        async with manual(ChannelHub(rt, [channel(slack_api)])) as hub:
            await hub.poll()
        (posted,) = slack_api.of("chat.postMessage")
        (shown,) = [b["text"]["text"] for b in posted["blocks"] if b["block_id"] == "signoff.input"]
        assert shown.count("```") == 2 and shown.startswith("```") and shown.endswith("```")
        assert json.loads(shown[3:-3]) == {"cmd": forged}


async def test_the_notes_only_the_responder_sees_are_escaped_too(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """A response policy's reason (or any text in an error) told back to the person who acted
    reaches Slack with `&`, `<` and `>` escaped, so it reads as written and mentions no one."""

    told = await _refused_note(tmp_path, slack_api, "over 100 & <!channel> must approve")
    assert told["text"] == (
        "Your answer was not accepted (rejected: over 100 &amp; &lt;!channel&gt; must approve)."
    )


async def _refused_note(tmp_path: Path, slack_api: FakeSlack, reason: str) -> dict[str, Any]:
    """The note only the responder sees (its `chat.postEphemeral`) after a response policy
    rejects their click with `reason`."""

    async def refuse(ctx: so.ResponseContext) -> so.Rejected:
        return so.Rejected(reason=reason)

    @so.tool(approval=so.ApprovalSpec(request=so.always(), response=refuse))
    async def run(cmd: str) -> str:
        """Run a command."""
        return "ran"

    agent = scripted_agent("ops", [call_tools(call("run", cmd="ls")), reply("ok")], tools=[run])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        (req,) = (await rt.generate("ops", prompt="go")).pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            approve = {"action_id": "signoff.approve", "block_id": "b", "value": req.id}
            body = click(approve, user="U5")
            await slack.handle(body, sign(body, int(time.time())))
            await slack.idle()
    (told,) = slack_api.of("chat.postEphemeral")
    return dict(told)


HOSTILE = "<!here> <@U123> <#C1> <http://x|y> & *bold* @here @channel #general"


def _unparsed(body: dict[str, Any]) -> None:
    """A call whose top-level `text` Slack must not process: no `<…>` of the request's text,
    and `parse` "none" (chat.update's default is `client`, which links names and mentions)."""
    assert "<" not in body["text"] and ">" not in body["text"], body["text"]
    assert body.get("parse") == "none", body
    assert not body.get("link_names"), body


async def test_the_notification_text_is_never_parsed_for_mentions_or_links(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """The top-level `text` (the notification fallback) has no `verbatim` switch: it is escaped,
    and every post and update sends `parse="none"`, so Slack links no bare `@here`,
    `#channel` or name in it, also when the message is updated (where its default differs)."""
    ask = call("ask_question", question=HOSTILE)
    agent = scripted_agent("shop", [call_tools(ask), reply("ok")], tools=[so.ask_question()])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="go")
        (req,) = r.pending
        async with manual(ChannelHub(rt, [channel(slack_api)])) as hub:
            await hub.poll()
            await rt.respond(r.session_id, [so.InputResponse(request_id=req.id, text="fine")])
            await hub.poll()
        (posted,) = slack_api.of("chat.postMessage")
        (updated,) = slack_api.of("chat.update")
        for body in (posted, updated):
            _unparsed(body)
            assert (
                "&lt;!here&gt; &lt;@U123&gt; &lt;#C1&gt; &lt;http://x|y&gt; &amp; *bold* "
                "@here @channel #general"
            ) in body["text"]


async def test_the_notes_only_the_responder_sees_are_never_parsed_either(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    told = await _refused_note(tmp_path, slack_api, HOSTILE)
    _unparsed(told)
    assert "@here @channel #general" in told["text"]


async def test_a_message_slack_refuses_as_too_long_is_posted_short_and_still_answers(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """Slack also refuses a message whose blocks hold too much text together (`msg_blocks_too
    _long`, a limit it does not document). Posted again as it was, it would be refused for
    ever: the request is posted once as a short message instead, which says its input is too
    long for Slack and where to read it whole, and keeps Approve / Deny; the closed message,
    refused as well, is written short too."""

    @so.tool(approval=so.ApprovalSpec(request=so.always()))
    async def run(cmd: str) -> str:
        """Run a command."""
        return "ran"

    steps = [call_tools(call("run", cmd="x" * 5000)), reply("ok")]
    agent = scripted_agent("runner", steps, tools=[run])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        (req,) = (await rt.generate("runner", prompt="go")).pending
        slack_api.most_text = 2500  # less than the input's part of the message: a lower limit
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], max_attempts=1)) as hub:
            await hub.poll()
            assert slack.recall(f"msg:{req.id}") is not None  # announced
            full, short = slack_api.of("chat.postMessage")
            assert [b["block_id"] for b in full["blocks"]][:2] == [
                "signoff.summary",
                "signoff.input",
            ]
            assert full["blocks"][1]["text"]["text"].endswith(
                "```\n_Cut here: it is 5,015 characters long; read it whole on the signoff "
                "dashboard or with `signoff pending --json`._"
            )
            shown = "\n".join(strings(short["blocks"]))
            assert "*runner* wants to run `run`" in shown
            assert "too long for a Slack message" in shown and "msg_blocks_too_long" in shown
            assert "signoff dashboard" in shown and "signoff pending --json" in shown
            (actions,) = [b for b in short["blocks"] if b["type"] == "actions"]
            assert [e["action_id"] for e in actions["elements"]] == [
                "signoff.approve",
                "signoff.deny",
            ]
            await hub.poll()
            assert len(slack_api.of("chat.postMessage")) == 2  # posted once
            body = click({"action_id": "signoff.approve", "block_id": "b", "value": req.id})
            await slack.handle(body, sign(body, int(time.time())))
            await slack.idle()
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.outcome == "approved"
            await hub.poll()
            assert slack.recall(f"msg:{req.id}") is None  # its closed message written
            updated = slack_api.of("chat.update")[-1]
            assert updated["blocks"][-1]["block_id"] == "signoff.resolution"
            assert "*Approved*" in updated["blocks"][-1]["elements"][0]["text"]
            assert "too long for a Slack message" in "\n".join(strings(updated["blocks"]))


async def test_two_hundred_long_choices_that_begin_alike_can_be_told_apart_and_chosen(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """200 choices of 500 characters each, alike but for their ends: cut to Slack's 75 each,
    they read the same in the menu, and together they passed the text Slack takes in one
    message (`msg_blocks_too_long`). The menu shows each numbered and cut to what the message
    leaves room for, the question's section lists them whole as far as it can and says where
    to read the rest, and the 200th is chosen from Slack."""
    stem = "Refund the customer in full and close the ticket with the standard apology, " * 6
    options: list[so.Option | str] = [
        so.Option(id=f"o{i}", label=f"{stem[:480]} (variant {i})") for i in range(200)
    ]

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Ask which."""
        return str((await ctx.ask("Which one?", options=options)).option_id)

    agent = scripted_agent("shop", [call_tools(call("pick")), reply("ok")], tools=[pick])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        (req,) = (await rt.generate("shop", prompt="go")).pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], max_attempts=1)) as hub:
            await hub.poll()
            assert slack.recall(f"msg:{req.id}") is not None
            (posted,) = slack_api.of("chat.postMessage")  # taken at once, in full
            (select,) = selects(posted)
            shown = [o for g in select["option_groups"] for o in g["options"]]
            texts = [o["text"]["text"] for o in shown]
            assert len(set(texts)) == 200 and texts[199].startswith("200. Refund the")
            (summary,) = [b for b in posted["blocks"] if b["block_id"] == "signoff.summary"]
            text = summary["text"]["text"]
            assert f"*1.* {stem[:480]} (variant 0)" in text
            assert "read the question and its choices whole on the signoff dashboard" in text
            body = click(
                {
                    "type": "static_select",
                    "action_id": "signoff.option",
                    "block_id": f"signoff:{req.id}",
                    "selected_option": shown[199],
                },
                user="U5",
            )
            await slack.handle(body, sign(body, int(time.time())))
            await slack.idle()
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.resolution is not None
            assert stored.resolution["answer"]["option_id"] == "o199"


async def test_a_short_message_slack_refuses_too_is_posted_as_text_and_not_again(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """Slack may refuse the short message as well (`invalid_blocks` for a limit signoff does
    not know, in what the short message keeps). Posted again, both would be refused on every
    round and the request would never appear in Slack: it is posted once as text alone, which
    says where to answer it, and its close is written so too."""

    @so.tool(approval=so.ApprovalSpec(request=so.always()))
    async def run(cmd: str) -> str:
        """Run a command."""
        return "ran"

    steps = [call_tools(call("run", cmd="x" * 5000)), reply("ok")]
    agent = scripted_agent("runner", steps, tools=[run])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        result = await rt.generate("runner", prompt="go")
        (req,) = result.pending
        slack_api.most_text = 10  # less than any blocks hold: only a message of text passes
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], max_attempts=1)) as hub:
            await hub.poll()
            assert slack.recall(f"msg:{req.id}") is not None  # announced
            *refused, posted = slack_api.of("chat.postMessage")
            assert len(refused) == 2 and "blocks" not in posted
            assert "too long for Slack" in posted["text"]
            assert "signoff dashboard" in posted["text"]
            await hub.poll()
            assert len(slack_api.of("chat.postMessage")) == 3  # posted once
            answer = so.InputResponse(request_id=req.id, option_id="approve")
            await rt.respond(result.session_id, [answer])
            await hub.poll()
            assert slack.recall(f"msg:{req.id}") is None  # its closed message written
            updated = slack_api.of("chat.update")[-1]
            assert updated["blocks"] == []  # the short message's buttons taken off
            assert updated["text"].startswith("Approved") and "read it on" in updated["text"]
