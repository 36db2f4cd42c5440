"""`TextChannel.reply` and the matcher of typed replies: a message sent on (`unmatched="send"`)
must not answer a request the person was not shown, and a reply names an option however its
accents are encoded."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any, Literal

import pytest

import signoff as so
from signoff._option_names import named_options
from signoff._text import BIDI
from signoff.channels import ChannelHub
from signoff.channels.text import parse_reply
from signoff.testing import call, call_tools, reply, scripted_agent

from ._channels import runtime, status, three_refunds
from .test_text_channel import BOB, CAROL, Texts, manual


def _two_questions() -> so.Agent:
    """An agent that asks, in one step, a free-text question and then a choice of two."""

    @so.tool
    async def ask(ctx: so.ToolContext, question: str, choose: bool) -> str:
        """Ask the user."""
        options = ["red", "blue"] if choose else None
        return (await ctx.ask(question, options=options, allow_text=not choose)).value

    asks = [
        call("ask", question="Which warehouse?", choose=False),
        call("ask", question="Which colour?", choose=True),
    ]
    return scripted_agent("shop", [call_tools(*asks), reply("Done.")], tools=[ask])


def _choices_only(request: so.InputRequest) -> bool:
    return bool(request.options)


async def _pending(rt: so.Runtime, *ids: str) -> bool:
    stored = [await rt.store.get_request(rid) for rid in ids]
    return all(s is not None and s.status == "pending" for s in stored)


async def test_a_message_sent_on_does_not_answer_another_request_than_the_one_shown(
    store_url: str,
) -> None:
    """The channel shows only choices (free-text questions go elsewhere): the session's first
    open request is a free-text question, which a message sent on would answer. The person,
    who sees the choice, is told so and how to answer it; neither request changes."""
    async with so.Runtime([_two_questions()], store=store_url) as rt:
        r = await rt.generate("shop", prompt="Reorder", auth=BOB)
        text, choice = r.pending
        sms = Texts(unmatched="send", accepts=_choices_only)
        async with manual(ChannelHub(rt, [sms])) as hub:
            await hub.poll()
            assert sms.current is not None and sms.current.id == choice.id
            shown = len(sms.sent)
            assert await sms.reply("what is the difference?", BOB) is None
            assert await _pending(rt, text.id, choice.id)
            assert (await rt.state(r.session_id)).queued == []
            assert len(sms.sent) == shown + 1
            assert text.id in sms.sent[-1]
            assert sms.sent[-1].endswith("Reply with a number (1-2) or an option's name.")
            outcome = await sms.reply("blue", BOB)  # the one shown is still answered
            assert outcome is not None and outcome.outcome == "answered"
            assert await _pending(rt, text.id)


async def test_a_message_another_person_sends_on_is_sent_as_runtime_send_takes_it(
    store_url: str,
) -> None:
    """Carol may not answer Bob's requests, so `Runtime.send` takes her message as a message
    (queued for Bob's turn), not an answer to the first open request; the channel predicted
    the answer and refused it ("it would answer another request"), unlike what send does."""
    async with so.Runtime([_two_questions()], store=store_url) as rt:
        r = await rt.generate("shop", prompt="Reorder", auth=BOB)
        text, choice = r.pending
        sms = Texts(unmatched="send", accepts=_choices_only)
        async with manual(ChannelHub(rt, [sms])) as hub:
            await hub.poll()
            assert sms.current is not None and sms.current.id == choice.id
            assert await sms.reply("what is the difference?", CAROL) is None
            assert not any("would answer another request" in m for m in sms.sent)
            assert await _pending(rt, text.id, choice.id)
            queued = (await rt.state(r.session_id)).queued
            assert [q["message"] for q in queued] == ["what is the difference?"]


def _drinks(*labels: str) -> so.InputRequest:
    options = [so.Option(id=f"o{i}", label=label) for i, label in enumerate(labels, 1)]
    return so.InputRequest(
        kind="question",
        id="req_1",
        session_id="s",
        turn_id="t",
        agent="a",
        created_at=0.0,
        options=options,
        allow_text=True,
    )


@pytest.mark.parametrize(("form", "typed"), [("NFC", "NFD"), ("NFD", "NFC")])
def test_a_reply_names_an_option_whatever_the_unicode_form_of_its_accents(
    form: Literal["NFC", "NFD"], typed: Literal["NFC", "NFD"]
) -> None:
    """`café` typed with a combining accent (as macOS file names and some keyboards give it)
    is the label `Café` written precomposed, and the other way round: it was taken as free text
    rather than the option the person named."""
    request = _drinks(
        unicodedata.normalize(form, "Café"), unicodedata.normalize(form, "Crème brûlée")
    )
    for text, option in (("café", "o1"), ("CRÈME BRÛLÉE", "o2")):
        reply_text = unicodedata.normalize(typed, text)
        assert [o.id for o in named_options(request.options, reply_text)] == [option]
        assert parse_reply(request, reply_text) == so.InputResponse(
            request_id="req_1", option_id=option
        )


async def test_bidirectional_controls_in_what_a_text_channel_sends_show_as_escapes(
    tmp_path: Path,
) -> None:
    """A model's question and labels, and another reviewer's answer, reached the person with
    their bidirectional controls (`\\u202e` reverses what follows), so they read another text
    than the request holds; the dashboard, Slack and the terminal show them as escapes."""

    @so.tool
    async def ask(ctx: so.ToolContext) -> str:
        """Ask the user."""
        options = ["2", "refund \u202e001$\u202c"]
        return (await ctx.ask("Refund \u202e0001$\u202c?", options=options)).value

    agent = scripted_agent("shop", [call_tools(call("ask")), reply("Done.")], tools=[ask])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 'state.db'}") as rt:
        r = await rt.generate("shop", prompt="Refund", auth=BOB)
        (q,) = r.pending
        sms = Texts()
        async with manual(ChannelHub(rt, [sms])) as hub:
            await hub.poll()
            assert "Refund \\u202e0001$\\u202c?" in sms.sent[0]
            assert "2. refund \\u202e001$\\u202c" in sms.sent[0]
            assert await sms.reply("2", BOB) is None  # names two options: told how to choose
            assert "to choose refund \\u202e001$\\u202c, reply refund" in sms.sent[-1]
            await rt.respond(
                r.session_id, [so.InputResponse(request_id=q.id, text="ok \u202eon")], principal=BOB
            )
            await hub.poll()
        assert all(not BIDI.search(text) for text in sms.sent), sms.sent
        assert sms.sent[-1].endswith(": ok \\u202eon.")


class _Utf8Texts(Texts):
    """`Texts` through a transport that sends UTF-8, as an SMS API or an HTTP client does."""

    async def send_text(self, text: str) -> None:
        text.encode("utf-8")
        await super().send_text(text)


async def test_a_lone_surrogate_in_a_request_stored_is_sent_as_an_escape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A question and an option's description asked with a lone surrogate (before `ctx.ask`
    refused them) reached `send_text` raw: a transport that sends UTF-8 failed on every retry,
    no later request was shown, and a reply raised UnicodeEncodeError. They are sent as
    `\\udce9` escapes, as Slack shows them, and the reply answers the request shown."""
    from signoff import _tool_context

    @so.tool
    async def confirm(ctx: so.ToolContext) -> str:
        """Confirm the address."""
        options: list[Any] = [{"label": "yes", "description": "to Jos\udce9"}, "no"]
        return (await ctx.ask("Ship to Jos\udce9?", options=options)).value

    @so.tool
    async def wrap(ctx: so.ToolContext) -> str:
        """Ask about wrapping."""
        return (await ctx.ask("Gift wrap?", options=["yes", "no"])).value

    ship = scripted_agent("ship", [call_tools(call("confirm")), reply("Sent.")], tools=[confirm])
    gift = scripted_agent("gift", [call_tools(call("wrap")), reply("Done.")], tools=[wrap])
    async with runtime(tmp_path, ship, gift) as rt:
        with monkeypatch.context() as before_the_check:
            before_the_check.setattr(_tool_context, "_askable", lambda question, options: None)
            (shipping,) = (await rt.generate("ship", prompt="go", auth=BOB)).pending
        (wrapping,) = (await rt.generate("gift", prompt="go", auth=BOB)).pending
        sms = _Utf8Texts()
        async with manual(ChannelHub(rt, [sms], retry_backoff=0)) as hub:
            await hub.poll()
            assert sms.sent[:1] == [
                "Ship to Jos\\udce9?\n1. yes - to Jos\\udce9\n2. no\n"
                "Reply with a number (1-2) or your own answer."
            ]
            outcome = await sms.reply("yes", BOB)
            assert outcome is not None and outcome.outcome == "answered"
            await hub.poll()
            assert sms.sent[-1].startswith("Gift wrap?\n")
        assert await status(rt, shipping.id) == ("settled", "answered")
        assert await status(rt, wrapping.id) == ("pending", None)


@pytest.mark.parametrize(
    ("typed", "option", "reason"),
    [
        ("ｎｏ：ｔｏｏ ｂｉｇ", "cancel", "ｔｏｏ ｂｉｇ"),  # the reason as typed
        ("no：too big", "cancel", "too big"),
        ("no，too big", "cancel", "too big"),
        ("no、too big", "cancel", "too big"),
        ("ｙｅｓ！", "approve", None),
        ("ｙｅｓ．", "approve", None),
        ("yes。", "approve", None),
    ],
)
def test_an_approval_reads_its_separators_in_any_width(
    typed: str, option: str, reason: str | None
) -> None:
    """`ＮＯ: too big` was read and `ｎｏ：ｔｏｏ ｂｉｇ` (an input method's wide mode, whole)
    was not: the word was compared in compatibility form, its separator only as typed."""
    approval = so.InputRequest(
        kind="tool-approval", id="req_1", session_id="s", turn_id="t", agent="a", created_at=0.0
    )
    assert parse_reply(approval, typed) == so.InputResponse(
        request_id="req_1", option_id=option, text=reason
    )
    assert parse_reply(approval, "１．５") is None  # a number, as `1.5` is: no yes or no


@pytest.mark.parametrize("typed", ["y\udcff", "\udcffy", "yes\udcff", "1\udcff", "\udcff"])
def test_a_reply_not_utf8_answers_nothing(typed: str) -> None:
    """`y` and a byte that is not UTF-8 (Python's lone surrogate, as a byte piped in reads)
    approved, and `1` and one chose the first option: the byte was passed over as a character
    that draws nothing. Such a reply answers nothing, free text included."""
    base: dict[str, Any] = {"id": "req_1", "session_id": "s", "turn_id": "t", "agent": "a"}
    approval = so.InputRequest(kind="tool-approval", created_at=0.0, **base)
    question = so.InputRequest(
        kind="question",
        question="Which?",
        options=[so.Option(id="a", label="Alpha"), so.Option(id="b", label="Beta")],
        allow_text=True,
        created_at=0.0,
        **base,
    )
    assert parse_reply(approval, typed) is None
    assert parse_reply(question, typed) is None
    assert parse_reply(approval, "y") == so.InputResponse(request_id="req_1", option_id="approve")
    assert parse_reply(question, "1") == so.InputResponse(request_id="req_1", option_id="a")


def _asking(options: list[str], allow_text: bool) -> so.Agent:
    """An agent that asks one question of `options`."""

    @so.tool
    async def ask(ctx: so.ToolContext) -> str:
        """Ask the user."""
        return (await ctx.ask("Which?", options=options, allow_text=allow_text)).value

    return scripted_agent("shop", [call_tools(call("ask")), reply("Done.")], tools=[ask])


async def test_a_text_yes_with_a_zero_width_space_approves_and_is_not_sent_on(
    tmp_path: Path,
) -> None:
    """`yes` + a zero-width space (a paste, some keyboards) shows as `yes` and was sent on as a
    message (`unmatched="send"`): it withdrew the approval the person gave, and the model read
    `yes` as a new prompt."""
    runs: list[str] = []
    async with runtime(tmp_path, three_refunds(runs)) as rt:
        r = await rt.generate("support", prompt="Refund", auth=BOB)
        sms = Texts(unmatched="send")
        async with manual(ChannelHub(rt, [sms])) as hub:
            await hub.poll()
            outcome = await sms.reply("yes\u200b", BOB)
            assert outcome is not None and outcome.outcome == "approved"
        assert await status(rt, r.pending[0].id) == ("settled", "approved")
        assert [await status(rt, q.id) for q in r.pending[1:]] == [("pending", None)] * 2
        assert (await rt.state(r.session_id)).queued == []


@pytest.mark.parametrize(
    ("options", "allow_text", "typed", "chosen"),
    [
        (["Yes", "No"], True, "\u200fYes", "Yes"),  # a right-to-left keyboard's mark first
        (["\u2764\ufe0f", "\U0001f494"], False, "\u2764", "\u2764\ufe0f"),  # no U+FE0F
        (["\U0001f44d", "\U0001f44e"], False, "\U0001f44d\ufe0f", "\U0001f44d"),
    ],
)
async def test_a_text_reply_with_what_draws_nothing_chooses_the_option_it_shows(
    tmp_path: Path, options: list[str], allow_text: bool, typed: str, chosen: str
) -> None:
    """`Yes` after a right-to-left mark was stored as free text, never choosing the option
    `Yes`; `❤` was not the option `❤️`, and the person was told to reply with an option's name,
    which they had typed."""
    async with runtime(tmp_path, _asking(options, allow_text)) as rt:
        r = await rt.generate("shop", prompt="Ask", auth=BOB)
        sms = Texts()
        async with manual(ChannelHub(rt, [sms])) as hub:
            await hub.poll()
            outcome = await sms.reply(typed, BOB)
            assert outcome is not None and outcome.outcome == "answered", sms.sent[-1]
        stored = await rt.store.get_request(r.pending[0].id)
        assert stored is not None and stored.resolution is not None
        answer = stored.resolution["answer"]
        assert (answer["option_id"], answer["value"], answer["text"]) == (chosen, chosen, None)
