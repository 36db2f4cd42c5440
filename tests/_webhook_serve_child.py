"""Child process for the tests of how `serve` stops with webhook deliveries unsent:
`signoff.server.serve` of the `refunder` agent (whose refund waits for approval) with one
`WebhookChannel` posting to RECEIVER (each attempt bounded by a minute) on the channel state
file STATE.

`python -m tests._webhook_serve_child STORE_URL STATE RECEIVER PORT`; a Ctrl-C ends it with
status 130, as it does `signoff serve`.
"""

from __future__ import annotations

import argparse

import signoff as so
from signoff.channels import WebhookChannel
from signoff.server import serve
from signoff.testing import call, call_tools, reply, scripted_agent

SECRET = "whsec_stop_7c2d"
TIMEOUT = 60.0  # an attempt's bound, and how long a graceful stop waits for the queues


@so.tool(approval=so.always())
async def refund(order_id: str) -> str:
    """Refund an order, once approved."""
    return "refunded"


refunder = scripted_agent(
    "refunder", [call_tools(call("refund", order_id="1042")), reply("Done.")], tools=[refund]
)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests._webhook_serve_child")
    parser.add_argument("store")
    parser.add_argument("state")
    parser.add_argument("receiver")
    parser.add_argument("port", type=int)
    args = parser.parse_args()
    hooks = WebhookChannel(args.receiver, SECRET, timeout=TIMEOUT)
    runtime = so.Runtime([refunder], store=args.store)
    try:
        serve(runtime, port=args.port, channels=[hooks], channel_state=args.state)
    except KeyboardInterrupt:  # as `signoff serve` ends on Ctrl-C
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
