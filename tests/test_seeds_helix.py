"""Every tool-approval example of the helix seed, translated to Python: needsApproval on
issue_refund, and the tool-approval guide statement by statement."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.testing import (
    Capture,
    ExecutionLog,
    ManualClock,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
    tool_results,
)

from ._seeds import event_types

# -- helix: issue_refund with needsApproval: amount > 100 ----------------------------------------


def helix_refund(log: ExecutionLog) -> so.Tool:
    @log.tool(approval=lambda input: input.amount > 100)
    async def issue_refund(order_id: str, amount: float, reason: str) -> dict[str, float]:
        """Refund an order in full or in part. Amounts over 100 need a human to approve."""
        return {"refunded": amount}

    return issue_refund


REFUND_180 = call("issue_refund", order_id="1042", amount=180, reason="Item arrived broken")


async def test_helix_pause_then_approve(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture(reply("Done. I've refunded 180.00 to the original payment method."))
    agent = scripted_agent(
        "support-agent",
        [call_tools(REFUND_180, text="Let me get that approved."), seen],
        tools=[helix_refund(log)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support-agent", prompt="Refund order 1042, the item arrived broken.")
        assert r.status == "waiting"
        assert r.text == "Let me get that approved."  # what the model said before it asked
        (pending,) = r.pending
        assert pending.id.startswith("req_")
        assert pending.tool_name == "issue_refund"
        assert pending.call_id is not None
        # the validated input the tool would run with
        assert pending.input == {
            "order_id": "1042",
            "amount": 180.0,
            "reason": "Item arrived broken",
        }
        assert log.count() == 0
        resumed = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=pending.id, approved=True, reason="ok")],
        )
        assert resumed.status == "completed"
        assert resumed.text.endswith("Done. I've refunded 180.00 to the original payment method.")
        assert [e.input for e in log.executions] == [pending.input]
        (result,) = tool_results(seen.last)
        assert result.call_id == pending.call_id
        # helix: the approval's optional reason reaches the model beside the result.
        assert result.content == {
            "result": {"refunded": 180.0},
            "approval": {"approved": True, "by": None, "reason": "ok"},
        }
        assert not result.is_error


async def test_helix_deny_with_reason_reaches_the_model(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture(reply("Sorry, I could not refund that."))
    agent = scripted_agent(
        "support-agent", [call_tools(REFUND_180), seen], tools=[helix_refund(log)]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support-agent", prompt="Refund order 1042")
        resumed = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=False, reason="Only the 3-pack.")],
        )
        assert resumed.status == "completed"
        assert log.count() == 0  # a denied tool never runs
        (result,) = tool_results(seen.last)
        assert result.is_error
        assert result.call_id == r.pending[0].call_id
        assert result.content["denied"] is True
        assert result.content["reason"] == "Only the 3-pack."


async def test_helix_small_amount_runs_without_approval(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "support-agent",
        [call_tools(call("issue_refund", order_id="7", amount=40, reason="late")), reply("Done.")],
        tools=[helix_refund(log)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support-agent", prompt="Refund order 7")
        assert r.status == "completed"
        assert r.text == "Done."
        assert log.count() == 1
        assert await rt.pending() == []
        types = await event_types(rt, r.session_id)
        assert "input.requested" not in types
        assert "turn.waiting" not in types


async def test_helix_several_gated_calls_in_one_step_each_get_an_entry(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture(reply("Both handled."))
    a = call("issue_refund", order_id="1", amount=150, reason="a")
    b = call("issue_refund", order_id="2", amount=40, reason="b")  # small: runs now
    c = call("issue_refund", order_id="3", amount=900, reason="c")
    agent = scripted_agent("support-agent", [call_tools(a, b, c), seen], tools=[helix_refund(log)])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support-agent", prompt="Refund 1, 2 and 3")
        assert r.status == "waiting"
        assert [p.input["order_id"] for p in r.pending] == ["1", "3"]
        assert len({p.id for p in r.pending}) == 2
        assert len({p.call_id for p in r.pending}) == 2
        assert [e.input["order_id"] for e in log.executions] == ["2"]
        # one call must decide all of them
        with pytest.raises(so.PartialAnswer) as info:
            await rt.generate(
                session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
            )
        assert info.value.request_ids == [r.pending[1].id]
        resumed = await rt.generate(
            session_id=r.session_id,
            approvals=[
                so.Decision(id=r.pending[0].id, approved=True),
                so.Decision(id=r.pending[1].id, approved=False, reason="too much"),
            ],
        )
        assert resumed.status == "completed"
        assert sorted(e.input["order_id"] for e in log.executions) == ["1", "2"]
        results = {
            m.content.get("refunded", m.content.get("reason")) for m in tool_results(seen.last)
        }
        assert results == {150.0, 40.0, "too much"}


async def test_helix_async_predicate(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen_inputs: list[Any] = []

    async def needs_approval(input: Any) -> bool:
        seen_inputs.append(input)
        return bool(input.amount > 100)

    @log.tool(approval=needs_approval)
    async def issue_refund(order_id: str, amount: float, reason: str) -> dict[str, float]:
        """Refund an order."""
        return {"refunded": amount}

    agent = scripted_agent(
        "support-agent",
        [
            call_tools(REFUND_180, call("issue_refund", order_id="5", amount="20", reason="x")),
            reply("ok"),
        ],
        tools=[issue_refund],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support-agent", prompt="two refunds")
        assert r.status == "waiting"
        assert [p.input["order_id"] for p in r.pending] == ["1042"]
        # the predicate saw validated input: "20" became the float 20.0
        assert [i.amount for i in seen_inputs] == [180.0, 20.0]
        assert all(isinstance(i.amount, float) for i in seen_inputs)
        assert log.count() == 1


# -- helix (002): the tool-approval guide, statement by statement ---------------------------------


async def test_helix_an_approval_waits_as_long_as_its_session_is_kept(store_url: str) -> None:
    """helix: "Approvals have no time limit of their own, so on a session with no `ttl` a pending
    approval never lapses"; "Sessions do not expire unless the agent sets a `ttl`"."""
    log = ExecutionLog()
    clock = ManualClock()

    def make_agent() -> so.Agent:
        return scripted_agent(
            "support-agent", [call_tools(REFUND_180), reply("Refunded.")], tools=[helix_refund(log)]
        )

    async with so.Runtime([make_agent()], store=store_url, clock=clock) as rt:
        r = await rt.generate("support-agent", prompt="Refund order 1042")
        (req,) = r.pending
        assert req.expires_at is None
    clock.advance(400 * 86_400.0)  # over a year, the platform store's 30 days long past
    async with so.Runtime([make_agent()], store=store_url, clock=clock) as rt2:
        assert await rt2.expire_due() == 0
        assert [p.id for p in await rt2.pending()] == [req.id]
        assert (await rt2.state(r.session_id)).status == "waiting"
        done = await rt2.generate(
            session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)]
        )
        assert done.status == "completed" and done.text == "Refunded."
        assert log.count("issue_refund") == 1


async def test_helix_the_persons_note_goes_as_the_next_calls_prompt(tmp_path: Path) -> None:
    """helix: "If the person also has something to say, send it as the next call's `prompt`":
    the model reads the denial with its reason, then the note."""
    log = ExecutionLog()
    told = Capture(reply("I could not refund it."))
    noted = Capture(reply("Understood, a replacement then."))
    agent = scripted_agent(
        "support-agent", [call_tools(REFUND_180), told, noted], tools=[helix_refund(log)]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support-agent", prompt="Refund order 1042")
        resumed = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=False, reason="policy")],
        )
        assert resumed.status == "completed" and resumed.text == "I could not refund it."
        after = await rt.generate(session_id=r.session_id, prompt="Send a replacement instead.")
        assert after.status == "completed"
        assert after.text == "Understood, a replacement then."
        assert log.count() == 0
        conversation = noted.last
        assert conversation[-1] == so.UserMessage(text="Send a replacement instead.")
        (denial,) = tool_results(conversation)
        assert denial.content["denied"] is True and denial.content["reason"] == "policy"


def helix_app(store_url: str, *agents: so.Agent) -> Any:
    alice = so.Principal(authenticator="token", principal_id="alice")
    runtime = so.Runtime(list(agents), store=store_url)
    return create_app(
        runtime, auth=TokenAuth({"alice-token": alice}), sweep_every=None, close_runtime=True
    )


async def test_helix_a_complete_approval_endpoint(store_url: str) -> None:
    """helix: "Two functions: one to chat, one to decide": the chat call answers `sessionId`,
    `status`, `text` and the pending approvals; the decide call takes at least one decision
    `{id, approved, reason?}`, and the same decision again (a double click) is a no-op."""
    log = ExecutionLog()
    agent = scripted_agent(
        "support-agent",
        [call_tools(REFUND_180, text="Let me get that approved."), reply("Done.")],
        tools=[helix_refund(log)],
    )
    app = helix_app(store_url, agent)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://t",
            headers={"Authorization": "Bearer alice-token"},
        ) as c:
            chat = await c.post(
                "/v1/sessions", json={"agent": "support-agent", "message": "Refund order 1042"}
            )
            assert chat.status_code == 201, chat.text
            body = chat.json()
            sid = body["session_id"]
            assert (body["status"], body["text"]) == ("waiting", "Let me get that approved.")
            (pending,) = body["pending"]
            action = pending["action"]
            assert action["tool_name"] == "issue_refund" and action["call_id"]
            assert action["input"] == {
                "order_id": "1042",
                "amount": 180.0,
                "reason": "Item arrived broken",
            }
            url = f"/v1/sessions/{sid}/approvals"
            empty = await c.post(url, json={"approvals": []})
            assert empty.status_code == 422, empty.text
            assert empty.json()["error"]["code"] == "invalid_request"
            assert (await c.get(f"/v1/sessions/{sid}")).json()["status"] == "waiting"
            decision = {"approvals": [{"id": pending["id"], "approved": True, "reason": "ok"}]}
            decided = await c.post(url, json=decision)
            assert decided.status_code == 200, decided.text
            assert decided.json()["session_id"] == sid
            assert decided.json()["status"] == "completed"
            assert decided.json()["text"].endswith("Done.")
            assert decided.json()["pending"] == []
            again = await c.post(url, json=decision)
            assert again.status_code == 200, again.text
            assert [o["applied"] for o in again.json()["outcomes"]] == [False]
            assert again.json()["status"] == "completed"
    assert log.count("issue_refund") == 1


async def test_helix_dashboard_tools_view_shows_each_approval_setting(tmp_path: Path) -> None:
    """helix: "The Tools view ... shows each tool's approval setting: Always, Conditional, or
    Never"."""

    @so.tool(approval=True)
    async def close_account(account_id: str) -> str:
        """Close an account."""
        return "closed"

    @so.tool
    async def lookup_order(order_id: str) -> str:
        """Look up an order."""
        return "delivered"

    agent = scripted_agent(
        "support-agent",
        [reply("hi")],
        tools=[helix_refund(ExecutionLog()), close_account, lookup_order],
    )
    app = helix_app(f"sqlite:///{tmp_path / 'state.db'}", agent)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://t",
            headers={"Authorization": "Bearer alice-token"},
        ) as c:
            page = await c.get("/_signoff/tools")
            assert page.status_code == 200
    badges = {
        name: label
        for label, name in (
            ("Always", "close_account"),
            ("Conditional", "issue_refund"),
            ("Never", "lookup_order"),
        )
    }
    rows = page.text.split('<td class="mono">')[1:]
    shown = {
        row.split("</td>", 1)[0].removeprefix("<bdi>").removesuffix("</bdi>"): row for row in rows
    }
    for name, label in badges.items():
        assert f">{label}</span>" in shown[name], name


async def test_helix_a_run_waiting_on_approval_shows_as_awaiting_approval(tmp_path: Path) -> None:
    """helix: "A run waiting on approval shows as awaiting approval in its execution trace"."""
    agent = scripted_agent(
        "support-agent",
        [call_tools(REFUND_180), reply("Done.")],
        tools=[helix_refund(ExecutionLog())],
    )
    app = helix_app(f"sqlite:///{tmp_path / 'state.db'}", agent)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://t",
            headers={"Authorization": "Bearer alice-token"},
        ) as c:
            chat = await c.post(
                "/v1/sessions", json={"agent": "support-agent", "message": "Refund order 1042"}
            )
            sid = chat.json()["session_id"]
            page = (await c.get(f"/_signoff/sessions/{sid}")).text
            assert "Awaiting approval: <bdi>issue_refund</bdi>" in page
            fragment = (await c.get(f"/_signoff/fragments/sessions/{sid}?after=1")).json()
            assert "Awaiting approval: <bdi>issue_refund</bdi>" in fragment["rows"]


async def test_helix_the_same_id_twice_in_one_call_is_refused_by_name(tmp_path: Path) -> None:
    """helix: "Each approval resolves once": one call naming an id twice (approving and denying
    it, or twice alike) decides nothing and names the id; store and tool are untouched."""
    log = ExecutionLog()
    agent = scripted_agent(
        "support-agent", [call_tools(REFUND_180), reply("Refunded.")], tools=[helix_refund(log)]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support-agent", prompt="Refund order 1042")
        rid = r.pending[0].id
        before = await store_contents(rt.store, r.session_id)
        for second in (True, False):
            with pytest.raises(so.InvalidAnswer) as info:
                await rt.generate(
                    session_id=r.session_id,
                    approvals=[
                        so.Decision(id=rid, approved=True),
                        so.Decision(id=rid, approved=second),
                    ],
                )
            assert info.value.request_ids == [rid]
            assert rid in str(info.value)
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 0
        done = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=rid, approved=True)]
        )
        assert done.status == "completed"
        assert log.count() == 1
