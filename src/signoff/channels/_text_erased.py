"""The request a `TextChannel` showed whose session was deleted while no hub delivered to it: a
channel made anew (in a new process) holds nothing of it and the store has nothing left, so the
memo of the request shown keeps what describes it (`described`), and the deletion's entry says
when, by whom and why; the person is told it closed before the next request is shown."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._types import InputRequest
from ..stores._deletions import DELETIONS_STREAM, SESSION_DELETED
from ._base import DELETED, Erased, Resolution, off_loop

if TYPE_CHECKING:
    from .text import TextChannel

__all__ = ["DESCRIBED", "described", "erased_on_show"]

DESCRIBED = "shown_as"
"""The state's memo describing the request on show (the store's keeps it in its `shown` memo)."""

_PAGE = 500  # deletion entries read at once
_UNKNOWN = "the request shown"  # what a memo written before descriptions were kept calls it


def described(request: InputRequest) -> dict[str, Any]:
    """What tells the person which request closed once its session is gone: no input nor
    question (the deletion may be an erasure request), only its kind, agent and tool."""
    return {
        "request_id": request.id,
        "session_id": request.session_id,
        "kind": request.kind,
        "agent": request.agent,
        "tool_name": request.tool_name,
    }


async def _description(ch: TextChannel, request_id: str, in_store: Any) -> dict[str, Any]:
    """The memo describing `request_id`: the store's (`in_store`), else the state's; empty if
    neither describes it (written by an earlier signoff, or since replaced)."""
    for memo in (in_store, await off_loop(ch.recall, DESCRIBED)):
        if isinstance(memo, dict) and memo.get("request_id") == request_id and "kind" in memo:
            return memo
    return {}


def _stand_in(request_id: str, session_id: str, memo: dict[str, Any]) -> InputRequest:
    """The request as the memo describes it, for `render_resolution`; one it does not describe
    as an approval of a tool named for what it is, so the text reads `the request shown was`."""
    kind, tool, agent = memo.get("kind"), memo.get("tool_name"), memo.get("agent")
    if kind not in ("tool-approval", "question", "session-limit") or (
        kind == "tool-approval" and not isinstance(tool, str)
    ):
        kind, tool = "tool-approval", _UNKNOWN
    action = {"call_id": "", "tool_name": tool, "input": None, "input_hash": ""}
    return InputRequest.model_validate(
        {
            "kind": kind,
            "id": request_id,
            "session_id": session_id,
            "turn_id": "",
            "agent": agent if isinstance(agent, str) else "",
            "action": action if kind == "tool-approval" else None,
            "created_at": 0.0,
            "status": "withdrawn",
        }
    )


async def _deletion_of(ch: TextChannel, request_id: str) -> Erased | None:
    """How the deletion that erased `request_id` closed it, from its entry on `store:deletions`
    (None: no entry names it, e.g. one an earlier signoff wrote)."""
    store = ch.runtime.store
    after = 0
    while True:
        entries = await store.audit(stream=DELETIONS_STREAM, after_id=after, limit=_PAGE)
        for e in entries:
            if e.type != SESSION_DELETED:
                continue
            for erased, _ in Erased.from_deletion(e.data, e.at):
                if erased.request_id == request_id:
                    return erased
        if len(entries) < _PAGE:
            return None
        after = entries[-1].id


async def erased_on_show(
    ch: TextChannel, request_id: str, in_store: Any
) -> tuple[InputRequest, Resolution]:
    """The request on show, which the store no longer has, as the memo describes it
    (`in_store`: the store's memo of it, if any), with how its session's deletion closed it
    (when no entry names it: withdrawn now, as deleted)."""
    memo = await _description(ch, request_id, in_store)
    erased = await _deletion_of(ch, request_id)
    if erased is not None:
        return _stand_in(request_id, erased.session_id, memo), erased.resolution
    session_id = memo.get("session_id")
    at = ch.runtime.now()
    resolution = Resolution(request_id=request_id, outcome=DELETED, status="withdrawn", at=at)
    session_id = session_id if isinstance(session_id, str) else ""
    return _stand_in(request_id, session_id, memo), resolution
