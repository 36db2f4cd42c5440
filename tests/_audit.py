"""The audit tests' agent and scenario (a refund only bob may approve, a wipe that expires) and
`alter`, which changes a store's rows behind its back.
"""

import contextlib
import sqlite3
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import signoff as so
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

__all__ = ["ALICE", "BOB", "agent", "alter", "only_bob", "refund", "run_scenario", "wipe"]


ALICE = so.Principal(authenticator="test", principal_id="alice")
BOB = so.Principal(authenticator="test", principal_id="bob")


def only_bob(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
    return so.Allowed() if ctx.response.principal == BOB else so.Rejected("bob approves refunds")


@so.tool(approval=so.ApprovalSpec(request=so.always(), response=only_bob))
async def refund(order_id: str, amount: float) -> dict[str, object]:
    """Refund an order."""
    return {"refunded": amount}


@so.tool(approval=so.always(expires_in=60))
async def wipe(disk: str) -> str:
    """Wipe a disk."""
    return f"wiped {disk}"


def agent() -> so.Agent:
    return scripted_agent(
        "support",
        [
            call_tools(call("refund", order_id="1", amount=50), call("wipe", disk="sda")),
            reply("done"),
        ],
        tools=[refund, wipe],
    )


async def run_scenario(rt: so.Runtime, clock: ManualClock) -> str:
    r = await rt.generate("support", prompt="refund and wipe", auth=ALICE)
    refund_req = next(p for p in r.pending if p.tool_name == "refund")
    # refused by the response policy, then approved by bob with an edit
    await rt.respond(
        r.session_id,
        [so.InputResponse(request_id=refund_req.id, option_id="approve")],
        principal=ALICE,
    )
    await rt.respond(
        r.session_id,
        [
            so.InputResponse(
                request_id=refund_req.id,
                option_id="approve",
                edited_input={"order_id": "1", "amount": 40},
            )
        ],
        principal=BOB,
    )
    clock.advance(61)  # nobody decides the wipe: it expires
    await rt.expire_due()
    assert (await rt.state(r.session_id)).status == "idle"
    return r.session_id


def alter(url: str, sql: str, *params: object) -> None:
    """Write to signoff's tables behind its back (`{t}` and `{p}` as in `query`)."""
    if url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(url[len("sqlite:///") :])) as conn, conn:
            conn.execute(sql.format(t="", p="?"), params)
        return
    import psycopg

    parts = urlsplit(url)
    options = parse_qs(parts.query)
    schema = options.pop("schema", ["signoff"])[0]
    libpq = urlunsplit(parts._replace(query=urlencode(options, doseq=True)))
    with psycopg.connect(libpq) as pg:
        pg.execute(sql.format(t=f'"{schema}".', p="%s").encode(), params)
