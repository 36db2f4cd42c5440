"""The audit trail: every request, evaluation, decision, edit, expiry and execution, chained."""

import asyncio
import hashlib
import io
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.server._page_data import tool_rows
from signoff.stores._audit import AuditRow, chain_hash, chain_parts
from signoff.stores._codec import pack, unpack_event
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._audit import agent, only_bob, run_scenario, wipe


async def test_the_trail_records_each_step_and_verifies(tmp_path: Path) -> None:
    clock = ManualClock()
    async with so.Runtime([agent()], store=f"sqlite:///{tmp_path}/a.db", clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        entries = await rt.audit(sid)
        kinds = [e.type for e in entries]
        assert kinds[0] == "input.requested"
        # refused: pending then rejected; allowed: pending, then the settlement itself
        outcomes = [e.data["outcome"] for e in entries if e.type == "approval.candidate"]
        assert outcomes == ["pending", "rejected", "pending"]
        settled = next(e for e in entries if e.type == "approval.settled")
        assert settled.data["by"]["principal_id"] == "bob"
        assert settled.data["edited_input"] == {"order_id": "1", "amount": 40.0}
        expired = [e for e in entries if e.type == "input.resolved"]
        assert {e.data["outcome"] for e in expired} == {"approved", "expired"}
        assert [e.type for e in entries if e.type.startswith("tool.")] == [
            "tool.started",
            "tool.completed",
            "tool.completed",
        ]
        assert [e.n for e in entries] == list(range(1, len(entries) + 1))
        assert entries[0].prev is None and all(
            b.prev == a.hash for a, b in zip(entries, entries[1:], strict=False)
        )
        # tool settings were recorded when the runtime opened
        tools = await rt.audit(stream="tools:support.refund")
        assert [e.data["new"] for e in tools] == ["Always + response policy"]
        assert await rt.verify_audit() == []


async def test_altering_the_log_or_the_trail_is_named(tmp_path: Path) -> None:
    clock = ManualClock()
    db = tmp_path / "a.db"
    async with so.Runtime([agent()], store=f"sqlite:///{db}", clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        settled = next(e for e in await rt.audit(sid) if e.type == "approval.settled")
    assert settled.seq is not None
    # Rewrite who approved, in the event log itself: the trail reads the event, so it notices.
    with sqlite3.connect(db) as conn:
        (sk,) = conn.execute("SELECT sk FROM sessions WHERE id=?", (sid,)).fetchone()
        stored = dict(
            conn.execute(
                "SELECT seq, data FROM events WHERE sk=? AND seq BETWEEN ? AND ?",
                (sk, settled.seq - 2, settled.seq),
            ).fetchall()
        )
        # it may be kept on the events before it: read it with them
        data = unpack_event(stored[settled.seq], stored[settled.seq - 1], stored[settled.seq - 2])
        data["by"]["principal_id"] = "mallory"
        conn.execute("UPDATE events SET data=? WHERE sk=? AND seq=?", (pack(data), sk, settled.seq))
    async with so.Runtime([agent()], store=f"sqlite:///{db}", clock=clock) as rt2:
        problems = await rt2.verify_audit()
        assert [(p.id, p.stream, p.reason) for p in problems] == [
            (settled.id, sid, "content does not match")
        ]
        # rewriting an entry of the trail itself (a tool setting change) is named too
        with sqlite3.connect(db) as conn:
            tool_entry = conn.execute(
                "SELECT id, data FROM audit WHERE stream='tools:support.wipe' AND n > 0"
            ).fetchone()
            changed = json.loads(tool_entry[1]) | {"new": "Never"}
            conn.execute("UPDATE audit SET data=? WHERE id=?", (json.dumps(changed), tool_entry[0]))
        problems = await rt2.verify_audit("tools:support.wipe")
        assert [(p.id, p.reason) for p in problems] == [(tool_entry[0], "content does not match")]
        # deleting an entry breaks the chain at the next one
        with sqlite3.connect(db) as conn:
            conn.execute("DELETE FROM audit WHERE id=?", (settled.id,))
        problems = await rt2.verify_audit(sid)
        assert [p.id for p in problems] == [settled.id + 1]


async def test_tool_setting_changes_are_recorded_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/a.db"
    loose = so.tool(approval=so.never())(wipe.fn)
    for tools, expected in (([wipe], 1), ([wipe], 1), ([loose], 2)):
        a = scripted_agent("support", [reply("hi")], tools=tools)
        async with so.Runtime([a], store=url) as rt:
            history = await rt.audit(stream="tools:support.wipe")
            assert len(history) == expected
    assert [(e.data["old"], e.data["new"]) for e in history] == [
        (None, "Always [expires in 60 s]"),
        ("Always [expires in 60 s]", "Never"),
    ]


async def test_a_change_of_any_rule_of_an_approval_is_recorded(tmp_path: Path) -> None:
    """Only a policy's name and approver count were recorded: a deadline made to approve on
    timeout, or the requester no longer excluded, left no entry. Each rule other than its
    default is part of the setting recorded, so each change is one entry."""
    url = f"sqlite:///{tmp_path}/a.db"
    settings = [
        (so.always(), "Always"),
        (so.always(exclude_requester=True), "Always [not the requester]"),
        (
            so.always(expires_in=60, exclude_requester=True),
            "Always [not the requester; expires in 60 s]",
        ),
        (
            so.always(expires_in=60, on_timeout="approve"),
            "Always [expires in 60 s; on timeout approve]",
        ),
        (
            so.always(
                approvers=2,
                distinct=False,
                expires_in=1.5,
                on_timeout="escalate",
                escalate_to="ops",
            ),
            "Always (2 approvers) [one person's approvals count each; expires in 1.5 s; "
            "on timeout escalate; escalates to ops]",
        ),
    ]
    for approval, _ in [*settings, settings[-1]]:  # the last one twice: recorded once
        tool = so.tool(approval=approval)(wipe.fn)
        async with so.Runtime(
            [scripted_agent("support", [reply("hi")], tools=[tool])], store=url
        ) as rt:
            history = await rt.audit(stream="tools:support.wipe")
    assert [e.data["new"] for e in history] == [said for _, said in settings]
    async with so.Runtime([], store=url) as rt:
        assert await rt.verify_audit() == []


async def test_a_deadline_change_too_small_for_six_digits_is_recorded(tmp_path: Path) -> None:
    """A deadline was recorded to six significant digits: 1,000,000 s made 1,000,004 s was no
    entry (both "1e+06 s"), nor 3,600 s made 3,600.0000001 s. Each is now an entry, written
    short where that reads back as the same number, as before."""
    url = f"sqlite:///{tmp_path}/a.db"
    said: list[str] = []
    for seconds in (1_000_000, 1_000_004, 1_000_000.4, 3600, 3600.0000001, 3600):
        tool = so.tool(approval=so.always(expires_in=seconds))(wipe.fn)
        async with so.Runtime(
            [scripted_agent("support", [reply("hi")], tools=[tool])], store=url
        ) as rt:
            said = [e.data["new"] for e in await rt.audit(stream="tools:support.wipe")]
    assert said == [
        f"Always [expires in {text} s]"
        for text in ("1e+06", "1000004", "1000000.4", "3600", "3600.0000001", "3600")
    ]


def _large(input: Any) -> bool:
    return bool(input.disk == "sda")


async def _recorded(url: str, approval: Any, guardrails: list[so.Guardrail]) -> list[str]:
    """The settings recorded of `support.wipe` once a runtime with `approval` has opened."""
    tool = so.tool(approval=approval)(wipe.fn)
    a = scripted_agent("support", [reply("hi")], tools=[tool], guardrails=guardrails)
    async with so.Runtime([a], store=url) as rt:
        return [e.data["new"] for e in await rt.audit(stream="tools:support.wipe")]


async def test_a_quorum_given_through_approval_spec_is_recorded(tmp_path: Path) -> None:
    """Only `always()` said its approver count: a quorum given to any other policy through
    `ApprovalSpec` (a predicate's 2 approvers made 5, `once()` given 3) was no entry."""
    url = f"sqlite:///{tmp_path}/a.db"
    for approval in (
        so.ApprovalSpec(_large, approvers=2),
        so.ApprovalSpec(_large, approvers=5),
        so.once(),
        so.ApprovalSpec(so.once(), approvers=3, expires_in=60),
        so.always(approvers=2),
    ):
        history = await _recorded(url, approval, [])
    assert history == [
        "Conditional (_large) [2 approvers]",
        "Conditional (_large) [5 approvers]",
        "Once",
        "Once [3 approvers; expires in 60 s]",
        "Always (2 approvers)",
    ]


async def test_a_guarded_tool_records_its_own_rules_and_response_policy(tmp_path: Path) -> None:
    """A guardrail's request takes the tool's quorum and deadline (a deadline that would
    approve denies) and its response policy decides who answers: the setting recorded was
    'Always (guardrail)' whatever they were, so none of their changes was an entry."""
    url = f"sqlite:///{tmp_path}/a.db"
    guard = [so.tool_policy(require_approval=["wipe"])]
    two = so.always(approvers=2, expires_in=60, on_timeout="approve")
    await _recorded(url, two, guard)
    await _recorded(url, so.ApprovalSpec(two, only_bob), guard)
    # Denied now, it asks no one, but its policy still decides who answers a request it parked.
    denied = [so.tool_policy(require_approval=["wipe"], deny=["wipe"])]
    assert await _recorded(url, so.ApprovalSpec(two, only_bob), denied) == [
        "Always (guardrail) [2 approvers; expires in 60 s]",
        "Always (guardrail) [2 approvers; expires in 60 s] + response policy",
        "Never (denied by guardrail) + response policy",
    ]


async def test_a_guardrail_with_a_deny_method_of_its_own_is_recorded(tmp_path: Path) -> None:
    """A guardrail of the app's whose `deny` is a method, not `tool_policy`'s set of names:
    the setting looked for the tool in it, and every runtime's opening failed with a bare
    TypeError. Its `tool_names()` say a guardrail asks for the tool."""

    class Hours(so.Guardrail):
        async def decide(self, ctx: so.ApprovalContext) -> so.Verdict | None:
            return None

        def deny(self) -> bool:
            return False

        def tool_names(self) -> list[str]:
            return ["wipe"]

    history = await _recorded(f"sqlite:///{tmp_path}/a.db", so.always(), [Hours()])
    assert history == ["Always (guardrail)"]


@pytest.mark.parametrize("deny_first", [True, False])
async def test_a_tool_one_guardrail_denies_is_denied_on_both_surfaces(
    tmp_path: Path, deny_first: bool
) -> None:
    """One guardrail denies the tool, another requires approval for it: every call is denied,
    but the recorded setting took the first guardrail naming the tool and the dashboard's row
    the last, so one of them said a person is asked. Both say it is denied, in either order."""
    asks = so.tool_policy(require_approval=["wipe"])
    denies = so.tool_policy(deny=["wipe"])
    guards = [denies, asks] if deny_first else [asks, denies]
    history = await _recorded(f"sqlite:///{tmp_path}/a.db", so.always(), guards)
    tool = so.tool(approval=so.always())(wipe.fn)
    (row,) = tool_rows(scripted_agent("support", [], tools=[tool], guardrails=guards))
    assert history == ["Never (denied by guardrail)"]
    assert row["guardrail"] == "Never (denied by guardrail)"


async def test_a_runtime_opens_on_a_store_refusing_writes_and_records_its_settings_later(
    tmp_path: Path,
) -> None:
    """A tool's setting changed while the store refuses writes (full): opening the runtime must
    not fail for it, so the store can still be read (the queue, a session); the change is
    recorded by the first call once the store takes writes again, before that call's writes."""
    url = f"sqlite:///{tmp_path}/a.db"
    gated = scripted_agent("support", [reply("hi")], tools=[wipe])
    async with so.Runtime([gated], store=url) as rt:
        r = await rt.generate("support", prompt="hello")
    never = so.tool(approval=so.never())(wipe.fn)
    loose = scripted_agent("support", [reply("hi")], tools=[never], repeat_last=True)
    rt = so.Runtime([loose], store=url)
    await rt.store.open()
    conn = rt.store.conn  # type: ignore[attr-defined]
    conn.execute("PRAGMA query_only=1")  # every write refused from now on
    try:
        assert await rt.pending() == []
        assert (await rt.state(r.session_id)).status == "idle"
        assert len(await rt.audit(stream="tools:support.wipe")) == 1
        with pytest.raises(so.StoreError):
            await rt.generate(session_id=r.session_id, prompt="again")
        conn.execute("PRAGMA query_only=0")
        again = await rt.generate(session_id=r.session_id, prompt="again")
        assert again.status == "completed"
        history = await rt.audit(stream="tools:support.wipe")
        assert [(e.data["old"], e.data["new"]) for e in history] == [
            (None, "Always [expires in 60 s]"),
            ("Always [expires in 60 s]", "Never"),
        ]
    finally:
        await rt.close()


async def test_export_writes_json_lines(tmp_path: Path) -> None:
    clock = ManualClock()
    async with so.Runtime([agent()], store=f"sqlite:///{tmp_path}/a.db", clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        out = io.StringIO()
        count = await rt.export_audit(out, sid)
        lines = [json.loads(line) for line in out.getvalue().splitlines()]
        assert count == len(lines) == len(await rt.audit(sid))
        assert {"id", "stream", "n", "type", "at", "data", "prev", "hash"} <= set(lines[0])


async def test_the_trail_on_both_stores(store_url: str) -> None:
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        assert len(await rt.audit(sid)) >= 10
        assert await rt.verify_audit(sid) == []


async def test_a_clock_of_whole_seconds_leaves_a_trail_that_verifies(
    store_url: str, tmp_path: Path
) -> None:
    """A clock giving whole seconds as int (`ManualClock(1_700_000_000)`): the stores keep
    times as floats, so an entry hashed with the int's text read back as altered, every one."""
    clock = ManualClock(1_700_000_000)
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        assert isinstance(clock(), int)
        assert await rt.verify_audit() == []
        assert await rt.verify_audit(sid) == []
        assert await rt.verify_audit("tools:support.wipe") == []
        path = tmp_path / "trail.jsonl"
        with path.open("w", encoding="utf-8") as f:
            assert await rt.export_audit(f) == len(await rt.audit())
        with path.open(encoding="utf-8") as f:
            assert so.verify_audit_export(f) == []


def test_an_entry_hashed_with_whole_seconds_as_int_still_verifies() -> None:
    """Entries an int clock recorded before times were hashed as floats: their time reads
    back as a float of the same value, which verifies."""
    data = {"agent": "a", "tool": "t", "old": None, "new": "Always"}
    digest = chain_hash(None, stream="tools:a.t", n=1, type="t", at=1000, seq=None, data=data)
    line = {"id": 1, "stream": "tools:a.t", "n": 1, "type": "t", "at": 1000.0, "seq": None}
    line |= {"data": data, "prev": None, "hash": digest}
    assert so.verify_audit_export([json.dumps(line)]) == []
    forged = line | {"at": 1001.0}
    assert [p.reason for p in so.verify_audit_export([json.dumps(forged)])] == [
        "content does not match"
    ]


async def test_runtimes_opening_at_once_record_a_tool_setting_once(store_url: str) -> None:
    runtimes = [so.Runtime([agent()], store=store_url) for _ in range(3)]
    try:
        await asyncio.gather(*(rt.open() for rt in runtimes))
        history = await runtimes[0].audit(stream="tools:support.wipe")
        assert [(e.n, e.data["old"], e.data["new"]) for e in history] == [
            (1, None, "Always [expires in 60 s]")
        ]
        assert await runtimes[0].verify_audit() == []
    finally:
        for rt in runtimes:
            await rt.close()


async def test_an_entry_expecting_its_stream_elsewhere_is_skipped(store_url: str) -> None:
    def row(after: int | None, new: str) -> AuditRow:
        return AuditRow(
            stream="tools:a.t", type="t", at=1.0, seq=None, data={"new": new}, after=after
        )

    async with so.Runtime([], store=store_url) as rt:
        store = rt.store
        await store.record_audit([row(0, "A")])
        await store.record_audit([row(0, "B")])  # recorded from the same empty stream: skipped
        await store.record_audit([row(1, "C"), row(None, "D")])
        entries = await store.audit(stream="tools:a.t")
        assert [(e.n, e.data["new"]) for e in entries] == [(1, "A"), (2, "C"), (3, "D")]
        assert await rt.verify_audit() == []


async def test_export_to_a_utf8_file_keeps_text_no_encoding_can_hold(tmp_path: Path) -> None:
    """Recorded data may hold a lone surrogate (a model's text): the export still writes every
    entry to a UTF-8 file, that one escaped as JSON allows."""
    a = scripted_agent(
        "support", [call_tools(call("wipe", disk="sd\ud800a")), reply("ok")], tools=[wipe]
    )
    async with so.Runtime([a], store=f"sqlite:///{tmp_path}/a.db") as rt:
        r = await rt.generate("support", prompt="wipe")
        assert r.pending
        out = tmp_path / "trail.jsonl"
        with out.open("w", encoding="utf-8") as f:
            count = await rt.export_audit(f)
        listed = await rt.audit()
    text = out.read_text(encoding="utf-8")
    assert count == len(listed) == len(text.splitlines())
    assert [json.loads(line) for line in text.splitlines()] == [e.to_dict() for e in listed]
    assert "\\ud800" in text


@pytest.mark.parametrize(
    ("prev", "n", "at", "seq", "data"),
    [
        (None, 1, 1.5, None, {}),
        ("ab" * 32, 12, 1700000000.123456, None, {"new": "Never", "old": None}),
        ("00" * 32, 999, 0.1, 7, {"z": [1, {"b": 2, "a": "é\u2028"}], "a": {"n": 3}}),
        (None, 2, -0.0, None, {"at": "x", "seq": 1, "n": "\ud800"}),
        (None, 3, 1_700_000_000, None, {}),  # a clock's whole seconds, as int
    ],
)
def test_chain_parts_hash_as_chain_hash_does(
    prev: str | None, n: int, at: float, seq: int | None, data: dict[str, object]
) -> None:
    """A store chaining an entry itself (PostgreSQL's `record_audit`, in SQL) hashes the
    previous hash, a newline and the parts around the entry's number: the same as `chain_hash`."""
    before, behind = chain_parts(stream="tools:a.t", type="t", at=at, seq=seq, data=data)
    ours = hashlib.sha256(f"{prev or ''}\n".encode() + before + str(n).encode() + behind)
    theirs = chain_hash(prev, stream="tools:a.t", n=n, type="t", at=at, seq=seq, data=data)
    assert ours.hexdigest() == theirs


async def test_a_call_an_auto_review_cleared_has_its_verdict_and_reason_in_the_trail(
    store_url: str,
) -> None:
    """A call `so.auto()` let run without a person: the trail says the review cleared it, and
    why, as a request's entry says why a review asked a person."""
    reason = 'A small refund of an existing charge. </td>\n"\u2028'
    review = so.models.Scripted(
        [so.ModelResponse(text=json.dumps({"verdict": "clear", "reason": reason}))]
    )

    @so.tool(approval=so.auto(review))
    async def refund_charge(charge_id: str) -> str:
        """Refund a charge."""
        return "refunded"

    a = scripted_agent(
        "billing",
        [call_tools(call("refund_charge", charge_id="ch_1")), reply("done")],
        tools=[refund_charge],
    )
    async with so.Runtime([a], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund ch_1")
        assert r.status == "completed"
        [started] = [e for e in await rt.audit(r.session_id) if e.type == "tool.started"]
        assert (started.data["auto_verdict"], started.data["auto_reason"]) == ("clear", reason)
        assert await rt.verify_audit() == []


async def test_a_clearing_reviews_reason_of_megabytes_is_cut_in_the_trail(tmp_path: Path) -> None:
    """The review's reason is stored no longer than a policy's reason the model reads: an
    eighth of the call's result bound."""
    long = "fine " * 1000
    review = so.models.Scripted(
        [so.ModelResponse(text=json.dumps({"verdict": "clear", "reason": long}))]
    )

    @so.tool(approval=so.auto(review), max_result_bytes=800)
    async def refund_charge(charge_id: str) -> str:
        """Refund a charge."""
        return "refunded"

    a = scripted_agent(
        "billing",
        [call_tools(call("refund_charge", charge_id="ch_1")), reply("done")],
        tools=[refund_charge],
    )
    async with so.Runtime([a], store=f"sqlite:///{tmp_path}/a.db") as rt:
        r = await rt.generate("billing", prompt="refund ch_1")
        [started] = [e for e in await rt.audit(r.session_id) if e.type == "tool.started"]
        assert started.data["auto_reason"] == long.strip()[:100] + " [cut]"


async def test_a_policys_reason_for_running_a_call_that_then_failed_is_in_the_trail(
    store_url: str,
) -> None:
    """`so.Approved(reason)` is a policy's decision: the trail keeps its reason also when the
    call then fails, whose result (where the model reads the reason) does not hold it."""

    def small(ctx: so.ApprovalContext) -> so.Approved:
        return so.Approved("refunds under 100 need no person")

    @so.tool(approval=small)
    async def refund_charge(charge_id: str) -> str:
        """Refund a charge."""
        raise RuntimeError("the payment provider is down")

    a = scripted_agent(
        "billing",
        [call_tools(call("refund_charge", charge_id="ch_1")), reply("done")],
        tools=[refund_charge],
    )
    async with so.Runtime([a], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund ch_1")
        trail = await rt.audit(r.session_id)
        [started] = [e for e in trail if e.type == "tool.started"]
        [ended] = [e for e in trail if e.type == "tool.completed"]
        assert ended.data["status"] == "error"
        assert started.data["policy_reason"] == "refunds under 100 need no person"
        assert await rt.verify_audit() == []


async def test_a_trail_cut_at_its_limit_says_so(store_url: str) -> None:
    """`rt.audit()` stopped at its limit (10,000 by default) and returned a list like any
    other: a caller read a cut trail as the whole. The list now says whether entries followed
    (`truncated`), on either store, for a session and across all, and when `limit` is 0."""
    clock = ManualClock()
    async with so.Runtime([agent()], store=store_url, clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        whole = await rt.audit(sid)
        assert len(whole) > 3 and whole.truncated is False
        cut = await rt.audit(sid, limit=3)
        assert cut == whole[:3] and cut.truncated is True
        exact = await rt.audit(sid, limit=len(whole))
        assert exact == whole and exact.truncated is False
        assert (await rt.audit(sid, limit=0)).truncated is True
        assert (await rt.audit("tools:none.none", limit=0)).truncated is False
        everything = await rt.audit()
        assert everything.truncated is False
        assert (await rt.audit(limit=len(everything) - 1)).truncated is True
        assert rt.audit_sync(sid, limit=1).truncated is True


async def test_telling_a_trail_was_cut_reads_no_page_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry past the limit, read to tell whether one follows, comes with the last page:
    a limit of whole pages reads as many pages as it did before it was told."""
    from signoff import _audit_trail

    clock = ManualClock()
    async with so.Runtime([agent()], store=f"sqlite:///{tmp_path}/a.db", clock=clock) as rt:
        sid = await run_scenario(rt, clock)
        monkeypatch.setattr(_audit_trail, "PAGE", 2)
        reads: list[int] = []
        read = rt.store.audit

        async def counted(**kwargs: Any) -> Any:
            reads.append(kwargs["limit"])
            return await read(**kwargs)

        monkeypatch.setattr(rt.store, "audit", counted)
        for limit, pages in ((2, 1), (4, 2), (5, 3)):
            reads.clear()
            cut = await rt.audit(sid, limit=limit)
            assert len(cut) == limit and cut.truncated is True
            assert len(reads) == pages, (limit, reads)
