"""`AsyncClient` / `Client` against servers that misbehave: error bodies of every code, bodies
that are not what a signoff server sends, bad arguments, closed clients, and a bad call raising
the same class over HTTP as in process.

A tiny raw HTTP server on loopback (`Canned`, tests/_client.py) sends exactly the bytes a test
gives it, as a proxy or a broken server would; the real server is used where its own answers
matter.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import AsyncClient, Client

from ._client import CANCEL, EVENTS, Canned, canned, error, event, http, stream
from .test_server_common import served

__all__ = ["canned"]  # the fixture, used by name


# Every error body the server sends for a signoff error, and the class the client raises.
MAPPED: dict[str, tuple[bytes, type[so.SignoffError]]] = {
    "payload_too_large": (error("413 Payload Too Large", "payload_too_large"), so.TooLarge),
    "schema_version": (error("503 Service Unavailable", "schema_version"), so.SchemaVersionError),
    "store_gone": (error("503 Service Unavailable", "store_gone"), so.StoreGone),
    "store_error": (error("503 Service Unavailable", "store_error"), so.StoreError),
    "model_error": (error("502 Bad Gateway", "model_error"), so.ModelError),
    "unknown_agent": (error("422 Unprocessable Entity", "unknown_agent"), so.UnknownAgent),
    "invalid_request": (error("422 Unprocessable Entity", "invalid_request"), so.UsageError),
    "session_busy": (error("409 Conflict", "session_busy", session_id="ses_x"), so.SessionBusy),
}


@pytest.mark.parametrize("code", sorted(MAPPED))
async def test_each_error_code_is_its_named_class(canned: Canned, code: str) -> None:
    body, cls = MAPPED[code]
    canned.on(CANCEL, body)
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.SignoffError) as caught:
            await c.cancel("ses_x")
    assert type(caught.value) is cls, type(caught.value).__name__


def test_every_error_class_the_server_can_name_comes_back_as_itself() -> None:
    """A class added to the hierarchy with a code must not come back as a bare `RemoteError`."""
    from signoff import _exceptions
    from signoff._wire import error as _error

    for name in _exceptions.__all__:
        cls = getattr(_exceptions, name)
        if cls in (so.RemoteError, so.StepFailed) or "code" not in vars(cls):
            continue  # no code of its own to send, or never sent by a server
        got = _error({"code": cls.code, "message": "m"}, 400)
        assert type(got) is cls, name


def test_every_error_class_comes_back_with_the_attributes_it_documents() -> None:
    """A class the client rebuilds without its `__init__` must still have what its `__init__`
    sets: `ModelError.usage` (None when no reply came) was an AttributeError."""
    from signoff._wire import error as _error

    attributes: dict[type[so.SignoffError], dict[str, Any]] = {
        so.ModelError: {"usage": None},
        so.SessionExpired: {"session_id": "ses_x", "pending": ["req_1"]},
        so.UnknownRequest: {"request_ids": ["req_1"]},
        so.PartialAnswer: {"request_ids": ["req_1"]},
        so.IdempotencyKeyReused: {"session_id": "ses_x"},
        so.InvalidAnswer: {"request_ids": ["req_1"]},
        so.SessionWaiting: {"session_id": "ses_x", "request_ids": ["req_1"], "held_by": ["ses_x"]},
        so.SubagentSession: {"session_id": "ses_x", "parent_id": ""},
        so.SubagentOrphaned: {"session_id": "ses_x", "parent_id": "", "lapsed": None},
    }
    body = {"message": "m", "session_id": "ses_x", "request_ids": ["req_1"], "held_by": ["ses_x"]}
    for cls, expected in attributes.items():
        got = _error({**body, "code": cls.code}, 400)
        assert type(got) is cls
        for name, value in expected.items():
            assert getattr(got, name, "missing") == value, (cls.__name__, name)


async def test_an_invalid_request_on_an_answer_is_an_invalid_answer(canned: Canned) -> None:
    canned.on("/v1/sessions/ses_x/responses", error("422 Unprocessable Entity", "invalid_request"))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.InvalidAnswer):
            await c.respond("ses_x", [{"request_id": "req_1", "option_id": "approve"}])


async def test_retry_after_is_the_servers(canned: Canned) -> None:
    canned.on(CANCEL, error("503 Service Unavailable", "store_busy", extra="Retry-After: 7\r\n"))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.StoreBusy) as busy:
            await c.cancel("ses_x")
        assert busy.value.retry_after == 7
        canned.on(
            CANCEL,
            error("503 Service Unavailable", "store_unavailable", extra="Retry-After: x\r\n"),
        )
        with pytest.raises(so.StoreUnavailable) as down:
            await c.cancel("ses_x")
        assert down.value.retry_after == so.StoreUnavailable.retry_after  # unreadable: the hint


async def test_a_retry_after_past_what_the_client_waits_is_bounded(canned: Canned) -> None:
    """`.retry_after` is what a caller sleeps before trying again: a server (or one of another
    kind behind the same address) saying 999999999 had it wait 31 years. It is bounded as
    `events()` bounds its own waits, at 30 s."""
    hint = "Retry-After: 999999999\r\n"
    canned.on(CANCEL, error("503 Service Unavailable", "store_unavailable", extra=hint))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.StoreUnavailable) as down:
            await c.cancel("ses_x")
    assert down.value.retry_after == 30


async def test_request_ids_that_are_not_a_list_are_not_split_into_characters(
    canned: Canned,
) -> None:
    canned.on(CANCEL, error("409 Conflict", "conflicting_answer", request_ids="req_1"))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.ConflictingAnswer) as caught:
            await c.cancel("ses_x")
    assert caught.value.request_ids == []


BAD_BODIES = {
    "empty-object": "{}",
    "array": "[1]",
    "null": "null",
    "pending-not-requests": '{"session_id": "a", "status": "waiting", "pending": [{"id": 1}]}',
    "outcomes-not-a-list": '{"session_id": "a", "status": "waiting", "outcomes": 5}',
    "outcome-not-an-object": '{"session_id": "a", "status": "waiting", "outcomes": [5]}',
    "outcome-without-applied": (
        '{"session_id": "a", "status": "waiting", '
        '"outcomes": [{"request_id": "req_1", "outcome": "approved"}]}'
    ),
    "total-past-any-float": '{"items": [], "total": 1e400}',  # inf: int() overflowed, bare
    # A result holding a field of another type was returned as it came (`text` 5).
    "text-a-number": '{"session_id": "ses_x", "status": "completed", "turn_id": "t", "text": 5}',
    "turn-id-a-number": '{"session_id": "ses_x", "status": "completed", "turn_id": 7}',
    "error-a-string": '{"session_id": "ses_x", "status": "failed", "error": "boom"}',
    "retryable-a-string": '{"session_id": "ses_x", "status": "failed", "retryable": "no"}',
}

DEEP = "[" * 100_000 + "]" * 100_000
"""JSON nested deeper than Python's parser recurses: a `RecursionError`, not a `ValueError`."""


async def test_json_nested_past_the_parsers_depth_is_a_remote_error(canned: Canned) -> None:
    canned.on(CANCEL, http("200 OK", DEEP))
    canned.on(EVENTS, stream(event(1) + f"data: {DEEP}\n\n"))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.RemoteError, match="is not JSON"):
            await c.cancel("ses_x")
        seen: list[int] = []
        with pytest.raises(so.RemoteError, match="not JSON"):
            async for e in c.events("ses_x", follow=False):
                seen.append(e.seq)
    assert seen == [1]


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
async def test_a_json_body_of_the_wrong_shape_is_a_remote_error(canned: Canned, name: str) -> None:
    canned.on(CANCEL, http("200 OK", BAD_BODIES[name]))
    canned.on("/v1/sessions/ses_x", http("200 OK", "[]"))
    canned.on("/v1/requests", http("200 OK", BAD_BODIES[name]))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.RemoteError, match="not a turn's result") as raised:
            await c.cancel("ses_x")
        assert raised.value.code == "http_error"
        with pytest.raises(so.RemoteError, match="not a session"):
            await c.state("ses_x")
        with pytest.raises(so.RemoteError, match="not a page of requests"):
            await c.pending()


BAD_SESSION_PAGES = {
    "no-items": '{"total": 1}',
    "no-total": '{"items": []}',
    "item-not-an-object": '{"items": [5], "total": 1}',
    "seq-a-string": (
        '{"items": [{"id": "ses_1", "agent": "a", "status": "idle", "seq": "1", '
        '"created_at": 1, "updated_at": 1, "expires_at": null}], "total": 1}'
    ),
    "id-a-number": (
        '{"items": [{"id": 1, "agent": "a", "status": "idle", "seq": 1, '
        '"created_at": 1, "updated_at": 1, "expires_at": null}], "total": 1}'
    ),
    "no-expires-at": (
        '{"items": [{"id": "ses_1", "agent": "a", "status": "idle", "seq": 1, '
        '"created_at": 1, "updated_at": 1}], "total": 1}'
    ),
    "total-infinite": '{"items": [], "total": Infinity}',
}


@pytest.mark.parametrize("name", sorted(BAD_SESSION_PAGES))
async def test_a_page_of_sessions_of_the_wrong_shape_is_a_remote_error(
    canned: Canned, name: str
) -> None:
    canned.on("/v1/sessions", http("200 OK", BAD_SESSION_PAGES[name]))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.RemoteError, match="not a page of sessions"):
            await c.sessions()


BAD_STREAMS = {
    "not-json": "id: 1\nevent: x\ndata: {not json\n\n",
    "no-session": 'data: {"seq": 1}\n\n',
    "seq-not-a-number": 'data: {"session_id": "s", "seq": "abc", "type": "t", "at": 1}\n\n',
    "an-array": "data: [1]\n\n",
    "end-without-error": 'event: stream.end\ndata: {"nope": 1}\n\n',
    "end-of-an-array": "event: stream.end\ndata: []\n\n",
    "seq-past-any-float": 'data: {"session_id": "s", "seq": 1e400, "type": "t", "at": 1}\n\n',
    "end-status-infinite": (
        'event: stream.end\ndata: {"status": -Infinity, "error": {"code": "x", "message": "m"}}\n\n'
    ),
    # Yielded as the session's: another session's event, a seq of text, data of pairs.
    "another-sessions-event": event(2, "ses_OTHER"),
    "seq-a-string": (
        'data: {"session_id": "ses_x", "seq": "2", "type": "turn.started", "at": 1}\n\n'
    ),
    "data-not-an-object": (
        'data: {"session_id": "ses_x", "seq": 2, "type": "turn.started", "at": 1, '
        '"data": [["k", 1]]}\n\n'
    ),
    # Raised as `StoreDamaged`, as if this process's store were damaged.
    "turn-id-a-number": (
        'data: {"session_id": "ses_x", "seq": 2, "type": "turn.started", "at": 1, "turn_id": 5}\n\n'
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_STREAMS))
async def test_an_event_stream_that_is_not_signoffs_is_a_remote_error(
    canned: Canned, name: str
) -> None:
    canned.on(EVENTS, stream(event(1) + BAD_STREAMS[name]))
    async with AsyncClient(canned.base) as c:
        seen: list[int] = []
        with pytest.raises(so.RemoteError, match="event") as raised:
            async for e in c.events("ses_x", follow=False):
                seen.append(e.seq)
    assert seen == [1] and raised.value.code == "http_error"


@pytest.mark.parametrize("token", ["tök", "a\nb", "trailing ", " leading", "nul\x00", ""])
def test_a_token_no_header_can_carry_is_refused_at_once(token: str) -> None:
    """Not later, as a `UnicodeEncodeError` or an httpx protocol error from the first call."""
    if token == "":
        AsyncClient("http://127.0.0.1:9", token=token)  # no token: anonymous, as before
        return
    with pytest.raises(so.UsageError, match="token"):
        AsyncClient("http://127.0.0.1:9", token=token)
    with pytest.raises(so.UsageError, match="token"):
        Client("http://127.0.0.1:9", token=token)


async def test_a_closed_async_client_says_so(canned: Canned) -> None:
    canned.on(CANCEL, http("200 OK", '{"session_id": "ses_x", "status": "idle"}'))
    c = AsyncClient(canned.base)
    await c.aclose()
    with pytest.raises(so.UsageError, match="closed"):
        await c.cancel("ses_x")
    with pytest.raises(so.UsageError, match="closed"):
        await anext(aiter(c.events("ses_x")))
    await c.aclose()  # twice is fine
    assert canned.seen == []


def test_a_closed_sync_client_says_so() -> None:
    import threading

    c = Client("http://127.0.0.1:9")
    c.close()
    threads = threading.active_count()
    with pytest.raises(so.UsageError, match="closed"):
        c.state("ses_x")
    with pytest.raises(so.UsageError, match="closed"):
        c.events("ses_x")
    c.close()
    assert threading.active_count() == threads  # no new loop thread started for nothing


MALFORMED_ANSWERS: dict[str, Callable[[AsyncClient], Awaitable[Any]]] = {
    "responses-a-mapping": lambda c: c.respond(
        "ses_x",
        {"request_id": "req_1", "option_id": "approve"},  # type: ignore[arg-type]
    ),
    "response-id-not-text": lambda c: c.respond("ses_x", [{"request_id": 5}]),
    "responses-empty": lambda c: c.respond("ses_x", []),
    "decision-without-id": lambda c: c.generate(session_id="ses_x", approvals=[{"idx": 1}]),
    "decisions-a-string": lambda c: c.generate(session_id="ses_x", approvals="yes"),  # type: ignore[arg-type]
    "decisions-empty": lambda c: c.generate(session_id="ses_x", approvals=[]),
}


@pytest.mark.parametrize("name", sorted(MALFORMED_ANSWERS))
async def test_a_malformed_answer_is_an_invalid_answer_without_a_call(
    canned: Canned, name: str
) -> None:
    """As `Runtime.respond` / `generate(approvals=...)` raise in process, not a pydantic error."""
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.InvalidAnswer):
            await MALFORMED_ANSWERS[name](c)
    assert canned.seen == []


def test_every_call_of_the_async_client_has_its_blocking_twin() -> None:
    """Same name, parameters and docstring; the documented exceptions are listed here."""
    only_async = {"session", "aclose"}  # LiveSession is async only; `close` is the twin
    differ = {"events"}  # the blocking one returns the events so far, without following
    calls = inspect.getmembers(
        AsyncClient, lambda m: inspect.iscoroutinefunction(m) or inspect.isasyncgenfunction(m)
    )
    for name, method in calls:
        if name.startswith("_") or name in only_async:
            continue
        assert hasattr(Client, name), name
        if name not in differ:
            sync = getattr(Client, name)
            assert inspect.signature(sync) == inspect.signature(method), name
            assert inspect.getdoc(sync) == inspect.getdoc(method), name
    assert set(inspect.signature(Client.__init__).parameters) == set(
        inspect.signature(AsyncClient.__init__).parameters
    )


async def test_a_real_servers_too_large_prompt_is_too_large(tmp_path: Path) -> None:
    with served(f"sqlite:///{tmp_path}/state.db") as base:
        async with AsyncClient(base, token="alice-token") as c:
            with pytest.raises(so.TooLarge):
                await c.generate("support", "x" * (5 << 20))
            with pytest.raises(so.UsageError, match="turnPolicy"):
                r = await c.generate("support", "Refund order 1042")
                await c.send(r.session_id, "hi", turn_policy="bogus")  # type: ignore[arg-type]


async def test_a_bad_call_raises_the_same_class_over_http_as_in_process(tmp_path: Path) -> None:
    """docs/server.md: server errors come back as the in-process exception classes. Each bad
    call is made on the runtime and, through the client, on a server of that same runtime."""

    from signoff.server import TokenAuth, create_app

    from .test_server_common import ALICE, TOKENS, make_runtime

    rt = make_runtime(f"sqlite:///{tmp_path}/state.db")
    app = create_app(rt, auth=TokenAuth(TOKENS), sweep_every=None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with AsyncClient("http://t", token="alice-token", transport=transport) as c:
            one = await c.generate("support", "Refund order 1042")
            two = await c.generate("batch", "refund both")
            settled = await c.generate("support", "Refund order 1042")
            rid = settled.pending[0].id
            await c.respond(settled.session_id, [{"request_id": rid, "option_id": "approve"}])
            sid, first = two.session_id, two.pending[0].id
            approve = [{"request_id": one.pending[0].id, "option_id": "approve"}]
            calls: dict[str, tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]]] = {
                "unknown-session": (lambda: rt.state("ses_nope"), lambda: c.state("ses_nope")),
                "unknown-request": (
                    lambda: rt.respond(sid, [{"request_id": "req_nope", "option_id": "approve"}]),
                    lambda: c.respond(sid, [{"request_id": "req_nope", "option_id": "approve"}]),
                ),
                "conflicting": (
                    lambda: rt.respond(
                        settled.session_id,
                        [{"request_id": rid, "option_id": "cancel"}],
                        principal=ALICE,
                    ),
                    lambda: c.respond(
                        settled.session_id, [{"request_id": rid, "option_id": "cancel"}]
                    ),
                ),
                "partial": (
                    lambda: rt.generate(
                        session_id=sid,
                        approvals=[so.Decision(id=first, approved=True)],
                        auth=ALICE,
                    ),
                    lambda: c.generate(
                        session_id=sid, approvals=[so.Decision(id=first, approved=True)]
                    ),
                ),
                "approvals-and-a-prompt": (
                    lambda: rt.generate(
                        prompt="hi",
                        session_id=sid,
                        approvals=[so.Decision(id=first, approved=True)],
                    ),
                    lambda: c.generate(
                        prompt="hi",
                        session_id=sid,
                        approvals=[so.Decision(id=first, approved=True)],
                    ),
                ),
                "approvals-empty": (
                    lambda: rt.generate(session_id=sid, approvals=[]),
                    lambda: c.generate(session_id=sid, approvals=[]),
                ),
                "responses-empty": (lambda: rt.respond(sid, []), lambda: c.respond(sid, [])),
                "response-malformed": (
                    lambda: rt.respond(sid, [{"request_id": 5}]),
                    lambda: c.respond(sid, [{"request_id": 5}]),
                ),
                "answer-of-the-wrong-kind": (
                    lambda: rt.respond(
                        one.session_id, [{**approve[0], "option_id": "maybe"}], principal=ALICE
                    ),
                    lambda: c.respond(one.session_id, [{**approve[0], "option_id": "maybe"}]),
                ),
                "unknown-agent": (
                    lambda: rt.generate("nobody", prompt="hi"),
                    lambda: c.generate("nobody", "hi"),
                ),
                "prompt-too-large": (
                    lambda: rt.generate("support", prompt="x" * (5 << 20)),
                    lambda: c.generate("support", "x" * (5 << 20)),
                ),
                "turn-policy": (
                    lambda: rt.send(sid, "hi", turn_policy="bogus"),  # type: ignore[arg-type]
                    lambda: c.send(sid, "hi", turn_policy="bogus"),  # type: ignore[arg-type]
                ),
            }
            got = {}
            for name, (local, remote) in calls.items():
                kinds = []
                for call in (local, remote):
                    try:
                        await call()
                        kinds.append("no error")
                    except so.SignoffError as exc:
                        kinds.append(type(exc).__name__)
                got[name] = tuple(kinds)
    await rt.close()
    assert {k: v for k, v in got.items() if v[0] != v[1]} == {}
    assert all(v[0] != "no error" for v in got.values()), got


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), True, "5"])
def test_a_client_refuses_a_timeout_that_is_not_positive_finite_seconds(timeout: Any) -> None:
    """httpx took each of these, and every call then failed: 0 as if the server were down, the
    others with a bare ValueError, OverflowError or TypeError."""
    for make in (AsyncClient, Client):
        with pytest.raises(so.UsageError, match="^timeout must be a positive, finite number"):
            make("http://127.0.0.1:8000", token="t", timeout=timeout)


@pytest.mark.parametrize("retries", [-1, 2.5, "5", None, True])
async def test_events_refuse_retries_that_are_not_a_count_before_asking(
    canned: Canned, retries: Any
) -> None:
    """`retries="5"` was taken, and the first refusal of the stream then raised a bare
    TypeError (`-1` gave up on a stream that had not failed yet)."""
    canned.on(EVENTS, stream(event(1)))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.UsageError, match="^retries must be a whole number from 0, not "):
            _ = [e async for e in c.events("ses_x", follow=False, retries=retries)]
        with pytest.raises(so.UsageError, match="^follow must be True or False, not 'no'$"):
            _ = [e async for e in c.events("ses_x", follow="no")]  # type: ignore[arg-type]
    with Client(canned.base) as blocking:
        with pytest.raises(so.UsageError, match="^retries must be a whole number from 0"):
            await asyncio.to_thread(blocking.events, "ses_x", retries=retries)
    assert canned.seen == []


@pytest.mark.parametrize("after", ["3", 2.5, -1, None, True, 2**63], ids=repr)
async def test_events_refuse_an_after_that_is_not_an_event_seq_before_asking(
    canned: Canned, after: Any
) -> None:
    """As `Runtime.events` refuses it: `after="3"` was sent, and the first event then raised a
    bare TypeError (`'<=' not supported between int and str`); -1 was sent too and read as 0
    by a server that takes it."""
    canned.on(EVENTS, stream(event(4)))
    message = "^after must be an event seq, a whole number from 0, not "
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.UsageError, match=message):
            _ = [e async for e in c.events("ses_x", after, follow=False)]
    with Client(canned.base) as blocking:
        with pytest.raises(so.UsageError, match=message):
            await asyncio.to_thread(blocking.events, "ses_x", after)
    assert canned.seen == []


@pytest.mark.parametrize("agent", ["batch", "nobody", 5], ids=["another", "unknown", "int"])
async def test_approvals_naming_another_agent_are_refused_over_http_and_settle_nothing(
    store_url: str, agent: Any
) -> None:
    """`Client.generate(agent, session_id=..., approvals=...)` dropped `agent`, so decisions sent
    under another agent's name approved the call, where `Runtime.generate` refuses them
    (`UsageError`). The client now sends it (an int is refused before asking, as in process)
    and the server refuses it: 400 `usage_error`, the same class, nothing settled."""
    from signoff.server import TokenAuth, create_app

    from .test_server_common import TOKENS, make_runtime

    rt = make_runtime(store_url)
    app = create_app(rt, auth=TokenAuth(TOKENS), sweep_every=None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with AsyncClient("http://t", token="alice-token", transport=transport) as c:
            r = await c.generate("support", "Refund order 1042")
            sid, rid = r.session_id, r.pending[0].id
            before = [e.type async for e in rt.events(sid, follow=False)]
            yes = [so.Decision(id=rid, approved=True)]
            with pytest.raises(so.UsageError) as local:
                await rt.generate(agent, session_id=sid, approvals=yes)
            with pytest.raises(so.UsageError) as remote:
                await c.generate(agent, session_id=sid, approvals=yes)
            assert str(remote.value) == str(local.value)
            raw = await transport.handle_async_request(  # the API itself, without the client
                httpx.Request(
                    "POST",
                    f"http://t/v1/sessions/{sid}/approvals",
                    json={"agent": "batch", "approvals": [{"id": rid, "approved": True}]},
                    headers={"Authorization": "Bearer alice-token"},
                )
            )
            await raw.aread()
            assert raw.status_code == 400
            assert [e.type async for e in rt.events(sid, follow=False)] == before
            assert [q.id for q in await rt.pending(session_id=sid)] == [rid]
            done = await c.generate("support", session_id=sid, approvals=yes)
            assert done.status != "waiting"
    await rt.close()


async def test_a_prompt_to_a_session_is_taken_over_http_as_runtime_generate_takes_it(
    store_url: str,
) -> None:
    """`Client.generate(session_id=..., prompt=...)` sent the prompt as a steering message:
    on a session waiting for approval it withdrew the open request (the turn completed, the
    refund never asked for again; a prompt naming an option, `approve`, approved the call), and
    under any agent's name, where `Runtime.generate` refuses both (`PartialAnswer`,
    `UsageError` for another agent's session) and records nothing. The server now runs the
    call as `Runtime.generate` (`POST .../generate`) and refuses them so; an idle session runs
    the prompt's turn."""
    from signoff.server import TokenAuth, create_app

    from .test_server_common import ALICE, TOKENS, make_runtime

    rt = make_runtime(store_url)
    app = create_app(rt, auth=TokenAuth(TOKENS), sweep_every=None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with AsyncClient("http://t", token="alice-token", transport=transport) as c:
            r = await c.generate("support", "Refund order 1042")
            sid, rid = r.session_id, r.pending[0].id
            before = [e.type async for e in rt.events(sid, follow=False)]
            cases = [
                (None, "hello", None, so.PartialAnswer),
                (None, "approve", None, so.PartialAnswer),
                (None, "hello", "k-1", so.PartialAnswer),
                ("batch", "hello", None, so.UsageError),
            ]
            for agent, prompt, key, error in cases:
                with pytest.raises(error) as local:
                    await rt.generate(
                        agent, session_id=sid, prompt=prompt, auth=ALICE, idempotency_key=key
                    )
                with pytest.raises(error) as remote:
                    await c.generate(agent, session_id=sid, prompt=prompt, idempotency_key=key)
                assert type(remote.value) is type(local.value)
                assert str(remote.value) == str(local.value)
            assert [e.type async for e in rt.events(sid, follow=False)] == before
            assert [q.id for q in await rt.pending(session_id=sid)] == [rid]
            done = await c.generate(session_id=sid, approvals=[so.Decision(id=rid, approved=True)])
            assert done.status == "completed"
            again = await c.generate("support", session_id=sid, prompt="thanks")
            assert again.status == "completed" and not again.queued
            assert again.turn_id != done.turn_id
    await rt.close()


async def test_a_failed_turn_is_resumed_over_http_as_runtime_generate_resumes_it(
    store_url: str,
) -> None:
    """`Runtime.generate(session_id=...)` alone resumes a session's turn (a retry after a
    failure); `Client.generate(session_id=...)` refused it (`UsageError`: 'needs a prompt or
    approvals'), so a turn that failed over HTTP could not be retried there. It now resumes it
    (`POST .../generate`), with the errors `Runtime.generate` raises, recording nothing then."""
    from signoff.server import TokenAuth, create_app

    from .test_server_common import ALICE, TOKENS

    def down(conversation: list[so.Message]) -> so.ModelResponse:
        raise so.ModelError("the model is down")

    model = so.models.Scripted([down])
    rt = so.Runtime([so.Agent(name="a", model=model)], store=store_url)
    app = create_app(rt, auth=TokenAuth(TOKENS), sweep_every=None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with AsyncClient("http://t", token="alice-token", transport=transport) as c:
            failed = await c.generate("a", "hello")
            sid = failed.session_id
            assert (failed.status, failed.retryable) == ("failed", True)
            assert (await c.generate(session_id=sid)).status == "failed"  # still down
            before = [e.type async for e in rt.events(sid, follow=False)]
            for agent, error in (("b", so.UsageError), (None, so.UnknownSession)):
                target = sid if error is so.UsageError else "ses_nope"
                with pytest.raises(error) as local:
                    await rt.generate(agent, session_id=target, auth=ALICE)
                with pytest.raises(error) as remote:
                    await c.generate(agent, session_id=target)
                assert str(remote.value) == str(local.value)
            assert [e.type async for e in rt.events(sid, follow=False)] == before

            model.steps = [so.ModelResponse(text="back again")]
            done = await c.generate("a", session_id=sid)
            assert (done.status, done.text, done.turn_id) == (
                "completed",
                "back again",
                failed.turn_id,
            )
            again = await c.generate(session_id=sid)  # nothing to resume: the turn as it stands
            local_again = await rt.generate(session_id=sid, auth=ALICE)
            assert (again.status, again.text) == (local_again.status, local_again.text)
            assert [e.type async for e in rt.events(sid, follow=False)].count("turn.started") == 1
    await rt.close()


async def test_a_prompt_to_a_running_turn_is_refused_over_http_as_in_process(
    store_url: str,
) -> None:
    """`Runtime.generate(session_id=..., prompt=...)` refuses a prompt while the session's turn
    runs (`SessionBusy`: `send()` is the way to steer it); `Client.generate` sent it as a
    steering message, which the running turn took in. It is now refused the same way over
    HTTP (409 `session_busy`), and the running turn never reads it."""
    from signoff.server import TokenAuth, create_app

    from .test_server_common import ALICE, TOKENS

    entered, hang = asyncio.Event(), asyncio.Event()

    @so.tool
    async def slow(x: int) -> int:
        """A call that runs while the prompt arrives."""
        entered.set()
        await hang.wait()
        return x

    def said(conversation: list[so.Message]) -> so.ModelResponse:
        return so.ModelResponse(
            text=" | ".join(m.text for m in conversation if isinstance(m, so.UserMessage))
        )

    go = so.ModelResponse(tool_calls=[so.ToolCall(name="slow", input={"x": 1})])
    model = so.models.Scripted([go, said], repeat_last=True)
    rt = so.Runtime([so.Agent(name="a", model=model, tools=[slow])], store=store_url)
    app = create_app(rt, auth=TokenAuth(TOKENS), sweep_every=None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with AsyncClient("http://t", token="alice-token", transport=transport) as c:
            sid = (await c.generate("a")).session_id
            running = asyncio.create_task(rt.generate(session_id=sid, prompt="go", auth=ALICE))
            await asyncio.wait_for(entered.wait(), 10)
            before = [e.type async for e in rt.events(sid, follow=False)]
            with pytest.raises(so.SessionBusy) as local:
                await rt.generate(session_id=sid, prompt="hurry up", auth=ALICE)
            for key in (None, "k-1"):
                with pytest.raises(so.SessionBusy) as remote:
                    await c.generate(session_id=sid, prompt="hurry up", idempotency_key=key)
                assert str(remote.value) == str(local.value)
                assert remote.value.session_id == sid
            raw = await transport.handle_async_request(  # the API itself, without the client
                httpx.Request(
                    "POST",
                    f"http://t/v1/sessions/{sid}/generate",
                    json={"message": "hurry up"},
                    headers={"Authorization": "Bearer alice-token"},
                )
            )
            await raw.aread()
            assert (raw.status_code, raw.json()["error"]["code"]) == (409, "session_busy")
            assert [e.type async for e in rt.events(sid, follow=False)] == before
            hang.set()
            done = await asyncio.wait_for(running, 10)
            assert (done.status, done.text) == ("completed", "go")
            steered = await c.send(sid, "hurry up")  # the explicit way on, now the turn ended
            assert steered.status == "completed" and steered.text == "go | hurry up"
    await rt.close()
