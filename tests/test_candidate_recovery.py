"""A response whose policy evaluation died with its process is evaluated again, not lost."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import Field

import signoff as so
from signoff._candidates import RECOVERY_GRACE
from tests._candidate_child import ALICE, BOB, CAROL, make_agent
from tests._workers import is_, until, working

ROOT = Path(__file__).resolve().parent.parent
DAVE = so.Principal(authenticator="test", principal_id="dave")


def died_deciding(
    tmp_path: Path, *flags: str, store: str | None = None
) -> tuple[Path, Path, dict[str, str]]:
    """A child process records a response (Bob's message "approve" sent with an idempotency key
    with `--key KEY` in `flags`, see `tests._candidate_child`) in `store` (a SQLite file in
    `tmp_path` if None) and is killed while its policy runs: the SQLite file, the file the
    refund tool writes to, and the ids the child printed."""
    db, out = tmp_path / "s.db", tmp_path / "runs"
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests._candidate_child",
            store or str(db),
            str(out),
            "--die",
            *flags,
        ],
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
    db, out, ids = died_deciding(tmp_path, "--key", "k-1")
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


def _clock() -> tuple[list[float], Callable[[], float]]:
    """A clock held still, set by `_set` once the dead candidate's time is known."""
    now = [time.time()]
    return now, lambda: now[0]


async def _set(rt: so.Runtime, sid: str, now: list[float], when: str) -> None:
    """Set `now` by the time Bob's dead candidate was recorded: `deciding` keeps it within the
    policy's timeout (its process may still be deciding: nobody judges it again), `lost` well
    past it and `RECOVERY_GRACE`."""
    (dead,) = (await rt.state(sid)).candidates.values()
    now[0] = float(dead["at"]) + (0.1 if when == "deciding" else 60.0)


def _bobs(events: list[so.Event]) -> list[dict[str, Any]]:
    """The `approval.candidate` events of Bob's answers (any client of his)."""
    return [
        e.data
        for e in events
        if e.type == "approval.candidate" and e.data["by"]["principal_id"] == "bob"
    ]


@pytest.mark.parametrize("when", ["deciding", "lost"])
@pytest.mark.parametrize("settled", ["approve", "cancel"])
async def test_a_keyed_answer_that_died_deciding_meets_its_request_settled_by_another(
    store_url: str, tmp_path: Path, settled: str, when: str
) -> None:
    """Bob's "approve" sent with idempotency key k-1, his process SIGKILLed while the response
    policy judged it; before anyone judges it again (its process may still be deciding, or is
    taken for dead), Carol settles the request. The commit that settles it ends Bob's answer
    too: if she approved, his was taken as a live call's would have been, and that end keeps
    its key with the turn, so the message sent again is a repeat, never a new turn taking
    "approve" as its prompt. If she denied, his answer is refused as a live call's would have
    been, which delivers the message anew: sent again, it is delivered once, as that."""
    _, out, ids = died_deciding(tmp_path, "--key", "k-1", store=store_url)
    sid, rid = ids["session"], ids["request"]
    now, clock = _clock()
    agent = make_agent(str(out), also=["carol"])
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        await _set(rt, sid, now, when)
        turn = (await rt.state(sid)).turn
        assert turn is not None and not (await rt.state(sid)).keys
        answer = so.InputResponse(request_id=rid, option_id=settled)
        assert (await rt.respond(sid, [answer], principal=CAROL)).status == "completed"
        assert not (await rt.state(sid)).candidates
        again = await rt.send(sid, "approve", principal=BOB, idempotency_key="k-1")
        events = [e async for e in rt.events(sid, follow=False)]
        started = [e.data["message"] for e in events if e.type == "turn.started"]
        bob = _bobs(events)
        if settled == "approve":
            assert started == ["refund 9"]
            assert (again.status, again.turn_id, again.replayed) == ("completed", turn.id, True)
            assert [b["outcome"] for b in bob] == ["pending", "stale"]  # ended as it closed
            assert bob[1]["idem"] == bob[0]["message_idem"]  # in the commit that closed it
            with pytest.raises(so.IdempotencyKeyReused):
                await rt.send(sid, "deny", principal=BOB, idempotency_key="k-1")
        else:
            assert [b["outcome"] for b in bob] == ["pending", "stale"]
            assert "idem" not in bob[1]
            assert (again.turn_id != turn.id, again.replayed) == (True, False)
            assert started == ["refund 9", "approve"]
            repeat = await rt.send(sid, "approve", principal=BOB, idempotency_key="k-1")
            assert (repeat.turn_id, repeat.replayed) == (again.turn_id, True)
    runs = out.read_text().splitlines() if out.exists() else []
    assert len(runs) == (1 if settled == "approve" else 0)


async def test_a_keyed_vote_that_died_deciding_keeps_its_key_when_others_make_the_quorum(
    store_url: str, tmp_path: Path
) -> None:
    """Under a quorum of two, Bob's "approve" sent with idempotency key k-1 dies in the
    response policy; while its process may still be deciding, Carol and Dave vote and the
    second vote settles the request. That commit ends Bob's vote and keeps its key: the
    message sent again is a repeat, not a new turn taking "approve" as its prompt."""
    _, out, ids = died_deciding(tmp_path, "--key", "k-1", "--quorum", store=store_url)
    sid, rid = ids["session"], ids["request"]
    now, clock = _clock()
    agent = make_agent(str(out), approvers=2, also=["carol", "dave"])
    yes = so.InputResponse(request_id=rid, option_id="approve")
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        await _set(rt, sid, now, "deciding")
        turn = (await rt.state(sid)).turn
        assert turn is not None
        first = await rt.respond(sid, [yes], principal=CAROL)
        assert (first.status, first.outcomes[0].outcome) == ("waiting", "counted")
        assert (await rt.respond(sid, [yes], principal=DAVE)).status == "completed"
        again = await rt.send(sid, "approve", principal=BOB, idempotency_key="k-1")
        events = [e async for e in rt.events(sid, follow=False)]
        assert [e.data["message"] for e in events if e.type == "turn.started"] == ["refund 9"]
        assert (again.status, again.turn_id, again.replayed) == ("completed", turn.id, True)
        bob = _bobs(events)
        assert [b["outcome"] for b in bob] == ["pending", "stale"]
        assert bob[1]["idem"] == bob[0]["message_idem"]
    assert len(out.read_text().splitlines()) == 1


async def test_a_keyed_vote_that_died_deciding_after_its_sender_voted_keeps_its_key(
    store_url: str, tmp_path: Path
) -> None:
    """Under a quorum of two, Bob's "approve" sent with idempotency key k-1 dies in the
    response policy; then Bob approves from another client, which is counted. The drive that
    judges the dead answer again finds his vote counted (one person, one vote): that answer
    changed nothing, and its end keeps its key in the same commit, as a live call keeps it.
    Once Carol's vote settles the request, the message sent again is a repeat, not a new turn
    taking "approve" as its prompt."""
    _, out, ids = died_deciding(tmp_path, "--key", "k-1", "--quorum", store=store_url)
    sid, rid = ids["session"], ids["request"]
    now, clock = _clock()
    agent = make_agent(str(out), approvers=2, also=["carol"])
    web = BOB.model_copy(update={"attributes": {"client": "web"}})
    yes = so.InputResponse(request_id=rid, option_id="approve")
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        await _set(rt, sid, now, "lost")
        turn = (await rt.state(sid)).turn
        assert turn is not None
        voted = await rt.respond(sid, [yes], principal=web)
        assert voted.status == "waiting" and voted.outcomes[0].outcome == "counted"
        assert not (await rt.state(sid)).candidates  # the dead one judged again meanwhile
        assert (await rt.respond(sid, [yes], principal=CAROL)).status == "completed"
        again = await rt.send(sid, "approve", principal=BOB, idempotency_key="k-1")
        events = [e async for e in rt.events(sid, follow=False)]
        assert [e.data["message"] for e in events if e.type == "turn.started"] == ["refund 9"]
        assert (again.status, again.turn_id, again.replayed) == ("completed", turn.id, True)
        dead = [b for b in _bobs(events) if not b["by"].get("attributes")]
        assert [b["outcome"] for b in dead] == ["pending", "stale"]
        assert dead[1]["idem"] == dead[0]["message_idem"]  # with its end, not after it
    assert len(out.read_text().splitlines()) == 1


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


def _refunds(
    out: Path,
    *,
    digits_only: bool,
    response: Callable[[so.ResponseContext], Any] = _allow,
    limits: so.Limits | None = None,
) -> so.Agent:
    """A refund agent whose order ids are any text, or (a later deploy) digits only."""
    spec = so.ApprovalSpec(request=so.always(), response=response, timeout=1.0)

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
    return so.Agent(name="support", model=model, tools=[refund], limits=limits)


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


def _dead(request: so.InputRequest, edited_input: dict[str, Any] | None) -> dict[str, Any]:
    """Bob's approve of `request`, recorded pending by a process that then died."""
    return {
        "request_id": request.id,
        "call_id": request.call_id,
        "candidate_id": "cand_dead",
        "decision": "approve",
        "by": BOB.model_dump(),
        "outcome": "pending",
        "text": None,
        "value": None,
        "edited_input": edited_input,
    }


async def _expired_with_its_end(rt: so.Runtime, session_id: str, request_id: str) -> None:
    """The session expired, its request with it, and the dead response ended (`stale`)."""
    stored = await rt.store.get_request(request_id)
    assert stored is not None and stored.status == "expired"
    state = await rt.state(session_id)
    assert state.lapsed and not state.candidates
    events = [e async for e in rt.events(session_id, follow=False)]
    ends = [e.data for e in events if e.type == "approval.candidate"]
    assert [c["outcome"] for c in ends] == ["pending", "stale"]
    assert "the session expired" in ends[-1]["reason"]
    failed = [e.data["error"]["code"] for e in events if e.type == "turn.failed"]
    assert failed == ["session_expired"]


async def test_a_dead_candidate_refused_again_past_the_ttl_expires_the_session(
    store_url: str, tmp_path: Path
) -> None:
    """A dead response judged again by a slow policy that refuses it meets the session's TTL
    passed meanwhile: its end is recorded with the expiry, and the drive raises
    `SessionExpired`. The refusal was recorded alone, which as activity renewed the TTL: the
    expired session waited on, open to answers."""
    out = tmp_path / "runs"
    now = [1_000_000.0]

    def slow_refusal(ctx: so.ResponseContext) -> so.Rejected:
        now[0] += 120  # a slow lookup
        return so.Rejected("not today")

    agent = _refunds(out, digits_only=False, response=slow_refusal, limits=so.Limits(ttl=60))
    async with so.Runtime([agent], store=store_url, clock=lambda: now[0]) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (req,) = r.pending
        driver = rt._driver((await rt.state(r.session_id)).copy(), None)
        await driver.record([("approval.candidate", _dead(req, None))], durable=True)
        now[0] += 1.0 + RECOVERY_GRACE + 1  # its process is taken for dead; the TTL is 60 s
        with pytest.raises(so.SessionExpired):
            await rt.generate(session_id=r.session_id)
        await _expired_with_its_end(rt, r.session_id, req.id)
    assert not out.exists()


async def test_a_dead_candidate_that_cannot_settle_ends_with_the_expiry_past_the_ttl(
    store_url: str, tmp_path: Path
) -> None:
    """A dead response whose edit a later deploy's schema refuses, ended by a process that read
    the session just before its TTL passed (`_recover`, as a drive or an answer's call runs
    it): its end is recorded with the expiry, and `SessionExpired` raised. Its end was recorded
    alone, which as activity renewed the TTL of the expired session."""
    out = tmp_path / "runs"
    now = [1_000_000.0]
    ttl = so.Limits(ttl=60)
    async with so.Runtime(
        [_refunds(out, digits_only=False, limits=ttl)], store=store_url, clock=lambda: now[0]
    ) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (req,) = r.pending
        driver = rt._driver((await rt.state(r.session_id)).copy(), None)
        await driver.record([("approval.candidate", _dead(req, {"order_id": "A-9"}))])
    async with so.Runtime(
        [_refunds(out, digits_only=True, limits=ttl)], store=store_url, clock=lambda: now[0]
    ) as rt:
        state = await rt._state(r.session_id)
        now[0] += 120
        with pytest.raises(so.SessionExpired):
            await rt._recover(state)
        await _expired_with_its_end(rt, r.session_id, req.id)
    assert not out.exists()
