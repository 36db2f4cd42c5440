"""The `/v1` REST API and its event stream."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Header, Path, Query, Request
from starlette.responses import StreamingResponse

from .._deadlines import stored_after_deadline
from .._exceptions import UnknownRequest
from .._mirrors import followed, stored_followed
from .._types import Decision, InputResponse, Principal
from ..stores import PendingFilter
from ..stores._base import created_before
from ._context import ServerContext, get_context
from ._errors import ERROR_RESPONSES, ApiError
from ._json_response import JSONText
from ._models import (
    Approvals,
    CancelBody,
    CreateSession,
    DeleteBody,
    Deleted,
    GenerateBody,
    PruneBody,
    Pruned,
    QueuePage,
    RequestRecord,
    Responses,
    SendMessage,
    SessionPage,
    SessionView,
    TurnResult,
    idle_result,
    session_page,
    session_view,
    turn_result,
    without_inputs,
)
from ._route import ApiRoute
from ._sse import event_stream, parse_last_event_id, stream_response

__all__ = ["router"]

# JSONText: a stored lone surrogate is escaped, not a 500 (FastAPI's own JSON path refuses it).
router = APIRouter(
    prefix="/v1",
    responses=ERROR_RESPONSES,
    route_class=ApiRoute,
    default_response_class=JSONText,
)

MAX_SEQ = 2**53  # bounds numbers a store (and JSON) can hold exactly

SessionId = Annotated[str, Path(description="The session's id (`ses_…`).")]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=200,
        pattern=r"^[!-~](?:[ -~]*[!-~])?$",
        description="Makes the call safe to retry: a repeat with the same key (by the same "
        "caller) starts or sends nothing and answers with the turn the first call's message "
        "went to, as that turn stands now (`replayed` true); the same key with another agent "
        "or message, or another `turnPolicy`, is a 409 `idempotency_key_reused`. 1 to 200 "
        "printable ASCII characters, with no space at either end.",
    ),
]


async def _caller(request: Request) -> tuple[ServerContext, Any]:
    ctx = get_context(request)
    return ctx, await ctx.require(request)


def _no_null(schema: dict[str, Any]) -> None:
    """The schema of an optional body: an object when one is sent, never `null`."""
    schema["anyOf"] = [s for s in schema.get("anyOf", ()) if s.get("type") != "null"]


def _object_or_none(body: object, sent: bytes) -> None:
    """422 `invalid_request` for an optional body sent as JSON `null`, which FastAPI reads as
    no body: one that is sent must be an object."""
    if body is None and sent:
        problem = "the body must be a JSON object, not null"
        raise ApiError(
            422, "invalid_request", problem, fields=[{"field": "body", "problem": problem}]
        )


@router.post("/sessions", status_code=201, tags=["sessions"])
async def create_session(
    request: Request, body: CreateSession, idempotency_key: IdempotencyKey = None
) -> TurnResult:
    """Open a session with an agent; with a `message`, run its first turn until it completes
    or waits for a person."""
    ctx, caller = await _caller(request)
    rt = ctx.runtime
    if body.agent not in rt.agents:
        known = ", ".join(sorted(rt.agents)) or "none"
        raise ApiError(
            422, "unknown_agent", f"unknown agent {body.agent!r}; this server has: {known}"
        )
    if body.message is None:
        sid, replayed = await rt._open(body.agent, caller, idempotency_key)
        if replayed:
            await _replayed_to(ctx, sid, caller)
        return idle_result(await rt._state(sid), replayed=replayed)
    result = await rt.generate(
        body.agent, prompt=body.message, auth=caller, idempotency_key=idempotency_key
    )
    if result.replayed and not await _replayed_to(ctx, result.session_id, caller):
        # Its creator, whom the rule shows it no more: the call is told it happened, not
        # what the turn said or asked since (a GET of the session is 404 to them).
        result = dataclasses.replace(
            result, text="", pending=[], outcomes=[], error=None, cut_off=None
        )
    return turn_result(result)


async def _replayed_to(ctx: ServerContext, session_id: str, caller: Principal) -> bool:
    """Whether the caller may see the session a key replays: a 404 for another's (a key given
    before keys were scoped to exact identities) they may not; its creator is told of it,
    whatever the access rule shows them (a submit-only client retries its POST), but False
    when the rule hides it from them."""
    state = await ctx.runtime._state(session_id)
    if state.initiator is None or not state.initiator.same_as(caller):
        await ctx.session(session_id, caller)
        return True
    return await ctx._may_see(caller, state.initiator)


@router.post("/sessions/{session_id}/messages", tags=["sessions"])
async def send_message(
    request: Request,
    session_id: SessionId,
    body: SendMessage,
    idempotency_key: IdempotencyKey = None,
) -> TurnResult:
    """Send a message: it answers the open request it matches, steers the turn (`steer`), or
    waits for the turn to end (`queue`). To a subagent whose parent, or a session above that,
    passed its TTL with its turn unfinished, a message answering no open request is 409
    `subagent_orphaned`: its conversation is over."""
    ctx, caller = await _caller(request)
    await ctx.session(session_id, caller)
    result = await ctx.runtime.send(
        session_id,
        body.text,
        principal=caller,
        turn_policy=body.turn_policy,
        idempotency_key=idempotency_key,
    )
    return turn_result(result)


@router.post("/sessions/{session_id}/responses", tags=["requests"])
async def respond(request: Request, session_id: SessionId, body: Responses) -> TurnResult:
    """Answer requests by id (an `optionId`, or `text`), then continue the turn if it can."""
    ctx, caller = await _caller(request)
    with ctx.runtime._counts.refusing():  # a refused answer, as the runtime counts its own
        await ctx.session(session_id, caller)
    responses = [
        InputResponse(
            request_id=r.request_id,
            option_id=r.option_id,
            text=r.text,
            value=r.value,
            edited_input=r.edited_input,
            input_hash=r.input_hash,
        )
        for r in body.input_responses
    ]
    result = await ctx.runtime.respond(session_id, responses, principal=caller)
    return turn_result(result)


@router.post("/sessions/{session_id}/approvals", tags=["requests"])
async def approvals(request: Request, session_id: SessionId, body: Approvals) -> TurnResult:
    """Settle every pending request of the session at once, with decisions, and continue; a
    question open is refused as unanswered (422 `partial_answer`): answer it at `/responses`."""
    ctx, caller = await _caller(request)
    with ctx.runtime._counts.refusing():
        await ctx.session(session_id, caller)
    decisions = [
        Decision(
            id=a.id,
            approved=a.approved,
            reason=a.reason,
            value=a.value,
            edited_input=a.edited_input,
            input_hash=a.input_hash,
        )
        for a in body.approvals
    ]
    result = await ctx.runtime.generate(
        body.agent, session_id=session_id, approvals=decisions, auth=caller
    )
    return turn_result(result)


@router.post("/sessions/{session_id}/generate", tags=["sessions"])
async def generate(
    request: Request,
    session_id: SessionId,
    body: Annotated[GenerateBody | None, Body(json_schema_extra=_no_null)] = None,
    idempotency_key: IdempotencyKey = None,
) -> TurnResult:
    """Run the session's next turn with `message` until it completes or waits for a person, as
    `Runtime.generate(session_id=...)` does: refused while a turn runs (409 `session_busy`) or
    waits on a request (422 `partial_answer`), and while a turn a retry can resume waits for
    it, unless the caller is the person it serves (409 `session_busy`). Without a message,
    resume the session's turn (a retry after a failure; a subagent's failed turn its parent no
    longer waits on is 409 `subagent_orphaned`, as is a message to a subagent whose parent, or
    a session above that, passed its TTL with its turn unfinished)."""
    _object_or_none(body, await request.body())
    ctx, caller = await _caller(request)
    await ctx.session(session_id, caller)
    body = body or GenerateBody()
    result = await ctx.runtime.generate(
        body.agent,
        body.message,
        session_id=session_id,
        auth=caller,
        idempotency_key=idempotency_key,
    )
    return turn_result(result)


@router.get("/sessions", tags=["sessions"])
async def list_sessions(
    request: Request,
    agent: Annotated[str | None, Query(description="Only this agent's sessions.")] = None,
    status: Annotated[
        Literal["idle", "running", "waiting", "failed", "cancelled"] | None,
        Query(description="Only sessions in this status (a passed TTL reads `failed`)."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
) -> SessionPage:
    """The sessions the caller may see, most recently active first, paginated, with the
    total (`Runtime.sessions`)."""
    ctx, caller = await _caller(request)
    rows, total = await ctx.visible_sessions(
        caller, agent=agent, status=status, limit=limit, offset=offset
    )
    return session_page(rows, total, limit, offset)


@router.get("/sessions/{session_id}", tags=["sessions"])
async def get_session(request: Request, session_id: SessionId) -> SessionView:
    """The session's state and its pending requests (a mirror as its subagent's request
    stands: `Runtime.state`)."""
    ctx, caller = await _caller(request)
    return session_view(await ctx.session(session_id, caller, shown=True))


@router.post("/sessions/{session_id}/cancel", tags=["sessions"])
async def cancel(
    request: Request,
    session_id: SessionId,
    body: Annotated[CancelBody | None, Body(json_schema_extra=_no_null)] = None,
) -> TurnResult:
    """Cancel the running or waiting turn (with `turn_id`, only that one); its open requests
    are withdrawn."""
    _object_or_none(body, await request.body())
    ctx, caller = await _caller(request)
    await ctx.session(session_id, caller)
    reason, turn_id = (None, None) if body is None else (body.reason, body.turn_id)
    return turn_result(
        await ctx.runtime.cancel(session_id, reason, principal=caller, turn_id=turn_id)
    )


@router.delete("/sessions/{session_id}", tags=["sessions"])
async def delete_session(
    request: Request,
    session_id: SessionId,
    body: Annotated[DeleteBody | None, Body(json_schema_extra=_no_null)] = None,
) -> Deleted:
    """Delete the session, and its subagents' sessions, with everything the store keeps of
    them; the deletion is recorded in the audit trail (`store:deletions`). Whoever may cancel
    it may delete it. A turn running is 409 `session_busy`, one waiting on people 409
    `session_waiting` (cancel it first, or where that fails, `force` it), a subagent's session
    409 `subagent_session`."""
    _object_or_none(body, await request.body())
    ctx, caller = await _caller(request)
    await ctx.session(session_id, caller)
    reason, force = (None, False) if body is None else (body.reason, body.force)
    deleted = await ctx.runtime.delete_session(session_id, by=caller, reason=reason, force=force)
    return Deleted(deleted=deleted)


@router.post("/prune", tags=["sessions"])
async def prune(request: Request, body: PruneBody) -> Pruned:
    """Retention (`Runtime.prune`), for admins only (403 `admin_only`: it deletes every tenant's
    sessions; under an app's own access rule, for no caller): delete the finished top-level
    sessions last active more than `olderThan` seconds ago, oldest first, at most `limit`
    (10,000 at most), each with its subagents' sessions and its own `store:deletions` entry
    naming the caller; `dryRun` lists them, deleting nothing. `listed`: those it tried (a
    session it skips takes no place in the batch); `more`: more were old enough past the last
    it tried, left for another run; `damaged`: those it could not read (a damaged row), logged
    and left, the others deleted all the same."""
    ctx, caller = await _caller(request)
    if not ctx.sees_every_request(caller):
        # Under an access rule of the app's own, no caller is known to see every session.
        raise ApiError(
            403,
            "admin_only",
            "pruning deletes every tenant's sessions: an admin's token does it, under the "
            "default access rule (with an app's own rule, prune with `signoff prune`)",
        )
    deleted, listed, more, damaged = await ctx.runtime._prune(
        older_than=body.older_than,
        by=caller,
        reason=body.reason,
        limit=body.limit,
        agent=body.agent,
        dry_run=body.dry_run,
    )
    return Pruned(deleted=deleted, listed=listed, more=more, damaged=list(damaged))


@router.get(
    "/sessions/{session_id}/events",
    tags=["sessions"],
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "Server-Sent Events: `id` is the event's seq, `event` its type, "
            "`data` its JSON.",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        }
    },
)
async def events(
    request: Request,
    session_id: SessionId,
    after: Annotated[
        int, Query(ge=0, le=MAX_SEQ, description="Send the events after this seq.")
    ] = 0,
    follow: Annotated[bool, Query(description="Keep the stream open for new events.")] = True,
    shown: Annotated[
        int | None,
        Query(
            ge=1,
            le=MAX_SEQ,
            description="The seq of the last event the client read, which it reads again to "
            "check it: a session whose last event is before it is refused, as a store that "
            "lost commits.",
        ),
    ] = None,
    last_event_id: Annotated[
        str | None,
        Header(description="Set by a reconnecting client; takes precedence over `after`."),
    ] = None,
) -> StreamingResponse:
    """The session's events as Server-Sent Events, from the store; resumable. A followed
    stream ends with a `stream.end` event when the session can have no more events."""
    ctx, caller = await _caller(request)
    state = await ctx.session(session_id, caller)
    start = after
    if last_event_id is not None and last_event_id.strip():
        parsed = parse_last_event_id(last_event_id)
        if parsed is None:
            raise ApiError(
                422, "invalid_request", f"Last-Event-ID must be an event seq, not {last_event_id!r}"
            )
        if parsed > MAX_SEQ:
            raise ApiError(422, "invalid_request", f"Last-Event-ID must be in 0..{MAX_SEQ}")
        start = parsed
    if max(start, shown or 0) > state.seq:
        # Not an id this session has sent: a followed stream would wait, silent, until the
        # session caught up, and skip every event before it. A client checking an event it
        # read asks from the one before, so a store one event short still has its start.
        raise ApiError(
            422,
            "invalid_request",
            f"{max(start, shown or 0)} is past the session's last event ({state.seq}); "
            "resume from an id it sent",
        )
    if follow and start >= state.seq:  # not ended while a drive runs its turn on past the TTL
        ended = await ctx.runtime._ended(state, ctx.runtime.now())
        if ended is not None:
            # Nothing more will come: a 410 stops a reconnecting EventSource, which a stream
            # that merely ends again would not.
            raise ended
    release = ctx.streams.take(caller)  # last: a refusal above holds no slot
    stream = event_stream(request, ctx, session_id, start, follow=follow, head=state.seq)
    return stream_response(stream, release)


@router.get("/requests", tags=["requests"])
async def list_requests(
    request: Request,
    agent: Annotated[str | None, Query(description="Only this agent's requests.")] = None,
    tool: Annotated[str | None, Query(description="Only approvals of this tool.")] = None,
    kind: Annotated[Literal["tool-approval", "question", "session-limit"] | None, Query()] = None,
    status: Annotated[Literal["pending", "settled", "expired", "withdrawn"], Query()] = "pending",
    older_than: Annotated[
        float | None,
        Query(
            ge=0,
            allow_inf_nan=False,
            description="Only requests at least this many seconds old: a number in plain "
            "decimal digits (`90`, `1.5`, `1e3`; not `+5`, `1_0` or ` 5`).",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
    inputs: Annotated[
        bool,
        Query(
            description="false: each request's `action.input` and `payload` are sent as null "
            "(its `action.input_hash` as it is), a page of calls with megabytes of arguments "
            "a few kilobytes; `GET /v1/requests/{request_id}` has all of one."
        ),
    ] = True,
) -> QueuePage:
    """The approval queue across sessions (oldest first), paginated, with the total."""
    ctx, caller = await _caller(request)
    rt = ctx.runtime
    flt = PendingFilter(
        agent=agent,
        tool_name=tool,
        kind=kind,
        status=status,
        created_before=created_before(rt.now(), older_than),
        limit=limit,
        offset=offset,
    )
    items, total = await ctx.visible_requests(caller, flt)
    if not inputs:
        items = [without_inputs(r) for r in items]
    return QueuePage(items=items, total=total, limit=limit, offset=offset)


@router.get("/requests/{request_id}", tags=["requests"])
async def get_request(
    request: Request, request_id: Annotated[str, Path(description="The request's id (`req_…`).")]
) -> RequestRecord:
    """One request, open or closed, with how it was resolved."""
    ctx, caller = await _caller(request)
    try:
        stored = await ctx.request(request_id, caller)
    except UnknownRequest:
        raise ApiError(
            404, "unknown_request", f"unknown request {request_id!r}", request_ids=[request_id]
        ) from None
    if stored.status == "pending":  # a mirror as its subagent's request stands, deadline too
        now = ctx.runtime.now()
        [shown] = await followed(ctx.runtime.store, [stored.request], now)
        stored = stored_after_deadline(stored_followed(stored, shown), now)
    return RequestRecord(
        request=stored.request,
        status=stored.status,
        outcome=stored.outcome,
        resolution=stored.resolution,
    )
