"""How stores pack JSON documents: short ones stay text, long ones deflate with a dictionary,
and anything else read back is a named StoreError."""

from __future__ import annotations

import random
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import signoff as so
from signoff._events import EVENT_TYPES
from signoff.stores import Commit, Store
from signoff.stores._codec import (
    CHAIN_MAX,
    EventTexts,
    PerSession,
    Tails,
    event_text,
    needs_previous,
    pack,
    pack_bytes,
    pack_event,
    stored_type,
    type_name,
    unpack,
    unpack_event,
    unpack_text,
)
from signoff.testing import call, call_tools, reply, scripted_agent

from ._procs import query
from .conftest import make_store

PROSE = " ".join(["the parcel arrived damaged and the customer asks for a refund"] * 8)


@pytest.mark.parametrize(
    "value",
    [
        {},
        {"text": "", "tool_calls": [], "usage": {"input_tokens": 0}},
        {"message": PROSE, "nested": [{"a": 1.5, "b": None, "c": ["é", "日本", "🙂"]}]},
        [PROSE, PROSE],
        "a plain string",
        12345,
    ],
)
def test_round_trip_text_and_binary(value: Any) -> None:
    for stored in (pack(value), pack_bytes(value), memoryview(pack_bytes(value))):
        assert unpack(stored) == value


def test_short_documents_stay_readable_text_and_long_ones_shrink() -> None:
    assert pack({"on": "input"}) == '{"on":"input"}'
    long = {"message": PROSE, "principal": None, "source": "message"}
    packed = pack(long)
    assert isinstance(packed, bytes) and packed[0] == 1
    assert len(packed) < len(unpack_text(packed).encode()) / 2
    # JSON text stored before packing existed (or as bytes) still reads back
    assert unpack('{"a": 1}') == {"a": 1} and unpack(b'{"a": 1}') == {"a": 1}


def test_short_documents_pack_only_when_that_is_smaller() -> None:
    assert pack({"a": 1}) == '{"a":1}'  # under the threshold: text
    incompressible = {"k": "q7Zx9Lw2Vb8Nc4Rt6Yp1Gh3Jm5Sd0Fk"}
    assert pack(incompressible) == '{"k":"q7Zx9Lw2Vb8Nc4Rt6Yp1Gh3Jm5Sd0Fk"}'  # would not shrink
    # made of the dictionary's phrases, a resolution of 80 bytes packs into a quarter
    resolution = {"outcome": "approved", "decision": "approve", "reason": "ok", "value": None}
    resolution["by"] = None
    packed = pack(resolution)
    assert isinstance(packed, bytes) and len(packed) < 20 and unpack(packed) == resolution


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        (b"", "empty"),
        (b"\x07abc", "unknown format 7"),
        (b"\x01not deflate at all", "corrupt"),
        (b"\xff\xfe{}", "not UTF-8"),
        ("{not json", "not JSON"),
        (pack_bytes({"message": PROSE})[:40], "corrupt"),
        (pack_bytes({"message": PROSE}) + b"tail", "corrupt"),
    ],
)
def test_damaged_documents_raise_store_error(stored: str | bytes, message: str) -> None:
    with pytest.raises(so.StoreError, match=message):
        unpack(stored)


@pytest.mark.parametrize(
    "text",
    [
        '{"call_id":"t1","index":3,"result":[1.5,null,"\u00e9"]}',
        ' {"a":1}',
        '{"a":1}\n',
        "\t[1, 2]\r\n",
        '{"a":1} x',
        '{"a":1}{"b":2}',
        "\ufeff{}",
        "NaN",
        "",
        "   ",
        '"unterminated',
    ],
)
def test_stored_json_reads_as_json_loads_reads_it(text: str) -> None:
    """`loads` takes a shorter way for text that is nothing but a value; what it accepts, what
    it refuses and what it makes of either is still `json.loads`'s."""
    import json

    from signoff._events import loads

    try:
        expected: Any = ("value", json.loads(text))
    except ValueError as exc:
        expected = ("refused", type(exc), str(exc))
    try:
        got: Any = ("value", loads(text))
    except ValueError as exc:
        got = ("refused", type(exc), str(exc))
    assert repr(got) == repr(expected)


@pytest.mark.parametrize("stored", [5, 2.5, None, ["a"]])
def test_a_stored_value_that_is_neither_text_nor_bytes_is_a_store_error(stored: Any) -> None:
    """SQLite keeps whatever a hand edit puts in a column (`UPDATE events SET data=5`): such a
    value is named as unreadable, not a TypeError from indexing it."""
    assert not needs_previous(stored)
    for read in (unpack, unpack_event, lambda s: EventTexts(lambda seq: []).value(1, s)):
        with pytest.raises(so.StoreError, match="neither text nor bytes"):
            read(stored)


@pytest.mark.parametrize(
    "odd",
    [
        "bytes \udcff and \ud800 alone " * 8,
        # The two halves of a pair, each a lone surrogate (a streamed reply split between them):
        # stored as JSON escapes, they read back as the one character the pair would encode.
        "half \ud83d\ude00 of a pair " * 8,
    ],
)
async def test_lone_surrogates_from_tools_and_models_are_stored_exactly(
    store_url: str, odd: str
) -> None:
    """A tool result or model text holding a lone surrogate (text decoded with surrogateescape,
    a `\\ud800` escape in a model's JSON) is recorded, read back and audited unchanged."""

    @so.tool(approval=so.always())
    async def decode(blob: str) -> str:
        """Decode a blob."""
        return blob + odd

    agent = scripted_agent("a", [call_tools(call("decode", blob=odd)), reply(odd)], tools=[decode])
    async with so.Runtime([agent], store=store_url) as rt:
        parked = await rt.generate("a", prompt="decode it")
        assert parked.pending[0].action is not None
        assert parked.pending[0].action.input == {"blob": odd}
        done = await rt.generate(
            session_id=parked.session_id,
            approvals=[so.Decision(id=parked.pending[0].id, approved=True)],
        )
        assert done.status == "completed" and done.text == odd
        events = [e async for e in rt.events(parked.session_id, follow=False)]
        result = next(e.data["result"] for e in events if e.type == "tool.completed")
        assert result == odd + odd
        assert await rt.verify_audit() == []


# Any code point, a surrogate too: Hypothesis's text() leaves those out, even when asked.
ODD_TEXT = st.lists(
    st.one_of(st.characters(), st.characters(categories=["Cs"]), st.sampled_from('\x00"\\')),
    max_size=120,
).map("".join)


@given(
    parts=st.lists(ODD_TEXT, min_size=1, max_size=5),
    repeat=st.sampled_from(["", PROSE[:40], PROSE]),
)
@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_any_text_reads_back_exactly_alone_or_stored_on_the_event_before(
    parts: list[str], repeat: str
) -> None:
    """Whatever the text (NUL, quotes, lone surrogates side by side, long runs each event
    repeats), a document and a run of events stored on each other read back as written."""
    values = [{"text": part, "repeat": repeat, "i": i} for i, part in enumerate(parts)]
    stored: list[str | bytes] = []
    previous = None
    for value in values:
        assert unpack(pack(value)) == value and unpack(pack_bytes(value)) == value
        packed, previous = pack_event(value, previous)
        stored.append(packed)
    for i, packed in enumerate(stored):
        earlier = [stored[i - j] if i >= j else None for j in range(1, CHAIN_MAX + 1)]
        assert unpack_event(packed, *earlier) == values[i]


def test_every_event_type_has_a_one_letter_code_that_reads_back() -> None:
    codes = {stored_type(name) for name in EVENT_TYPES}
    assert len(codes) == len(EVENT_TYPES)
    assert all(len(code) == 1 and "." not in code for code in codes)
    for name in EVENT_TYPES:
        assert type_name(stored_type(name)) == name
    # a type this signoff has no code for is kept as its name, and read back as it
    assert stored_type("tool.future_thing") == "tool.future_thing"
    assert type_name("tool.future_thing") == "tool.future_thing"


@pytest.mark.parametrize("stored", ["z", "", 7, None, b"a"])
def test_an_unknown_type_code_is_a_store_error(stored: object) -> None:
    with pytest.raises(so.StoreError, match="type"):
        type_name(stored)


# -- events kept on the event before them ---------------------------------------------------------

BIG_INPUT = {"path": "notes.txt", "text": PROSE + " and a second paragraph " + PROSE[::-1]}
PROPOSED = {"text": "", "tool_calls": [{"id": "call_1", "name": "write", "input": BIG_INPUT}]}
REQUESTED = {"requests": [{"kind": "tool-approval", "id": "req_1", "input": BIG_INPUT}]}


def test_an_event_repeating_the_one_before_stores_only_what_is_new() -> None:
    first, after_first = pack_event(PROPOSED, None)
    assert after_first == (unpack_text(first), 0)  # stands alone: reading it needs nothing
    second, after_second = pack_event(REQUESTED, after_first)
    assert needs_previous(second) and after_second is not None and after_second[1] == 1
    assert len(second) < len(pack(REQUESTED)) / 3
    assert unpack_event(second, first) == REQUESTED
    with pytest.raises(so.StoreError, match="missing"):
        unpack(second)
    with pytest.raises(so.StoreError, match="missing"):
        unpack_event(second, None)


def test_a_small_saving_keeps_an_event_standalone() -> None:
    _, after = pack_event({"request_id": "req_1", "outcome": "approved"}, None)
    stored, _ = pack_event({"request_id": "req_1", "outcome": "approved", "by": None}, after)
    assert not needs_previous(stored)


def test_reading_an_event_never_needs_more_than_chain_max_others() -> None:
    values = [{"n": i, "input": BIG_INPUT} for i in range(CHAIN_MAX + 3)]
    stored: list[str | bytes] = []
    previous = None
    for value in values:
        packed, previous = pack_event(value, previous)
        stored.append(packed)
    # stored on the one before until the chain is full, then one stands alone again
    needs = [needs_previous(s) for s in stored]
    assert needs == [False, *[True] * CHAIN_MAX, False, True]
    for i, packed in enumerate(stored):
        earlier = [stored[j] if j >= 0 else None for j in range(i - 1, i - 1 - CHAIN_MAX, -1)]
        assert unpack_event(packed, *earlier) == values[i]
    with pytest.raises(so.StoreError, match=f"need more than {CHAIN_MAX}"):
        event_text(stored[2], [stored[1], stored[2]])  # a forged chain of three


def test_event_texts_fetch_only_what_a_run_does_not_hold() -> None:
    values = [PROPOSED, REQUESTED, {"on": "input"}, PROPOSED, REQUESTED]
    stored: list[str | bytes] = []
    previous = None
    for value in values:
        packed, previous = pack_event(value, previous)
        stored.append(packed)
    fetched: list[int] = []

    def fetch(seq: int) -> list[str | bytes | None]:
        fetched.append(seq)
        return [stored[seq - i] if seq - i >= 0 else None for i in range(1, CHAIN_MAX + 1)]

    for start in range(len(values)):
        fetched.clear()
        texts = EventTexts(fetch)
        assert [texts.value(i, stored[i]) for i in range(start, len(values))] == values[start:]
        assert fetched == ([start] if needs_previous(stored[start]) else [])


def test_a_text_too_long_to_be_a_dictionary_is_not_handed_on() -> None:
    """Stores keep what the last event gives for many sessions: never a long text."""
    long = {"text": " ".join(f"word{i}" for i in range(4000))}
    stored, after = pack_event(long, None)
    assert after is None and unpack_event(stored) == long
    stored, after = pack_event(REQUESTED, (unpack_text(pack(long)), 0))
    assert not needs_previous(stored) and after is not None


def test_tails_answer_only_for_the_head_they_saw_and_keep_the_most_recent() -> None:
    tails: Tails[tuple[str, int] | None] = Tails(keep=2)
    tails.put("a", 5, ("text a", 0))
    assert tails.knows("a", 5) and tails.get("a", 5) == ("text a", 0)
    assert not tails.knows("a", 6) and tails.get("a", 6) is None  # someone else wrote since
    tails.put("b", 3, None)  # known to give nothing (an audited event, a long text)
    assert tails.knows("b", 3) and tails.get("b", 3) is None
    tails.put("a", 7, ("text a2", 1))  # a is now the most recent
    tails.put("c", 1, ("text c", 0))  # over `keep`: the least recent (b) goes
    assert not tails.knows("b", 3) and tails.get("a", 7) == ("text a2", 1)
    assert tails.knows("c", 1)
    tails.forget("a", past=7)  # a head read at 7: kept
    tails.forget("c", past=0)  # a head read below 1: the store lost it, so forgotten
    assert tails.knows("a", 7) and not tails.knows("c", 1)
    tails.forget("a")
    assert not tails.knows("a", 7)


def test_the_stored_format_keeps_chains_of_at_most_two() -> None:
    """Schema 3 fixed how far back an event may be stored (`EARLIER_JOIN` joins two rows): a
    signoff that stored longer chains would write files the others of its schema cannot read."""
    assert CHAIN_MAX == 2
    previous = None
    needs = []
    for i in range(7):
        packed, previous = pack_event({"n": i, "input": BIG_INPUT}, previous)
        needs.append(needs_previous(packed))
    assert needs == [False, True, True, False, True, True, False]


def test_event_texts_read_a_run_with_gaps_from_the_rows_before_each() -> None:
    """A run filtered by type skips rows: an event stored on one it skipped inflates from that
    one, fetched, not from the event read just before it."""
    values = [{"on": "input", "note": PROSE}, PROPOSED, REQUESTED]
    stored: list[str | bytes] = []
    previous = None
    for value in values:
        packed, previous = pack_event(value, previous)
        stored.append(packed)
    assert needs_previous(stored[2]) and not needs_previous(stored[0])
    fetched: list[int] = []

    def fetch(seq: int) -> list[str | bytes | None]:
        fetched.append(seq)
        return [stored[seq - i] if seq - i >= 0 else None for i in range(1, CHAIN_MAX + 1)]

    texts = EventTexts(fetch)
    assert [texts.value(0, stored[0]), texts.value(2, stored[2])] == [values[0], values[2]]
    assert fetched == [2]


async def test_events_read_by_type_inflate_from_the_rows_they_skip(store: Store) -> None:
    """`read_events(types=...)` skips the event a request is stored on; it still reads back."""
    sid = "ses_codec_types"
    created = so.Event(session_id=sid, seq=1, type="session.created", at=1.0, data={"n": PROSE})
    proposed = so.Event(session_id=sid, seq=2, type="model.completed", at=2.0, data=PROPOSED)
    asked = so.Event(session_id=sid, seq=3, type="input.requested", at=3.0, data=REQUESTED)
    await store.create_session(sid, "a", [created, proposed, asked], None)
    read = await store.read_events(sid, types=["session.created", "input.requested"])
    assert [(e.seq, e.data) for e in read] == [(1, created.data), (3, REQUESTED)]
    assert [e.data for e in await store.read_events(sid)] == [created.data, PROPOSED, REQUESTED]


def test_what_a_store_remembers_per_session_is_bounded() -> None:
    """A process serving for weeks forgets what it kept of each session past `keep` of them."""
    remembered: PerSession[int] = PerSession()
    remembered.keep = 3
    for i in range(3):
        remembered[f"ses_{i}"] = i
    remembered["ses_0"] = 10  # one it knows: nothing is forgotten
    assert remembered == {"ses_0": 10, "ses_1": 1, "ses_2": 2}
    remembered["ses_3"] = 3
    assert remembered == {"ses_3": 3}


def test_type_codes_are_the_ones_files_already_hold() -> None:
    """Codes are forever: a file written by any signoff since schema 3 holds these letters, so
    a code moved to another type would read its rows as the wrong event."""
    written = dict(
        zip(sorted(EVENT_TYPES), (stored_type(t) for t in sorted(EVENT_TYPES)), strict=True)
    )
    assert written == {
        "approval.candidate": "j",
        "approval.settled": "k",
        "input.requested": "h",
        "input.repeated": "v",  # new, likewise
        "input.resolved": "l",
        "model.completed": "d",
        "model.paused": "s",  # new: an older signoff refuses its rows as of a newer one
        "model.spent": "u",  # new, likewise
        "session.created": "a",
        "session.waiting": "q",
        "subagent.spent": "r",
        "tool.completed": "g",
        "tool.started": "e",
        "tool.step": "f",
        "turn.cancelled": "p",
        "turn.completed": "m",
        "turn.failed": "n",
        "turn.message": "c",
        "turn.resumed": "o",
        "turn.started": "b",
        "turn.waiting": "i",
    }
    assert all(type_name(code) == name for name, code in written.items())


async def test_no_event_is_stored_on_an_audited_one(store_url: str) -> None:
    """An audited event altered in the log is named at its entry alone: the event after it,
    however much it repeats it, is never stored on it, on either store, in the same commit or
    in a later one by a store that reads the head back."""
    sid = "ses_codec_audited"
    asked, answered = "input.requested", "model.completed"
    events = [so.Event(session_id=sid, seq=1, type="session.created", at=1.0, data={})] + [
        so.Event(session_id=sid, seq=seq, type=t, at=float(seq), data=REQUESTED)  # type: ignore[arg-type]
        for seq, t in enumerate([asked, answered, asked, answered, answered], 2)
    ]
    for batch in (events[:4], events[4:]):  # a store opened anew for each: nothing at hand
        store = make_store(store_url)
        await store.open()
        try:
            if batch[0].seq == 1:
                await store.create_session(sid, "a", batch, None)
            else:
                await store.commit(Commit(session_id=sid, expected_seq=4, events=batch))
            read = await store.read_events(sid)
            assert [e.data for e in read] == [e.data for e in events[: batch[-1].seq]]
        finally:
            await store.close()
    rows = query(
        store_url,
        "SELECT e.seq, e.data FROM {t}events e JOIN {t}sessions s ON s.sk = e.sk "
        "WHERE s.id = {p} ORDER BY e.seq",
        sid,
    )
    stored = {seq: bytes(data) if isinstance(data, memoryview) else data for seq, data in rows}
    # 3 and 5 repeat the audited 2 and 4 in full (5 written by a store that read 4 back);
    # the audited 4 may be stored on 3, and 6 is stored on 5
    needs = [needs_previous(stored[seq]) for seq in range(2, 7)]
    assert needs == [False, False, True, False, True]


def prose(seed: int) -> dict[str, Any]:
    """Event data of 100 random six-letter words: as long as any other seed's."""
    r = random.Random(seed)
    return {"text": " ".join("".join(r.choices(string.ascii_lowercase, k=6)) for _ in range(100))}


def stored_rows(store_url: str, sid: str) -> dict[int, Any]:
    rows = query(
        store_url,
        "SELECT e.seq, e.data FROM {t}events e JOIN {t}sessions s ON s.sk = e.sk "
        "WHERE s.id = {p} ORDER BY e.seq",
        sid,
    )
    return {seq: bytes(data) if isinstance(data, memoryview) else data for seq, data in rows}


@pytest.mark.parametrize("lost", [1, 2])
async def test_no_event_is_stored_on_a_head_the_store_lost_and_another_wrote_again(
    store_url: str, lost: int
) -> None:
    """A store keeps the text of the last event it wrote, to store the next on it. The store may
    lose that commit while the process runs on, and another process write those seqs again with
    other data: a PostgreSQL crash losing commits made with `synchronous_commit=off`, a backup
    restored in place. The loss is made here by hand (the rows deleted, the session row put back
    as it was), as either leaves it. The first store's next event, repeating what it wrote, then
    reads back as written; with two lost, the other's head row is byte for byte the first's
    (it repeats the event before it, which differs), so the rows below the head are checked too."""
    sid = f"ses_codec_lost_{lost}"
    first, other, reader = make_store(store_url), make_store(store_url), make_store(store_url)
    for s in (first, other, reader):
        await s.open()
    try:
        created = so.Event(session_id=sid, seq=1, type="session.created", at=1.0, data={})
        await first.create_session(sid, "a", [created], None)
        kept = query(
            store_url,
            "SELECT head, status, updated_at, expires_at, audit_n, audit_hash "
            "FROM {t}sessions WHERE id = {p}",
            sid,
        )[0]

        def run(seed: int) -> list[so.Event]:  # each event repeats the one before it
            data: list[dict[str, Any]] = [prose(seed), {"input": prose(seed)}][:lost]
            return [
                so.Event(session_id=sid, seq=2 + i, type="turn.started", at=2.0 + i, data=d)
                for i, d in enumerate(data)
            ]

        mine, theirs = run(1), run(2)
        await first.commit(Commit(session_id=sid, expected_seq=1, events=mine))
        written = stored_rows(store_url, sid)
        query(
            store_url,
            "DELETE FROM {t}events WHERE seq > 1 AND sk = "
            "(SELECT sk FROM {t}sessions WHERE id = {p}) RETURNING seq",
            sid,
        )
        query(
            store_url,
            "UPDATE {t}sessions SET head = {p}, status = {p}, updated_at = {p}, "
            "expires_at = {p}, audit_n = {p}, audit_hash = {p} WHERE id = {p} RETURNING id",
            *kept,
            sid,
        )
        await other.commit(Commit(session_id=sid, expected_seq=1, events=theirs))
        rewritten = stored_rows(store_url, sid)
        assert (written[lost + 1] == rewritten[lost + 1]) is (lost == 2)
        head = lost + 1
        again = [
            so.Event(session_id=sid, seq=head + i, type="turn.started", at=9.0 + i, data=d)
            for i, d in enumerate([{"again": mine[-1].data}, {"more": mine[-1].data}], 1)
        ]
        await first.commit(Commit(session_id=sid, expected_seq=head, events=again[:1]))
        await first.commit(Commit(session_id=sid, expected_seq=head + 1, events=again[1:]))
        assert [e.data for e in await reader.read_events(sid)] == [
            e.data for e in [created, *theirs, *again]
        ]
        stored = stored_rows(store_url, sid)
        # stored alone, as the head is not what it wrote; the next one, on what it just wrote
        assert not needs_previous(stored[head + 1]) and needs_previous(stored[head + 2])
    finally:
        for s in (first, other, reader):
            await s.close()


@pytest.mark.parametrize("kept", [1, 2])
async def test_no_event_is_stored_in_the_turn_of_a_head_the_store_lost_and_another_wrote_again(
    store_url: str, kept: int
) -> None:
    """A row names its turn only where it changes, so a store keeps the turn at the head it
    wrote. The file lost the first store's events past seq `kept` (a backup restored in place,
    made by hand here as in the test above) and another store wrote those seqs again, in
    another turn; the first store's next event, in its own turn, read back in the other's (its
    row named none, the kept turn being its own). SQLite trusted its copy at the same head."""
    sid = f"ses_codec_named_{kept}"
    first, other, reader = make_store(store_url), make_store(store_url), make_store(store_url)
    for s in (first, other, reader):
        await s.open()

    def said(seq: int, turn: str) -> so.Event:
        data = {"message": f"{turn} {seq}"}
        return so.Event(
            session_id=sid, seq=seq, type="turn.message", at=float(seq), turn_id=turn, data=data
        )

    try:
        created = so.Event(session_id=sid, seq=1, type="session.created", at=1.0, data={})
        await first.create_session(sid, "a", [created], None)
        mine = [said(seq, "trn_a") for seq in range(2, 4)]
        if kept > 1:
            await first.commit(Commit(session_id=sid, expected_seq=1, events=mine[: kept - 1]))
        lost = query(
            store_url,
            "SELECT head, status, updated_at, expires_at, audit_n, audit_hash "
            "FROM {t}sessions WHERE id = {p}",
            sid,
        )[0]
        await first.commit(Commit(session_id=sid, expected_seq=kept, events=mine[kept - 1 :]))
        query(
            store_url,
            "DELETE FROM {t}events WHERE seq > {p} AND sk = "
            "(SELECT sk FROM {t}sessions WHERE id = {p}) RETURNING seq",
            kept,
            sid,
        )
        query(
            store_url,
            "UPDATE {t}sessions SET head = {p}, status = {p}, updated_at = {p}, "
            "expires_at = {p}, audit_n = {p}, audit_hash = {p} WHERE id = {p} RETURNING id",
            *lost,
            sid,
        )
        theirs = [said(seq, "trn_b") for seq in range(kept + 1, 4)]
        await other.commit(Commit(session_id=sid, expected_seq=kept, events=theirs))
        again = [said(4, "trn_a"), said(5, "trn_a")]
        for event in again:
            await first.commit(Commit(session_id=sid, expected_seq=event.seq - 1, events=[event]))
        found = [(e.seq, e.turn_id) for e in await reader.read_events(sid)]
        assert found == [(1, None), *[(e.seq, e.turn_id) for e in mine[: kept - 1]]] + [
            (e.seq, e.turn_id) for e in [*theirs, *again]
        ]
    finally:
        for s in (first, other, reader):
            await s.close()
