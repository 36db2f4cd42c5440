"""A `Runtime` entry point given an agent name or a session id that is not text says so as a
`UsageError` (as the HTTP client does), not as an agent or session it does not know."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import signoff as so

from .test_server_common import ALICE, make_agents

CALLS: dict[str, Callable[[so.Runtime, Any, str], Awaitable[Any]]] = {
    "generate": lambda rt, bad, sid: rt.generate(bad, prompt="Refund order 1042"),
    "generate-session": lambda rt, bad, sid: rt.generate(bad, prompt="hi", session_id=sid),
    "schedule": lambda rt, bad, sid: rt.schedule(bad, prompt="Refund order 1042"),
    "create_session": lambda rt, bad, sid: rt.create_session(bad),
}


@pytest.mark.parametrize("bad", [5, ["support"], b"support"], ids=["int", "list", "bytes"])
@pytest.mark.parametrize("call", list(CALLS))
async def test_an_agent_name_that_is_not_text_is_a_usage_error(
    tmp_path: Path, call: str, bad: Any
) -> None:
    """`generate(5, ...)` raised `UnknownAgent` ("unknown agent 5"), and with a session id a
    "belongs to agent 'support'" that blamed the session: a wrong type is misuse, said as such."""
    async with so.Runtime(make_agents(), store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        sid = (await rt.generate("support", prompt="Refund order 1042", auth=ALICE)).session_id
        with pytest.raises(so.UsageError, match="agent must be text") as caught:
            await CALLS[call](rt, bad, sid)
        assert not isinstance(caught.value, so.UnknownAgent)
        assert type(bad).__name__ in str(caught.value)


async def _first(events: AsyncIterator[so.Event]) -> None:
    async for _ in events:
        break


SESSION_CALLS: dict[str, Callable[[so.Runtime, Any], Awaitable[Any]]] = {
    "generate": lambda rt, bad: rt.generate(prompt="hi", session_id=bad),
    "send": lambda rt, bad: rt.send(bad, "hi"),
    "respond": lambda rt, bad: rt.respond(
        bad, [so.InputResponse(request_id="req_1", option_id="approve")]
    ),
    "state": lambda rt, bad: rt.state(bad),
    "events": lambda rt, bad: _first(rt.events(bad)),
    "cancel": lambda rt, bad: rt.cancel(bad),
}


@pytest.mark.parametrize("call", list(SESSION_CALLS))
async def test_a_session_id_that_is_not_text_is_a_usage_error(tmp_path: Path, call: str) -> None:
    """Checked already: kept so, beside the agent names."""
    async with so.Runtime(make_agents(), store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        with pytest.raises(so.UsageError, match="session_id must be text, not int"):
            await SESSION_CALLS[call](rt, 5)
