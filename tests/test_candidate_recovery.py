"""A response whose policy evaluation died with its process is evaluated again, not lost."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import Field

import signoff as so
from signoff._candidates import RECOVERY_GRACE
from tests._candidate_child import ALICE, BOB, make_agent
from tests._workers import is_, until, working

ROOT = Path(__file__).resolve().parent.parent


def died_deciding(tmp_path: Path, *key: str) -> tuple[Path, Path, dict[str, str]]:
    """A child process records a response (Bob's message "approve" sent with the idempotency
    key `key`, if given) and is killed while its policy runs: the store file, the file the
    refund tool writes to, and the ids the child printed."""
    db, out = tmp_path / "s.db", tmp_path / "runs"
    keyed = ["--key", *key] if key else []
    child = subprocess.run(
        [sys.executable, "-m", "tests._candidate_child", str(db), str(out), "--die", *keyed],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    ids: dict[str, str] = json.loads(child.stdout.splitlines()[0])
    return db, out, ids


async def test_a_candidate_pending_when_the_process_died_is_evaluated_again(
    tmp_path: Path,
) -> None:
    db, out, ids = died_deciding(tmp_path)
    later = time.time() + 60  # well past the policy's timeout: nobody is still deciding
    async with so.Runtime(
        [make_agent(str(out))], store=f"sqlite:///{db}", clock=lambda: later
    ) as rt:
        before = [e async for e in rt.events(ids["session"], follow=False)]
        assert [e.data["outcome"] for e in before if e.type == "approval.candidate"] == ["pending"]
        assert (await rt.state(ids["session"])).candidates  # recorded, never decided
        r = await rt.generate(session_id=ids["session"])  # any process touching it resumes it
        assert r.status == "completed"
        assert r.text.endswith("refunded")
        events = [e async for e in rt.events(ids["session"], follow=False)]
        settled = [e for e in events if e.type == "approval.settled"]
        assert len(settled) == 1
        assert settled[0].data["by"]["principal_id"] == "bob"
        assert settled[0].data["reason"] == "checked it"  # the whole response survived
        assert [e.data["outcome"] for e in events if e.type == "approval.candidate"] == ["pending"]
        assert not (await rt.state(ids["session"])).candidates
    assert len(out.read_text().splitlines()) == 1  # the refund ran once


@pytest.mark.parametrize("first", ["drive", "repeat"])
async def test_a_keyed_message_whose_candidate_died_deciding_is_a_repeat_once_judged_again(
    tmp_path: Path, first: str
) -> None:
    """Bob's "approve" sent with an idempotency key, its process SIGKILLed while the response
    policy judged it (its pending candidate committed): the process that judges it again (a
    drive, or Bob's call sent again itself) records the key with the approval it settles, so the
    call sent again with the key is a repeat answered with the turn it answered into, not a new
    turn taking "approve" as its prompt."""
    db, out, ids = died_deciding(tmp_path, "k-1")
    sid = ids["session"]
    later = time.time() + 60  # well past the policy's timeout: nobody is still deciding
    async with so.Runtime(
        [make_agent(str(out))], store=f"sqlite:///{db}", clock=lambda: later
    ) as rt:
        turn = (await rt.state(sid)).turn
        assert turn is not None and not (await rt.state(sid)).keys  # no key taken yet
        if first == "drive":
            assert (await rt.generate(session_id=sid)).status == "completed"
        for _ in range(2):
            again = await rt.send(sid, "approve", principal=BOB, idempotency_key="k-1")
            assert (again.status, again.turn_id, again.replayed) == ("completed", turn.id, True)
            assert again.text.endswith("refunded")
        events = [e async for e in rt.events(sid, follow=False)]
        assert [e.data["message"] for e in events if e.type == "turn.started"] == ["refund 9"]
        assert not [e for e in events if e.type == "turn.message"]
        (settled,) = [e.data for e in events if e.type == "approval.settled"]
        assert settled["by"]["principal_id"] == "bob" and settled.get("idem")
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, "deny", principal=BOB, idempotency_key="k-1")
    assert len(out.read_text().splitlines()) == 1  # the refund ran once


async def test_a_front_that_runs_no_turns_still_evaluates_a_dead_candidate_again(
    tmp_path: Path,
) -> None:
    """With `inline=False` the front records and returns, and a waiting turn is no worker's to
    claim: touching the session evaluates the dead candidate again there, and a worker then
    runs the approved call."""
    db, out, ids = died_deciding(tmp_path)
    later = time.time() + 60
    url = f"sqlite:///{db}"
    agent = make_agent(str(out))
    async with (
        so.Runtime([agent], store=url, clock=lambda: later, inline=False) as front,
        so.Runtime([agent], store=url, clock=lambda: later, inline=False) as worker,
    ):
        r = await front.generate(session_id=ids["session"])
        assert r.status == "running"  # the approval settled; the call is the worker's to run
        async with working(worker):
            await until(lambda: is_(front, ids["session"], "completed"))
    assert len(out.read_text().splitlines()) == 1


async def test_a_candidate_still_within_its_timeout_is_left_to_its_process(
    tmp_path: Path,
) -> None:
    db, out, ids = died_deciding(tmp_path)
    async with so.Runtime([make_agent(str(out))], store=f"sqlite:///{db}") as rt:
        r = await rt.generate(session_id=ids["session"])
        assert r.status == "waiting"  # its process may still be deciding: not evaluated twice
        assert (await rt.state(ids["session"])).candidates
    assert not out.exists()


async def test_a_dead_candidate_waits_out_the_timeout_and_grace_then_keeps_its_decision(
    tmp_path: Path,
) -> None:
    """A response recorded pending, whose process then died, is left alone until the policy's
    timeout and `RECOVERY_GRACE` have passed (its process may still be deciding), and is then
    evaluated again with the decision it gave: a cancel stays a cancel, the call never runs."""
    out = tmp_path / "runs"
    now = [1_000_000.0]
    async with so.Runtime(
        [make_agent(str(out))], store=f"sqlite:///{tmp_path / 's.db'}", clock=lambda: now[0]
    ) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (req,) = r.pending
        dead = {
            "request_id": req.id,
            "call_id": req.call_id,
            "candidate_id": "cand_dead",
            "decision": "cancel",
            "by": BOB.model_dump(),
            "outcome": "pending",
            "text": "not this one",
            "value": None,
            "edited_input": None,
        }
        driver = rt._driver((await rt.state(r.session_id)).copy(), None)
        await driver.record([("approval.candidate", dead)], durable=True)
        now[0] += 1.0 + RECOVERY_GRACE - 0.5  # the policy's timeout is 1 s
        assert (await rt.generate(session_id=r.session_id)).status == "waiting"
        assert (await rt.state(r.session_id)).candidates
        now[0] += 1.0
        done = await rt.generate(session_id=r.session_id)
        assert done.status == "completed"
        events = [e async for e in rt.events(r.session_id, follow=False)]
        (settled,) = [e.data for e in events if e.type == "approval.settled"]
        assert settled["decision"] == "cancel" and settled["reason"] == "not this one"
        assert settled["by"]["principal_id"] == "bob"
    assert not out.exists()


def _allow(ctx: so.ResponseContext) -> so.Allowed:
    return so.Allowed()


def _refunds(out: Path, *, digits_only: bool) -> so.Agent:
    """A refund agent whose order ids are any text, or (a later deploy) digits only."""
    spec = so.ApprovalSpec(request=so.always(), response=_allow, timeout=1.0)

    async def text_id(order_id: str) -> dict[str, Any]:
        """Refund an order."""
        with open(out, "a") as f:
            f.write(f"{order_id!r}\n")
        return {"refunded": order_id}

    async def digits(order_id: Annotated[str, Field(pattern=r"^[0-9]+$")]) -> dict[str, Any]:
        """Refund an order."""
        return await text_id(order_id)

    refund = so.tool(name="refund", approval=spec)(digits if digits_only else text_id)
    model = so.models.Scripted(
        [
            so.ModelResponse(tool_calls=[so.ToolCall(name="refund", input={"order_id": "9"})]),
            so.ModelResponse(text="refunded"),
        ]
    )
    return so.Agent(name="support", model=model, tools=[refund])


async def test_a_dead_candidate_whose_edit_the_tool_now_refuses_ends_and_frees_the_session(
    store_url: str, tmp_path: Path
) -> None:
    """A response recorded pending with an edit, whose process then died, meets a deploy under
    which the edit no longer fits the tool's schema: evaluated again, it ends (`stale`, saying
    why) rather than raising `InvalidAnswer` at everyone who touches the session, and the
    request stays open for a fresh answer."""
    out = tmp_path / "runs"
    now = [1_000_000.0]
    async with so.Runtime(
        [_refunds(out, digits_only=False)], store=store_url, clock=lambda: now[0]
    ) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (req,) = r.pending
        dead = {
            "request_id": req.id,
            "call_id": req.call_id,
            "candidate_id": "cand_dead",
            "decision": "approve",
            "by": BOB.model_dump(),
            "outcome": "pending",
            "text": None,
            "value": None,
            "edited_input": {"order_id": "A-9"},
        }
        driver = rt._driver((await rt.state(r.session_id)).copy(), None)
        await driver.record([("approval.candidate", dead)], durable=True)
    now[0] += 60
    async with so.Runtime(
        [_refunds(out, digits_only=True)], store=store_url, clock=lambda: now[0]
    ) as rt:
        again = await rt.generate(session_id=r.session_id)
        assert again.status == "waiting" and [p.id for p in again.pending] == [req.id]
        assert not (await rt.state(r.session_id)).candidates
        events = [e async for e in rt.events(r.session_id, follow=False)]
        ended = [e.data for e in events if e.type == "approval.candidate"]
        assert [c["outcome"] for c in ended] == ["pending", "stale"]
        assert "schema" in ended[-1]["reason"]
        assert (await rt.generate(session_id=r.session_id)).status == "waiting"  # not again
        yes = so.InputResponse(request_id=req.id, option_id="approve")
        done = await rt.respond(r.session_id, [yes], principal=BOB)
        assert done.status == "completed"
    assert out.read_text().splitlines() == ["'9'"]
