"""Fuzzing the decoders of stored data: the store codec, `Event.from_row`, snapshots and the fold.

Whatever the bytes or JSON, decoding either succeeds or raises a named `StoreError` (of which
`SchemaVersionError` is one); a `KeyError`, `TypeError` or `ValidationError` escaping is a bug.
Besides arbitrary input, real logs and snapshots of a run are mutated one field at a time.
"""

from __future__ import annotations

import asyncio
import copy
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import signoff as so
from signoff._events import EVENT_TYPES, SCHEMA_VERSION, Event
from signoff._state import SessionState, fold
from signoff.stores._codec import (
    CHAIN_MAX,
    EventTexts,
    event_text,
    pack,
    pack_bytes,
    pack_event,
    unpack,
)

from . import _proof
from ._properties import AGENT, Runs, make_agent, prompt

FUZZ = settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
json_objects = st.dictionaries(st.text(max_size=12), json_values, max_size=6)


def decodes_or_refuses(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a decoder; only a named StoreError may come out of it."""
    try:
        return fn(*args, **kwargs)
    except so.StoreError as exc:
        assert str(exc), "a decode error needs a message"
        return exc


# -- the store codec ------------------------------------------------------------------------------


@given(raw=st.one_of(st.binary(max_size=200), st.binary(max_size=200).map(lambda b: b"\x01" + b)))
@FUZZ
def test_unpack_arbitrary_bytes(raw: bytes) -> None:
    _proof.record("hypothesis:test_unpack_arbitrary_bytes:examples")
    decodes_or_refuses(unpack, raw)
    decodes_or_refuses(unpack, memoryview(raw))


@given(text=st.text(max_size=200))
@FUZZ
def test_unpack_arbitrary_text(text: str) -> None:
    _proof.record("hypothesis:test_unpack_arbitrary_text:examples")
    decodes_or_refuses(unpack, text)


@given(value=json_values, cut=st.integers(0, 400), flip=st.integers(0, 255))
@FUZZ
def test_packed_documents_round_trip_and_damage_is_named(value: Any, cut: int, flip: int) -> None:
    _proof.record("hypothesis:test_packed_round_trip:examples")
    for stored in (pack(value), pack_bytes(value)):
        assert unpack(stored) == value
        raw = stored.encode() if isinstance(stored, str) else stored
        decodes_or_refuses(unpack, raw[: cut % (len(raw) + 1)])  # truncated
        i = cut % len(raw)
        decodes_or_refuses(unpack, raw[:i] + bytes([raw[i] ^ flip]) + raw[i + 1 :])  # a bit flip


@given(
    values=st.lists(
        st.one_of(json_objects, st.builds(lambda v, n: {"n": n, "same": v}, json_objects, scalars)),
        min_size=1,
        max_size=8,
    ),
    repeat=st.text(min_size=60, max_size=300),
)
@FUZZ
def test_events_kept_on_the_ones_before_read_back_from_any_start(
    values: list[Any], repeat: str
) -> None:
    _proof.record("hypothesis:test_events_kept_on_others:examples")
    values = [{"shared": repeat, "i": i, "v": v} if i % 2 else v for i, v in enumerate(values)]
    stored: list[str | bytes] = []
    previous = None
    for value in values:
        packed, previous = pack_event(value, previous)
        stored.append(packed)

    def fetch(seq: int) -> list[str | bytes | None]:
        return [stored[seq - i] if seq >= i else None for i in range(1, CHAIN_MAX + 1)]

    for start in range(len(values)):
        texts = EventTexts(fetch)
        assert [texts.value(i, stored[i]) for i in range(start, len(stored))] == values[start:]


@given(
    stored=st.one_of(st.binary(max_size=200).map(lambda b: b"\x02" + b), st.binary(max_size=50)),
    earlier=st.lists(
        st.one_of(st.none(), st.binary(max_size=80), st.text(max_size=40)), max_size=3
    ),
)
@FUZZ
def test_event_text_takes_anything(stored: bytes, earlier: list[Any]) -> None:
    _proof.record("hypothesis:test_event_text_arbitrary:examples")
    decodes_or_refuses(event_text, stored, earlier)


@pytest.mark.parametrize("depth", [10_000, 100_000])
def test_deeply_nested_documents_are_refused_by_name(depth: int) -> None:
    decodes_or_refuses(unpack, "[" * depth + "]" * depth)
    decodes_or_refuses(unpack, ('{"a":' * depth) + "1" + "}" * depth)


# -- events ---------------------------------------------------------------------------------------


@given(
    session_id=st.one_of(st.text(max_size=20), json_values),
    seq=st.one_of(st.integers(), json_values),
    type=st.one_of(st.sampled_from(sorted(EVENT_TYPES)), json_values),
    at=st.one_of(st.floats(), json_values),
    turn_id=st.one_of(st.none(), st.text(max_size=20), json_values),
    data=st.one_of(json_objects, json_values),
    v=st.one_of(st.integers(-2, SCHEMA_VERSION + 2), json_values),
)
@FUZZ
def test_event_from_row_takes_anything(**row: Any) -> None:
    _proof.record("hypothesis:test_event_from_row:examples")
    event = decodes_or_refuses(Event.from_row, **row)
    if isinstance(event, Event):  # what is accepted is well-formed
        assert isinstance(event.session_id, str) and isinstance(event.seq, int)
        assert event.type in EVENT_TYPES and isinstance(event.data, dict)
        assert isinstance(event.at, float | int) and math.isfinite(event.at)
        assert isinstance(event.v, int)
        assert event.turn_id is None or isinstance(event.turn_id, str)


def row(event: Event) -> dict[str, Any]:
    return {k: v for k, v in event.to_dict().items() if k != "id"}


@pytest.fixture(scope="module")
def real() -> dict[str, Any]:
    """The log and the final snapshot of real sessions: approvals, a question, a cancel."""

    async def build(directory: Path) -> dict[str, Any]:
        rt = so.Runtime([make_agent(Runs())], store=f"sqlite:///{directory}/state.db")
        try:
            done = await rt.generate(AGENT, prompt=prompt(["refund", "ship", "note"]))
            answers = [
                so.InputResponse(
                    request_id=r.id, option_id="approve" if r.kind == "tool-approval" else "exp"
                )
                for r in done.pending
            ]
            done = await rt.respond(done.session_id, answers)
            while done.pending:
                answers = [
                    so.InputResponse(
                        request_id=r.id,
                        option_id="approve" if r.kind == "tool-approval" else "exp",
                    )
                    for r in done.pending
                ]
                done = await rt.respond(done.session_id, answers)
            assert done.status == "completed", done
            waiting = await rt.generate(session_id=done.session_id, prompt=prompt(["refund"]))
            await rt.cancel(waiting.session_id)
            sid = done.session_id
            events = [e async for e in rt.events(sid, follow=False)]
            return {"events": [row(e) for e in events], "snapshot": fold(events).to_snapshot()}
        finally:
            await rt.close()

    with tempfile.TemporaryDirectory() as d:
        return asyncio.run(build(Path(d)))


def test_the_real_log_folds(real: dict[str, Any]) -> None:
    events = [Event.from_row(**r) for r in real["events"]]
    types = [e.type for e in events]
    assert {"input.requested", "approval.settled", "turn.cancelled", "tool.completed"} <= set(types)
    state = fold(events)
    again = SessionState.from_snapshot(state.to_snapshot())
    assert again.to_snapshot() == state.to_snapshot() == real["snapshot"]


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON document (dict keys and list indexes), the root excluded."""
    out: list[tuple[Any, ...]] = []
    if isinstance(value, dict | list):
        for k, v in value.items() if isinstance(value, dict) else enumerate(value):
            out.append((*prefix, k))
            out.extend(paths(v, (*prefix, k)))
    return out


def damaged(doc: Any, where: tuple[Any, ...], how: str, junk: Any) -> Any:
    doc = copy.deepcopy(doc)
    parent = doc
    for k in where[:-1]:
        parent = parent[k]
    if how == "delete":
        del parent[where[-1]]
    else:
        parent[where[-1]] = junk
    return doc


@given(data=st.data(), how=st.sampled_from(["replace", "delete"]), junk=json_values)
@FUZZ
def test_a_damaged_snapshot_loads_or_is_refused(
    real: dict[str, Any], data: Any, how: str, junk: Any
) -> None:
    _proof.record("hypothesis:test_damaged_snapshot:examples")
    snapshot = real["snapshot"]
    where = data.draw(st.sampled_from(paths(snapshot)))
    state = decodes_or_refuses(SessionState.from_snapshot, damaged(snapshot, where, how, junk))
    if isinstance(state, SessionState):
        folds_on(state)


def folds_on(state: SessionState) -> None:
    """Use a state read from a snapshot as a session's next event does: what the fold reads of
    it (its seq, times, TTL, queue) holds the types the fold gives it, so nothing escapes but a
    named StoreError (a snapshot's `seq` text was a TypeError here, its `ttl` text one in
    `expired`, a queued number one as the next turn took it)."""
    state.expired(0.0)
    for queued in state.queued:
        assert "message" in queued
    for candidate in state.candidates.values():
        assert (
            isinstance(candidate["request_id"], str) and float(candidate["at"]) == candidate["at"]
        )
    message = {"message": "and then", "queued": True}
    event = Event(
        session_id=state.id,
        seq=state.seq + 1,
        type="turn.message",
        at=state.updated_at + 1,
        data=message,
    )
    decodes_or_refuses(state.copy().apply, event)


@given(doc=st.one_of(json_objects, json_values))
@FUZZ
def test_an_arbitrary_snapshot_loads_or_is_refused(doc: Any) -> None:
    _proof.record("hypothesis:test_arbitrary_snapshot:examples")
    decodes_or_refuses(SessionState.from_snapshot, doc)


@given(data=st.data(), how=st.sampled_from(["replace", "delete"]), junk=json_values)
@FUZZ
def test_a_damaged_log_folds_or_is_refused(
    real: dict[str, Any], data: Any, how: str, junk: Any
) -> None:
    """Damage one field of one stored event: reading and folding the log fails only by name, and
    what it folds holds the types later code reads (a text `ttl` folded was a TypeError in
    `expired`, a null call id a ValidationError as its request was answered, a text error an
    AttributeError on the session's page)."""
    _proof.record("hypothesis:test_damaged_log:examples")
    log = real["events"]
    where = data.draw(st.sampled_from([p for p in paths(log) if len(p) > 1]))  # not whole rows
    if len(where) == 2:  # a column of the row: it is always there, its value may be anything
        how = "replace"
    rows = damaged(log, where, how, junk)

    def read_and_fold() -> SessionState:
        return fold([Event.from_row(**r) for r in rows])

    state = decodes_or_refuses(read_and_fold)
    if isinstance(state, SessionState):
        assert isinstance(state.agent, str) and isinstance(state.parent, str | None)
        calls = [] if state.turn is None else state.turn.calls.values()
        assert all(isinstance(c.id, str) and isinstance(c.tool_name, str) for c in calls)
        assert state.turn is None or isinstance(state.turn.error, dict | None)
        folds_on(state)


@given(
    # (type, data, turn id) per event: a list of six datas and six or more turn ids, zipped with
    # one to six types, drew data for events that were never made (half the test's time)
    events=st.lists(
        st.tuples(
            st.sampled_from(sorted(EVENT_TYPES)),
            json_objects,
            st.one_of(st.none(), st.sampled_from(["trn_1", "trn_2"])),
        ),
        min_size=1,
        max_size=6,
    ),
)
@FUZZ
def test_arbitrary_events_fold_or_are_refused(
    events: list[tuple[str, dict[str, Any], str | None]],
) -> None:
    _proof.record("hypothesis:test_arbitrary_events:examples")
    state = SessionState(id="ses_fuzz")
    for seq, (type_, data, turn_id) in enumerate(events, 1):
        event = Event.from_row(
            session_id="ses_fuzz",
            seq=seq,
            type=type_,
            at=float(seq),
            turn_id=turn_id,
            data=data,
            v=1,
        )
        if isinstance(decodes_or_refuses(state.apply, event), so.StoreError):
            return
    assert state.seq == len(events)
    assert not math.isnan(state.updated_at)
