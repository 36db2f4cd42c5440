"""A set in what a tool hands back (its result, a step's, an approval's payload) is written as a
list in one order whatever the process: sorted, numbers by value and text as text, other items
by their JSON text. Its own order is another in each process (hash randomization), so a call
run again after a crash, or in another process, recorded another result than the first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import signoff as so
from signoff._tool_json import json_size, jsonable, over_limit

from ._cli import ROOT

ALICE = so.Principal(authenticator="test", principal_id="alice")
LABELS = ["red", "green", "blue", "amber", "teal", "plum", "ochre", "sand"]


class Tagged(BaseModel):
    name: str
    tags: set[str]


@dataclass(frozen=True)
class Pin:
    labels: frozenset[str]


def _value() -> dict[str, Any]:
    """A value holding sets wherever a result may: in dicts, lists, tuples, models, dataclasses
    and other sets."""
    return {
        "labels": set(LABELS),
        "ids": frozenset({3, 10, 2, 100, -7, 2.5}),
        "mixed": {1, "a", None, (2, "b"), False},
        "nested": frozenset({frozenset(LABELS[:4]), frozenset(LABELS[4:]), frozenset()}),
        "listed": [set(LABELS[:3]), (set(LABELS[3:6]),)],
        "model": Tagged(name="x", tags=set(LABELS)),
        "pin": Pin(labels=frozenset(LABELS)),
        "keys": {None: set(LABELS[:5])},
    }


@so.tool
async def tags(ctx: so.ToolContext) -> Any:
    """Tags."""
    stepped = await ctx.step("labels", lambda: set(LABELS))
    return {**_value(), "stepped": stepped}


@so.tool
async def ask() -> str:
    """Ask."""
    raise so.ApprovalRequired({"labels": set(LABELS), "value": _value()})


_RUN = """
import asyncio, json, sys
import signoff as so
from signoff.testing import call_tools, reply, scripted_agent
from tests.test_tool_json import ALICE, ask, tags

async def main(url):
    proposal = call_tools(so.ToolCall(id="c1", name="tags"), so.ToolCall(id="c2", name="ask"))
    agent = scripted_agent("a", [proposal, reply("ok")], tools=[tags, ask])
    async with so.Runtime([agent], store=url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        events = [e async for e in rt.events(r.session_id, follow=False)]
        [done] = [e.data for e in events if e.type == "tool.completed"]
        steps = [e.data for e in events if e.type == "step.completed"]
        print(json.dumps([done["result"], [s["result"] for s in steps], r.pending[0].payload]))

asyncio.run(main(sys.argv[1]))
"""


def test_a_set_is_recorded_in_one_order_whatever_the_process(tmp_path: Path) -> None:
    """The same result, step and payload recorded by processes of three hash seeds: each
    recorded its sets of text in an order of its own before."""

    def run(seed: str) -> Any:
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
        url = f"sqlite:///{tmp_path}/{seed}.db"
        done = subprocess.run(
            [sys.executable, "-c", _RUN, url], env=env, cwd=ROOT, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    first = run("1")
    assert run("2") == first and run("3") == first
    result, steps, payload = first
    assert result["labels"] == sorted(LABELS) and payload["labels"] == sorted(LABELS)
    assert result == {**jsonable(_value()), "stepped": sorted(LABELS)}
    assert payload["value"] == jsonable(_value())


def test_a_sets_items_are_sorted_by_value_or_else_by_their_json() -> None:
    """Text as text and numbers by value; items of mixed kinds, which do not compare, by their
    JSON text, which always does: `"a"`, `1`, `(2, "b")` as `[2, "b"]`, `false`, `null`."""
    form = jsonable(_value())
    assert form["labels"] == sorted(LABELS)
    assert form["ids"] == [-7, 2, 2.5, 3, 10, 100]
    assert form["mixed"] == ["a", 1, [2, "b"], False, None]
    assert form["nested"] == [sorted(LABELS[:4]), sorted(LABELS[4:]), []]  # `]` after `"`
    assert form["listed"] == [sorted(LABELS[:3]), [sorted(LABELS[3:6])]]
    assert form["model"] == {"name": "x", "tags": sorted(LABELS)}
    assert form["pin"] == {"labels": sorted(LABELS)}
    assert form["keys"] == {"null": sorted(LABELS[:5])}
    assert jsonable({"x": {float("nan"), 1.5}}) == {"x": [1.5, None]}  # NaN as JSON writes it
    assert jsonable(frozenset()) == [] and jsonable(set("ba")) == ["a", "b"]


@pytest.mark.parametrize("char", ["x", '"', "\n", "é", "€", "😀", "\ud800", "\x01", "\x1f"])
def test_a_string_is_over_a_limit_exactly_when_its_json_is(char: str) -> None:
    """Strings were let through unmeasured at up to 4 bytes a character: a control character
    is 6 as JSON (`\\u0001`), so 999 of them, 5,996 bytes, passed a bound of 4,000."""
    for limit in (4000, 4001, 4002, 4003, 4004, 4005):
        # Around where each size of character (1 to 6 bytes) fills the limit.
        for n in {(limit - 2) // k + d for k in range(1, 7) for d in range(-2, 3)}:
            value = char * n
            assert (over_limit("it is", value, limit) is None) == (json_size(value) <= limit)
