"""Principals: who called each turn, who asked for each call, and whose identity a call runs with.

Covers `session.auth.current` / `.initiator`, `request.requested_by` captured when a request opens,
scheduled turns running as the app principal (and the eve schedule-skip policy), and execution
identity: the requester by default, the approver with `run_as="approver"`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._tools import RunAs
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
    timeline,
    tool_results,
)

ALICE = so.Principal(
    authenticator="slack", issuer="T01", principal_id="alice", attributes={"tenant_id": "t1"}
)
BOB = so.Principal(
    authenticator="slack", issuer="T01", principal_id="bob", attributes={"tenant_id": "t1"}
)


def allow_anyone(ctx: so.ResponseContext) -> so.Allowed:
    return so.Allowed()


async def events_of(rt: so.Runtime, session_id: str, after: int = 0) -> list[so.Event]:
    return [e async for e in rt.events(session_id, after, follow=False)]


# -- who called: current, initiator, requested_by -------------------------------------------------


async def test_turn_records_its_caller_and_the_session_its_initiator(tmp_path: Path) -> None:
    seen: list[so.SessionInfo] = []

    @so.tool
    async def whoami(ctx: so.ToolContext) -> str:
        """Say who is calling."""
        seen.append(ctx.session)
        current = ctx.session.auth.current
        return "nobody" if current is None else current.principal_id

    agent = scripted_agent(
        "a",
        [call_tools(call("whoami")), reply("one"), call_tools(call("whoami")), reply("two")],
        tools=[whoami],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="who?", auth=ALICE)
        assert r.status == "completed"
        r2 = await rt.generate(session_id=r.session_id, prompt="and now?", auth=BOB)
        assert r2.status == "completed"
        first, second = seen
        assert first.auth.current == ALICE and first.auth.initiator == ALICE
        assert second.auth.current == BOB and second.auth.initiator == ALICE
        assert first.turn == r.turn_id and second.turn == r2.turn_id
        assert first.turn != second.turn
        events = await events_of(rt, r.session_id)
        assert events[0].data["initiator"] == ALICE.model_dump()
        started = [e.data for e in events if e.type == "turn.started"]
        assert [s["principal"] for s in started] == [ALICE.model_dump(), BOB.model_dump()]
        assert [s["source"] for s in started] == ["message", "message"]
        state = await rt.state(r.session_id)
        assert state.initiator == ALICE
        assert state.turn is not None and state.turn.principal == BOB


async def test_anonymous_turns_have_no_principal(tmp_path: Path) -> None:
    seen: list[so.SessionAuth] = []

    @so.tool(approval=so.always())
    async def act(ctx: so.ToolContext) -> str:
        """Act."""
        seen.append(ctx.session.auth)
        return "ok"

    agent = scripted_agent("a", [call_tools(call("act")), reply("done")], tools=[act])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        (req,) = r.pending
        assert req.requested_by is None
        r = await rt.respond(
            r.session_id, [so.InputResponse(request_id=req.id, option_id="approve")]
        )
        assert r.status == "completed"
        assert seen == [so.SessionAuth(current=None, initiator=None)]


async def test_request_principal_is_captured_when_asked_and_never_changes(tmp_path: Path) -> None:
    log = ExecutionLog()

    @log.tool(approval=so.ApprovalSpec(request=so.always(), response=allow_anyone))
    async def publish_release(version: str) -> str:
        """Publish a release."""
        return f"published {version}"

    agent = scripted_agent(
        "rel",
        [
            call_tools(call("publish_release", version="1.0")),
            reply("1.0 out"),
            call_tools(call("publish_release", version="1.1")),
            reply("1.1 out"),
        ],
        tools=[publish_release],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("rel", prompt="ship 1.0", auth=ALICE)
        (first,) = r.pending
        assert first.requested_by == ALICE
        # Bob writes in the shared thread while Alice's request waits: his message waits for the
        # end of the turn, and the request still names Alice.
        r = await rt.send(r.session_id, "ship it already", principal=BOB)
        assert r.status == "waiting"
        (still,) = await rt.pending(session_id=r.session_id)
        assert still.id == first.id and still.requested_by == ALICE
        # Bob approves (the response policy lets anyone): the turn ends, his queued message
        # starts the next turn, whose request names Bob; Alice's request keeps naming Alice.
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=first.id, option_id="approve")],
            principal=BOB,
        )
        assert r.status == "waiting"
        (second,) = r.pending
        assert second.id != first.id
        assert second.requested_by == BOB
        stored = await rt.store.get_request(first.id)
        assert stored is not None and stored.status == "settled"
        assert stored.request.requested_by == ALICE
        state = await rt.state(r.session_id)
        assert state.initiator == ALICE
        assert state.turn is not None and state.turn.principal == BOB
        assert [e.principal_id for e in log.executions] == ["alice"]


# -- scheduled turns run as the app principal -----------------------------------------------------


def test_app_principal_fields() -> None:
    app = so.APP_PRINCIPAL
    assert (app.authenticator, app.principal_id, app.principal_type) == (
        "app",
        "signoff:app",
        "runtime",
    )
    assert app.issuer is None


async def test_schedule_runs_the_turn_as_the_app_principal(tmp_path: Path) -> None:
    seen: list[so.SessionAuth] = []

    @so.tool
    async def nightly(ctx: so.ToolContext) -> str:
        """Nightly job."""
        seen.append(ctx.session.auth)
        return "ran"

    agent = scripted_agent(
        "ops",
        [call_tools(call("nightly")), reply("ok"), call_tools(call("nightly")), reply("ok")],
        tools=[nightly],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.schedule("ops", "run the nightly job")
        assert r.status == "completed"
        events = await events_of(rt, r.session_id)
        assert events[0].data["initiator"] == so.APP_PRINCIPAL.model_dump()
        (started,) = [e.data for e in events if e.type == "turn.started"]
        assert started["source"] == "schedule"
        assert started["principal"] == so.APP_PRINCIPAL.model_dump()
        # a schedule firing into a session a person created keeps that person as initiator
        sid = await rt.create_session("ops", auth=ALICE)
        r = await rt.schedule("ops", "run it here", session_id=sid)
        assert r.status == "completed"
        assert seen == [
            so.SessionAuth(current=so.APP_PRINCIPAL, initiator=so.APP_PRINCIPAL),
            so.SessionAuth(current=so.APP_PRINCIPAL, initiator=ALICE),
        ]


# -- eve: skip approval for schedule-dispatched turns ---------------------------------------------


def schedule_skip(ctx: so.ApprovalContext) -> so.ApprovalStatus:
    """The seed's policy: match all three fields of the app principal."""
    auth = ctx.session.auth.current
    return (
        "not-applicable"
        if auth is not None
        and auth.authenticator == "app"
        and auth.principal_id == "signoff:app"
        and auth.principal_type == "runtime"
        else "user-approval"
    )


def refund_tool(log: ExecutionLog, approval: Any, **kwargs: Any) -> so.Tool:
    @log.tool(approval=approval, **kwargs)
    async def refund_charge(charge_id: str, amount: float) -> dict[str, Any]:
        """Refund a charge."""
        return {"refunded": amount, "charge": charge_id}

    return refund_charge


async def test_schedule_skip_policy_runs_scheduled_turns_and_asks_people(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "billing",
        [
            call_tools(call("refund_charge", charge_id="c1", amount=5)),
            reply("scheduled refund done"),
            call_tools(call("refund_charge", charge_id="c2", amount=7)),
            reply("manual refund done"),
        ],
        tools=[refund_tool(log, schedule_skip)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.schedule("billing", "nightly refunds")
        assert r.status == "completed" and r.pending == []
        assert [e.principal_id for e in log.executions] == ["signoff:app"]
        assert "input.requested" not in [e.type for e in await events_of(rt, r.session_id)]
        # a person resumes the schedule-started session: the same tool asks them
        r = await rt.generate(session_id=r.session_id, prompt="refund c2 too", auth=ALICE)
        assert r.status == "waiting"
        (req,) = r.pending
        assert req.requested_by == ALICE
        assert log.count() == 1
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=req.id, option_id="approve")],
            principal=ALICE,
        )
        assert r.status == "completed" and r.text == "manual refund done"
        assert [e.principal_id for e in log.executions] == ["signoff:app", "alice"]


@pytest.mark.parametrize(
    "lookalike",
    [
        so.Principal(authenticator="app", principal_id="signoff:app", principal_type="user"),
        so.Principal(authenticator="slack", principal_id="signoff:app", principal_type="runtime"),
        so.Principal(authenticator="app", principal_id="eve:app", principal_type="runtime"),
    ],
    ids=["type", "authenticator", "id"],
)
async def test_schedule_skip_policy_asks_a_lookalike_of_the_app_principal(
    tmp_path: Path, lookalike: so.Principal
) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "billing",
        [call_tools(call("refund_charge", charge_id="c1", amount=5)), reply("x")],
        tools=[refund_tool(log, schedule_skip)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("billing", prompt="refund", auth=lookalike)
        assert r.status == "waiting"
        assert r.pending[0].requested_by == lookalike
        assert log.count() == 0


async def test_a_scheduled_turn_that_must_ask_is_answerable_only_as_the_policy_says(
    tmp_path: Path,
) -> None:
    """A schedule's request was asked by the app: by default no person may settle it."""
    log = ExecutionLog()
    agent = scripted_agent(
        "billing",
        [call_tools(call("refund_charge", charge_id="c1", amount=5)), reply("done")],
        tools=[refund_tool(log, so.always())],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.schedule("billing", "nightly refunds")
        assert r.status == "waiting"
        (req,) = r.pending
        assert req.requested_by == so.APP_PRINCIPAL
        before = await store_contents(rt.store, r.session_id)
        for who in (ALICE, None):
            with pytest.raises(so.NotAllowed):
                await rt.respond(
                    r.session_id,
                    [so.InputResponse(request_id=req.id, option_id="approve")],
                    principal=who,
                )
        assert await store_contents(rt.store, r.session_id) == before
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=req.id, option_id="cancel")],
            principal=so.APP_PRINCIPAL,
        )
        assert r.status == "completed"
        assert log.count() == 0


# -- execution identity ---------------------------------------------------------------------------


def identity_agent(log: ExecutionLog, *, run_as: RunAs) -> tuple[so.Agent, Capture]:
    @log.tool(approval=so.ApprovalSpec(request=so.always(), response=allow_anyone), run_as=run_as)
    async def deploy(service: str) -> str:
        """Deploy a service."""
        return f"deployed {service}"

    @log.tool
    async def notify(channel: str) -> str:
        """Post a note."""
        return "posted"

    seen = Capture(reply("all done"))
    agent = scripted_agent(
        "ops",
        [
            call_tools(call("deploy", service="api")),
            call_tools(call("notify", channel="#ops")),
            seen,
        ],
        tools=[deploy, notify],
    )
    return agent, seen


@pytest.mark.parametrize(("run_as", "deployer"), [("requester", "alice"), ("approver", "bob")])
async def test_approved_call_runs_as_requester_unless_the_tool_opts_in_to_the_approver(
    tmp_path: Path, run_as: RunAs, deployer: str
) -> None:
    log = ExecutionLog()
    agent, seen = identity_agent(log, run_as=run_as)
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("ops", prompt="deploy api", auth=ALICE)
        (req,) = r.pending
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=req.id, option_id="approve")],
            principal=BOB,
        )
        assert r.status == "completed"
        # the approved call runs as the requester (or the approver, by opt-in); the next call
        # of the same turn runs as the turn's owner again
        assert [(e.tool_name, e.principal_id) for e in log.executions] == [
            ("deploy", deployer),
            ("notify", "alice"),
        ]
        events = await events_of(rt, r.session_id)
        started = {
            e.data["tool_name"]: e.data["principal"] for e in events if e.type == "tool.started"
        }
        assert started["deploy"]["principal_id"] == deployer
        assert started["notify"]["principal_id"] == "alice"
        settled = next(e for e in events if e.type == "approval.settled")
        assert settled.data["by"] == BOB.model_dump()
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.principal == ALICE
        assert [m.content for m in tool_results(seen.last)] == ["deployed api", "posted"]


async def test_run_as_approver_with_the_requester_approving_runs_as_the_requester(
    tmp_path: Path,
) -> None:
    log = ExecutionLog()
    agent, _ = identity_agent(log, run_as="approver")
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("ops", prompt="deploy api", auth=ALICE)
        r = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=True)],
            auth=ALICE,
        )
        assert r.status == "completed"
        assert [e.principal_id for e in log.executions] == ["alice", "alice"]
        lines = timeline(await events_of(rt, r.session_id))
        assert lines.count("tool.started deploy") == 1


def test_run_as_takes_requester_or_approver() -> None:
    async def f() -> None:
        """F."""

    with pytest.raises(so.UsageError, match="run_as"):
        so.tool(run_as="admin")(f)  # type: ignore[call-overload]


async def test_a_refusal_tells_apart_two_names_that_differ_only_in_type(tmp_path: Path) -> None:
    """`--as app:signoff:app` names a user, not the app that asked a schedule's request: the
    refusal said "asked by app:signoff:app (runtime); app:signoff:app may not settle it", the
    same name twice; it names the type of each."""
    log = ExecutionLog()
    agent = scripted_agent(
        "billing",
        [call_tools(call("refund_charge", charge_id="c1", amount=5)), reply("done")],
        tools=[refund_tool(log, so.always())],
    )
    posing = so.Principal(authenticator="app", principal_id="signoff:app")
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.schedule("billing", "nightly refunds")
        (req,) = r.pending
        with pytest.raises(so.NotAllowed) as refused:
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="approve")],
                principal=posing,
            )
        assert "asked by app:signoff:app (runtime); app:signoff:app (user) may not" in str(
            refused.value
        )


class Staff(so.Principal):
    """An app's own principal type, with a field of its own."""

    team: str = "support"


async def test_an_apps_own_principal_type_is_recorded_as_a_plain_principal(
    tmp_path: Path,
) -> None:
    # Recorded with its own field, it could not be read back: the approved call never ran and
    # each resume failed; a turn it started failed as a store error.
    log = ExecutionLog()
    agent, _ = identity_agent(log, run_as="approver")
    carol = Staff(authenticator="slack", issuer="T01", principal_id="carol", team="ops")
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("ops", prompt="deploy api", auth=carol)
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=r.pending[0].id, option_id="approve")],
            principal=Staff(**dict(BOB)),
        )
        assert r.status == "completed"
        assert [e.principal_id for e in log.executions] == ["bob", "carol"]
        assert "team" not in str([e.data async for e in rt.events(r.session_id, follow=False)])
