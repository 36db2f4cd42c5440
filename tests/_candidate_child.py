"""Child for the candidate-recovery test: a response policy that dies while it decides.

`python -m tests._candidate_child DB OUT [--die] [--key KEY]`: parks a turn on an approval whose
response policy SIGKILLs this process on its first evaluation (with --die), after signoff
recorded the response as a pending candidate. It prints the session and request ids before
answering: Bob's approval by id, or with --key his message "approve" sent with that idempotency
key.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

import signoff as so

ALICE = so.Principal(authenticator="test", principal_id="alice")
BOB = so.Principal(authenticator="test", principal_id="bob")
DIE = "--die" in sys.argv
KEY = sys.argv[sys.argv.index("--key") + 1] if "--key" in sys.argv else None


def only_bob(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
    if DIE:
        os.kill(os.getpid(), signal.SIGKILL)  # dies mid-evaluation
    ok = ctx.response.principal is not None and ctx.response.principal.principal_id == "bob"
    return so.Allowed() if ok else so.Rejected("only bob approves refunds")


def make_agent(out: str) -> so.Agent:
    @so.tool(approval=so.ApprovalSpec(request=so.always(), response=only_bob, timeout=1.0))
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


async def main(db: str, out: str) -> None:
    async with so.Runtime([make_agent(out)], store=f"sqlite:///{db}") as rt:
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
