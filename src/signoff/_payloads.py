"""The client's payloads: the JSON bodies it sends (answers, approvals) and the `RemoteResult` it
reads back from a call that runs a turn, refused locally as the server would refuse them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import _exceptions as errors
from ._answers import input_responses
from ._results import Outcome
from ._tool_json import key_not_text
from ._types import Decision, InputRequest, InputResponse

__all__ = ["RemoteResult", "decision_body", "encode", "input_responses", "response_body"]


def encode(path: str, body: Any) -> bytes:
    """The body as JSON, refused here (as the server would) when it is not plain JSON text, and
    when it holds a key that is not text, as `Runtime` refuses it: sent, `{1: "a"}` would reach
    the server as `{"1": "a"}`."""
    kind = (
        errors.InvalidAnswer if path.endswith(("/responses", "/approvals")) else errors.UsageError
    )
    try:
        data = json.dumps(body, allow_nan=False, ensure_ascii=False).encode()
    except (TypeError, ValueError, RecursionError) as exc:  # NaN, objects, surrogates, depth
        raise kind(f"the request body is not plain JSON: {type(exc).__name__}: {exc}") from None
    problem = key_not_text(body)
    if problem is not None:
        raise kind(f"the request body is not plain JSON: its {problem}")
    return data


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteResult:
    """What a call that runs a turn returns: like `GenerateResult`, read from JSON."""

    session_id: str
    status: str
    turn_id: str | None
    text: str
    pending: list[InputRequest]
    outcomes: list[Outcome]
    error: dict[str, Any] | None = None
    retryable: bool = False
    replayed: bool = False
    queued: bool = False
    cut_off: str | None = None  # why the latest reply stopped short, as `GenerateResult` says
    cancelled: bool = False  # a cancel's: it recorded the cancel, as `GenerateResult` says

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RemoteResult:
        """The result a server sent; a field of another type is a `ValueError` (a malformed
        answer, `http_error`), not a result that holds it."""
        if not isinstance(data.get("session_id"), str) or not isinstance(data.get("status"), str):
            raise ValueError("it has no session_id and status")
        turn_id, text, error = data.get("turn_id"), data.get("text", ""), data.get("error")
        pending, outcomes = data.get("pending", []), data.get("outcomes", [])
        retryable = data.get("retryable", False)
        if not (
            (turn_id is None or isinstance(turn_id, str))
            and isinstance(text, str)
            and (error is None or isinstance(error, dict))
            and isinstance(pending, list)
            and isinstance(outcomes, list)
            and isinstance(retryable, bool)
        ):
            raise ValueError(
                "its turn_id, text, error, pending, outcomes or retryable is not of its type"
            )
        return cls(
            session_id=data["session_id"],
            status=data["status"],
            turn_id=turn_id,
            text=text,
            pending=[InputRequest.model_validate(r) for r in pending],
            outcomes=[outcome(o) for o in outcomes],
            error=error,
            retryable=retryable,
            replayed=data.get("replayed") is True,
            queued=data.get("queued") is True,
            cut_off=cut if isinstance(cut := data.get("cut_off"), str) else None,
            cancelled=data.get("cancelled") is True,
        )


def outcome(data: Any) -> Outcome:
    """One answer's `Outcome`, as the runtime returns it in process."""
    reason = data.get("reason") if isinstance(data, Mapping) else None
    if not isinstance(data, Mapping) or not (
        isinstance(data.get("request_id"), str)
        and isinstance(data.get("outcome"), str)
        and isinstance(data.get("applied"), bool)
        and (reason is None or isinstance(reason, str))
    ):
        raise ValueError(f"an outcome is not {{request_id, outcome, applied, reason}}: {data!r}")
    return Outcome(
        request_id=data["request_id"],
        outcome=data["outcome"],
        applied=data["applied"],
        reason=reason,
    )


def response_body(resp: InputResponse) -> dict[str, Any]:
    body: dict[str, Any] = {"requestId": resp.request_id}
    for key, name in (
        ("optionId", resp.option_id),
        ("text", resp.text),
        ("value", resp.value),
        ("editedInput", resp.edited_input),
        ("inputHash", resp.input_hash),
    ):
        if name is not None:
            body[key] = name
    return body


def decision_body(dec: Decision) -> dict[str, Any]:
    body: dict[str, Any] = {"id": dec.id, "approved": dec.approved}
    for key, value in (
        ("reason", dec.reason),
        ("value", dec.value),
        ("editedInput", dec.edited_input),
        ("inputHash", dec.input_hash),
    ):
        if value is not None:
            body[key] = value
    return body
