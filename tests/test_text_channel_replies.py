"""`TextChannel.reply` with more than one request open in a session: a message sent on
(`unmatched="send"`) must not answer a request the person was not shown."""

from __future__ import annotations

import signoff as so
from signoff.channels import ChannelHub
from signoff.testing import call, call_tools, reply, scripted_agent

from .test_text_channel import BOB, Texts, manual


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
