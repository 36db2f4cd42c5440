"""The clients' idempotency keys: a message that got no answer is sent once more with its key,
a refused one is not, and a repeated key acts once against a real server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import AsyncClient, Client

from ._client import Canned, canned, dropped, error, http

__all__ = ["canned"]  # the fixture, used by name


MESSAGES = "/v1/sessions/ses_x/messages"


TURN = json.dumps(
    {
        "session_id": "ses_x",
        "status": "completed",
        "turn_id": "trn_1",
        "text": "ok",
        "pending": [],
        "outcomes": [],
        "error": None,
        "retryable": False,
        "replayed": True,
    }
)


async def test_a_message_left_in_the_queue_reads_queued(canned: Canned) -> None:
    """The server's `queued` (a message that waits for the turn's end) reaches the result."""
    canned.on(MESSAGES, http("200 OK", json.dumps({**json.loads(TURN), "queued": True})))
    async with AsyncClient(canned.base) as c:
        result = await c.send("ses_x", "hello")
    assert result.queued


async def test_a_message_that_got_no_answer_is_sent_once_more_with_its_key(
    canned: Canned,
) -> None:
    canned.on(MESSAGES, dropped, http("200 OK", TURN))
    async with AsyncClient(canned.base) as c:
        result = await c.send("ses_x", "hello")
    assert result.replayed and result.text == "ok" and not result.queued
    keys = [h.get("idempotency-key") for _, h in canned.seen]
    assert len(keys) == 2 and keys[0] == keys[1] and keys[0]
    # each call has a key of its own
    canned.on(MESSAGES, http("200 OK", TURN))
    async with AsyncClient(canned.base) as c:
        await c.send("ses_x", "hello")
        await c.send("ses_x", "hello", idempotency_key="mine-1")
    assert canned.seen[2][1]["idempotency-key"] not in keys
    assert canned.seen[3][1]["idempotency-key"] == "mine-1"


async def test_a_new_empty_session_that_got_no_answer_is_opened_once_with_its_key(
    canned: Canned,
) -> None:
    """`generate(agent)` with no prompt opens an empty session: the server honours a key there
    too, so a call that got no answer is sent once more with one, not opened anew."""
    idle = {**json.loads(TURN), "status": "idle", "turn_id": None, "text": ""}
    canned.on("/v1/sessions", dropped, http("201 Created", json.dumps(idle)))
    async with AsyncClient(canned.base) as c:
        result = await c.generate("support")
        assert result.replayed and result.status == "idle"
        keys = [h.get("idempotency-key") for _, h in canned.seen]
        assert len(keys) == 2 and keys[0] == keys[1] and keys[0]
        canned.on("/v1/sessions", dropped, dropped)
        with pytest.raises(so.RemoteError, match="call again with it") as caught:
            await c.generate("support", idempotency_key="o-1")
    assert caught.value.idempotency_key == "o-1"
    assert [h["idempotency-key"] for _, h in canned.seen[2:]] == ["o-1", "o-1"]


async def test_a_message_that_got_no_answer_twice_names_its_key(canned: Canned) -> None:
    canned.on("/v1/sessions", dropped)
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.RemoteError, match="call again with it") as caught:
            await c.generate("support", "hello", idempotency_key="k-7")
    assert (caught.value.code, caught.value.status) == ("connection_lost", 0)
    assert caught.value.idempotency_key == "k-7"
    assert [h["idempotency-key"] for _, h in canned.seen] == ["k-7", "k-7"]


@pytest.mark.parametrize("first", [httpx.ReadTimeout, httpx.RemoteProtocolError])
async def test_a_message_maybe_applied_then_not_sent_again_still_names_its_key(
    first: type[httpx.TransportError],
) -> None:
    """The first send got no answer (it may have been applied) and the second found the server
    gone (a restart): the error said "the call was not sent" and gave no key, so a caller
    sending again under a new key could have the message delivered twice."""
    sent: list[str | None] = []

    def failing(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers.get("idempotency-key"))
        if len(sent) == 1:
            raise first("no answer", request=request)
        raise httpx.ConnectError("refused", request=request)

    async with AsyncClient("http://signoff.test", transport=httpx.MockTransport(failing)) as c:
        with pytest.raises(so.RemoteError, match="call again with it") as caught:
            await c.send("ses_x", "hello")
    assert len(sent) == 2 and sent[0] == sent[1] and sent[0]
    assert caught.value.idempotency_key == sent[0]
    assert caught.value.code in ("timeout", "connection_lost") and caught.value.status == 0
    assert "may or may not have been applied" in str(caught.value)


async def test_a_refused_message_is_not_sent_again(canned: Canned) -> None:
    canned.on(MESSAGES, error("409 Conflict", "session_busy", session_id="ses_x"))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.SessionBusy):
            await c.send("ses_x", "hello")
        for bad in ("", "é", "x" * 201, " k", "k "):  # no header carries spaces around a value
            with pytest.raises(so.UsageError, match="idempotency_key"):
                await c.send("ses_x", "hello", idempotency_key=bad)
        with pytest.raises(so.UsageError, match="goes with a prompt"):
            await c.generate(session_id="ses_x", approvals=[], idempotency_key="k")
    assert len(canned.seen) == 1


async def test_a_key_repeated_against_a_real_server_acts_once(tmp_path: Path) -> None:
    from signoff.server import TokenAuth, create_app

    from .test_server_common import TOKENS, make_runtime

    rt = make_runtime(f"sqlite:///{tmp_path}/state.db")
    app = create_app(rt, auth=TokenAuth(TOKENS), sweep_every=None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with AsyncClient("http://t", token="alice-token", transport=transport) as c:
            one = await c.generate("support", "Refund order 1042", idempotency_key="k-1")
            two = await c.generate("support", "Refund order 1042", idempotency_key="k-1")
            assert not one.replayed and two.replayed and two.session_id == one.session_id
            with pytest.raises(so.IdempotencyKeyReused) as caught:
                await c.generate("support", "Refund order 9", idempotency_key="k-1")
            assert caught.value.session_id == one.session_id
            sent = await c.send(one.session_id, "never mind", idempotency_key="m-1")
            again = await c.send(one.session_id, "never mind", idempotency_key="m-1")
            assert not sent.replayed and again.replayed
            opened = await c.generate("support", idempotency_key="o-1")
            reopened = await c.generate("support", idempotency_key="o-1")
            assert not opened.replayed and reopened.replayed and opened.status == "idle"
            assert reopened.session_id == opened.session_id
            # A prompt to a session, repeated once its turn waits: that turn, not a refusal
            # (the client read the session first, and raised PartialAnswer for its own turn).
            asked = await c.generate(
                session_id=opened.session_id, prompt="Refund", idempotency_key="g-1"
            )
            asked_again = await c.generate(
                session_id=opened.session_id, prompt="Refund", idempotency_key="g-1"
            )
            assert asked.status == "waiting" and not asked.replayed
            assert asked_again.replayed and asked_again.turn_id == asked.turn_id
        assert len(await rt.sessions()) == 2
        messages = [
            e.data["message"]
            async for e in rt.events(one.session_id, follow=False)
            if e.type in ("turn.started", "turn.message")
        ]
        assert messages == ["Refund order 1042", "never mind"]


async def test_a_key_repeated_after_a_later_message_answers_with_its_own_turn(
    tmp_path: Path,
) -> None:
    from signoff.server import TokenAuth, create_app

    from .test_server_common import TOKENS, make_runtime

    rt = make_runtime(f"sqlite:///{tmp_path}/state.db")
    app = create_app(rt, auth=TokenAuth(TOKENS), sweep_every=None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with AsyncClient("http://t", token="alice-token", transport=transport) as c:
            one = await c.generate("support", "Refund order 1042", idempotency_key="k-1")
            assert one.status == "waiting"
            await c.respond(
                one.session_id,
                [{"request_id": one.pending[0].id, "option_id": "approve"}],
            )
            later = await c.send(one.session_id, "and order 7?", idempotency_key="m-1")
            assert later.turn_id != one.turn_id
            again = await c.generate("support", "Refund order 1042", idempotency_key="k-1")
            assert again.replayed and again.turn_id == one.turn_id
            assert again.status == "completed" and again.text.startswith("tool ok: ")
            assert again.pending == []


@pytest.mark.parametrize("status", ["502 Bad Gateway", "504 Gateway Timeout"])
async def test_a_message_a_proxy_got_no_answer_for_is_sent_once_more_with_its_key(
    canned: Canned, status: str
) -> None:
    """A proxy in front of the server answers 502/504 with its own page when the server died
    mid-call or took longer than the proxy waits (nginx: 60 s): the message may have been
    delivered, as after a timeout, so it is sent once more under its key, and if the proxy
    says the same again the error carries the key; it was a bare `http_error` without one,
    and a caller sending again under a new key could have it delivered twice."""
    page = http(status, "<html>the upstream did not answer</html>", "text/html")
    canned.on(MESSAGES, page, http("200 OK", TURN))
    async with AsyncClient(canned.base) as c:
        result = await c.send("ses_x", "hello")
    assert result.replayed
    keys = [h.get("idempotency-key") for _, h in canned.seen]
    assert len(keys) == 2 and keys[0] == keys[1] and keys[0]
    canned.seen.clear()
    canned.on("/v1/sessions", page)
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.RemoteError, match="call again with it") as caught:
            await c.generate("support", "hello", idempotency_key="k-8")
    assert caught.value.idempotency_key == "k-8"
    assert (caught.value.code, caught.value.status) == ("http_error", int(status[:3]))
    assert [h["idempotency-key"] for _, h in canned.seen] == ["k-8", "k-8"]


async def test_a_message_the_server_refused_as_busy_is_not_sent_again(canned: Canned) -> None:
    """A 503 of the server's own (`store_busy`: nothing was written) is its answer: raised as
    its class, not sent again."""
    canned.on(MESSAGES, error("503 Service Unavailable", "store_busy", extra="Retry-After: 1\r\n"))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.StoreBusy):
            await c.send("ses_x", "hello")
    assert len(canned.seen) == 1


@pytest.mark.parametrize(
    ("then", "raised"),
    [
        (error("503 Service Unavailable", "store_busy", extra="Retry-After: 1\r\n"), so.StoreBusy),
        (error("503 Service Unavailable", "store_unavailable"), so.StoreUnavailable),
        (error("409 Conflict", "session_busy", session_id="ses_x"), so.SessionBusy),
        (error("500 Internal Server Error", "internal_error"), so.RemoteError),
    ],
)
async def test_a_message_maybe_applied_then_refused_carries_its_key(
    canned: Canned, then: bytes, raised: type[so.SignoffError]
) -> None:
    """The first send got no answer (it may have been applied) and the second was refused for a
    while (`store_busy`: "repeat the call as it was"): the refusal was raised without the key,
    so a caller repeating the call under a new key could have the message delivered twice."""
    canned.on(MESSAGES, dropped, then)
    async with AsyncClient(canned.base) as c:
        with pytest.raises(raised) as caught:
            await c.send("ses_x", "hello")
    keys = [h.get("idempotency-key") for _, h in canned.seen]
    assert len(keys) == 2 and keys[0] == keys[1] and keys[0]
    assert caught.value.idempotency_key == keys[0]
    assert any("may have been applied" in note for note in caught.value.__notes__)


@pytest.mark.parametrize(
    "reply",
    [
        http("500 Internal Server Error", "Internal Server Error", "text/plain"),
        error("503 Service Unavailable", "store_error"),
    ],
)
async def test_a_message_failing_on_the_server_carries_its_key(
    canned: Canned, reply: bytes
) -> None:
    """A bare 500 (a server stopping mid-call) or a store failing mid-turn says nothing of
    whether the message was recorded: the error carries the key to call again with safely."""
    canned.on("/v1/sessions", reply)
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.SignoffError) as caught:
            await c.generate("support", "hello", idempotency_key="k-9")
    assert caught.value.idempotency_key == "k-9"
    assert [h["idempotency-key"] for _, h in canned.seen] == ["k-9"]


@pytest.mark.parametrize(
    ("path", "call"),
    [
        (MESSAGES, lambda c: c.send("ses_x", "hello")),
        ("/v1/sessions", lambda c: c.generate("support", "hello")),
    ],
    ids=["send", "generate"],
)
async def test_a_blocking_call_cut_short_by_close_from_another_thread_carries_its_key(
    canned: Canned, path: str, call: Any
) -> None:
    """`Client.close()` from another thread while a message waits for its answer: the loop was
    stopped under the call, still unwinding, and its error was a `UsageError` without the key
    the server got the message under (an `AsyncClient` closed so keeps it)."""
    arrived = asyncio.Event()

    async def silent(writer: asyncio.StreamWriter) -> None:
        arrived.set()
        await canned.done.wait()

    canned.on(path, silent)
    client = Client(canned.base, timeout=30)
    calling = asyncio.create_task(asyncio.to_thread(call, client))
    await asyncio.wait_for(arrived.wait(), 10)
    await asyncio.to_thread(client.close)
    with pytest.raises(so.SignoffError) as caught:
        await asyncio.wait_for(calling, 30)
    ((_, headers),) = canned.seen
    assert caught.value.idempotency_key == headers["idempotency-key"]
