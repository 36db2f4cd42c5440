"""A snapshot whose call keeps its journal, or what is kept beside it (`since`, `journaled`,
`keyed`, `kids`), in a form signoff never writes (a hand edit, a half-restored backup) is a
`StoreError` naming the session when it is read, on either store: before, it loaded, and the
damage surfaced later as a bare TypeError out of `respond` (a journal read back from event
"x"), or was recorded as the tool's own failure (`string indices must be integers`), which the
model then read and the turn completed on. Nothing is written and no step runs again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import signoff as so
from signoff._events import Event
from signoff._exceptions import StoreError
from signoff._state import fold
from signoff.stores._codec import pack_bytes
from signoff.testing import call, call_tools, reply, scripted_agent

from .test_store_edited_rows import edit, session_rows


def workflow(ran: list[str]) -> so.Agent:
    """A tool that steps twice (each step noted in `ran` when it really runs), then asks."""

    @so.tool
    async def tally(ctx: so.ToolContext) -> list[Any]:
        """Step twice, then ask."""

        async def note(name: str) -> str:
            ran.append(name)
            return name

        first = await ctx.step("first", note, "first")
        second = await ctx.step("second", note, "second")
        answer = await ctx.ask("Proceed?", options=["yes", "no"])
        return [first, second, answer.option_id]

    return scripted_agent("wf", [call_tools(call("tally")), reply("done")], tools=[tally])


def _without_journal(**fields: Any) -> Callable[[dict[str, Any]], None]:
    def damage(c: dict[str, Any]) -> None:
        c.pop("journal", None)  # left out, as a snapshot taken while the call steps leaves it
        c.update(fields)

    return damage


def _journal(value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda c: c.update(journal=value)


DAMAGES: dict[str, Callable[[dict[str, Any]], None]] = {
    "since text": _without_journal(since="x"),
    "since null": _without_journal(since=None),
    "since negative": _without_journal(since=-1),
    "since a fraction": _without_journal(since=2.5),
    "since true": _without_journal(since=True),
    "journaled text": _without_journal(journaled="no"),
    "keyed a number": _without_journal(keyed=1),
    "kids a list": _without_journal(kids=[1]),
    "kids text": _without_journal(kids="ab"),
    "a kid a number": _without_journal(kids={"n0": 5}),
    "a kid's key unknown": _without_journal(kids={"zz": "ses_1"}),
    "journal text": _journal("abc"),
    "journal an object": _journal({"a": 1}),
    "journal entries numbers": _journal([1, 2]),
    "an entry without name": _journal([{"kind": "step", "result": 1}]),
    "an entry of another kind": _journal([{"kind": "wait", "name": "first", "result": 1}]),
    "a step without result": _journal([{"kind": "step", "name": "first"}]),
    "an ask without request": _journal([{"kind": "ask", "name": "Proceed?"}]),
    "an occurrence text": _journal([{"kind": "step", "name": "first", "result": 1, "n": "0"}]),
    # A step's failure is replayed from its error (`raise_recorded`): text, a number or a list
    # there was an AttributeError in the body, recorded as the tool's own failure.
    "a step's error text": lambda c: c["journal"][0].update(error="boom"),
    "a step's error a list": lambda c: c["journal"][0].update(error=["boom"]),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
async def test_a_damaged_call_in_a_snapshot_is_a_store_error_and_nothing_runs(
    store_url: str, damage: str
) -> None:
    ran: list[str] = []
    async with so.Runtime([workflow(ran)], store=store_url) as rt:
        parked = await rt.generate("wf", prompt="go")
        assert parked.status == "waiting" and ran == ["first", "second"]
        sid = parked.session_id
        snapshot = (await rt.state(sid)).to_snapshot(journals=True)
    [c] = snapshot["turn"]["calls"]
    assert len(c["journal"]) == 3  # the two steps and the question, as the fold keeps them
    DAMAGES[damage](c)
    edit(
        store_url,
        "INSERT INTO {t}snapshots (sk, seq, data) SELECT sk, {p}, {p} FROM {t}sessions "
        "WHERE id = {p} ON CONFLICT (sk) DO UPDATE SET seq = excluded.seq, "
        "data = excluded.data",
        snapshot["seq"],
        pack_bytes(snapshot),
        sid,
    )
    before = session_rows(store_url, sid)
    answer = so.InputResponse(request_id=parked.pending[0].id, option_id="yes")
    async with so.Runtime([workflow(ran)], store=store_url) as rt:
        for attempt in (lambda: rt.state(sid), lambda: rt.respond(sid, [answer])):
            with pytest.raises(StoreError, match=f"session '{sid}'") as info:
                await attempt()
            assert type(info.value) is StoreError, info.value
    assert session_rows(store_url, sid) == before
    assert ran == ["first", "second"]


async def test_an_undamaged_snapshot_written_the_same_way_resumes(store_url: str) -> None:
    """The control: the same snapshot written back as it was loads, and the turn goes on from
    its journal (no step runs again)."""
    ran: list[str] = []
    async with so.Runtime([workflow(ran)], store=store_url) as rt:
        parked = await rt.generate("wf", prompt="go")
        sid = parked.session_id
        snapshot = (await rt.state(sid)).to_snapshot(journals=True)
    edit(
        store_url,
        "INSERT INTO {t}snapshots (sk, seq, data) SELECT sk, {p}, {p} FROM {t}sessions "
        "WHERE id = {p} ON CONFLICT (sk) DO UPDATE SET seq = excluded.seq, "
        "data = excluded.data",
        snapshot["seq"],
        pack_bytes(snapshot),
        sid,
    )
    answer = so.InputResponse(request_id=parked.pending[0].id, option_id="yes")
    async with so.Runtime([workflow(ran)], store=store_url) as rt:
        done = await rt.respond(sid, [answer])
    assert done.status == "completed"
    assert ran == ["first", "second"]


SPENT: dict[str, Callable[[dict[str, Any]], None]] = {
    "last input negative": lambda s: s.update(last_input_tokens=-1_000_000),
    "last input a fraction": lambda s: s.update(last_input_tokens=2.5),
    "last input true": lambda s: s.update(last_input_tokens=True),
    "usage negative": lambda s: s["usage"].update(output_tokens=-500),
    "cost negative": lambda s: s["usage"].update(cost_usd=-1.0),
    "usage text": lambda s: s["usage"].update(input_tokens="12"),
    "delegated negative": lambda s: s.update(
        delegated={"input_tokens": 0, "output_tokens": -9, "cost_usd": 0.0}
    ),
}


@pytest.mark.parametrize("damage", list(SPENT))
async def test_a_snapshot_whose_spend_gives_budget_back_is_a_store_error(
    store_url: str, damage: str
) -> None:
    """What the session spent, as a snapshot keeps it, is never negative, a fraction of a token
    or text: read, a negative count would give the session's budgets back (a reply capped past
    `Limits`, as a model's negative usage would, which is refused)."""
    ran: list[str] = []
    async with so.Runtime([workflow(ran)], store=store_url) as rt:
        parked = await rt.generate("wf", prompt="go")
        sid = parked.session_id
        snapshot = (await rt.state(sid)).to_snapshot(journals=True)
    SPENT[damage](snapshot)
    edit(
        store_url,
        "INSERT INTO {t}snapshots (sk, seq, data) SELECT sk, {p}, {p} FROM {t}sessions "
        "WHERE id = {p} ON CONFLICT (sk) DO UPDATE SET seq = excluded.seq, "
        "data = excluded.data",
        snapshot["seq"],
        pack_bytes(snapshot),
        sid,
    )
    before = session_rows(store_url, sid)
    answer = so.InputResponse(request_id=parked.pending[0].id, option_id="yes")
    async with so.Runtime([workflow(ran)], store=store_url) as rt:
        for attempt in (lambda: rt.state(sid), lambda: rt.respond(sid, [answer])):
            with pytest.raises(StoreError, match=f"session '{sid}'") as info:
                await attempt()
            assert type(info.value) is StoreError, info.value
    assert session_rows(store_url, sid) == before


@pytest.mark.parametrize(
    ("kind", "field"),
    [
        ("model.completed", "usage"),
        ("input.requested", "usage"),
        ("tool.started", "usage"),
        ("tool.completed", "usage"),
        ("tool.completed", "delegated"),
        ("turn.failed", "usage"),
    ],
)
async def test_an_event_whose_spend_is_negative_is_malformed(kind: str, field: str) -> None:
    """The same of the log: an event whose usage is negative (never recorded: a model's is
    refused, a review's or a child's is counted as billed) is a malformed event, not budget
    given back as the log is folded."""
    ran: list[str] = []
    async with so.Runtime([workflow(ran)]) as rt:
        parked = await rt.generate("wf", prompt="go")
        events = [e.to_dict() for e in await rt.store.read_events(parked.session_id)]
    turn_id = events[-1]["turn_id"]
    row = next((e for e in events if e["type"] == kind), None)
    if row is None:  # not in this log: one added at its end (an event of the turn)
        [made] = next(e for e in events if e["type"] == "model.completed")["data"]["tool_calls"]
        data = {"call_id": made["id"], "tool_name": "tally", "status": "ok", "result": None}
        if kind == "turn.failed":
            data = {"error": {"code": "model_error", "message": "x"}, "retryable": True}
        row = {**events[-1], "seq": len(events) + 1, "type": kind, "data": data}
        events.append(row)
    row["turn_id"] = row["turn_id"] or turn_id
    good = {"input_tokens": 1, "output_tokens": 1, "cost_usd": 0.0}
    row["data"] = {**row["data"], field: {**good, "output_tokens": -500}}
    rows = [
        {k: e[k] for k in ("session_id", "seq", "type", "at", "turn_id", "data", "v")}
        for e in events
    ]
    with pytest.raises(StoreError, match=f"\\({kind}\\) is malformed: .*negative"):
        fold([Event.from_row(**r) for r in rows])


@pytest.mark.parametrize("kept", [-1_000_000, 1.5, "12", True])
async def test_a_model_reply_whose_context_tokens_is_not_a_count_is_malformed(
    kept: object,
) -> None:
    """`context_tokens` on `model.completed` becomes what the next call holds back: one that
    is negative or not a whole count would give budget back, so the event is malformed."""
    ran: list[str] = []
    async with so.Runtime([workflow(ran)]) as rt:
        parked = await rt.generate("wf", prompt="go")
        events = [e.to_dict() for e in await rt.store.read_events(parked.session_id)]
    [row] = [e for e in events if e["type"] == "model.completed"]
    row["data"] = {**row["data"], "context_tokens": kept}
    rows = [
        {k: e[k] for k in ("session_id", "seq", "type", "at", "turn_id", "data", "v")}
        for e in events
    ]
    with pytest.raises(StoreError, match=r"\(model.completed\) is malformed: .*context_tokens"):
        fold([Event.from_row(**r) for r in rows])
    row["data"]["context_tokens"] = 7
    assert fold([Event.from_row(**r) for r in rows]).last_input_tokens == 7


def _write_snapshot(store_url: str, sid: str, snapshot: dict[str, Any]) -> None:
    edit(
        store_url,
        "INSERT INTO {t}snapshots (sk, seq, data) SELECT sk, {p}, {p} FROM {t}sessions "
        "WHERE id = {p} ON CONFLICT (sk) DO UPDATE SET seq = excluded.seq, "
        "data = excluded.data",
        snapshot["seq"],
        pack_bytes(snapshot),
        sid,
    )


def _ask_elsewhere(s: dict[str, Any]) -> None:
    s["turn"]["calls"][0]["journal"][2]["request_id"] = "req_not_in_the_snapshot"


def _question_left_out(s: dict[str, Any]) -> None:
    s["requests"] = [r for r in s["requests"] if r["request"]["source"] != "ask"]


@pytest.mark.parametrize("damage", [_ask_elsewhere, _question_left_out])
async def test_a_journaled_question_whose_request_is_not_in_the_snapshot_is_refused(
    store_url: str, damage: Callable[[dict[str, Any]], None]
) -> None:
    """The fold records a question's journal entry and its request together and keeps every
    request of the turn its calls are in, so a journal naming a request the snapshot lacks is
    damage. It loaded, and the tool was told its question was withdrawn (`QuestionWithdrawn`,
    recorded as its failure, which the model read); now it is the strict checks' `StoreError`
    naming the session and the request, on both stores, nothing written, no step run again."""
    ran: list[str] = []
    async with so.Runtime([workflow(ran)], store=store_url) as rt:
        parked = await rt.generate("wf", prompt="go")
        sid = parked.session_id
        snapshot = (await rt.state(sid)).to_snapshot(journals=True)
    damage(snapshot)
    _write_snapshot(store_url, sid, snapshot)
    before = session_rows(store_url, sid)
    answer = so.InputResponse(request_id=parked.pending[0].id, option_id="yes")
    async with so.Runtime([workflow(ran)], store=store_url) as rt:
        for attempt in (lambda: rt.state(sid), lambda: rt.respond(sid, [answer])):
            with pytest.raises(StoreError, match=f"session '{sid}'.*not in the snapshot") as info:
                await attempt()
            assert type(info.value) is StoreError, info.value
    assert session_rows(store_url, sid) == before
    assert ran == ["first", "second"]


async def test_a_question_of_an_earlier_turn_left_out_of_the_snapshot_still_loads(
    store_url: str,
) -> None:
    """The control: a question answered in an earlier turn is rightly dropped from the state
    (a new turn keeps only open requests) with that turn's calls and their journals; the next
    turn's question, parked, loads from its snapshot and its tool goes on."""
    ran: list[str] = []
    agent = scripted_agent(
        "wf",
        [
            call_tools(call("tally", call_id="c1")),
            reply("done"),
            call_tools(call("tally", call_id="c2")),
            reply("done again"),
        ],
        tools=list(workflow(ran).tools.values()),
    )
    async with so.Runtime([agent], store=store_url) as rt:
        first = await rt.generate("wf", prompt="go")
        sid, asked = first.session_id, first.pending[0].id
        answer = so.InputResponse(request_id=asked, option_id="yes")
        assert (await rt.respond(sid, [answer])).status == "completed"
        second = await rt.generate(session_id=sid, prompt="again")
        assert second.status == "waiting" and second.pending[0].id != asked
        state = await rt.state(sid)
        assert asked not in state.requests  # dropped, rightly
        _write_snapshot(store_url, sid, state.to_snapshot(journals=True))
    async with so.Runtime([agent], store=store_url) as rt:
        assert asked not in (await rt.state(sid)).requests
        answer = so.InputResponse(request_id=second.pending[0].id, option_id="no")
        done = await rt.respond(sid, [answer])
    assert (done.status, done.text) == ("completed", "done again")
    assert ran == ["first", "second"] * 2  # no step of the second call ran again
