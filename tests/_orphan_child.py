"""Child for the orphan-sweep crash test: a child session created as its parent moved to a new
turn, and this process killed while it cleans that child up.

`python -m tests._orphan_child STORE_URL`: the parent's delegate call stalls before it creates
the child session; meanwhile its lease lapses and another runtime cancels the parent's turn and
runs a new one, which fails. The call then creates the child with its turn started (its row
made as the new turn is the parent's current one), and would find its own turn stopped and
cancel the child's (`abandon_child`): the store's fault hook SIGKILLs this process right after
the child's creation is committed. It prints the parent's and the child's ids first.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

import signoff as so
from signoff import _child_sessions, _subagents
from signoff.testing import call, call_tools, reply, scripted_agent

ALICE = so.Principal(authenticator="test", principal_id="alice")


def agents() -> list[so.Agent]:
    """A parent that delegates a refund (then its model fails), and the billing agent."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    def down(conversation: list[so.Message]) -> so.ModelResponse:
        raise RuntimeError("the model is down")

    child = scripted_agent(
        "billing",
        [call_tools(call("issue_refund", order_id="1042")), reply("Refund done.")],
        tools=[issue_refund],
    )
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Refund order 1042")), down],
        tools=[so.delegate("billing")],
    )
    return [parent, child]


async def main(url: str) -> None:
    async with so.Runtime(agents(), store=url) as rt, so.Runtime(agents(), store=url) as other:
        sid = await rt.create_session("support", auth=ALICE)
        held: dict[str, tuple[str, int]] = {}
        acquire = rt._acquire

        async def acquired(session_id: str, owner: str, wait: float | None = None) -> int | None:
            token = await acquire(session_id, owner, wait)
            if token is not None:
                held[session_id] = (owner, token)
            return token

        rt._acquire = acquired  # type: ignore[method-assign]
        on_grant = rt._on_grant

        async def granted(ahead: Any, token: int | None, asked: float) -> None:
            # The lease the commit of the message's turn granted the call's drive.
            await on_grant(ahead, token, asked)
            if token is not None:
                held[ahead.session_id] = (ahead.owner, token)

        rt._on_grant = granted  # type: ignore[method-assign]
        create = _subagents.RuntimeHost.create_child

        async def create_child(
            host: _subagents.RuntimeHost,
            agent: str,
            parent: str,
            key: str,
            *,
            turn: str | None = None,
            task: tuple[str, dict[str, Any] | None, str] | None = None,
        ) -> str:
            # This process stalls here: its lease lapses (given back, as the store would let
            # another take it), and another process cancels the turn and runs a new one.
            await rt.store.release_lease(sid, *held[sid])
            await other.cancel(sid, "changed my mind")
            again = await other.generate(session_id=sid, prompt="Try again", auth=ALICE)
            assert again.status == "failed", again
            child = _child_sessions.child_id(key)
            print(json.dumps({"parent": sid, "child": child}), flush=True)

            def kill(when: str, label: str) -> None:
                if (when, label) == ("after", "session.created"):  # with the child's turn
                    os.kill(os.getpid(), signal.SIGKILL)

            rt.store.set_fault_hook(kill)
            return await create(host, agent, parent, key, turn=turn, task=task)

        setattr(_subagents.RuntimeHost, "create_child", create_child)  # noqa: B010 (a method)
        result: Any = await rt.generate(session_id=sid, prompt="Refund", auth=ALICE)
        print(json.dumps({"survived": result.status}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
