"""Child process for the tests of how `serve` stops the turns a Slack click resumed:
`signoff.server.serve` of the `napper` agent, whose approved tool naps a minute, with one
`SlackChannel` (channel C42 of the fake Slack at SLACK_URL) on the channel state file STATE.

`python -m tests._slack_serve_child STORE_URL STATE SLACK_URL PORT`; a Ctrl-C ends it with
status 130, as it does `signoff serve`.
"""

from __future__ import annotations

import argparse
import asyncio

import signoff as so
from signoff.channels.slack import SlackChannel
from signoff.server import serve

from ._slack_signing import SECRET


@so.tool(approval=so.always())
async def nap(seconds: float) -> str:
    """Sleep a while, once approved."""
    await asyncio.sleep(seconds)
    return "rested"


napper = so.Agent(
    name="napper",
    model=so.models.Scripted(
        [
            so.ModelResponse(tool_calls=[so.ToolCall(name="nap", input={"seconds": 60})]),
            so.ModelResponse(text="Rested."),
        ]
    ),
    tools=[nap],
)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests._slack_serve_child")
    parser.add_argument("store")
    parser.add_argument("state")
    parser.add_argument("slack_url")
    parser.add_argument("port", type=int)
    args = parser.parse_args()
    slack = SlackChannel("C42", token="xoxb-test", base_url=args.slack_url, signing_secret=SECRET)
    runtime = so.Runtime([napper], store=args.store)
    try:
        serve(runtime, port=args.port, channels=[slack], channel_state=args.state)
    except KeyboardInterrupt:  # as `signoff serve` ends on Ctrl-C
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
