"""A workflow call parked on its own question (`ctx.ask`) after a journaled step, whose tool a
deploy then renamed: nothing can run its body on, so an answer is refused (`UnknownTool`),
nothing recorded, as one through a delegate call whose tool is gone is; and a call that ends
anyway tells the model its tool went after it started and that what it did ran."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, NamedTuple

import httpx
import pytest
from typer.testing import CliRunner

import signoff as so
from signoff.cli import app
from signoff.server import TokenAuth, create_app
from signoff.testing import (
    Capture,
    call,
    call_tools,
    reply,
    scripted_agent,
    store_contents,
    tool_results,
)

from ._server_api import error

ALICE = so.Principal(authenticator="okta", principal_id="alice")
ASKED = "unknown tool 'transfer': request {rid} was asked by call c1 of session {sid!r}"
ENDED = (
    "unknown tool 'transfer': it was removed from the agent (or renamed) after this call "
    "started, so the call cannot finish; what the call did before that (the steps it recorded) "
    "ran and is not undone; available: transfer_v2"
)
DEPLOYED: dict[str, Any] = {}
"""The agents of `deployed`'s runtime (the command line's), set by the test that uses it."""


def _agents(charged: list[int], seen: Capture) -> tuple[so.Agent, so.Agent]:
    """The bank agent before and after a deploy that renamed `transfer` to `transfer_v2`:
    `transfer` charges (a journaled step), then asks whether to send a receipt; the model's
    reply after the call is `seen`."""

    @so.tool
    async def transfer(ctx: so.ToolContext, amount: int) -> dict[str, Any]:
        """Transfer money."""

        def charge_card() -> str:
            charged.append(amount)
            return "ch_1"

        charge = await ctx.step("charge", charge_card)
        # Options only: a message naming neither steers the turn, rather than answering.
        receipt = await ctx.ask("Send the receipt too?", options=["yes", "no"], allow_text=False)
        return {"charge": charge, "receipt": receipt.value}

    @so.tool
    async def transfer_v2(ctx: so.ToolContext, amount: int) -> dict[str, Any]:
        """Transfer money (the renamed tool)."""
        charged.append(amount)
        return {"charge": "ch_2"}

    steps: list[Any] = [call_tools(call("transfer", call_id="c1", amount=5)), seen]
    return (
        scripted_agent("bank", steps, tools=[transfer]),
        scripted_agent("bank", steps, tools=[transfer_v2]),
    )


class _Parked(NamedTuple):
    r: so.GenerateResult  # waiting on the question
    question: so.InputRequest
    charged: list[int]  # the charges made, by either tool
    seen: Capture  # the model's step after the call
    after: so.Agent  # the agent after the deploy


async def _parked(url: str, *, answered: bool = False) -> _Parked:
    """The call charged and asked, before the deploy; `answered`: the question answered then
    with `resume=False`, the turn left for a later drive (a worker's, a sweep's)."""
    charged: list[int] = []
    seen = Capture(reply("ok"))
    before, after = _agents(charged, seen)
    async with so.Runtime([before], store=url) as rt:
        r = await rt.generate("bank", prompt="send 5", auth=ALICE)
        assert r.status == "waiting" and charged == [5]
        [question] = r.pending
        if answered:
            yes = so.InputResponse(request_id=question.id, option_id="yes")
            await rt.respond(r.session_id, [yes], principal=ALICE, resume=False)
    return _Parked(r, question, charged, seen, after)


@pytest.mark.parametrize("how", ["respond", "respond-unresumed", "send", "send-queue"])
async def test_an_answer_to_a_question_whose_tool_is_gone_is_refused(
    store_url: str, how: str
) -> None:
    """The answer was taken (`applied=True`) and dropped: the call ended `unknown tool`, the
    model told nothing of the charge it made. Now it is `UnknownTool`, by id (resumed or not)
    or by message, naming the call and the agent's tools, and records nothing; the charge is
    never made again."""
    r, question, charged, seen, after = await _parked(store_url)
    async with so.Runtime([after], store=store_url) as rt:
        before = await store_contents(rt.store, r.session_id)
        yes = so.InputResponse(request_id=question.id, option_id="yes")
        with pytest.raises(so.UnknownTool) as refused:
            if how.startswith("respond"):
                await rt.respond(r.session_id, [yes], principal=ALICE, resume=how == "respond")
            else:
                policy: Literal["steer", "queue"] = "queue" if how == "send-queue" else "steer"
                await rt.send(r.session_id, "yes", principal=ALICE, turn_policy=policy)
        said = str(refused.value)
        assert said.startswith(ASKED.format(rid=question.id, sid=r.session_id)), said
        assert "(its tools: transfer_v2)" in said and "cancel session" in said
        assert await store_contents(rt.store, r.session_id) == before
        assert await rt.pending() == [question]
    assert charged == [5] and seen.conversations == []


async def test_a_server_refuses_an_answer_to_a_question_whose_tool_is_gone(
    store_url: str,
) -> None:
    """Over HTTP, by id or by message: 422 `unknown_tool`, the session as it was."""
    r, question, charged, seen, after = await _parked(store_url)
    runtime = so.Runtime([after], store=store_url)
    app_ = create_app(runtime, auth=TokenAuth({"alice": ALICE}), sweep_every=None)
    async with (
        app_.router.lifespan_context(app_),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app_),
            base_url="http://t",
            headers={"Authorization": "Bearer alice"},
        ) as c,
    ):
        before = await store_contents(runtime.store, r.session_id)
        answer = {"inputResponses": [{"requestId": question.id, "optionId": "yes"}]}
        for path, body in (("responses", answer), ("messages", {"text": "yes"})):
            got = await c.post(f"/v1/sessions/{r.session_id}/{path}", json=body)
            assert "unknown tool 'transfer'" in error(got, 422, "unknown_tool")["message"]
            assert await store_contents(runtime.store, r.session_id) == before
    await runtime.close()
    assert charged == [5] and seen.conversations == []


@pytest.mark.parametrize("how", ["resumed", "steered"])
async def test_a_call_ended_for_its_gone_tool_says_what_it_did_ran(
    store_url: str, how: str
) -> None:
    """The turn takes the call up after the deploy: its answer given before it (`resume=False`)
    and the turn resumed, or a message steering it. The model read only `unknown tool
    'transfer'; available: transfer_v2`, as for a call that never ran, and could charge again
    with the renamed tool; it reads that the tool went after the call started, and that what
    the call did ran. A call that never started (an approval of a tool gone) reads as before."""
    r, question, charged, seen, after = await _parked(store_url, answered=how == "resumed")
    async with so.Runtime([after], store=store_url) as rt:
        if how == "resumed":
            done = await rt.generate(session_id=r.session_id)
        else:
            done = await rt.send(r.session_id, "never mind the receipt", principal=ALICE)
        assert done.status == "completed", done
        [result] = tool_results(seen.last)
        assert result.is_error and result.content == {"error": ENDED}
        assert await rt.pending() == []
    assert charged == [5]


def deployed() -> so.Runtime:
    """The command line's runtime after the deploy: `DEPLOYED`'s agents."""
    return so.Runtime(DEPLOYED["agents"], store="sqlite:///unused.db")


@asynccontextmanager
async def _browsing(rt: so.Runtime) -> AsyncIterator[httpx.AsyncClient]:
    app_ = create_app(rt, auth=TokenAuth({"okta": ALICE}), sweep_every=None, close_runtime=True)
    async with (
        app_.router.lifespan_context(app_),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app_),
            base_url="http://t",
            headers={"Authorization": "Bearer okta"},
        ) as c,
    ):
        yield c


def _card(page: str, rid: str) -> str:
    card = page[page.index(f'data-request-id="{rid}"') :]
    return card[: card.index("</article>")]


async def test_the_dashboard_offers_no_answer_to_a_question_whose_tool_is_gone(
    tmp_path: Path,
) -> None:
    """The question's card (queue, session page, its live read) offered its options, an answer
    then dropped; it says why instead, and the pages write nothing."""
    url = f"sqlite:///{tmp_path}/s.db"
    r, question, charged, seen, after = await _parked(url)
    sid, rid = r.session_id, question.id
    rt = so.Runtime([after], store=url)
    async with _browsing(rt) as c:
        before = await store_contents(rt.store, sid)
        queue = (await c.get("/_signoff/")).text
        page = (await c.get(f"/_signoff/sessions/{sid}")).text
        fragment = (await c.get(f"/_signoff/fragments/sessions/{sid}")).json()
        for shown in (_card(queue, rid), _card(page, rid), fragment["pending"]):
            assert "/respond" not in shown and 'name="option"' not in shown, shown
            assert "data-not-allowed" in shown and "unknown tool &#39;transfer&#39;" in shown
            assert "data-answer-in" not in shown  # no other request to answer instead
        assert await store_contents(rt.store, sid) == before
    assert charged == [5] and seen.conversations == []


async def _contents(url: str, session_id: str) -> Any:
    async with so.Runtime([], store=url) as rt:
        return await store_contents(rt.store, session_id)


def test_chat_and_answer_refuse_a_question_whose_tool_is_gone(tmp_path: Path) -> None:
    """`signoff chat` asked the question, and the answer was dropped: it says why instead and
    asks nothing. `signoff answer` with the app's runtime is refused, exit 1. Nothing is
    recorded."""
    url = f"sqlite:///{tmp_path}/s.db"
    r, question, charged, seen, after = asyncio.run(_parked(url))
    sid, rid = r.session_id, question.id
    before = asyncio.run(_contents(url, sid))
    DEPLOYED["agents"] = [after]
    target = "tests.test_workflow_tool_gone:deployed"
    on = ["--store", url, "--as", "okta:alice"]
    chat = CliRunner().invoke(app, ["chat", target, "--session", sid, *on], input="1\n")
    assert chat.exit_code == 0, chat.output
    assert f"unknown tool 'transfer': request {rid}" in chat.output, chat.output
    assert "Send the receipt too?" not in chat.output.split("unknown tool")[-1]
    answered = CliRunner().invoke(app, ["answer", rid, target, "--option", "yes", *on])
    assert answered.exit_code == 1, answered.output
    assert "UnknownTool: unknown tool 'transfer'" in answered.output
    assert asyncio.run(_contents(url, sid)) == before
    assert charged == [5] and seen.conversations == []
