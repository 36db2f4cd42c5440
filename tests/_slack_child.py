"""Child process for the Slack crash tests: a channel hub that posts the open requests to Slack.

`python -m tests._slack_child STORE_URL RECORDS STATE SLACK_URL` starts a `ChannelHub` with one
`SlackChannel` (channel C42 of the fake Slack at SLACK_URL) on the channel state file STATE,
which posts the requests open in the store, polls once and prints one JSON line with the
messages it saved. The parent SIGKILLs it while Slack answers a post, to leave a post that
Slack has and the state does not.

With `--interaction BODY_FILE` it then hands the interaction in BODY_FILE (signed now, as Slack
signs) to the channel's endpoint (its Events API endpoint with `--events`), prints the answer
Slack would get (`acknowledged`) and SIGKILLs itself before the event loop runs anything else:
a process dying right after Slack had its 200, before the settling it started in the
background.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels.slack import SlackChannel

from ._procs import make_agent
from ._slack_signing import SECRET, sign


async def run(args: argparse.Namespace) -> None:
    async with so.Runtime([make_agent(args.records)], store=args.store) as rt:
        slack = SlackChannel(
            "C42", token="xoxb-test", base_url=args.slack_url, signing_secret=SECRET
        )
        hub = ChannelHub(rt, [slack], state=args.state, claim_ttl=args.claim_ttl)
        await hub.start(follow=False)
        try:
            await hub.poll()
            saved = dict(slack.memos("msg:"))
            if args.interaction is not None:
                body = Path(args.interaction).read_bytes()
                handle = slack.handle_event if args.events else slack.handle
                answer = await handle(body, sign(body, int(time.time())))
                sys.stdout.write(json.dumps({"event": "acknowledged", "answer": answer}) + "\n")
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            await hub.stop()
    sys.stdout.write(json.dumps({"event": "posted", "memos": saved}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests._slack_child")
    parser.add_argument("store")
    parser.add_argument("records")
    parser.add_argument("state")
    parser.add_argument("slack_url")
    parser.add_argument("--interaction", help="a file with an interaction's form body")
    parser.add_argument(
        "--events", action="store_true", help="the file holds an Events API delivery instead"
    )
    parser.add_argument("--claim-ttl", type=float, default=30.0, help="the hub's claim_ttl")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
