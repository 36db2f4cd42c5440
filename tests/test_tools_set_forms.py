"""A set the validated input holds is shown, and its approval bound, sorted whatever the JSON
schema says (`Tool.approved_form`, `sets_sorted`): only a set the schema declared (an array of
`uniqueItems`) was, so one a validator made (`AfterValidator(set)`) or a serializer wrote as
`list(s)` was shown in its own order, another in each process (hash randomization), and an
approval answered in another process (a worker, a server restarted since) never ran: "validates
now to other input than was approved"."""

# No `from __future__ import annotations`: the tools' hints name types local to a test.
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, BaseModel, PlainSerializer

import signoff as so
from signoff.testing import call_tools, reply, scripted_agent, sqlite_runtime

from ._cli import ROOT

ALICE = so.Principal(authenticator="test", principal_id="alice")
LABELS = ["red", "green", "blue", "amber", "teal", "plum", "ochre", "sand"]
ODD = ["b", "a!", "a b", "a"]  # by JSON text `"a b"` comes first, by text `"a"`
ran: list[Any] = []

# A set of a list's schema warns as pydantic writes it; the form is a list all the same.
MADE_WARNS = pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")


@so.tool(approval=so.always())
async def made(labels: Annotated[list[str], AfterValidator(set)]) -> str:
    """Label, each label once."""
    ran.append(labels)
    return ",".join(sorted(labels))


@so.tool(approval=so.always())
async def written(labels: Annotated[set[str], PlainSerializer(list, return_type=list[str])]) -> str:
    """Label."""
    ran.append(labels)
    return ",".join(sorted(labels))


class _Batch(BaseModel):
    name: str
    labels: Annotated[set[str], PlainSerializer(list, return_type=list[str])]


@so.tool(approval=so.always())
async def batched(batches: list[_Batch]) -> str:
    """Label batches."""
    return ";".join(",".join(sorted(b.labels)) for b in batches)


_ASK_OR_APPROVE = """
import asyncio, json, sys, warnings
warnings.simplefilter("ignore")
import signoff as so
from signoff.testing import call_tools, reply, scripted_agent
from tests.test_tools_set_forms import ALICE, LABELS, batched, made, written

async def main(url, session_id=""):
    proposal = call_tools(
        so.ToolCall(id="c1", name="made", input={"labels": LABELS}),
        so.ToolCall(id="c2", name="written", input={"labels": LABELS}),
        so.ToolCall(id="c3", name="batched", input={"batches": [{"name": "x", "labels": LABELS}]}),
    )
    agent = scripted_agent("a", [proposal, reply("ok")], tools=[made, written, batched])
    async with so.Runtime([agent], store=url) as rt:
        if not session_id:
            r = await rt.generate("a", prompt="go", auth=ALICE)
            print(json.dumps([r.session_id, [p.input for p in r.pending]]))
            return
        pending = (await rt.state(session_id)).pending_requests()
        approve = [so.Decision(id=p.id, approved=True) for p in pending]
        await rt.generate(session_id=session_id, approvals=approve, auth=ALICE)
        events = [e async for e in rt.events(session_id, follow=False)]
        done = [e.data for e in events if e.type == "tool.completed"]
        print(json.dumps([[d["status"], d["result"]] for d in done]))

asyncio.run(main(*sys.argv[1:]))
"""


def test_a_set_a_validator_makes_is_approved_in_another_process(tmp_path: Path) -> None:
    """Asked in a process of one hash seed, approved in one of another: each call runs."""
    url = f"sqlite:///{tmp_path}/state.db"

    def run(seed: str, *args: str) -> Any:
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
        code = [sys.executable, "-c", _ASK_OR_APPROVE, url, *args]
        done = subprocess.run(code, env=env, cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    session_id, shown = run("1")
    labels = sorted(LABELS)
    tagged = ",".join(labels)
    assert run("2", session_id) == [["ok", tagged], ["ok", tagged], ["ok", tagged]]
    assert shown == [
        {"labels": labels},
        {"labels": labels},
        {"batches": [{"name": "x", "labels": labels}]},
    ]


def _form(tool: so.Tool, raw: dict[str, Any]) -> Any:
    return tool.approved_form(tool.validate(raw))


def test_a_set_the_schema_declares_is_shown_as_before() -> None:
    """By each item's JSON text, as a form bound by an older signoff was: its hash still binds
    the call. So too where a serializer writes it only as JSON (the Python dump is a set)."""

    def declared(labels: set[str], more: frozenset[int] = frozenset()) -> str:
        """Label."""
        return ""

    def sorted_as_json(
        labels: Annotated[set[str], PlainSerializer(sorted, when_used="json")],
    ) -> str:
        """Label."""
        return ""

    by_json = ["a b", "a!", "a", "b"]
    tool = so.tool(declared, approval=so.always())
    assert _form(tool, {"labels": ODD, "more": [9, 10, 2]}) == {
        "labels": by_json,
        "more": [10, 2, 9],
    }
    assert _form(so.tool(sorted_as_json), {"labels": ODD}) == {"labels": by_json}


def test_a_serializer_that_sorts_keeps_its_order() -> None:
    """Its form was the same in every process before, and is not changed."""

    def ordered(
        labels: Annotated[set[str], PlainSerializer(sorted)],
        ids: Annotated[set[int], PlainSerializer(sorted)],
    ) -> str:
        """Label."""
        return ""

    form = _form(so.tool(ordered), {"labels": ODD, "ids": [10, 9, 100]})
    assert form == {"labels": sorted(ODD), "ids": [9, 10, 100]}


@MADE_WARNS
def test_a_set_a_validator_makes_is_sorted_as_a_results_set_is() -> None:
    """Text as text and numbers by value (`in_order`); in a model in a list, or under a key
    that is not text, too."""

    def numbers(ids: Annotated[list[int], AfterValidator(frozenset)]) -> str:
        """Number."""
        return ""

    def grouped(groups: dict[int, Annotated[set[str], PlainSerializer(list)]]) -> str:
        """Group."""
        return ""

    assert _form(made, {"labels": ODD}) == {"labels": sorted(ODD)}
    assert _form(written, {"labels": ODD}) == {"labels": sorted(ODD)}
    assert _form(so.tool(numbers), {"ids": [100, 9, 10]}) == {"ids": [9, 10, 100]}
    groups = {"groups": {"1": ODD, "20": LABELS}}
    assert _form(so.tool(grouped), groups) == {"groups": {"1": sorted(ODD), "20": sorted(LABELS)}}
    batches = {"batches": [{"name": "x", "labels": ODD}, {"name": "y", "labels": LABELS}]}
    assert _form(batched, batches) == {
        "batches": [{"name": "x", "labels": sorted(ODD)}, {"name": "y", "labels": sorted(LABELS)}]
    }


def test_a_sets_items_that_are_sets_are_sorted_too() -> None:
    """Each in its own order before, though the outer set was sorted: another form in each
    process. The outer set, which the schema declares, still by its items' JSON text."""

    def nested(groups: set[frozenset[str]]) -> str:
        """Group."""
        return ""

    form = _form(so.tool(nested), {"groups": [ODD, ["z", "y"], ["x", "w"]]})
    assert form == {"groups": [sorted(ODD), ["w", "x"], ["y", "z"]]}


async def test_an_edit_of_a_validators_set_may_give_its_items_in_any_order(tmp_path: Path) -> None:
    """The form comes back sorted: that is no change of the reviewer's edit."""
    ran.clear()
    proposal = call_tools(so.ToolCall(id="c1", name="written", input={"labels": ["x"]}))
    agent = scripted_agent("a", [proposal, reply("done")], tools=[written])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        edit = so.Decision(id=req.id, approved=True, edited_input={"labels": ODD})
        done = await rt.generate(session_id=r.session_id, approvals=[edit], auth=ALICE)
        assert done.status == "completed", done
    assert ran == [set(ODD)]


def test_plain_input_holds_no_set_to_look_for() -> None:
    """What JSON alone validates to has no set: its form is taken as it is, each call."""
    from signoff._input_sets import may_hold_sets  # here: code without it fails this test alone

    class Line(BaseModel):
        sku: str
        qty: int = 1

    def plain(order: str, lines: list[Line], note: str | None = None, tags: list[str] = []) -> str:  # noqa: B006
        """Order."""
        return ""

    assert not may_hold_sets(so.tool(plain).input_model.__pydantic_core_schema__)
    for tool in (made, written, batched):
        assert may_hold_sets(tool.input_model.__pydantic_core_schema__)
