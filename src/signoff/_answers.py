"""Answers on their way in: validating a reply against its request and what settling records."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from ._answer_edits import MAX_DEPTH, as_proposed, check_depth, edited_input, first_problems
from ._events import EventType
from ._exceptions import (
    ConflictingAnswer,
    InvalidAnswer,
    RequestClosed,
    StaleAnswer,
    TooLarge,
    UnknownTool,
    UsageError,
)
from ._option_names import how_to_choose, match_option, named_options
from ._results import Outcome
from ._text import is_blank, is_utf8
from ._tool_json import copied, key_not_text, nests_deeper
from ._tools import Tool
from ._types import Decision, InputRequest, InputResponse, Principal, same_json

if TYPE_CHECKING:
    from ._state import SessionState

__all__ = [
    "AUTO_APPROVED",
    "MAX_DEPTH",
    "MAX_PRINCIPAL_BYTES",
    "MAX_TEXT_BYTES",
    "Reply",
    "approved_on_timeout",
    "blank_identity",
    "check_decided",
    "check_asking_tools",
    "check_delegate_tools",
    "check_principal",
    "checked_cancel",
    "check_unambiguous",
    "closed_text",
    "decisions",
    "edit_review",
    "input_responses",
    "match",
    "names_several",
    "principal_too_large",
    "repeat",
    "resolution",
    "settlement_events",
]


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer on its way in: an option id (`approve` / `cancel` for approvals) or text."""

    request_id: str
    option_id: str | None
    text: str | None
    value: Any = None
    edited_input: dict[str, Any] | None = None
    input_hash: str | None = None


def match(request: InputRequest, text: str) -> Reply | None:
    """The answer a typed message gives `request`, if it gives one."""
    option = match_option(request.options, text)
    if option is not None:
        return Reply(request.id, option.id, None)
    if request.kind == "question" and request.allow_text:
        return Reply(request.id, None, text)
    return None


def given_reason(reply: Reply) -> str | None:
    """A decision's reason as recorded and shown to the model: one that shows nothing (`" "`)
    is none, rather than a blank the model is told a person wrote."""
    return None if reply.text is None or is_blank(reply.text) else reply.text


def names_several(request: InputRequest, text: str) -> bool:
    """Whether a typed reply names two or more of `request`'s options (a label that is another
    option's id or number), so it gives no answer one can tell."""
    return len(named_options(request.options, text)) > 1


def check_unambiguous(request: InputRequest, text: str) -> None:
    """Refuse a typed reply that names several options: taken as free text, or as no answer at
    all (a steer), the person would think they had chosen one; they are told how to."""
    named = named_options(request.options, text)
    if len(named) > 1:
        told = how_to_choose(request.options, named)
        raise InvalidAnswer(f"request {request.id}: {told}", [request.id])


def resolution(request: InputRequest, reply: Reply, tool: Tool | None = None) -> dict[str, Any]:
    """What settling `request` with `reply` records; raises InvalidAnswer for a bad reply.

    An approval may carry `edited_input` (validated against the tool's schema, and none where
    it is the call as proposed); any answer may carry the `input_hash` the reviewer saw, and
    one that is not the hash of the call the request is bound to means the reviewer looked at
    another call: it is refused as stale.
    """
    rid = request.id
    if request.kind == "tool-approval":
        if reply.option_id not in ("approve", "cancel"):
            raise InvalidAnswer(
                f"request {rid} is an approval: option_id must be 'approve' or 'cancel' "
                f"(to deny), not {reply.option_id!r}",
                [rid],
            )
        _check_hash(request, reply)
        # Held to Unicode and JSON as typed: a reason of one lone surrogate is blank to
        # given_reason, not valid.
        _check_unicode(rid, reply.text, "the reason")
        _check_json(rid, {}, text=reply.text)
        edited = None
        if reply.edited_input is not None:
            if reply.option_id != "approve":
                raise InvalidAnswer(f"request {rid}: edited input only goes with approve", [rid])
            edited = edited_input(request, reply.edited_input, tool)
        approve = reply.option_id == "approve"
        out: dict[str, Any] = {
            "outcome": "approved" if approve else "cancelled",
            "decision": "approve" if approve else "cancel",
            "reason": given_reason(reply),
            "value": reply.value,
        }
        if edited is not None:
            out["edited_input"] = edited
        _check_json(rid, {**out, "reason": None}, text=out["reason"])
        # As JSON gives it back: a tuple (or an IntEnum) in it reached the live run as it is
        # and a resumed one as a list (an int); both read the recorded value now.
        out["value"] = copied(out["value"])
        return out
    if reply.edited_input is not None:
        raise InvalidAnswer(f"request {rid} is a {request.kind}: it takes no edited input", [rid])
    if reply.input_hash is not None and request.action is None:
        raise InvalidAnswer(
            f"request {rid} is a {request.kind} bound to no call: it takes no input_hash", [rid]
        )
    _check_hash(request, reply)
    # A question records no value, but one given is held to what every answer's value must be.
    _check_json(rid, {"value": reply.value})
    if reply.option_id is not None and reply.text is not None:
        raise InvalidAnswer(f"request {rid}: give option_id or text, not both", [rid])
    if reply.option_id is not None:
        option = next((o for o in request.options if o.id == reply.option_id), None)
        if option is None:
            valid = ", ".join(o.id for o in request.options) or "none (free text only)"
            raise InvalidAnswer(
                f"request {rid} has no option {reply.option_id!r}; options: {valid}", [rid]
            )
        answer = {"value": option.label, "option_id": option.id, "text": None}
    elif reply.text is not None:
        if not request.allow_text:
            raise InvalidAnswer(f"request {rid} takes one of its options, not free text", [rid])
        _check_unicode(rid, reply.text, "the answer text")  # invalid, not blank
        if is_blank(reply.text):  # whitespace, controls or invisible characters say nothing
            raise InvalidAnswer(f"request {rid}: the answer text is empty", [rid])
        answer = {"value": reply.text, "option_id": None, "text": reply.text}
    else:
        raise InvalidAnswer(f"request {rid}: the answer needs an option_id or text", [rid])
    out = {"outcome": "answered", "answer": answer}
    # Free text is recorded twice, as the answer's value and as its text, but it is the person's
    # text once: bounded by `MAX_TEXT_BYTES` as a message is, not at half of it.
    _check_json(
        rid, {**out, "answer": {**answer, "value": None, "text": None}}, text=answer["text"]
    )
    return out


def _check_unicode(rid: str, text: str | None, what: str) -> None:
    """Refuse typed text that holds a lone surrogate, as `check_text` refuses it, before it is
    judged blank or fails as JSON in other words."""
    if text is not None and not is_utf8(text):
        raise InvalidAnswer(f"request {rid}: {NOT_UNICODE.format(what=what)}", [rid])


def _check_hash(request: InputRequest, reply: Reply) -> None:
    """Refuse an answer whose `input_hash` is not that of the call `request` is bound to: the
    reviewer looked at another call (or another version of it). No hash is no check."""
    action = request.action
    if reply.input_hash is not None and (action is None or reply.input_hash != action.input_hash):
        raise StaleAnswer(
            f"request {request.id}: the answer was given for input hash {reply.input_hash}, but "
            f"the request is bound to {action.input_hash if action else 'no call'}",
            [request.id],
        )


MAX_PRINCIPAL_BYTES = 16 << 10
"""The largest principal (identity and attributes) as JSON: it is recorded on every event it
signs, each turn it starts and each answer it gives."""
NOT_UNICODE = "{what} is not valid Unicode text: it holds a lone surrogate"
"""Why text holding a lone surrogate is refused; `what` names it."""
MAX_TEXT_BYTES = 4 << 20
"""The most a person's text may take as UTF-8 (a prompt, a message, an answer with its reason):
the HTTP server's default body limit, so Python and HTTP callers meet the same bound."""


def check_text(text: str, what: str) -> None:
    """Text is stored as UTF-8: a lone surrogate (`"\\ud800"`) cannot be, and is refused, and
    so is text over `MAX_TEXT_BYTES`."""
    try:
        size = len(text.encode())
    except UnicodeEncodeError:
        raise UsageError(NOT_UNICODE.format(what=what)) from None
    if size > MAX_TEXT_BYTES:
        raise TooLarge(f"{what} is {size} bytes, over the limit of {MAX_TEXT_BYTES} bytes")


def check_decided(request: InputRequest) -> None:
    """A decision (approve or deny) answers an approval only: a question whose options happen
    to be `approve` and `cancel` is answered by `respond`, as any other question."""
    if request.kind != "tool-approval":
        raise InvalidAnswer(
            f"request {request.id} is a {request.kind}, not an approval: a decision answers "
            "approvals only; answer it with respond() (over HTTP, POST "
            f"/v1/sessions/{request.session_id}/responses)",
            [request.id],
        )


def check_delegate_tools(
    state: SessionState, delegates: Iterable[str], answers: Iterable[Reply]
) -> None:
    """`UnknownTool` for an answer to one of the session's open mirrors whose delegate call's
    tool is no longer one of its agent's delegate tools (`delegates`) since the call started (a
    deploy renamed or removed it, or made it a plain tool): nothing would drive the subagent on
    to take its result, and the parent's drive cancels the subagent's turn, the answer dropped.
    Refused first instead, nothing recorded."""
    known = list(delegates)
    turn = state.turn
    for answer in answers:
        live = state.requests.get(answer.request_id)
        if turn is None or live is None or live.status != "pending":
            continue
        ref = live.request.child
        call = None if ref is None else turn.calls.get(ref.call_id)
        if ref is None or call is None or call.tool_name in known:
            continue
        has = ", ".join(known) or "none"
        raise UnknownTool(
            f"unknown tool {call.tool_name!r}: request {answer.request_id} was asked for "
            f"delegate call {call.id} of session {state.id!r}, whose agent {state.agent!r} no "
            f"longer has it as a delegate tool (its delegate tools: {has}): nothing would go on "
            "with the call, so the "
            f"answer would not be acted on; answer {ref.agent}'s request {ref.request_id} in "
            f"its session {ref.session_id!r} directly, or cancel session {state.id!r}"
        )


def check_asking_tools(state: SessionState, tools: Iterable[str], answers: Iterable[Reply]) -> None:
    """`UnknownTool` for an answer to a question a call's own body asked (`ctx.ask`) whose tool
    the session's agent (its `tools`, by name) no longer has since the call started (a deploy
    renamed or removed it): nothing would run the body on to take the answer, and the call ends
    without it, after the steps it recorded ran. Refused first instead, nothing recorded, as an
    answer through a delegate call whose tool is gone is (`check_delegate_tools`)."""
    known = list(tools)
    turn = state.turn
    for answer in answers:
        live = state.requests.get(answer.request_id)
        if turn is None or live is None or live.status != "pending":
            continue
        request = live.request
        call = turn.calls.get(request.call_id or "") if request.source == "ask" else None
        if call is None or call.tool_name in known:
            continue
        has = ", ".join(known) or "none"
        raise UnknownTool(
            f"unknown tool {call.tool_name!r}: request {answer.request_id} was asked by call "
            f"{call.id} of session {state.id!r}, whose agent {state.agent!r} no longer has that "
            f"tool (its tools: {has}): nothing would go on with the call, so the answer would "
            f"not be acted on; deploy the tool again to answer it, or cancel session {state.id!r}"
        )


def checked_cancel(
    reason: object, turn_id: object, principal: object
) -> tuple[Principal | None, dict[str, Any] | None]:
    """Refuse a cancel's bad arguments (`UsageError`); who cancels, and as its events record
    them (`by`)."""
    if reason is not None and not isinstance(reason, str):
        raise UsageError(f"reason must be a string, not {type(reason).__name__}")
    if reason is not None:
        check_text(reason, "the reason")
    if turn_id is not None and (not isinstance(turn_id, str) or not turn_id):
        raise UsageError(f"turn_id must be a turn's id (a non-empty string), not {turn_id!r}")
    checked = check_principal(principal, "principal")
    return checked, None if checked is None else checked.model_dump()


def check_principal(value: object, name: str) -> Principal | None:
    """Who acts (`auth`, `principal`) is a `so.Principal` or None, its attributes plain JSON:
    a name or a dict failed only where it was recorded, with an `AttributeError`, attributes
    JSON cannot hold with a bare TypeError or ValueError (and NaN was recorded), attributes
    nested deeper than `MAX_DEPTH` levels failed each request the turn opened. Returns it as a
    plain `Principal` (an app's subclass loses its own fields: what a policy needs goes in
    `attributes`), its attributes as JSON gives them back, as a resumed run reads them (a tuple
    as a list, an IntEnum as an int)."""
    if value is None:
        return None
    if not isinstance(value, Principal):
        raise UsageError(f"{name} must be a so.Principal, not {type(value).__name__}")
    try:
        value = type(value).model_validate(unchecked(value))  # an app's subclass checks itself
        if type(value) is not Principal:
            # Recorded as what every reader reads back: a subclass's own fields were recorded
            # too, and each read of them failed (the session stuck running, an answer lost).
            value = Principal.model_validate({f: getattr(value, f) for f in Principal.model_fields})
    except ValidationError as exc:
        raise UsageError(f"{name} is not a valid so.Principal: {first_problems(exc)}") from None
    problem = blank_identity(value)
    if problem is not None:
        raise UsageError(f"{name} names no one: {problem}")
    problem = principal_too_large(value)
    if problem is not None:
        raise UsageError(f"{name} is {problem}")
    if not value.attributes:
        return value
    if nests_deeper(value.attributes, MAX_DEPTH):
        # pydantic cannot write it past about 250 levels: every request its turn opened failed.
        raise UsageError(f"{name}'s attributes nest deeper than {MAX_DEPTH} levels")
    try:
        text = json.dumps(value.attributes, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise UsageError(f"{name}'s attributes are not plain JSON: {exc}") from None
    problem = key_not_text(value.attributes)  # recorded, it would read back as text
    if problem is not None:
        raise UsageError(f"{name}'s attributes are not plain JSON: their {problem}")
    return value.model_copy(update={"attributes": json.loads(text)})


def principal_too_large(principal: Principal) -> str | None:
    """Why `principal` is too large to record, if it is: it is stored on every event it signs,
    so one over `MAX_PRINCIPAL_BYTES` as JSON (its attributes most likely) is refused."""
    try:
        size = len(json.dumps(principal.model_dump(), ensure_ascii=False, default=repr).encode())
    except (ValueError, RecursionError, UnicodeEncodeError):
        return None  # not JSON at all: refused as such where it is checked
    if size <= MAX_PRINCIPAL_BYTES:
        return None
    return (
        f"{size} bytes as JSON, over the limit of {MAX_PRINCIPAL_BYTES} bytes (a principal is "
        "recorded on every event it signs: keep only the attributes a policy reads)"
    )


def blank_identity(principal: Principal) -> str | None:
    """What makes `principal` name no one, if anything: a blank `principal_id` or
    `authenticator` (an authenticator that read a missing header as ""), which would make every
    such caller one person, counted as a voter and answering the others' requests. Blank as a
    typed answer is (`is_blank`): a zero-width space alone shows no one either."""
    for field in ("authenticator", "principal_id"):
        if is_blank(getattr(principal, field)):
            return f"its {field} is blank"
    return None


def _check_json(rid: str, resolution: dict[str, Any], text: str | None = None) -> None:
    """What is recorded must be plain JSON: no NaN or infinity, nothing unserialisable, text
    that is valid Unicode, nested at most `MAX_DEPTH` levels, so every reader can parse it.
    What the person gave is at most `MAX_TEXT_BYTES` in all: their typed `text` (checked for
    Unicode by the caller, kept out of `resolution`) as UTF-8, as a message's text is counted,
    however JSON escapes it; a value and an edited input as JSON."""
    check_depth(rid, resolution.get("value"))
    check_depth(rid, resolution.get("edited_input"))
    size = 0 if text is None else len(text.encode())
    try:
        for key, part in resolution.items():
            dumped = json.dumps(part, allow_nan=False, ensure_ascii=False).encode()
            if key in ("value", "edited_input") and part is not None:
                size += len(dumped)
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError (a lone surrogate) is one
        raise InvalidAnswer(
            f"request {rid}: the answer is not plain JSON text: {exc}", [rid]
        ) from None
    if size > MAX_TEXT_BYTES:
        raise InvalidAnswer(
            f"request {rid}: the answer is {size} bytes, over the limit of {MAX_TEXT_BYTES}", [rid]
        )


def repeat(
    request: InputRequest, status: str, resolution: dict[str, Any] | None, wanted: dict[str, Any]
) -> Outcome:
    """A second answer to a closed request: a no-op if it repeats the first, else an error."""
    first = resolution or {}
    rid = request.id
    if status != "settled":
        told = closed_text(request, status, first.get("outcome"), first.get("on_timeout"))
        raise RequestClosed(told, [rid])
    recorded = first.get("edited_input")
    if recorded is not None and as_proposed(request, recorded):
        recorded = None  # recorded as an edit before a form posted back unchanged was none
    edited = same_json(recorded, wanted.get("edited_input"))
    if request.kind == "tool-approval":  # an approval of other edited input approves another call
        same = edited
        if request.source == "tool" and request.approvers <= 1:
            # Its decision's value is the call's result. Under a quorum the settlement holds
            # the last voter's: an earlier voter's retry of their own answer is no conflict.
            same = same and same_json(first.get("value"), wanted.get("value"))
    else:
        same = same_json(first.get("answer"), wanted.get("answer"))
    same = same and first.get("outcome") == wanted["outcome"]
    if not same:

        def shown(outcome: object) -> str:  # a deny's outcome is `cancelled`: say it is one
            denied = request.kind == "tool-approval" and outcome == "cancelled"
            return f"{outcome!r} (denied)" if denied else repr(outcome)

        says = f"says {shown(wanted['outcome'])}"
        if first.get("outcome") == wanted["outcome"]:
            says = "differs"
            if request.kind == "tool-approval":
                says = "has another value" if edited else "has other edited input"
        raise ConflictingAnswer(
            f"request {rid} was already settled as {shown(first.get('outcome'))}; "
            f"this answer {says}",
            [rid],
        )
    return Outcome(request_id=rid, outcome=str(first.get("outcome")), applied=False)


AUTO_APPROVED = "was approved automatically when its deadline passed (on_timeout='approve')"
"""How a call its deadline approved closed: `expired`, yet approved by no one to run (a
guardrail asked again as it would start may still deny it)."""


def approved_on_timeout(request: InputRequest, outcome: object, on_timeout: object) -> bool:
    """Whether `request` closed as its passed deadline approved it (`on_timeout="approve"`):
    recorded `expired`, but the call was approved to run (a guardrail may still deny it as it
    would start), which a late answer is told rather than `expired`."""
    return request.kind == "tool-approval" and outcome == "expired" and on_timeout == "approve"


def closed_text(request: InputRequest, status: str, outcome: object, on_timeout: object) -> str:
    """What an answer to `request`, closed as `status` (`outcome`) and not settled, is told:
    a call its deadline approved was approved automatically, not expired as one it denied."""
    rid = request.id
    if approved_on_timeout(request, outcome, on_timeout):
        return f"request {rid} {AUTO_APPROVED}; it takes no answers"
    how = f" ({outcome})" if outcome not in (None, status) else ""  # said when it says more
    return f"request {rid} is {status}{how}; it takes no answers"


def edit_review(answer: Mapping[str, Any]) -> dict[str, Any]:
    """The `auto()` review of an answer's edited input (`auto(review_edits=True)`), as the
    approval's events record it: its `auto_verdict` and `auto_reason`, if it had one."""
    return {k: answer[k] for k in ("auto_verdict", "auto_reason") if k in answer}


def settlement_events(
    request: InputRequest, reply: Reply, resolution: dict[str, Any]
) -> list[tuple[EventType, dict[str, Any]]]:
    by = resolution.get("by")
    if request.kind != "tool-approval":
        return [
            (
                "input.resolved",
                {
                    "request_id": request.id,
                    "outcome": "answered",
                    "status": "settled",
                    "by": by,
                    "answer": resolution["answer"],
                },
            )
        ]
    return [
        (
            "approval.settled",
            {
                "request_id": request.id,
                "call_id": request.call_id,
                "decision": resolution["decision"],
                "by": by,
                "reason": given_reason(reply),
                "value": resolution.get("value"),
                "edited_input": resolution.get("edited_input"),
                "approved_by": resolution.get("approved_by"),
                **edit_review(resolution),
            },
        ),
        (
            "input.resolved",
            {
                "request_id": request.id,
                "outcome": resolution["outcome"],
                "status": "settled",
                "by": by,
                "reason": given_reason(reply),
            },
        ),
    ]


def decisions(approvals: Iterable[Decision | Mapping[str, Any]]) -> list[Decision]:
    if isinstance(approvals, (str, bytes, Mapping, Decision)) or not isinstance(
        approvals, Iterable
    ):
        raise InvalidAnswer("approvals must be a list of decisions")
    out = []
    for i, raw in enumerate(approvals):
        if isinstance(raw, Decision):
            raw = unchecked(raw)
        try:
            out.append(Decision.model_validate(raw))
        except ValidationError as exc:
            rid = raw.get("id") if isinstance(raw, Mapping) else None
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'decision'}: {e['msg']}"
                for e in exc.errors(include_url=False)
            )
            raise InvalidAnswer(
                f"approval #{i + 1} is malformed: {problems}", [rid] if isinstance(rid, str) else []
            ) from None
    return out


def unchecked(model: BaseModel) -> dict[str, Any]:
    """`model`'s fields, to be validated again: `model_copy(update=)` and `model_construct`
    skip pydantic's checks, and a decision copied with `approved="false"` would approve."""
    return dict(model)


def input_responses(responses: Iterable[InputResponse | Mapping[str, Any]]) -> list[InputResponse]:
    """The answers `respond` was given, as `InputResponse`s; a malformed one is `InvalidAnswer`
    naming its problems, and a decision (`id`, `approved`) says where decisions go."""
    if isinstance(responses, (str, bytes, Mapping, InputResponse)) or not isinstance(
        responses, Iterable
    ):
        raise InvalidAnswer("responses must be a list of InputResponse")
    out = []
    for i, raw in enumerate(responses):
        if isinstance(raw, InputResponse):
            raw = unchecked(raw)
        if isinstance(raw, Decision) or (isinstance(raw, Mapping) and "approved" in raw):
            rid = raw.id if isinstance(raw, Decision) else raw.get("id", raw.get("request_id"))
            raise InvalidAnswer(
                f"response #{i + 1} is a decision (id, approved): respond takes "
                "InputResponse(request_id=..., option_id='approve' or 'cancel', text=reason); "
                "pass decisions to generate(approvals=...) instead",
                [rid] if isinstance(rid, str) else [],
            )
        try:
            out.append(InputResponse.model_validate(raw))
        except ValidationError as exc:
            rid = raw.get("request_id") if isinstance(raw, Mapping) else None
            raise InvalidAnswer(
                f"response #{i + 1} is malformed: {first_problems(exc)}",
                [rid] if isinstance(rid, str) else [],
            ) from None
    if not out:
        raise InvalidAnswer("no responses given")
    return out
