"""Ctrl-C while `signoff pending` or `signoff sessions` lays out a long table, or `signoff events`
prints a long log: it stops there, with status 130 and one line, rather than printing it all."""

from __future__ import annotations

import asyncio
import sys

import pytest

import signoff as so
from tests._cli import ROOT, agent, ctrl_c_after, park

# As the console script runs `main`, each table row laid out slowly (10,000 rows take seconds
# to lay out), saying "rendering" on stderr at the first one: the test's SIGINT comes then.
_SCRIPT = """
import sys, time
import signoff.cli._tables as tables
from signoff.cli import main

row = tables._row
said = []

def slow_row(*args, **kwargs):
    if not said:
        said.append(True)
        print("rendering", file=sys.stderr, flush=True)
    time.sleep(0.1)
    return row(*args, **kwargs)

tables._row = slow_row
sys.argv = ["signoff", *sys.argv[1:]]
sys.exit(main())
"""


async def _park(url: str, turns: int) -> None:
    async with so.Runtime([agent], store=url) as rt:
        for _ in range(turns):
            assert (await rt.generate("support", "Refund order 1042")).status == "waiting"


@pytest.mark.parametrize("command", ["pending", "sessions"])
def test_ctrl_c_while_a_listing_is_laid_out_stops_it(store_url: str, command: str) -> None:
    """asyncio's handler only cancelled the command's task, which laying out and printing the
    table never awaits: the whole table came out (about 4 s here), then `interrupted`, 130."""
    asyncio.run(_park(store_url, 40))
    argv = [sys.executable, "-c", _SCRIPT, command, "--limit", "100", "--store", store_url]
    status, out, err = ctrl_c_after(argv, "rendering\n", cwd=ROOT)
    assert (status, out, err) == (130, "", "interrupted\n")  # no row printed


# As above, each event printed slowly (a log of 100,000 events takes seconds to print), the
# first only once the test's SIGINT came (20 s at most): sent 0.2 s after "printing" by a test
# descheduled for longer, it found the first event printed.
_EVENTS_SCRIPT = """
import sys, time
import signoff.cli._events as events
from signoff.cli import main

print_event = events._print
said = []

def slow_print(*args, **kwargs):
    if not said:
        said.append(True)
        print("printing", file=sys.stderr, flush=True)
        time.sleep(20)  # a Ctrl-C ends it, if it ends the printing
    time.sleep(0.2)
    return print_event(*args, **kwargs)

events._print = slow_print
sys.argv = ["signoff", *sys.argv[1:]]
sys.exit(main())
"""


@pytest.mark.parametrize("as_json", [False, True], ids=["table", "json"])
def test_ctrl_c_while_events_print_stops_them(store_url: str, as_json: bool) -> None:
    """Printing a log never awaits between events on SQLite, so the whole log came out after
    the Ctrl-C, then `interrupted`, 130."""
    session_id, _ = park(store_url)
    shape = ["--json"] if as_json else []
    argv = [sys.executable, "-c", _EVENTS_SCRIPT, "events", session_id, *shape]
    status, out, err = ctrl_c_after([*argv, "--store", store_url], "printing\n", cwd=ROOT)
    assert (status, out, err) == (130, "", "interrupted\n")  # no event printed
