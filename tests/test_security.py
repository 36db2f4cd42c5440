"""Hostile answers: forged, foreign, replayed, stale, oversized and malformed ones are refused
with a named exception (Python) or a 4xx with a stable code (HTTP), and the store is unchanged.

Already covered elsewhere, not repeated here: the dashboard's CSRF tokens on its forms
(`test_dashboard.py::test_forms_without_the_csrf_token_are_refused`), its sign-in, and the status
codes alone of several bad bodies (`test_server_input.py`); this file adds the "nothing changed"
check and the cases those tests do not reach.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
import math
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.responses import PlainTextResponse
from starlette.types import Receive, Scope, Send

import signoff as so
from signoff._client import AsyncClient
from signoff.server import TokenAuth, create_app
from signoff.server._app import MAX_BODY_SIZE
from signoff.server._limits import BodyLimit
from signoff.server._pages import csrf_key
from signoff.server._sign_ins import issue
from signoff.testing import ManualClock

from .test_server_common import ALICE, BOB, MALLORY, TOKENS, _echo, auth, make_agents

STALE_HASH = "sha256:" + "0" * 64
DEEP = 100_000


def nested(depth: int) -> Any:
    """`depth` levels of lists, built without recursion."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def deep_json(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# -- the runtime under attack ---------------------------------------------------------------------


def expiring_agent() -> so.Agent:
    @so.tool(approval=so.always(expires_in=60))
    async def close_account(account: str) -> dict[str, Any]:
        """Close a customer's account."""
        return {"closed": account}

    call = so.ModelResponse(
        tool_calls=[so.ToolCall(name="close_account", input={"account": "ACC-1"})]
    )
    return so.Agent(
        name="closer",
        model=so.models.Scripted([call, _echo], repeat_last=True),
        tools=[close_account],
    )


@dataclass(slots=True)
class World:
    """A runtime with requests in every state, each owned by Alice (tenant `acme`)."""

    rt: so.Runtime
    clock: ManualClock
    a: str = ""  # a waiting support session and its open approval
    ra: str = ""
    b: str = ""  # a second one
    rb: str = ""
    q: str = ""  # a waiting question
    rq: str = ""
    t: str = ""  # a two-approver (quorum) approval
    rt_: str = ""
    s: str = ""  # a session whose approval was settled (approved)
    rs: str = ""
    c: str = ""  # a session whose approval was withdrawn by a cancel
    rc: str = ""
    x: str = ""  # a session whose approval expired
    rx: str = ""


async def build_world(tmp_path: Path) -> World:
    clock = ManualClock()
    rt = so.Runtime(
        [*make_agents(), expiring_agent()],
        store=f"sqlite:///{tmp_path / 'state.db'}",
        clock=clock,
    )
    w = World(rt=rt, clock=clock)

    async def start(agent: str) -> tuple[str, str]:
        r = await rt.generate(agent, prompt="please", auth=ALICE)
        assert r.status == "waiting", r
        return r.session_id, r.pending[0].id

    w.a, w.ra = await start("support")
    w.b, w.rb = await start("support")
    w.q, w.rq = await start("helper")
    w.t, w.rt_ = await start("treasury")
    w.s, w.rs = await start("support")
    done = await rt.respond(
        w.s, [so.InputResponse(request_id=w.rs, option_id="approve")], principal=ALICE
    )
    assert done.status == "completed"
    w.c, w.rc = await start("support")
    await rt.cancel(w.c, "changed my mind")
    w.x, w.rx = await start("closer")
    clock.advance(61)
    assert await rt.expire_due() == 1
    return w


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    w = await build_world(tmp_path)
    try:
        yield w
    finally:
        await w.rt.close()


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if dump is not None else value


async def snapshot(rt: so.Runtime) -> dict[str, Any]:
    """Everything the public API shows of the store: every session with its events and its
    requests (status and resolution), the open queue, and the audit trail."""
    sessions = await rt.sessions(limit=10_000)
    out: dict[str, Any] = {
        "sessions": [_plain(s) for s in sessions],
        "pending": [_plain(r) for r in await rt.pending(limit=10_000)],
        "audit": [_plain(e) for e in await rt.audit()],
        "events": {},
        "requests": {},
    }
    for s in sessions:
        events = [_plain(e) async for e in rt.events(s.id, follow=False)]
        out["events"][s.id] = events
        for rid in sorted((await rt.state(s.id)).requests):
            stored = await rt.store.get_request(rid)
            assert stored is not None, rid
            out["requests"][rid] = (stored.status, stored.outcome, stored.resolution)
    assert out["events"] and out["requests"], "the snapshot must see the world's sessions"
    return out


async def test_the_snapshot_sees_a_change(world: World) -> None:
    """The "nothing changed" check can fail: one more answer shows up in it."""
    before = await snapshot(world.rt)
    reply = so.InputResponse(request_id=world.ra, option_id="approve")
    await world.rt.respond(world.a, [reply], principal=ALICE, resume=False)
    after = await snapshot(world.rt)
    assert before["events"][world.a] != after["events"][world.a]
    assert before["requests"][world.ra] != after["requests"][world.ra]
    assert before["pending"] != after["pending"]
    assert before["audit"] != after["audit"]


# -- the Python API -------------------------------------------------------------------------------

Attack = Callable[[World], Awaitable[Any]]


def answer(
    sid: Callable[[World], str],
    rid: Callable[[World], str],
    who: so.Principal | None = ALICE,
    **extra: Any,
) -> Attack:
    async def attack(w: World) -> Any:
        reply = {"request_id": rid(w), "option_id": "approve", **extra}
        return await w.rt.respond(sid(w), [reply], principal=who)

    return attack


def decide(
    sid: Callable[[World], str],
    ids: Callable[[World], list[str]],
    who: so.Principal | None = ALICE,
    **extra: Any,
) -> Attack:
    async def attack(w: World) -> Any:
        decisions = [so.Decision(id=i, approved=True, **extra) for i in ids(w)]
        return await w.rt.generate(session_id=sid(w), approvals=decisions, auth=who)

    return attack


def forged() -> str:
    return f"req_{uuid.uuid4().hex[:20]}"


def A(w: World) -> str:
    return w.a


def RA(w: World) -> str:
    return w.ra


PY_ATTACKS: dict[str, tuple[Attack, type[Exception]]] = {
    # forged ids, well-formed and not
    "forged-id": (answer(A, lambda w: forged()), so.UnknownRequest),
    "forged-id-helix": (decide(A, lambda w: [forged()]), so.UnknownRequest),
    "malformed-id-sql": (answer(A, lambda w: "req_' OR '1'='1"), so.UnknownRequest),
    "malformed-id-path": (answer(A, lambda w: "../../req_x"), so.UnknownRequest),
    "malformed-id-nul": (answer(A, lambda w: "req_\x00"), so.UnknownRequest),
    "malformed-id-long": (answer(A, lambda w: "r" * 100_000), so.UnknownRequest),
    "malformed-id-empty": (answer(A, lambda w: ""), so.UnknownRequest),
    "forged-session": (answer(lambda w: "ses_" + uuid.uuid4().hex[:20], RA), so.UnknownSession),
    "forged-plus-real-in-one-batch": (
        decide(A, lambda w: [w.ra, forged()]),
        so.UnknownRequest,
    ),
    # a request of another session, answered through this one
    "other-session": (answer(A, lambda w: w.rb), so.UnknownRequest),
    "other-session-helix": (decide(A, lambda w: [w.rb]), so.UnknownRequest),
    "other-session-settled": (answer(A, lambda w: w.rs), so.UnknownRequest),
    # reviewers who may not settle: same tenant, other tenant, nobody
    "not-the-requester-same-tenant": (answer(A, RA, who=BOB), so.NotAllowed),
    "not-the-requester-other-tenant": (answer(A, RA, who=MALLORY), so.NotAllowed),
    "anonymous": (answer(A, RA, who=None), so.NotAllowed),
    "anonymous-helix": (decide(A, lambda w: [w.ra], who=None), so.NotAllowed),
    "anonymous-quorum-vote": (answer(lambda w: w.t, lambda w: w.rt_, who=None), so.NotAllowed),
    # replays onto closed requests
    "conflicting-replay": (
        answer(lambda w: w.s, lambda w: w.rs, option_id="cancel"),
        so.ConflictingAnswer,
    ),
    "after-cancel": (answer(lambda w: w.c, lambda w: w.rc), so.RequestClosed),
    "after-cancel-helix": (decide(lambda w: w.c, lambda w: [w.rc]), so.RequestClosed),
    "after-expiry": (answer(lambda w: w.x, lambda w: w.rx), so.RequestClosed),
    # the reviewer saw another call
    "stale-hash": (answer(A, RA, input_hash=STALE_HASH), so.StaleAnswer),
    "stale-hash-helix": (decide(A, lambda w: [w.ra], input_hash=STALE_HASH), so.StaleAnswer),
    "stale-hash-with-edit": (
        answer(
            A,
            RA,
            input_hash="md5:whatever",
            edited_input={"order_id": "1042", "amount": 1, "reason": "x"},
        ),
        so.StaleAnswer,
    ),
    "stale-hash-quorum": (
        answer(lambda w: w.t, lambda w: w.rt_, who=BOB, input_hash=STALE_HASH),
        so.StaleAnswer,
    ),
    # values that are not plain JSON
    "value-deeply-nested": (answer(A, RA, value=nested(DEEP)), so.InvalidAnswer),
    "value-nested-101": (answer(A, RA, value=nested(101)), so.InvalidAnswer),
    "value-nan": (answer(A, RA, value=math.nan), so.InvalidAnswer),
    "value-infinity": (answer(A, RA, value={"x": [math.inf]}), so.InvalidAnswer),
    "value-object": (answer(A, RA, value=object()), so.InvalidAnswer),
    "value-nested-helix": (decide(A, lambda w: [w.ra], value=nested(DEEP)), so.InvalidAnswer),
    "value-lone-surrogate": (answer(A, RA, value={"k": "\ud800"}), so.InvalidAnswer),
    "reason-lone-surrogate": (answer(A, RA, text="fine \udfff"), so.InvalidAnswer),
    "reason-lone-surrogate-helix": (
        decide(A, lambda w: [w.ra], reason="\ud800"),
        so.InvalidAnswer,
    ),
    "question-text-lone-surrogate": (
        answer(lambda w: w.q, lambda w: w.rq, option_id=None, text="\ud800"),
        so.InvalidAnswer,
    ),
    "prompt-lone-surrogate-new-session": (
        lambda w: w.rt.generate("support", prompt="hi \ud800", auth=ALICE),
        so.UsageError,
    ),
    "prompt-lone-surrogate-next-turn": (
        lambda w: w.rt.generate(session_id=w.s, prompt="\udfff", auth=ALICE),
        so.UsageError,
    ),
    "message-lone-surrogate": (
        lambda w: w.rt.send(w.a, "approve \ud800", principal=ALICE),
        so.UsageError,
    ),
    "edited-input-nan": (
        answer(A, RA, edited_input={"order_id": "1042", "amount": math.nan, "reason": "x"}),
        so.InvalidAnswer,
    ),
    "edited-input-unknown-field": (
        answer(A, RA, edited_input={"order_id": "1042", "amount": 1, "reason": "x", "admin": True}),
        so.InvalidAnswer,
    ),
    "question-with-an-approval-option": (
        answer(lambda w: w.q, lambda w: w.rq),
        so.InvalidAnswer,
    ),
}


@pytest.mark.parametrize("name", sorted(PY_ATTACKS))
async def test_python_api_refuses_and_changes_nothing(world: World, name: str) -> None:
    attack, error = PY_ATTACKS[name]
    before = await snapshot(world.rt)
    with pytest.raises(error) as caught:
        await attack(world)
    assert type(caught.value) is error, f"{name}: {type(caught.value).__name__}: {caught.value}"
    assert str(caught.value)
    assert await snapshot(world.rt) == before, f"{name} changed the store"


async def test_a_value_at_the_depth_limit_is_kept(world: World) -> None:
    """The nesting limit is a limit, not a refusal of nesting: 100 levels are recorded."""
    reply = so.InputResponse(request_id=world.ra, option_id="approve", value=nested(100))
    r = await world.rt.respond(world.a, [reply], principal=ALICE)
    assert r.status == "completed"
    stored = await world.rt.store.get_request(world.ra)
    assert stored is not None and stored.resolution is not None
    assert stored.resolution["value"] == nested(100)


REPLAYS: dict[str, Callable[[World], Awaitable[so.GenerateResult]]] = {
    "respond": lambda w: w.rt.respond(
        w.a, [so.InputResponse(request_id=w.ra, option_id="approve")], principal=ALICE
    ),
    "respond-without-resume": lambda w: w.rt.respond(
        w.a, [so.InputResponse(request_id=w.ra, option_id="approve")], principal=ALICE, resume=False
    ),
    "helix": lambda w: w.rt.generate(
        session_id=w.a, approvals=[so.Decision(id=w.ra, approved=True)], auth=ALICE
    ),
    "deny": lambda w: w.rt.respond(
        w.a, [so.InputResponse(request_id=w.ra, option_id="cancel", text="no")], principal=ALICE
    ),
}


@pytest.mark.parametrize("name", sorted(REPLAYS))
async def test_a_replayed_answer_is_a_no_op(world: World, name: str) -> None:
    first = await REPLAYS[name](world)
    assert [o.applied for o in first.outcomes] == [True]
    before = await snapshot(world.rt)
    for _ in range(2):
        again = await REPLAYS[name](world)
        assert [(o.request_id, o.applied) for o in again.outcomes] == [(world.ra, False)]
        assert again.outcomes[0].outcome == first.outcomes[0].outcome
    assert await snapshot(world.rt) == before, f"replaying {name} changed the store"


# -- the HTTP API ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Served:
    world: World
    client: httpx.AsyncClient
    transport: httpx.ASGITransport


@pytest.fixture
async def served(world: World) -> AsyncIterator[Served]:
    app = create_app(world.rt, auth=TokenAuth(TOKENS), sweep_every=None)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=transport, base_url="http://signoff.test") as c:
            yield Served(world, c, transport)


JSON = {"Content-Type": "application/json"}
CHARSET = "application/json; charset=utf-8"
JSON_REPLY = {"Accept": "application/json"}


@dataclass(frozen=True, slots=True)
class Call:
    """One hostile HTTP call: `build(world)` gives the method, path and httpx keyword arguments."""

    build: Callable[[World], tuple[str, str, dict[str, Any]]]
    status: int
    code: str
    token: str | None = "alice-token"


def responses(
    sid: Callable[[World], str], rid: Callable[[World], str], **extra: Any
) -> Callable[[World], tuple[str, str, dict[str, Any]]]:
    def build(w: World) -> tuple[str, str, dict[str, Any]]:
        item = {"requestId": rid(w), "optionId": "approve", **extra}
        return "POST", f"/v1/sessions/{sid(w)}/responses", {"json": {"inputResponses": [item]}}

    return build


def approvals(
    sid: Callable[[World], str], ids: Callable[[World], list[str]], **extra: Any
) -> Callable[[World], tuple[str, str, dict[str, Any]]]:
    def build(w: World) -> tuple[str, str, dict[str, Any]]:
        items = [{"id": i, "approved": True, **extra} for i in ids(w)]
        return "POST", f"/v1/sessions/{sid(w)}/approvals", {"json": {"approvals": items}}

    return build


def raw(
    path: Callable[[World], str], content: bytes | Callable[[World], bytes], **headers: str
) -> Callable[[World], tuple[str, str, dict[str, Any]]]:
    def build(w: World) -> tuple[str, str, dict[str, Any]]:
        body = content(w) if callable(content) else content
        return "POST", path(w), {"content": body, "headers": {**JSON, **headers}}

    return build


async def chunks(chunk: bytes, count: int) -> AsyncIterator[bytes]:
    """A streamed body with no Content-Length."""
    for _ in range(count):
        yield chunk


def to_responses(w: World) -> str:
    return f"/v1/sessions/{w.a}/responses"


def answer_json(value: bytes) -> Callable[[World], bytes]:
    def body(w: World) -> bytes:
        head = json.dumps({"requestId": w.ra, "optionId": "approve"})[:-1].encode()
        return b'{"inputResponses": [' + head + b', "value": ' + value + b"}]}"

    return body


BIG = MAX_BODY_SIZE + 1024


def alice_sign_in(w: World) -> str:
    """A valid dashboard sign-in of Alice's (the served app has no secret), as her cookie holds."""
    return issue(csrf_key(None), "alice-token", w.clock())


HTTP_ATTACKS: dict[str, Call] = {
    # forged ids
    "forged-id": Call(responses(A, lambda w: forged()), 404, "unknown_request"),
    "forged-id-helix": Call(approvals(A, lambda w: [forged()]), 404, "unknown_request"),
    "malformed-id": Call(responses(A, lambda w: "req_'; DROP TABLE--"), 404, "unknown_request"),
    "empty-id": Call(responses(A, lambda w: ""), 422, "invalid_request"),
    "numeric-id": Call(responses(A, lambda w: 7), 422, "invalid_request"),  # type: ignore[arg-type,return-value]
    "forged-session": Call(
        responses(lambda w: "ses_" + uuid.uuid4().hex[:20], RA), 404, "unknown_session"
    ),
    "get-forged-request": Call(
        lambda w: ("GET", f"/v1/requests/{forged()}", {}), 404, "unknown_request"
    ),
    "forged-plus-real": Call(approvals(A, lambda w: [w.ra, forged()]), 404, "unknown_request"),
    # foreign ids: another session, another tenant
    "other-session": Call(responses(A, lambda w: w.rb), 404, "unknown_request"),
    "other-session-helix": Call(approvals(A, lambda w: [w.rb]), 404, "unknown_request"),
    "other-tenant": Call(responses(A, RA), 404, "unknown_session", token="mallory-token"),
    "other-tenant-helix": Call(
        approvals(A, lambda w: [w.ra]), 404, "unknown_session", token="mallory-token"
    ),
    "other-tenant-cancel": Call(
        lambda w: ("POST", f"/v1/sessions/{w.a}/cancel", {}),
        404,
        "unknown_session",
        token="mallory-token",
    ),
    "other-tenant-message": Call(
        lambda w: ("POST", f"/v1/sessions/{w.a}/messages", {"json": {"text": "approve"}}),
        404,
        "unknown_session",
        token="mallory-token",
    ),
    "other-tenant-read-request": Call(
        lambda w: ("GET", f"/v1/requests/{w.ra}", {}),
        404,
        "unknown_request",
        token="mallory-token",
    ),
    "other-tenant-quorum-vote": Call(
        responses(lambda w: w.t, lambda w: w.rt_), 404, "unknown_session", token="mallory-token"
    ),
    "same-tenant-not-the-requester": Call(responses(A, RA), 403, "not_allowed", token="bob-token"),
    # closed requests
    "conflicting-replay": Call(
        responses(lambda w: w.s, lambda w: w.rs, optionId="cancel"), 409, "conflicting_answer"
    ),
    "after-cancel": Call(responses(lambda w: w.c, lambda w: w.rc), 409, "request_closed"),
    "after-expiry": Call(responses(lambda w: w.x, lambda w: w.rx), 409, "request_closed"),
    # stale input hash
    "stale-hash": Call(responses(A, RA, inputHash=STALE_HASH), 409, "stale_answer"),
    "stale-hash-helix": Call(
        approvals(A, lambda w: [w.ra], inputHash=STALE_HASH), 409, "stale_answer"
    ),
    # size
    "huge-prompt": Call(
        lambda w: ("POST", "/v1/sessions", {"json": {"agent": "support", "message": "x" * BIG}}),
        413,
        "payload_too_large",
    ),
    "huge-message": Call(
        lambda w: ("POST", f"/v1/sessions/{w.a}/messages", {"json": {"text": "x" * BIG}}),
        413,
        "payload_too_large",
    ),
    "huge-answer-value": Call(responses(A, RA, value="v" * BIG), 413, "payload_too_large"),
    "huge-chunked-body": Call(
        lambda w: (
            "POST",
            to_responses(w),
            {"content": chunks(b"[" * 65536, BIG // 65536 + 1), "headers": JSON},
        ),
        413,
        "payload_too_large",
    ),
    "huge-body-unauthenticated": Call(
        lambda w: ("POST", "/v1/sessions", {"content": b" " * BIG, "headers": JSON}),
        413,
        "payload_too_large",
        token=None,
    ),
    # malformed JSON
    "deep-body": Call(raw(to_responses, deep_json(DEEP)), 400, "malformed_json"),
    "deep-answer-value": Call(
        raw(to_responses, answer_json(deep_json(DEEP))), 400, "malformed_json"
    ),
    "nested-answer-value": Call(
        raw(to_responses, answer_json(deep_json(150))), 422, "invalid_answer"
    ),
    "edited-input-nested-wrong-type": Call(
        responses(A, RA, editedInput={"order_id": nested(150)}), 422, "invalid_answer"
    ),
    "non-utf8": Call(
        raw(to_responses, b'{"inputResponses": "\xff\xfe\xfd"}'), 400, "malformed_json"
    ),
    # a JSON media type with parameters is JSON all the same: not a bare `http_400`
    "non-utf8-charset": Call(
        raw(to_responses, b'{"inputResponses": "\xff"}', **{"Content-Type": CHARSET}),
        400,
        "malformed_json",
    ),
    "deep-body-charset": Call(
        raw(to_responses, deep_json(DEEP), **{"Content-Type": CHARSET}), 400, "malformed_json"
    ),
    "latin1-in-prompt": Call(
        raw(lambda w: "/v1/sessions", '{"agent": "support", "message": "café"}'.encode("latin-1")),
        400,
        "malformed_json",
    ),
    "lone-surrogate-value": Call(
        raw(to_responses, answer_json(b'{"\\udc00": "x"}')), 422, "invalid_request"
    ),
    "lone-surrogate-text": Call(
        raw(to_responses, answer_json(b'"x", "text": "ok \\ud800"')), 422, "invalid_request"
    ),
    "lone-surrogate-prompt": Call(
        raw(lambda w: "/v1/sessions", b'{"agent": "support", "message": "hi \\ud800"}'),
        422,
        "invalid_request",
    ),
    "lone-surrogate-message": Call(
        raw(lambda w: f"/v1/sessions/{w.a}/messages", b'{"text": "\\udfff"}'),
        422,
        "invalid_request",
    ),
    "truncated": Call(
        raw(to_responses, b'{"inputResponses": [{"requestId": '), 400, "malformed_json"
    ),
    # a key named twice: JSON parsers disagree on which one counts (Python's takes the last, a
    # gateway checking the body may take the first), so the body is refused
    "duplicate-approved": Call(
        raw(
            lambda w: f"/v1/sessions/{w.a}/approvals",
            lambda w: (
                b'{"approvals": [{"id": "%s", "approved": false, "approved": true}]}'
                % w.ra.encode()
            ),
        ),
        422,
        "invalid_request",
    ),
    "duplicate-option": Call(
        raw(
            to_responses,
            lambda w: (
                b'{"inputResponses": [{"requestId": "%s", "optionId": "deny", '
                b'"optionId": "approve"}]}' % w.ra.encode()
            ),
        ),
        422,
        "invalid_request",
    ),
    "duplicate-top-level": Call(
        raw(
            to_responses,
            lambda w: (
                b'{"inputResponses": [], "inputResponses": [{"requestId": "%s", '
                b'"optionId": "approve"}]}' % w.ra.encode()
            ),
        ),
        422,
        "invalid_request",
    ),
    "duplicate-in-value": Call(
        raw(to_responses, answer_json(b'{"amount": 1, "amount": 1000000}')),
        422,
        "invalid_request",
    ),
    "nan-value": Call(raw(to_responses, answer_json(b"NaN")), 422, "invalid_answer"),
    "infinity-value": Call(raw(to_responses, answer_json(b"[Infinity]")), 422, "invalid_answer"),
    "minus-infinity-value": Call(
        raw(to_responses, answer_json(b'{"x": -Infinity}')), 422, "invalid_answer"
    ),
    "huge-number": Call(raw(to_responses, answer_json(b"1e999")), 422, "invalid_answer"),
    # wrong content types and shapes
    "text-plain": Call(
        raw(to_responses, answer_json(b"1"), **{"Content-Type": "text/plain"}),
        422,
        "invalid_request",
    ),
    "form-encoded": Call(
        lambda w: ("POST", to_responses(w), {"data": {"requestId": w.ra, "optionId": "approve"}}),
        422,
        "invalid_request",
    ),
    "no-content-type": Call(
        lambda w: (
            "POST",
            to_responses(w),
            {"content": answer_json(b"1")(w), "headers": {"Content-Type": ""}},
        ),
        422,
        "invalid_request",
    ),
    "array-body": Call(raw(to_responses, b"[]"), 422, "invalid_request"),
    "unknown-field": Call(responses(A, RA, isAdmin=True), 422, "invalid_request"),
    "unknown-top-level-field": Call(
        lambda w: (
            "POST",
            to_responses(w),
            {"json": {"inputResponses": [{"requestId": w.ra, "optionId": "approve"}], "as": "bob"}},
        ),
        422,
        "invalid_request",
    ),
    "snake-case-spoof": Call(
        lambda w: (
            "POST",
            to_responses(w),
            {"json": {"inputResponses": [{"request_id": w.ra, "option_id": "approve"}]}},
        ),
        422,
        "invalid_request",
    ),
    # authentication
    "no-token": Call(responses(A, RA), 401, "unauthenticated", token=None),
    "wrong-token": Call(responses(A, RA), 401, "unauthenticated", token="alice-token-x"),
    "token-prefix": Call(responses(A, RA), 401, "unauthenticated", token="alice"),
    "no-token-helix": Call(approvals(A, lambda w: [w.ra]), 401, "unauthenticated", token=None),
    "no-token-cancel": Call(
        lambda w: ("POST", f"/v1/sessions/{w.a}/cancel", {}), 401, "unauthenticated", token=None
    ),
    "basic-scheme": Call(
        lambda w: (
            "POST",
            to_responses(w),
            {
                "json": {"inputResponses": [{"requestId": w.ra, "optionId": "approve"}]},
                "headers": {"Authorization": "Basic YWxpY2UtdG9rZW46"},
            },
        ),
        401,
        "unauthenticated",
        token=None,
    ),
    # the dashboard's cookie (a valid sign-in) carries no authority for the API's writes (no
    # CSRF from a page)
    "cookie-on-api-post": Call(
        lambda w: (
            "POST",
            to_responses(w),
            {
                "json": {"inputResponses": [{"requestId": w.ra, "optionId": "approve"}]},
                "headers": {"Cookie": f"signoff_token={alice_sign_in(w)}"},
            },
        ),
        401,
        "unauthenticated",
        token=None,
    ),
}


async def test_the_sign_in_refused_for_api_writes_is_valid_for_reads(served: Served) -> None:
    """`cookie-on-api-post` is refused for what it is, a cookie on an API write: the same
    sign-in is honoured for a read."""
    cookie = {"Cookie": f"signoff_token={alice_sign_in(served.world)}"}
    assert (await served.client.get("/v1/requests", headers=cookie)).status_code == 200


@pytest.mark.parametrize("name", sorted(HTTP_ATTACKS))
async def test_http_api_refuses_and_changes_nothing(served: Served, name: str) -> None:
    call = HTTP_ATTACKS[name]
    method, path, kwargs = call.build(served.world)
    headers = {**(auth(call.token) if call.token else {}), **kwargs.pop("headers", {})}
    before = await snapshot(served.world.rt)
    r = await served.client.request(method, path, headers=headers, **kwargs)
    assert r.status_code == call.status, f"{name}: {r.status_code} {r.text[:500]}"
    assert r.headers["content-type"].startswith("application/json"), name
    body = r.json()
    assert set(body) == {"error"}, body
    assert body["error"]["code"] == call.code, f"{name}: {body}"
    assert body["error"]["message"]
    assert await snapshot(served.world.rt) == before, f"{name} changed the store"


@pytest.mark.parametrize(
    "endpoint",
    [
        lambda w: (
            "/v1/sessions/{a}/responses",
            {"inputResponses": [{"requestId": w.ra, "optionId": "approve"}]},
        ),
        lambda w: ("/v1/sessions/{a}/approvals", {"approvals": [{"id": w.ra, "approved": True}]}),
    ],
    ids=["responses", "approvals"],
)
async def test_the_same_post_twice_is_a_no_op(served: Served, endpoint: Any) -> None:
    w = served.world
    path, body = endpoint(w)
    url = path.format(a=w.a)
    first = await served.client.post(url, json=body, headers=auth("alice-token"))
    assert first.status_code == 200, first.text
    assert first.json()["outcomes"][0]["applied"] is True
    before = await snapshot(w.rt)
    again = await served.client.post(url, json=body, headers=auth("alice-token"))
    assert again.status_code == 200, again.text
    assert again.json()["outcomes"] == [
        {"request_id": w.ra, "outcome": "approved", "applied": False, "reason": None}
    ]
    assert again.json()["status"] == first.json()["status"] == "completed"
    assert await snapshot(w.rt) == before


async def test_the_body_limit_is_configurable(world: World) -> None:
    app = create_app(world.rt, auth=TokenAuth(TOKENS), sweep_every=None, max_body_size=200)
    body = {"inputResponses": [{"requestId": world.ra, "optionId": "approve"}]}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://signoff.test") as c:
            before = await snapshot(world.rt)
            padded = {**body, "inputResponses": [{**body["inputResponses"][0], "text": "x" * 200}]}
            r = await c.post(
                f"/v1/sessions/{world.a}/responses", json=padded, headers=auth("alice-token")
            )
            assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
            assert await snapshot(world.rt) == before
            r = await c.post(
                f"/v1/sessions/{world.a}/responses", json=body, headers=auth("alice-token")
            )
            assert r.status_code == 200, r.text
    for bad in (0, -1, 1.5, True):
        with pytest.raises(so.UsageError, match="max_body_size"):
            create_app(world.rt, auth=TokenAuth(TOKENS), max_body_size=bad)  # type: ignore[arg-type]


async def test_a_declared_length_over_the_limit_is_refused_before_the_app_runs() -> None:
    """A `Content-Length` one byte over the limit is refused up front, even on a route that
    would never read the body; one at the limit reaches the app."""
    reached: list[int] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(1)  # answers without reading the body
        await PlainTextResponse("ok")(scope, receive, send)

    transport = httpx.ASGITransport(app=BodyLimit(app, max_bytes=100))
    async with httpx.AsyncClient(transport=transport, base_url="http://signoff.test") as c:
        r = await c.post("/", content=b"x" * 101)
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
        assert reached == []
        r = await c.post("/", content=b"x" * 100)
        assert r.status_code == 200 and reached == [1]


async def test_a_body_under_the_limit_is_accepted(served: Served) -> None:
    """The limit refuses only what is over it: a prompt of most of it starts a session."""
    text = "x" * (MAX_BODY_SIZE - 1024)
    r = await served.client.post(
        "/v1/sessions", json={"agent": "support", "message": text}, headers=auth("alice-token")
    )
    assert r.status_code == 201, r.text[:300]


# -- the HTTP client ------------------------------------------------------------------------------

CLIENT_ATTACKS: dict[
    str, tuple[Callable[[AsyncClient, World], Awaitable[Any]], type[Exception]]
] = {
    "forged-id": (
        lambda c, w: c.respond(w.a, [{"request_id": forged(), "option_id": "approve"}]),
        so.UnknownRequest,
    ),
    "stale-hash": (
        lambda c, w: c.respond(
            w.a, [{"request_id": w.ra, "option_id": "approve", "input_hash": STALE_HASH}]
        ),
        so.StaleAnswer,
    ),
    "after-cancel": (
        lambda c, w: c.generate(session_id=w.c, approvals=[so.Decision(id=w.rc, approved=True)]),
        so.RequestClosed,
    ),
    "value-nan": (
        lambda c, w: c.respond(
            w.a, [{"request_id": w.ra, "option_id": "approve", "value": math.nan}]
        ),
        so.InvalidAnswer,
    ),
    "value-deeply-nested": (
        lambda c, w: c.respond(
            w.a, [{"request_id": w.ra, "option_id": "approve", "value": nested(DEEP)}]
        ),
        so.InvalidAnswer,
    ),
    "reason-lone-surrogate": (
        lambda c, w: c.generate(
            session_id=w.a, approvals=[so.Decision(id=w.ra, approved=True, reason="\ud800")]
        ),
        so.InvalidAnswer,
    ),
    "prompt-lone-surrogate": (lambda c, w: c.generate("support", "hi \udfff"), so.UsageError),
    # a session id is one path segment: what it holds must not reach another session
    "session-id-with-a-query": (
        lambda c, w: c.respond(f"{w.a}?x=1", [{"request_id": w.ra, "option_id": "approve"}]),
        so.UnknownSession,
    ),
    "session-id-with-a-fragment": (
        lambda c, w: c.generate(
            session_id=f"{w.a}#x", approvals=[so.Decision(id=w.ra, approved=True)]
        ),
        so.UnknownSession,
    ),
    "session-id-climbing": (
        lambda c, w: c.respond(f"{w.s}/../{w.a}", [{"request_id": w.ra, "option_id": "approve"}]),
        so.UnknownSession,
    ),
    "session-id-dot-dot": (lambda c, w: c.cancel(".."), so.UnknownSession),
    "session-id-empty": (lambda c, w: c.send("", "approve"), so.UnknownSession),
    # as in process (the runtime refuses such a prompt with `TooLarge` too)
    "huge-prompt": (lambda c, w: c.generate("support", "x" * BIG), so.TooLarge),
}


@pytest.mark.parametrize("name", sorted(CLIENT_ATTACKS))
async def test_the_client_raises_named_errors(served: Served, name: str) -> None:
    attack, error = CLIENT_ATTACKS[name]
    async with AsyncClient(  # the same app, through signoff's own client
        "http://signoff.test", token="alice-token", transport=served.transport
    ) as client:
        before = await snapshot(served.world.rt)
        with pytest.raises(error) as caught:
            await attack(client, served.world)
        assert type(caught.value) is error, f"{name}: {type(caught.value).__name__}"
        if isinstance(caught.value, so.TooLarge):
            assert caught.value.code == "payload_too_large"
        assert await snapshot(served.world.rt) == before, f"{name} changed the store"


async def test_a_reviewer_the_policy_refuses_settles_nothing(world: World) -> None:
    """A responder the tool's response policy refuses (here: not a manager) settles nothing; the
    attempt is kept on record (`approval.candidate`), by design, and nothing else changes."""
    rt = world.rt
    started = await rt.generate("finance", prompt="pay it", auth=ALICE)
    sid, rid = started.session_id, started.pending[0].id
    before = await snapshot(rt)
    reply = so.InputResponse(request_id=rid, option_id="approve")
    r = await rt.respond(sid, [reply], principal=ALICE)
    assert [(o.outcome, o.applied) for o in r.outcomes] == [("rejected", False)]
    assert r.status == "waiting"
    after = await snapshot(rt)
    assert after["requests"] == before["requests"]
    assert after["pending"] == before["pending"]
    assert {k: v for k, v in after["events"].items() if k != sid} == {
        k: v for k, v in before["events"].items() if k != sid
    }
    added = after["events"][sid][len(before["events"][sid]) :]
    assert after["events"][sid][: len(before["events"][sid])] == before["events"][sid]
    assert {e["type"] for e in added} <= {"approval.candidate", "turn.waiting"}, added
    assert not any(e["type"].startswith("tool.") for e in added)


# -- the HTTP surface: headers on every response, the sign-in, the tokens ------------------------


def _failing_auth(request: Any) -> None:
    raise RuntimeError("the authenticator broke")


async def test_a_server_failure_carries_the_security_headers(world: World) -> None:
    """A 500 is a response like any other: it may not be framed or sniffed, and on the
    dashboard it carries the page policy and is not cached."""
    app = create_app(world.rt, auth=_failing_auth, sweep_every=None)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://signoff.test") as c:
        for path in ("/v1/requests", "/_signoff/"):
            r = await c.get(path)
            assert r.status_code == 500, path
            assert r.json()["error"]["code"] == "internal_error"
            assert r.headers.get("x-content-type-options") == "nosniff", path
            assert r.headers.get("x-frame-options") == "DENY", path
            assert r.headers.get("referrer-policy") == "same-origin", path
        assert "frame-ancestors 'none'" in r.headers.get("content-security-policy", "")
        assert r.headers.get("cache-control") == "no-store"


def _csrf_in(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, html[:500]
    return match.group(1)


async def test_a_sign_in_posted_from_another_site_is_refused(served: Served) -> None:
    """Login CSRF: an anonymous visitor's CSRF token is valid for every anonymous browser, so a
    page of a sibling subdomain (or of another port) could plant one in the victim's cookie and
    post the attacker's token, signing the victim in as the attacker. The browser names such a
    post `Sec-Fetch-Site: same-site` (or `cross-site`): it is refused, and signs nobody in."""
    c = served.client
    token = _csrf_in((await c.get("/_signoff/login")).text)  # the attacker's own visit
    async with httpx.AsyncClient(transport=served.transport, base_url="http://signoff.test") as v:
        v.cookies.set("signoff_csrf", token, domain="signoff.test", path="/_signoff")
        for site in ("same-site", "cross-site"):
            r = await v.post(
                "/_signoff/login",
                data={"csrf": token, "token": "mallory-token"},
                headers={"Sec-Fetch-Site": site, "Accept": "application/json"},
            )
            assert r.status_code == 403, r.text[:300]
            assert r.json()["error"]["code"] == "csrf_failed"
            assert "signoff_token" not in r.headers.get("set-cookie", "")
    # The dashboard's own form (same-origin), and a client that sends no such header, sign in.
    for headers in ({"Sec-Fetch-Site": "same-origin"}, {}):
        async with httpx.AsyncClient(
            transport=served.transport, base_url="http://signoff.test"
        ) as b:
            token = _csrf_in((await b.get("/_signoff/login")).text)
            r = await b.post(
                "/_signoff/login", data={"csrf": token, "token": "alice-token"}, headers=headers
            )
            assert r.status_code == 303 and "signoff_token=" in r.headers["set-cookie"]
            assert "alice-token" not in r.headers["set-cookie"]  # a sign-in, never the token


async def test_a_signed_in_form_posted_from_another_site_is_refused(served: Served) -> None:
    """Every dashboard form, not only the sign-in, refuses a post the browser says came from
    another site, even with a valid token and cookie; nothing changes."""
    w = served.world
    c = served.client
    page = await c.get("/_signoff/", headers=auth("alice-token"))
    token = _csrf_in(page.text)
    before = await snapshot(w.rt)
    r = await c.post(
        f"/_signoff/requests/{w.ra}/respond",
        data={"csrf": token, "option": "approve"},
        headers={**auth("alice-token"), "Sec-Fetch-Site": "cross-site", **JSON_REPLY},
    )
    assert r.status_code == 403 and r.json()["error"]["code"] == "csrf_failed", r.text[:300]
    assert await snapshot(w.rt) == before


@pytest.mark.parametrize("token", ["tök€n-1234", " padded ", "tab\there", "new\nline", "\x00"])
def test_a_token_no_request_can_carry_is_refused_up_front(token: str) -> None:
    """A token a header cannot carry as given (not ASCII, a control character, spaces around
    it, which the server strips) could never sign anyone in, and made the dashboard's sign-in a
    500: `TokenAuth` refuses it, without naming it."""
    with pytest.raises(so.UsageError, match="printable ASCII") as caught:
        TokenAuth({token: ALICE})
    assert token.strip() not in str(caught.value)


def test_a_token_auth_error_names_no_part_of_the_token() -> None:
    """Configuration errors end up in logs: they say which token is wrong by position, not by
    any of its characters."""
    with pytest.raises(so.UsageError, match="not a Principal") as caught:
        TokenAuth({"alice-token": ALICE, "s3cret-value": "bob"})  # type: ignore[dict-item]
    assert "s3cr" not in str(caught.value) and "#2" in str(caught.value)


def test_tokens_are_compared_at_one_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """`compare_digest` may return early on a length mismatch, which would time how long each
    configured token is: what it compares is always the same length."""
    lengths: set[tuple[int, int]] = set()
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        lengths.add((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    tokens = TokenAuth(TOKENS)
    assert tokens.lookup("alice-token") == ALICE
    assert tokens.lookup("x") is None and tokens.lookup("y" * 500) is None
    assert tokens.lookup("") is None
    assert lengths == {(32, 32)}, lengths  # whole SHA-256 digests: no prefix decides


async def test_edited_arguments_naming_a_key_twice_are_refused(served: Served) -> None:
    """A reviewer who types a new `"amount": 50` above the old line and approves means 50, but
    JSON parsing keeps the last one (180): the edit is refused, and nothing is approved."""
    w = served.world
    c = served.client
    token = _csrf_in((await c.get("/_signoff/", headers=auth("alice-token"))).text)
    before = await snapshot(w.rt)
    edited = '{"amount": 50, "order_id": "1042", "amount": 180, "reason": "arrived broken"}'
    r = await c.post(
        f"/_signoff/requests/{w.ra}/respond",
        data={"csrf": token, "option": "approve", "edited_input": edited},
        headers={**auth("alice-token"), **JSON_REPLY},
    )
    assert r.status_code == 422, r.text[:300]
    assert r.json()["error"]["code"] == "invalid_answer"
    assert "'amount'" in r.json()["error"]["message"]
    assert await snapshot(w.rt) == before


async def test_edited_arguments_nested_too_deeply_to_read_are_refused(served: Served) -> None:
    """Edited arguments nested past what the JSON parser can read are not JSON to the server:
    a 422 `invalid_answer` (not a 500 from the parser's `RecursionError`), and nothing changes."""
    w = served.world
    c = served.client
    token = _csrf_in((await c.get("/_signoff/", headers=auth("alice-token"))).text)
    before = await snapshot(w.rt)
    r = await c.post(
        f"/_signoff/requests/{w.ra}/respond",
        data={"csrf": token, "option": "approve", "edited_input": deep_json(DEEP).decode()},
        headers={**auth("alice-token"), **JSON_REPLY},
    )
    assert r.status_code == 422, r.text[:300]
    assert r.json()["error"]["code"] == "invalid_answer"
    assert "not JSON" in r.json()["error"]["message"]
    assert await snapshot(w.rt) == before
