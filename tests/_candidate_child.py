"""Child for the candidate-recovery test: a response policy that dies while it decides.

`python -m tests._candidate_child STORE OUT [--die] [--key KEY] [--quorum]`: parks a turn on an
approval whose response policy SIGKILLs this process on its first evaluation (with --die), after
signoff recorded the response as a pending candidate. STORE is a store URL, or a SQLite file. It
prints the session and request ids before answering: Bob's approval by id, or with --key his
message "approve" sent with that idempotency key. With --quorum the approval needs two votes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Iterable
from typing import Any

import signoff as so

ALICE = so.Principal(authenticator="test", principal_id="alice")
BOB = so.Principal(authenticator="test", principal_id="bob")
CAROL = so.Principal(authenticator="test", principal_id="carol")
DIE = "--die" in sys.argv
KEY = sys.argv[sys.argv.index("--key") + 1] if "--key" in sys.argv else None
QUORUM = "--quorum" in sys.argv


def make_agent(out: str, *, approvers: int = 1, also: Iterable[str] = ()) -> so.Agent:
    """The refund agent: its approval needs `approvers` votes, and its response policy allows
    only Bob's answers, and those of the principal ids in `also`."""
    allowed = {"bob", *also}

    def only_bob(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        if DIE:
            os.kill(os.getpid(), signal.SIGKILL)  # dies mid-evaluation
        ok = ctx.response.principal is not None and ctx.response.principal.principal_id in allowed
        return so.Allowed() if ok else so.Rejected("only bob approves refunds")

    spec = so.ApprovalSpec(request=so.always(), response=only_bob, timeout=1.0, approvers=approvers)

    @so.tool(approval=spec)
    async def refund(ctx: so.ToolContext, order_id: str) -> dict[str, Any]:
        """Refund an order."""
        with open(out, "a") as f:
            f.write(ctx.idempotency_key() + "\n")
        return {"refunded": order_id}

    model = so.models.Scripted(
        [
            so.ModelResponse(tool_calls=[so.ToolCall(name="refund", input={"order_id": "9"})]),
            so.ModelResponse(text="refunded"),
        ]
    )
    return so.Agent(name="support", model=model, tools=[refund])


async def main(store: str, out: str) -> None:
    url = store if "://" in store else f"sqlite:///{store}"
    agent = make_agent(out, approvers=2 if QUORUM else 1)
    async with so.Runtime([agent], store=url) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        rid = r.pending[0].id
        print(json.dumps({"session": r.session_id, "request": rid}), flush=True)
        if KEY is not None:
            await rt.send(r.session_id, "approve", principal=BOB, idempotency_key=KEY)
            return
        answer = so.InputResponse(request_id=rid, option_id="approve", text="checked it")
        await rt.respond(r.session_id, [answer], principal=BOB)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
