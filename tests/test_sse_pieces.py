"""What an event stream holds in hand: each read of the log is bounded (64 KiB of event JSON,
at least one event), and a large event's frame is written in bounded pieces, never built whole;
the pieces join into the same bytes as before, so the Python client and a plain SSE parse get
a large event whole and equal."""

from __future__ import annotations

import json
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import signoff as so
from signoff.server import AsyncClient, TokenAuth, create_app
from signoff.server._json_pieces import PIECE, json_pieces
from signoff.server._sse import READ_BYTES, event_stream, frame_pieces, sse

from .test_server_common import ALICE, PLAIN, TOKENS, auth, read_sse, running
from .test_sse_stream import _context, _request

BIG = "x" + "\x01" * (1 << 20)  # 1 MiB of control characters: 6 MiB of JSON once escaped

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False)
    | st.text(max_size=300),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=40), inner),
    max_leaves=40,
)


@given(value=_json, most=st.integers(min_value=64, max_value=400))
@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_json_pieces_join_into_json_dumps_and_each_is_bounded(value: Any, most: int) -> None:
    pieces = list(json_pieces(value, most))
    assert "".join(pieces) == json.dumps(value, separators=(",", ":"))
    assert all(0 < len(piece) <= most for piece in pieces)


def test_a_large_event_is_framed_in_bounded_pieces_that_join_into_its_sse_message() -> None:
    event = so.Event(
        session_id="ses_1", seq=2, type="turn.started", at=1.5, turn_id="trn_1", data={"m": BIG}
    )
    pieces = list(frame_pieces(event))
    assert "".join(pieces) == sse(event.to_dict(), event=event.type, id=event.seq)
    assert len(pieces) > 90 and max(len(piece) for piece in pieces) <= PIECE
    small = so.Event(session_id="ses_1", seq=1, type="turn.started", at=1.5, data={"m": "hi"})
    assert list(frame_pieces(small)) == [sse(small.to_dict(), event=small.type, id=small.seq)]


def _runtime(store: str) -> so.Runtime:
    reply = so.ModelResponse(text="noted")
    agent = so.Agent(name="notes", model=so.models.Scripted([reply], repeat_last=True))
    return so.Runtime([agent], store=store, poll_interval=0.05)


async def _big_session(tmp_path: Path) -> tuple[str, str, list[so.Event]]:
    """A session whose log holds a 1 MiB message of control characters among 20 small turns."""
    store = f"sqlite:///{tmp_path}/s.db"
    async with _runtime(store) as rt:
        sid = (await rt.generate("notes", "note 0", auth=ALICE)).session_id
        for prompt in [*(f"note {i}" for i in range(1, 20)), BIG, "after it"]:
            await rt.generate("notes", prompt, session_id=sid, auth=ALICE)
        return store, sid, await rt.store.read_events(sid)


@pytest.mark.parametrize("follow", [False, True])
async def test_a_stream_holds_a_bounded_read_and_writes_bounded_pieces(
    tmp_path: Path, follow: bool
) -> None:
    """Each read of the log asks for at most `READ_BYTES` (64 KiB) of event JSON, and holds no
    more than that past its first event; each message the stream yields is at most `PIECE`
    characters; and the messages parse back into the log's events, the large one whole."""
    store, sid, log = await _big_session(tmp_path)
    async with _runtime(store) as rt:
        real = rt.store.read_events
        reads: list[tuple[int | None, list[int]]] = []

        async def counted(*args: Any, **kwargs: Any) -> list[so.Event]:
            got = await real(*args, **kwargs)
            sizes = [len(json.dumps(e.data, separators=(",", ":"))) for e in got]
            reads.append((kwargs.get("max_bytes"), sizes))
            return got

        rt.store.read_events = counted  # type: ignore[method-assign]
        ctx = _context(rt, poll_interval=0.01, heartbeat=5.0)
        text, sizes = "", []
        stream = event_stream(_request(), ctx, sid, 0, follow=follow, head=log[-1].seq)
        async with aclosing(stream):  # type: ignore[type-var]
            async for message in stream:
                sizes.append(len(message))
                text += message
                if text.count("\n\n") > len(log):  # the retry line, then every event
                    break
    assert max(sizes) <= PIECE
    assert reads and all(most is not None and most <= READ_BYTES for most, _ in reads)
    assert all(sum(held[:-1]) < READ_BYTES for _, held in reads)  # the last may pass it
    events = [(m["id"], m["event"], m["data"]) for m in _parsed(text)]
    assert events == [(str(e.seq), e.type, e.to_dict()) for e in log]
    assert any(e.data.get("message") == BIG for e in log)


def _parsed(text: str) -> list[dict[str, Any]]:
    """The messages of an SSE text, parsed as `read_sse` does (comments and `retry` skipped)."""
    messages = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in fields:
            messages.append({**fields, "data": json.loads(fields["data"])})
    return messages


async def test_a_large_event_arrives_whole_through_the_client_and_a_raw_sse_read(
    tmp_path: Path,
) -> None:
    store, sid, log = await _big_session(tmp_path)
    app = create_app(_runtime(store), auth=TokenAuth(TOKENS), poll_interval=0.05)
    with running(app) as base:
        async with AsyncClient(base, token="alice-token") as c:
            got = [e async for e in c.events(sid, follow=False)]
        assert [e.to_dict() for e in got] == [e.to_dict() for e in log]
        with (
            httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as h,
            h.stream("GET", f"/v1/sessions/{sid}/events", params={"follow": "false"}) as s,
        ):
            raw = read_sse(s, timeout=60.0)
    assert [m["data"] for m in raw] == [e.to_dict() for e in log]
    assert [m["data"]["data"].get("message") for m in raw].count(BIG) == 1
