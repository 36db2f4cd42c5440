"""A hub reading an entry the store holds damaged (a request row or an event's data as a hand
edit or a half-restored copy left it): it failed every attempt the same way, so each channel
spent its `max_attempts` on it (about two minutes) while every later entry of every session
waited, then gave it up and failed on it again every minute and at each start; the requests
beside the damaged one in its entry were never delivered. Now the damage is logged once, the
rest of the entry told and the entry passed: nothing is retried, given up on or written."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.stores._codec import pack_bytes, type_name, unpack_event

from ._channels import manual, three_refunds
from ._procs import query
from .test_channels_hub import Flaky
from .test_store_edited_rows import edit


class Everything(Flaky):
    """A channel told of every request, also one closed since (as webhooks are)."""

    live_only = False


def rewrite_events(url: str, session_id: str, change: Callable[[str, Any], Any]) -> None:
    """Write each event of a session again as `change(type, data)` gives it (bytes as stored),
    each on its own (none deflated on the one before it)."""
    rows = query(
        url,
        "SELECT e.seq, e.type, e.data FROM {t}events e JOIN {t}sessions s ON s.sk = e.sk "
        "WHERE s.id = {p} ORDER BY e.seq",
        session_id,
    )
    stored = [bytes(r[2]) if isinstance(r[2], memoryview) else r[2] for r in rows]
    for i, (seq, code, _) in enumerate(rows):
        data = change(type_name(code), unpack_event(stored[i], *reversed(stored[:i])))
        edit(
            url,
            "UPDATE {t}events SET data = {p} WHERE seq = {p} "
            "AND sk = (SELECT sk FROM {t}sessions WHERE id = {p})",
            data if isinstance(data, bytes) else pack_bytes(data),
            seq,
            session_id,
        )


def _first_request(change: Callable[[dict[str, Any]], Any]) -> Callable[[str, Any], Any]:
    """A `rewrite_events` change of the first request of the `input.requested` event."""

    def changed(kind: str, data: Any) -> Any:
        if kind != "input.requested":
            return data
        return change(data)

    return changed


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    def change(data: dict[str, Any]) -> Any:
        data["requests"][0][key] = value
        return data

    return change


_EVENT_DAMAGE = {
    "unknown-kind": _set("kind", "bogus"),
    "wrong-type": _set("created_at", "yesterday"),
    "not-an-object": lambda data: {**data, "requests": [5, *data["requests"][1:]]},
}


async def _parked(rt: so.Runtime, prompt: str) -> so.GenerateResult:
    result = await rt.generate("support", prompt=prompt)
    assert len(result.pending) == 3
    return result


def _damage_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "passes audit entry" in r.getMessage()]


async def test_a_damaged_request_row_is_passed_and_the_rest_delivered_at_once(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Its data not JSON: a live channel cannot read whether it is still open (nor could its
    answer be taken), so it is passed; the two beside it in its entry are shown, and the next
    session's requests are shown by the same poll."""
    async with so.Runtime([three_refunds([])], store=store_url) as rt:
        live, every = Flaky(0, name="live"), Everything(0, name="every")
        async with manual(ChannelHub(rt, [live, every])) as hub:
            a = await _parked(rt, "Refund A")
            bad = a.pending[0]
            edit(store_url, "UPDATE {t}requests SET data = {p} WHERE id = {p}", b"{broken", bad.id)
            b = await _parked(rt, "Refund B")
            trail = await rt.store.audit(limit=1000)
            with caplog.at_level(logging.WARNING, logger="signoff.channels"):
                assert await hub.poll() == 2
            good = [r.id for r in a.pending[1:] + b.pending]
            assert live.seen == [("requested", i) for i in good]
            # One told of every request still reads it from its entry, which is whole.
            assert every.seen == [("requested", r.id) for r in a.pending + b.pending]
            assert hub.position(live) == hub.position(every) == trail[-1].id
            [logged] = _damage_logged(caplog)
            assert "channel live passes audit entry" in logged and bad.id in logged
            assert "not JSON" in logged and a.session_id in logged
            caplog.clear()
            with caplog.at_level(logging.DEBUG, logger="signoff.channels"):
                assert await hub.poll() == 0
            assert caplog.records == []  # logged once, not at every poll
            assert hub.state.recall("hub:live", "skipped") is None  # not given up on
        assert await rt.store.audit(limit=1000) == trail  # nothing recorded


@pytest.mark.parametrize("damage", sorted(_EVENT_DAMAGE))
async def test_a_request_its_entry_holds_damaged_is_passed_and_the_rest_delivered(
    store_url: str, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An `input.requested` event edited so its first request is no request (a kind this
    signoff does not know, a field of the wrong type, not an object): every channel passes it
    and is told the others, and the next session's requests by the same poll."""
    async with so.Runtime([three_refunds([])], store=store_url) as rt:
        live, every = Flaky(0, name="live"), Everything(0, name="every")
        async with manual(ChannelHub(rt, [live, every])) as hub:
            a = await _parked(rt, "Refund A")
            rewrite_events(store_url, a.session_id, _first_request(_EVENT_DAMAGE[damage]))
            b = await _parked(rt, "Refund B")
            with caplog.at_level(logging.WARNING, logger="signoff.channels"):
                assert await hub.poll() == 2
            good = [("requested", r.id) for r in a.pending[1:] + b.pending]
            assert live.seen == every.seen == good
            logged = _damage_logged(caplog)
            assert len(logged) == 2  # once by each channel
            assert all("input.requested" in m and "cannot be read" in m for m in logged)
            if damage != "not-an-object":
                assert all(a.pending[0].id in m for m in logged)
            caplog.clear()
            with caplog.at_level(logging.DEBUG, logger="signoff.channels"):
                assert await hub.poll() == 0
            assert caplog.records == []


async def test_an_entry_whose_data_cannot_be_read_is_passed(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A close whose event does not unpack (read as no data): nothing names the request, so
    it is logged and passed; it failed with a KeyError at every attempt. The closes after it
    and the next session's requests are told by the same poll."""
    async with so.Runtime([three_refunds([])], store=store_url) as rt:
        live = Flaky(0, name="live")
        async with manual(ChannelHub(rt, [live])) as hub:
            a = await _parked(rt, "Refund A")
            await hub.poll()
            approve = [so.InputResponse(request_id=r.id, option_id="approve") for r in a.pending]
            await rt.respond(a.session_id, approve)
            first = a.pending[0].id

            def unreadable(kind: str, data: Any) -> Any:
                closes = kind == "input.resolved" and data.get("request_id") == first
                return b"\x01not deflate" if closes else data

            rewrite_events(store_url, a.session_id, unreadable)
            b = await _parked(rt, "Refund B")
            del live.seen[:]
            with caplog.at_level(logging.WARNING, logger="signoff.channels"):
                await hub.poll()
            closes = [("approved", r.id) for r in a.pending[1:]]
            assert live.seen == closes + [("requested", r.id) for r in b.pending]
            [logged] = _damage_logged(caplog)
            assert "input.resolved" in logged and "names no request" in logged


async def test_a_store_failing_as_a_whole_is_still_retried(store_url: str) -> None:
    """Only a row the store cannot read is passed: a read the store failed as a whole (its
    database down, every connection busy) is tried again, as a channel's failure is."""
    async with so.Runtime([three_refunds([])], store=store_url) as rt:
        live = Flaky(0, name="live")
        async with manual(ChannelHub(rt, [live], retry_backoff=0)) as hub:
            a = await _parked(rt, "Refund A")
            reading = rt.store.get_request
            failures = [so.StoreUnavailable("down"), so.StoreBusy("busy")]

            async def failing(request_id: str) -> Any:
                if failures:
                    raise failures.pop(0)
                return await reading(request_id)

            rt.store.get_request = failing  # type: ignore[method-assign]
            for _ in range(3):
                await hub.poll()
            assert live.seen == [("requested", r.id) for r in a.pending]


@pytest.mark.parametrize(
    "failure",
    [
        # PostgreSQL's own words for a hub's read (not made for an HTTP request, so no
        # StoreBusy): every connection in use, the server refusing, a statement cancelled.
        "PostgreSQL store db:5432/x: all 10 connections in use for 30s (a pool too small?)",
        "reading request 'req_x' failed: canceling statement due to statement timeout",
        "SQLite read /data/s.db failed: disk I/O error",
    ],
)
async def test_a_read_failing_for_a_moment_with_a_plain_store_error_is_retried(
    store_url: str, failure: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A plain `StoreError` from `get_request` (what PostgreSQL raises for the hub's reads
    when its pool is busy or a query is cancelled, what SQLite raises for an I/O error) is a
    read that failed, not damage: it was taken for a damaged row, and the request never shown."""
    async with so.Runtime([three_refunds([])], store=store_url) as rt:
        live = Flaky(0, name="live")
        async with manual(ChannelHub(rt, [live], retry_backoff=0)) as hub:
            a = await _parked(rt, "Refund A")
            reading = rt.store.get_request
            failures = [so.StoreError(failure)]

            async def failing(request_id: str) -> Any:
                if failures:
                    raise failures.pop(0)
                return await reading(request_id)

            rt.store.get_request = failing  # type: ignore[method-assign]
            with caplog.at_level(logging.WARNING, logger="signoff.channels"):
                for _ in range(3):
                    await hub.poll()
            assert failures == []
            assert live.seen == [("requested", r.id) for r in a.pending]
            assert _damage_logged(caplog) == []
            assert hub.state.recall("hub:live", "skipped") is None


async def test_a_request_row_whose_resolution_cannot_be_read_is_passed(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A closed request whose stored resolution does not unpack reads the same every time
    (`StoreDamaged`, as its request's data would): its close is passed, the others told."""
    async with so.Runtime([three_refunds([])], store=store_url) as rt:
        live = Flaky(0, name="live")
        async with manual(ChannelHub(rt, [live], retry_backoff=0)) as hub:
            a = await _parked(rt, "Refund A")
            await hub.poll()
            approve = [so.InputResponse(request_id=r.id, option_id="approve") for r in a.pending]
            await rt.respond(a.session_id, approve)
            bad = a.pending[0].id
            edit(store_url, "UPDATE {t}requests SET resolution = {p} WHERE id = {p}", b"{x", bad)
            with pytest.raises(so.StoreDamaged, match="its resolution"):
                await rt.store.get_request(bad)
            del live.seen[:]
            with caplog.at_level(logging.WARNING, logger="signoff.channels"):
                await hub.poll()
            assert live.seen == [("approved", r.id) for r in a.pending[1:]]
            [logged] = _damage_logged(caplog)
            assert "input.resolved" in logged and bad in logged


async def test_an_entry_given_up_on_and_found_damaged_is_passed_at_the_next_start(
    store_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An entry a channel gave up on (its service down), whose request row is damaged since:
    delivering it again at the next start (and every minute) failed on it for ever, the two
    beside it never shown. It is passed once, the others shown, and no longer kept."""
    state = tmp_path / "hub.db"
    async with so.Runtime([three_refunds([])], store=store_url) as rt:
        down = Flaky(1, name="live")
        async with manual(ChannelHub(rt, [down], state=state, max_attempts=1)) as hub:
            a = await _parked(rt, "Refund A")
            await hub.poll()
            assert hub.state.recall("hub:live", "skipped") is not None
        bad = a.pending[0]
        edit(store_url, "UPDATE {t}requests SET data = {p} WHERE id = {p}", b"{broken", bad.id)
        back = Flaky(0, name="live")
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            async with manual(ChannelHub(rt, [back], state=state)) as hub:
                assert back.seen == [("requested", r.id) for r in a.pending[1:]]
                assert hub.state.recall("hub:live", "skipped") is None
        [logged] = _damage_logged(caplog)
        assert bad.id in logged
