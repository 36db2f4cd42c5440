"""`model.paused`: a part of a reply the provider paused, journaled as it arrives. The fold
counts what it cost at once and keeps it for a resumed drive until the reply's
`model.completed`; snapshots keep it (and older ones, which have none, load); a damaged one
is refused by name or makes the reply start over, never a crash; and nobody is shown it as a
message. The crash tests are in test_models_anthropic_pause_crash.py."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._paused_parts import paused_parts as _parts
from signoff._state import fold
from signoff.cli._events import _summary as cli_line
from signoff.models import ModelRequest, PausedPart
from signoff.server._trace_summary import summary as trace_line
from signoff.testing import sqlite_runtime

from .test_docs_events import rows

SEARCH = {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search", "input": {}}


def _paused(
    seq: int, text: str, tokens: tuple[int, int], read: int = 2, model: str = "claude-haiku-4-5"
) -> so.Event:
    data = {
        "model": f"anthropic:{model}",
        "data": {"content": [{"type": "text", "text": text}, SEARCH]},
        "usage": {"input_tokens": tokens[0], "output_tokens": tokens[1], "cost_usd": 0.001},
        "read_through": read,
    }
    return _event(seq, "model.paused", data)


def _event(seq: int, type_: str, data: dict[str, Any]) -> so.Event:
    turn = None if type_ == "session.created" else "trn_1"
    return so.Event(session_id="ses_1", seq=seq, type=type_, at=float(seq), turn_id=turn, data=data)  # type: ignore[arg-type]


def _log() -> list[so.Event]:
    return [
        _event(1, "session.created", {"agent": "a"}),
        _event(2, "turn.started", {"message": "policy?"}),
        _paused(3, "Searching. ", (100, 20)),
        _paused(4, "Reading. ", (101, 21)),
    ]


def _completed(seq: int) -> so.Event:
    usage = {"input_tokens": 150, "output_tokens": 30, "cost_usd": 0.002}
    return _event(seq, "model.completed", {"text": "Searching. Reading. Done.", "usage": usage})


def test_a_paused_part_is_counted_at_once_and_kept_until_the_reply() -> None:
    state = fold(_log())
    assert state.turn is not None
    assert (state.usage.input_tokens, state.usage.output_tokens) == (201, 41)
    assert state.usage.cost_usd == pytest.approx(0.002)
    assert [p["data"]["content"][0]["text"] for p in state.turn.paused] == [
        "Searching. ",
        "Reading. ",
    ]
    assert state.model_responses == 0 and state.turn.steps == 0  # not a response
    assert state.turn.text == "" and state.messages == [so.UserMessage(text="policy?")]
    parts = _parts(state.turn)
    assert [p.usage.output_tokens for p in parts] == [20, 21]
    state.apply(_completed(5))
    assert state.turn.paused == ()
    assert (state.usage.input_tokens, state.usage.output_tokens) == (351, 71)
    assert state.turn.text == "Searching. Reading. Done."
    assert [type(m).__name__ for m in state.messages or []] == ["UserMessage", "AssistantMessage"]


def test_a_snapshot_mid_pause_keeps_the_parts_and_an_older_one_has_none() -> None:
    state = fold(_log())
    snap = state.to_snapshot()
    assert len(snap["turn"]["paused"]) == 2
    again = so.SessionState.from_snapshot(snap)
    assert again.to_snapshot() == snap and again.turn == state.turn
    assert state.copy().turn == state.turn
    # A snapshot as signoff wrote it before `model.paused` (none, and no key) loads as none.
    del snap["turn"]["paused"]
    older = so.SessionState.from_snapshot(snap)
    assert older.turn is not None and older.turn.paused == ()
    assert "paused" not in older.to_snapshot()["turn"]
    assert "paused" not in fold(_log()[:2]).to_snapshot()["turn"]  # none, none written


@pytest.mark.parametrize("junk", [None, 5, "x", [1], [[]], {"a": 1}])
def test_a_damaged_snapshot_of_parts_is_refused_by_name(junk: Any) -> None:
    snap = fold(_log()).to_snapshot()
    snap["turn"]["paused"] = junk
    with pytest.raises(so.StoreError, match="snapshot is malformed"):
        so.SessionState.from_snapshot(snap)


def _damaged(value: Any) -> list[Any]:
    """`value` damaged every way one field can be: each key deleted or set to junk."""
    out: list[Any] = []
    if isinstance(value, dict):
        for k in value:
            gone = dict(value)
            del gone[k]
            out.append(gone)
            junks: list[Any] = [None, -1, "x", [], {}, 1.5]
            for junk in junks:
                out.append({**value, k: junk})
            out.extend({**value, k: d} for d in _damaged(value[k]))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.append(value[:i] + value[i + 1 :])
            out.extend([*value[:i], d, *value[i + 1 :]] for d in _damaged(v))
    return out


def test_a_damaged_part_folds_or_is_refused_by_name_and_then_starts_over() -> None:
    """Every way of damaging one field of a journaled part: the fold takes it or refuses the
    log with `StoreError`; what it takes, `Anthropic` continues from only if it is whole (else
    the reply starts over, asking again for what the damaged part said)."""
    log = _log()
    whole = _parts(fold(log).turn)  # type: ignore[arg-type]
    claude = so.models.Anthropic("claude-haiku-4-5", api_key="unused")
    assert claude._resumed(whole) == list(whole)
    for data in _damaged(log[3].data):
        damaged = [*log[:3], _event(4, "model.paused", copy.deepcopy(data))]
        try:
            state = fold(damaged)
        except so.StoreError:
            continue
        assert state.turn is not None
        parts = _parts(state.turn)
        # One renamed for another model is gone on from alone, as the start of a new reply.
        assert parts == () or len(parts) == 2 or parts[0].model != whole[0].model
        resumed = claude._resumed(parts)
        assert resumed in ([], list(parts))
        for part in resumed:
            content = part.data["content"]
            assert content and all(isinstance(b, dict) and "type" in b for b in content)


def test_a_message_since_the_parts_makes_the_reply_start_over() -> None:
    """The model read the conversation up to seq 2; a message said after it must be read."""
    state = fold([*_log(), _event(5, "turn.message", {"message": "and shipping?"})])
    assert state.turn is not None and len(state.turn.paused) == 2
    assert _parts(state.turn) == ()


def test_parts_journaled_after_the_reply_started_over_are_gone_on_from() -> None:
    """A message came after the first part, so the next drive started over and journaled one
    read after it: that one is gone on from, not the stale part, and never nothing again."""
    message = _event(4, "turn.message", {"message": "and shipping?"})
    state = fold([*_log()[:3], message, _paused(5, "Again. ", (102, 22), read=4)])
    assert state.turn is not None and len(state.turn.paused) == 2
    assert [p.data["content"][0]["text"] for p in _parts(state.turn)] == ["Again. "]
    state.apply(_paused(6, "More. ", (103, 23), read=5))  # a drive that went on from it
    assert [p.data["content"][0]["text"] for p in _parts(state.turn)] == ["Again. ", "More. "]
    state.apply(_event(7, "turn.message", {"message": "in euros"}))
    assert _parts(state.turn) == ()


def test_a_failure_that_starts_over_drops_the_parts_and_the_retrys_are_gone_on_from() -> None:
    """A `turn.failed` saying `start_over` (Anthropic's ninth pause) drops the parts, counted
    still, so its retry asks afresh, and the parts the retry journals are gone on from alone;
    another failure keeps them. Before, the parts stayed and every retry failed on them."""
    error = {"code": "model_error", "message": "paused its turn 9 times"}
    kept = fold([*_log(), _event(5, "turn.failed", {"error": error, "retryable": True})])
    assert kept.turn is not None and len(_parts(kept.turn)) == 2
    data = {"error": error, "retryable": True, "start_over": True}
    state = fold([*_log(), _event(5, "turn.failed", data)])
    assert state.turn is not None and state.turn.paused == () and _parts(state.turn) == ()
    assert state.usage == kept.usage and state.turn.retryable
    state.apply(_event(6, "turn.resumed", {}))
    state.apply(_paused(7, "Again. ", (102, 22), read=6))
    assert [p.data["content"][0]["text"] for p in _parts(state.turn)] == ["Again. "]
    again = so.SessionState.from_snapshot(state.to_snapshot())  # as a resumed process loads it
    assert again.turn is not None and _parts(again.turn) == _parts(state.turn)


def test_parts_after_another_models_are_gone_on_from_alone() -> None:
    """The agent's model changed, so the reply started over with the new one's parts: those
    are gone on from, and the old model's are given to nobody (nor mixed with them)."""
    log = [*_log(), _paused(5, "Sonnet. ", (104, 24), model="claude-sonnet-4-5")]
    parts = _parts(fold(log).turn)  # type: ignore[arg-type]
    assert [p.model for p in parts] == ["anthropic:claude-sonnet-4-5"]
    assert so.models.Anthropic("claude-haiku-4-5", api_key="unused")._resumed(parts) == []
    sonnet = so.models.Anthropic("claude-sonnet-4-5", api_key="unused")
    assert sonnet._resumed(parts) == list(parts)


async def test_a_drive_after_a_message_mid_reply_goes_on_from_the_parts_read_after_it(
    tmp_path: Path,
) -> None:
    """A message arrives after the first drive's part, so the second drive starts over; its
    part is the one the third drive goes on from. Before, the stale first part made every
    later drive start over, asking (and paying) again for what was journaled after it."""
    given: list[list[str]] = []
    steered, released = asyncio.Event(), asyncio.Event()

    class Pausing:
        async def complete(self, request: ModelRequest) -> so.ModelResponse:
            given.append([p.data["part"] for p in request.paused])
            if len(given) == 3:
                return so.ModelResponse(text="done", usage=so.Usage(output_tokens=1))
            part = {"part": f"P{len(given)}"}
            assert request.on_pause is not None
            await request.on_pause(
                PausedPart(model="m", data=part, usage=so.Usage(output_tokens=9))
            )
            if len(given) == 1:
                steered.set()
                await released.wait()
            raise so.ModelError("HTTP 500 on the continuation")

    async with sqlite_runtime(tmp_path, so.Agent(name="a", model=Pausing())) as rt:
        sid = await rt.create_session("a")
        first = asyncio.create_task(rt.generate(session_id=sid, prompt="search"))
        await steered.wait()
        await rt.send(sid, "and 2025")
        released.set()
        assert (await first).status == "failed"
        assert (await rt.generate(session_id=sid)).status == "failed"
        r = await rt.generate(session_id=sid)
        usage = (await rt.state(sid)).usage
    assert (r.status, r.text) == ("completed", "done")
    assert given == [[], [], ["P2"]]
    assert usage.output_tokens == 19  # each part counted once


def test_a_paused_part_is_never_shown_as_a_message() -> None:
    """The CLI's `signoff events` line and the dashboard's trace row say a reply paused and
    what it cost, never its text: the reply's `model.completed` shows it once, whole."""
    event = _paused(3, "Searching the web. ", (100, 20))
    line = cli_line(event)
    assert "Searching" not in line and "100 in, 20 out" in line
    row = "".join(text for text, _ in trace_line(event, {}))
    assert "Searching" not in row and "120 tokens" in row


def test_the_event_page_names_every_field_of_a_paused_part() -> None:
    row = rows()["model.paused"]
    for key in _paused(3, "x", (1, 1)).data:
        assert f"`{key}`" in row, key
