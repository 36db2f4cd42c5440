"""Ctrl-C while `approve`, `deny` or `answer` records an answer: the one line says whether the
answer was recorded, and how the turn goes on, on both stores; one it cannot tell (the store
failed meanwhile) says so, and the command still ends as Ctrl-C does, 130."""

from __future__ import annotations

import json
import shlex
import sys

import pytest

import signoff as so
from signoff.cli._app import store_args
from tests._cli import ROOT, agent, ctrl_c_after, log

# Run as the console script runs `main`, with `Runtime.respond` slowed in this interpreter only:
# it says "recording" (before) or "recorded" (after the answer is stored) on stderr, then sleeps
# there until the test's SIGINT. With `fail_reads`, every store read after that fails, as when
# the database goes away.
_SCRIPT = """
import asyncio, json, sys
import signoff._runtime
from signoff import StoreUnavailable
from signoff.cli import main

case = json.loads(sys.argv[1])
respond = signoff._runtime.Runtime.respond

async def slow_respond(self, *args, **kwargs):
    if case["when"] == "before":
        print("recording", file=sys.stderr, flush=True)
        await asyncio.sleep(60)
    result = await respond(self, *args, **kwargs)
    if case["fail_reads"]:
        async def down(*args, **kwargs):
            raise StoreUnavailable(case["message"])
        type(self.store).get_request = down
    print("recorded", file=sys.stderr, flush=True)
    await asyncio.sleep(60)
    return result

signoff._runtime.Runtime.respond = slow_respond
sys.argv = ["signoff", *case["argv"]]
sys.exit(main())
"""


def _park(url: str) -> tuple[str, str]:
    rt = so.Runtime([agent], store=url)
    try:
        r = rt.generate_sync("support", "Refund order 1042")
        assert r.status == "waiting"
        return r.session_id, r.pending[0].id
    finally:
        rt.close_sync()


def _ctrl_c(
    argv: list[str], when: str, fail_reads: bool = False, message: str = ""
) -> tuple[int, str, str]:
    """Run `signoff ARGV`, send SIGINT once its answer is being recorded (`before`) or stored
    (`after`), and return its status, stdout and stderr after the marker."""
    case = json.dumps({"argv": argv, "when": when, "fail_reads": fail_reads, "message": message})
    marker = "recording\n" if when == "before" else "recorded\n"
    return ctrl_c_after([sys.executable, "-c", _SCRIPT, case], marker, cwd=ROOT)


@pytest.mark.parametrize(("command", "outcome"), [("approve", "approved"), ("deny", "cancelled")])
def test_ctrl_c_after_a_recorded_answer_says_it_was_recorded(
    store_url: str, command: str, outcome: str
) -> None:
    """`approve REQ` without a runtime only records the answer: a Ctrl-C once it is stored said
    a bare "interrupted", leaving the person to wonder whether to answer again. Its chat hint
    names the store typed (6646e220), as the message of an answer not interrupted does: without
    it, run as printed, chat opened another store."""
    session_id, request_id = _park(store_url)
    status, out, err = _ctrl_c([command, request_id, "--store", store_url], "after")
    assert status == 130, err
    on = "".join(f" {shlex.quote(arg)}" for arg in store_args(store_url))
    assert err == (
        f"interrupted: {request_id} is {outcome}, recorded; the turn continues when a process "
        "running agent 'support' picks it up: a signoff worker or signoff serve of its runtime "
        f"does so by itself, or signoff chat MODULE:RUNTIME --session {session_id}{on}\n"
    ), err
    assert out == ""
    assert "approval.settled" in [e.type for e in log(store_url, session_id)]


def test_ctrl_c_before_the_answer_is_recorded_says_it_is_still_pending(store_url: str) -> None:
    session_id, request_id = _park(store_url)
    status, out, err = _ctrl_c(["approve", request_id, "--store", store_url], "before")
    assert (status, out, err) == (130, "", f"interrupted: {request_id} is still pending\n")
    assert "approval.settled" not in [e.type for e in log(store_url, session_id)]


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        (
            "connection refused\n(is the server running?)",
            "connection refused (is the server running?)",
        ),
        # Printed as it is: the line escaped it as markup, then printed it with markup off, so
        # it showed backslashes before brackets and `[none][/none]` around colons.
        ("[bold]db[/] :thumbs_up: down\x1b[2J", "[bold]db[/] :thumbs_up: down\\x1b[2J"),
    ],
    ids=["driver", "markup"],
)
@pytest.mark.parametrize("target", [None, "tests._cli:agent"], ids=["record-only", "runtime"])
def test_a_store_failing_as_ctrl_c_is_handled_still_exits_130_and_says_so(
    store_url: str, target: str | None, message: str, shown: str
) -> None:
    """The Ctrl-C handler reads the store to tell whether the answer stands: when that read
    failed, the command exited 1 with the store's error alone, as if nothing had been typed."""
    _, request_id = _park(store_url)
    argv = ["approve", request_id, *([target] if target else []), "--store", store_url]
    status, out, err = _ctrl_c(argv, "after", fail_reads=True, message=message)
    assert status == 130, err
    assert err == (
        f"interrupted: whether {request_id} was recorded is unknown, as the store failed: "
        f"StoreUnavailable: {shown}; signoff pending shows it while it is still open\n"
    ), err
    assert out == ""
