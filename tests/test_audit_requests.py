"""Request rows checked against the audit trail: a settled request's status, outcome or
resolution, or a pending one's data, changed in its row behind signoff's back is named by
`verify_audit`, on both stores; rows that only follow the trail are not."""

import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import pytest

import signoff as so
from signoff import _audit_requests as audit_trail_requests
from signoff import _audit_trail as audit_trail
from signoff.stores import Commit, Store
from signoff.stores._base import RequestRow
from signoff.stores._codec import pack_bytes
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._audit import ALICE, BOB, agent, alter, run_scenario, wipe
from ._delegation import refund_desk
from ._procs import query


def set_resolution(url: str, request_id: str, resolution: dict[str, object]) -> None:
    alter(
        url,
        "UPDATE {t}requests SET resolution={p} WHERE id={p}",
        pack_bytes(resolution),
        request_id,
    )


async def settled_ids(rt: so.Runtime, sid: str) -> tuple[str, str]:
    """The refund request (approved by bob with an edit) and the wipe request (expired)."""
    entries = await rt.audit(sid)
    refund = next(e.data["request_id"] for e in entries if e.type == "approval.settled")
    wiped = next(
        e.data["request_id"]
        for e in entries
        if e.type == "input.resolved" and e.data["outcome"] == "expired"
    )
    return refund, wiped


async def problems_of(url: str, clock: ManualClock, sid: str | None = None) -> list[str]:
    async with so.Runtime([agent()], store=url, clock=clock) as rt:
        problems = await rt.verify_audit(sid)
    assert all(p.n == 0 or p.reason for p in problems)
    return [p.reason for p in problems]


async def test_a_settled_requests_row_rewritten_is_named(store_url: str) -> None:
    """Who approved, the edited input, the status and the outcome of a settled request are kept
    in its row, which the dashboard and a repeated answer read; the trail's own settlement
    entries say otherwise once the row is rewritten, and verification names the request."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        refund, wiped = await settled_ids(rt, sid)
        assert await rt.verify_audit() == []
        stored = await rt.store.get_request(refund)
    assert stored is not None and stored.resolution is not None
    assert stored.resolution["by"]["principal_id"] == "bob"
    forged = {**stored.resolution, "by": {**stored.resolution["by"], "principal_id": "mallory"}}
    alter(
        store_url, "UPDATE {t}requests SET resolution={p} WHERE id={p}", pack_bytes(forged), refund
    )
    reasons = await problems_of(store_url, clock)
    assert len(reasons) == 1 and refund in reasons[0] and "by" in reasons[0]
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        (problem,) = await rt.verify_audit(sid)
        assert problem.stream == sid and problem.n > 0 and problem.id > 0

    # the edited input dropped: the trail's settlement still holds it
    no_edit = {k: v for k, v in stored.resolution.items() if k != "edited_input"}
    alter(
        store_url, "UPDATE {t}requests SET resolution={p} WHERE id={p}", pack_bytes(no_edit), refund
    )
    (reason,) = await problems_of(store_url, clock, sid)
    assert refund in reason and "edited_input" in reason

    # a key the trail never recorded added
    extra = {**stored.resolution, "note": "approved by the board"}
    alter(
        store_url, "UPDATE {t}requests SET resolution={p} WHERE id={p}", pack_bytes(extra), refund
    )
    (reason,) = await problems_of(store_url, clock, sid)
    assert refund in reason and "note" in reason

    # put back: nothing left to name
    set_resolution(store_url, refund, stored.resolution)
    assert await problems_of(store_url, clock) == []

    # what the expired wipe's deadline did dropped: a late answer would be told another close
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        expired = await rt.store.get_request(wiped)
    assert expired is not None and expired.resolution is not None
    assert expired.resolution["on_timeout"] is not None
    untold = {k: v for k, v in expired.resolution.items() if k != "on_timeout"}
    set_resolution(store_url, wiped, untold)
    (reason,) = await problems_of(store_url, clock, sid)
    assert wiped in reason and "its resolution's on_timeout differ" in reason, reason
    set_resolution(store_url, wiped, expired.resolution)
    assert await problems_of(store_url, clock) == []

    # the expired wipe turned into an approval, then reopened for anyone to approve
    alter(
        store_url,
        "UPDATE {t}requests SET status='settled', outcome='approved' WHERE id={p}",
        wiped,
    )
    reasons = await problems_of(store_url, clock)
    assert len(reasons) == 1 and wiped in reasons[0]
    assert "settled" in reasons[0] and "expired" in reasons[0]
    # each said once (it read `expired (expired)`), the outcome where it is not the status
    assert "it is settled as approved, but the trail has it expired" in reasons[0], reasons
    alter(
        store_url,
        "UPDATE {t}requests SET status='pending', outcome=NULL, resolution=NULL WHERE id={p}",
        wiped,
    )
    reasons = await problems_of(store_url, clock)
    assert len(reasons) == 1 and wiped in reasons[0] and "pending" in reasons[0]
    assert "it is pending, but the trail has it expired;" in reasons[0], reasons


async def test_a_number_in_a_row_made_a_boolean_is_named(store_url: str) -> None:
    """Rows were compared with the trail by `==`, for which `true` is `1` and `false` is `0`: a
    row's call input or edited input so rewritten was not named, though the queue then showed
    `true` for a call that runs with `1`. The same number written `1.0` is no change."""

    @so.tool(approval=so.always())
    async def set_flag(name: str, value: int) -> str:
        """Set a flag."""
        return f"{name}={value}"

    calls = [call_tools(call("set_flag", name="x", value=1))] * 2
    flags = scripted_agent("flags", [*calls, reply("ok")], tools=[set_flag], repeat_last=True)
    async with so.Runtime([flags], store=store_url) as rt:
        settled = await rt.generate("flags", "set x")
        edit = {"name": "x", "value": 0}
        (asked,) = settled.pending
        answer = so.InputResponse(request_id=asked.id, option_id="approve", edited_input=edit)
        await rt.respond(settled.session_id, [answer])
        (waiting,) = (await rt.generate("flags", "set x again")).pending
        stored = await rt.store.get_request(asked.id)
        shown = await rt.store.get_request(waiting.id)
        assert await rt.verify_audit() == []

    async def named() -> list[str]:
        async with so.Runtime([flags], store=store_url) as rt:
            return [p.reason for p in await rt.verify_audit()]

    assert stored is not None and stored.resolution is not None and shown is not None
    for value, said in ((False, True), (0.0, False)):
        edited = {**stored.resolution, "edited_input": {"name": "x", "value": value}}
        set_resolution(store_url, asked.id, edited)
        reasons = await named()
        assert bool(reasons) is said, (value, reasons)
        assert not said or (asked.id in reasons[0] and "edited_input" in reasons[0])
    set_resolution(store_url, asked.id, stored.resolution)
    dumped = shown.request.model_dump(mode="json", exclude_defaults=True)
    for value, said in ((True, True), (1.0, False)):
        action = {**dumped["action"], "input": {"name": "x", "value": value}}
        data = pack_bytes({**dumped, "action": action})
        alter(store_url, "UPDATE {t}requests SET data={p} WHERE id={p}", data, waiting.id)
        reasons = await named()
        assert bool(reasons) is said, (value, reasons)
        assert not said or (waiting.id in reasons[0] and "its data (action)" in reasons[0])


async def parked(rt: so.Runtime) -> tuple[str, str]:
    """A session waiting on one approval of `wipe`: its id and the request's."""
    r = await rt.generate("support", prompt="refund and wipe", auth=ALICE)
    await rt.respond(
        r.session_id,
        [so.InputResponse(request_id=p.id, option_id="cancel") for p in r.pending[:1]],
        principal=BOB,
    )
    (pending,) = await rt.pending(session_id=r.session_id)
    return r.session_id, pending.id


async def test_a_pending_requests_row_rewritten_is_named(store_url: str) -> None:
    """What a reviewer sees of a pending request (the call's input, who asked, how many must
    approve) is recorded by its `input.requested` entry: a row holding other data, moved to
    another session, relabelled for the queue's filters, deleted or forged is named."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        sid, rid = await parked(rt)
        other, _ = await parked(rt)
        assert await rt.verify_audit() == []
        shown = await rt.store.get_request(rid)
    assert shown is not None and shown.request.action is not None
    ((sk_other,),) = query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", other)
    original = query(
        store_url, "SELECT sk, seq, idx, agent, kind, tool, data FROM {t}requests WHERE id={p}", rid
    )[0]

    def restore() -> None:
        alter(
            store_url,
            "UPDATE {t}requests SET sk={p}, seq={p}, idx={p}, agent={p}, kind={p}, tool={p}, "
            "data={p} WHERE id={p}",
            *original,
            rid,
        )

    dumped = shown.request.model_dump(mode="json", exclude_defaults=True)
    for change, word in (
        ({"action": {**dumped["action"], "input": {"disk": "sdb"}}}, "data"),
        ({"approvers": 2, "options": dumped["options"][:1]}, "approvers, options"),
        ({"expires_at": None}, "data"),
    ):
        copy = pack_bytes({**dumped, **change})
        alter(store_url, "UPDATE {t}requests SET data={p} WHERE id={p}", copy, rid)
        (reason,) = await problems_of(store_url, clock)
        assert rid in reason and word in reason, reason
        restore()
        assert await problems_of(store_url, clock) == []

    # the columns the queue filters on
    alter(store_url, "UPDATE {t}requests SET agent='other', tool='refund' WHERE id={p}", rid)
    (reason,) = await problems_of(store_url, clock)
    assert rid in reason and "agent" in reason and "tool" in reason
    restore()
    # moved into another session
    alter(store_url, "UPDATE {t}requests SET sk={p} WHERE id={p}", sk_other, rid)
    reasons = await problems_of(store_url, clock)
    assert len(reasons) == 1 and rid in reasons[0] and other in reasons[0]
    restore()
    assert await problems_of(store_url, clock) == []
    # deleted: the trail still asks it
    alter(store_url, "DELETE FROM {t}requests WHERE id={p}", rid)
    (reason,) = await problems_of(store_url, clock, sid)
    assert rid in reason and "no row" in reason
    # forged: a row the trail never asked, copied from the real one under another id
    ((sk,),) = query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", sid)
    alter(
        store_url,
        "INSERT INTO {t}requests (id, sk, seq, idx, agent, kind, tool, status, created_at, data) "
        "VALUES ({p},{p},NULL,NULL,{p},{p},{p},'pending',{p},{p})",
        "req_forged",
        sk,
        "support",
        "tool-approval",
        "wipe",
        shown.request.created_at,
        pack_bytes({**dumped, "id": "req_forged"}),
    )
    reasons = await problems_of(store_url, clock, sid)
    assert len(reasons) == 2 and any("req_forged" in r and "no entry" in r for r in reasons)


async def test_a_pending_requests_deadline_column_changed_is_named(store_url: str) -> None:
    """The sweep finds due requests by their rows' `expires_at` column, a copy of the deadline in
    the request's data: a column cleared, made earlier or later (a deadline the sweep would miss,
    or read too soon) is named, as a change to the data is."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        _, rid = await parked(rt)
        shown = await rt.store.get_request(rid)
    assert shown is not None and shown.request.expires_at is not None
    deadline = shown.request.expires_at
    for value in (None, deadline - 5, deadline + 3600):
        alter(store_url, "UPDATE {t}requests SET expires_at={p} WHERE id={p}", value, rid)
        (reason,) = await problems_of(store_url, clock)
        assert rid in reason and "expires_at column" in reason, reason
    alter(store_url, "UPDATE {t}requests SET expires_at={p} WHERE id={p}", deadline, rid)
    assert await problems_of(store_url, clock) == []


async def test_an_unreadable_request_row_is_named_not_raised(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/a.db"
    clock = ManualClock()
    async with so.Runtime([agent()], store=url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        refund, wiped = await settled_ids(rt, sid)
    with sqlite3.connect(url[len("sqlite:///") :]) as conn:
        conn.execute("UPDATE requests SET resolution=? WHERE id=?", (b"\x01garbage", refund))
        conn.execute("UPDATE requests SET data=?, seq=NULL WHERE id=?", (b"{nope", wiped))
    reasons = await problems_of(url, clock)
    assert sorted(r.split(" ")[1].removesuffix("'s") for r in reasons) == sorted([refund, wiped])
    assert all("cannot be read" in r for r in reasons)


async def test_rows_that_follow_the_trail_check_out(store_url: str) -> None:
    """Rows the runtime itself keeps apart from the request as first asked (quorum votes counted,
    a deadline escalated, auto-approval at a deadline, a withdrawn question) are not named."""
    clock = ManualClock()

    @so.tool(approval=so.always(approvers=2))
    async def deploy(env: str) -> str:
        """Deploy."""
        return f"deployed {env}"

    @so.tool(approval=so.always(expires_in=10, on_timeout="escalate", escalate_to="leads"))
    async def purge(table: str) -> str:
        """Purge."""
        return f"purged {table}"

    @so.tool(approval=so.always(expires_in=10, on_timeout="approve"))
    async def rotate(key: str) -> str:
        """Rotate."""
        return f"rotated {key}"

    a = scripted_agent(
        "ops",
        [
            call_tools(
                call("deploy", env="prod"), call("purge", table="t"), call("rotate", key="k")
            ),
            reply("done"),
        ],
        tools=[deploy, purge, rotate, wipe],
    )
    async with so.Runtime([a], store=store_url, clock=clock) as rt:
        r = await rt.generate("ops", prompt="go", auth=ALICE)
        deploy_req = next(p for p in r.pending if p.tool_name == "deploy")
        await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=deploy_req.id, option_id="approve")],
            principal=BOB,
        )
        clock.advance(11)
        await rt.expire_due()  # purge escalates, rotate is approved
        still = {p.tool_name: p for p in await rt.pending(session_id=r.session_id)}
        assert set(still) == {"deploy", "purge"}
        assert still["deploy"].approved_by == ["bob"] and still["purge"].escalated_to == "leads"
        assert await rt.verify_audit() == []
        await rt.cancel(r.session_id)
        assert await rt.pending(session_id=r.session_id) == []
        assert await rt.verify_audit() == []


async def test_rows_and_requests_are_paired_across_pages_of_sessions(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole store is verified a page of sessions at a time: a row moved to a session on
    another page, a row deleted and a row forged are named as they are when every session is
    read at once; a row moved out of, or into, a session whose chain is broken is not named."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        parked_ = [await parked(rt) for _ in range(4)]
    (a, moved), (b, deleted), (_, into_a), (d, _) = parked_  # each on a page of its own below
    sk = {s: query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", s)[0][0] for s in (a, d)}
    alter(store_url, "UPDATE {t}requests SET sk={p} WHERE id={p}", sk[d], moved)
    alter(store_url, "DELETE FROM {t}requests WHERE id={p}", deleted)
    alter(
        store_url,
        "INSERT INTO {t}requests (id, sk, seq, idx, agent, kind, tool, status, created_at) "
        "VALUES ('req_forged', {p}, NULL, NULL, 'support', 'tool-approval', 'wipe', 'pending', 1)",
        sk[a],
    )

    async def found() -> list[list[tuple[str, int, int, str]]]:
        runs = []
        for page in (1000, 1):
            monkeypatch.setattr(audit_trail, "SESSIONS_PAGE", page)
            async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
                problems = await rt.verify_audit()
            runs.append(sorted((p.stream, p.id, p.n, p.reason) for p in problems))
        return runs

    whole, paged = await found()
    assert whole == paged
    reasons = {s: r for s, _, _, r in paged}
    assert len(paged) == 3 and moved in reasons[a] and d in reasons[a]
    assert deleted in reasons[b] and "no row" in reasons[b]
    assert [r for s, i, n, r in paged if (i, n) == (0, 0)] == [
        "request req_forged has a row, but no entry of its session's trail asks it"
    ]
    # a's chain broken: its rows, the one moved out of it and one moved into it are not checked
    alter(store_url, "UPDATE {t}requests SET sk={p} WHERE id={p}", sk[a], into_a)
    alter(
        store_url,
        "DELETE FROM {t}audit WHERE sk={p} AND n=(SELECT audit_n FROM {t}sessions WHERE sk={p})",
        sk[a],
        sk[a],
    )
    whole, paged = await found()
    assert whole == paged and {s for s, *_ in paged} == {a, b}
    assert all(moved not in r and into_a not in r for *_, r in paged)


class _CommitsAfterRows:
    """A store on which `then` commits just after verification read the request rows, before
    it reads the entries: as another process answering or asking meanwhile does."""

    def __init__(self, store: Store, then: Callable[[], Awaitable[object]]) -> None:
        self._store = store
        self._then: Callable[[], Awaitable[object]] | None = then

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def stored_requests(self, **scope: Any) -> list[RequestRow]:
        rows: list[RequestRow] = await self._store.stored_requests(**scope)
        then, self._then = self._then, None
        if then is not None:
            await then()
        return rows


@pytest.mark.parametrize("stream", [True, False])
async def test_requests_answered_or_asked_while_verifying_are_not_named(
    store_url: str, stream: bool
) -> None:
    """A row is checked against the trail as it was when the row was read, and a request asked
    after its session's head was read is not missing its row: a commit landing mid-check (an
    answer, a new request) is no tampering."""
    a = scripted_agent(
        "ops",
        [
            call_tools(call("wipe", disk="sda")),
            reply("wiped"),
            call_tools(call("wipe", disk="sdb")),
        ],
        tools=[wipe],
    )
    async with so.Runtime([a], store=store_url) as rt:
        r = await rt.generate("ops", prompt="wipe sda", auth=ALICE)
        sid = r.session_id

        async def answer() -> None:
            approve = so.InputResponse(request_id=r.pending[0].id, option_id="approve")
            assert (await rt.respond(sid, [approve], principal=ALICE)).status == "completed"

        async def ask() -> None:
            assert (await rt.generate(session_id=sid, prompt="wipe sdb")).status == "waiting"

        for then in (answer, ask):
            racing = cast(Store, _CommitsAfterRows(rt.store, then))
            assert await audit_trail.verify(racing, stream=sid if stream else None) == []
        assert await rt.verify_audit() == [] and await rt.verify_audit(sid) == []


async def test_request_rows_are_read_a_page_at_a_time_to_the_last(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session's request rows fill more than one page: each page is read, the last one too,
    so no request is named as missing its row."""
    monkeypatch.setattr(audit_trail_requests, "PAGE", 1)
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        rows = await audit_trail_requests.request_rows(rt.store, session_id=sid)
        assert len(rows) == 2
        assert await rt.verify_audit(sid) == [] and await rt.verify_audit() == []


async def test_an_entry_naming_another_sessions_request_leaves_that_row_alone(
    store_url: str,
) -> None:
    """A request is followed only through its own session's entries: a chained entry of another
    session that names its id neither resolves it nor makes its row differ from the trail,
    though it comes early in that session's chain."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund and wipe", auth=ALICE)
        created = so.Event(session_id="ses_other", seq=1, type="session.created", at=clock.now)
        await rt.store.create_session("ses_other", "support", [created], None)
        named = so.Event(
            session_id="ses_other",
            seq=2,
            type="input.resolved",
            at=clock.now,
            data={"request_id": r.pending[0].id, "status": "settled", "outcome": "approved"},
        )
        await rt.store.commit(Commit(session_id="ses_other", expected_seq=1, events=[named]))
        assert await rt.verify_audit() == [] and await rt.verify_audit(r.session_id) == []


async def test_a_mirror_rows_votes_and_edit_removed_are_named(store_url: str) -> None:
    """A parent's mirror of its subagent's approvals closes with `input.resolved` alone (no
    `approval.settled` of its own), which records the subagent's votes and edit: removing them
    from the mirror's row (what the dashboard's audit page and a late Slack click read) went
    unnamed, while the same removal from the subagent's own row was named."""

    @so.tool(approval=so.always(approvers=2))
    async def refund(order_id: str, amount: float) -> dict[str, float]:
        """Refund."""
        return {"refunded": amount}

    @so.tool(approval=so.always())
    async def wipe(disk: str) -> str:
        """Wipe."""
        return "wiped " + disk

    def agents() -> list[so.Agent]:
        calls = call_tools(call("refund", order_id="9", amount=5), call("wipe", disk="sda"))
        billing = scripted_agent("billing", [calls, reply("billed")], tools=[refund, wipe])
        ask = call_tools(call("billing", message="refund 9"))
        support = scripted_agent("support", [ask, reply("done")], tools=[so.delegate("billing")])
        return [support, billing]

    carol = so.Principal(authenticator="test", principal_id="carol")
    async with so.Runtime(agents(), store=store_url) as rt:
        r = await rt.generate("support", prompt="go", auth=ALICE)
        sid = r.session_id
        votes = next(p for p in r.pending if p.tool_name == "refund")
        edit = next(p for p in r.pending if p.tool_name == "wipe")
        for who in (BOB, carol):
            await rt.respond(sid, [{"request_id": votes.id, "option_id": "approve"}], principal=who)
        answer = {"request_id": edit.id, "option_id": "approve", "edited_input": {"disk": "sdb"}}
        r = await rt.respond(sid, [answer], principal=ALICE)
        assert r.status == "completed", r
        assert await rt.verify_audit() == []
        rows = {rid: await rt.store.get_request(rid) for rid in (votes.id, edit.id)}
    for rid, key in ((votes.id, "approved_by"), (edit.id, "edited_input")):
        row = rows[rid]
        assert row is not None and row.resolution is not None and key in row.resolution, row
        set_resolution(store_url, rid, {k: v for k, v in row.resolution.items() if k != key})
        async with so.Runtime(agents(), store=store_url) as rt:
            reasons = [p.reason for p in await rt.verify_audit()]
        assert any(rid in r and f"its resolution's {key} differ" in r for r in reasons), reasons
        set_resolution(store_url, rid, row.resolution)


async def test_a_quorums_rows_hold_its_last_vote_as_an_older_signoff_did_not(
    store_url: str,
) -> None:
    """A quorum's request, and the parent's mirror of it, now hold every vote that approved it
    once settled; an older signoff left the request's row without the last one and the mirror's
    with none. Both forms follow the trail; a vote no entry records is named."""
    ran: list[str] = []
    carol = so.Principal(authenticator="test", principal_id="carol")
    desk = refund_desk(so.always(approvers=2), ran)
    async with so.Runtime(desk, store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        for who in (BOB, carol):
            vote = {"request_id": mirror.id, "option_id": "approve"}
            await rt.respond(r.session_id, [vote], principal=who)
        assert ran == ["9"]
        ids = (mirror.child.request_id, mirror.id)
        rows = {rid: await rt.store.get_request(rid) for rid in ids}
        assert await rt.verify_audit() == []
    both = ["bob", "carol"]
    for (rid, row), before in zip(rows.items(), (["bob"], []), strict=True):
        assert row is not None and row.request.approved_by == both
        data = row.request.model_dump(mode="json", exclude_defaults=True)
        for votes, named in ((before, False), (["mallory", "carol"], True), (both, False)):
            form = pack_bytes({**data, "approved_by": votes})
            alter(store_url, "UPDATE {t}requests SET data={p} WHERE id={p}", form, rid)
            async with so.Runtime(desk, store=store_url) as rt:
                reasons = [p.reason for p in await rt.verify_audit()]
            assert bool(reasons) is named, (rid, votes, reasons)
            assert not named or (rid in reasons[0] and "its data (approved_by)" in reasons[0])
