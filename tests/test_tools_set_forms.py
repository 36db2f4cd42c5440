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


BEFORE = "0b50568a"
"""The commit before sets were sorted by the validated input (6e200b7d): its forms bound
approvals, and still must where they were the same in every process."""

_FORMS = """
import datetime, json, sys, warnings
warnings.simplefilter("ignore")
from typing import Annotated
from pydantic import AfterValidator, BaseModel, PlainSerializer
import signoff as so

LABELS = ["red", "green", "blue", "amber", "teal", "plum", "ochre", "sand"]
INTS = [8, 1, 17, 9, 100, 3]
Written = Annotated[set[int], PlainSerializer(list)]
WrittenText = Annotated[set[str], PlainSerializer(list)]
Made = Annotated[list[int], AfterValidator(set)]
MadeText = Annotated[list[str], AfterValidator(set)]

class Lot(BaseModel):
    ids: Written
    made: Made

class Box(BaseModel):  # a set the schema declares: the whole form as declared ones were
    tags: set[str]
    ids: Made
    more: Written

def declared_ints(xs: set[int]) -> str: ...
def declared_text(xs: set[str]) -> str: ...
def nested_ints(xs: set[frozenset[int]]) -> str: ...
def nested_text(xs: set[frozenset[str]]) -> str: ...
def written_ints(xs: Written) -> str: ...
def written_text(xs: WrittenText) -> str: ...
def made_ints(xs: Made) -> str: ...
def made_text(xs: MadeText) -> str: ...
def made_dates(xs: Annotated[list[datetime.date], AfterValidator(set)]) -> str: ...
def lots(xs: list[Lot]) -> str: ...
def boxes(xs: list[Box]) -> str: ...
def mixed(xs: set[int], ys: Made, zs: Written) -> str: ...
def keyed(xs: dict[str, frozenset[int]]) -> str: ...
def tuples(xs: tuple[frozenset[int], ...]) -> str: ...

CASES = {
    declared_ints: {"xs": INTS},
    declared_text: {"xs": LABELS},
    nested_ints: {"xs": [[8, 1], [17, 9, 3], [100]]},
    nested_text: {"xs": [LABELS[:4], LABELS[4:]]},
    written_ints: {"xs": INTS},
    written_text: {"xs": LABELS},
    made_ints: {"xs": INTS},
    made_text: {"xs": LABELS},
    made_dates: {"xs": ["2024-05-%02d" % d for d in range(1, 9)]},
    lots: {"xs": [{"ids": INTS, "made": INTS[::-1]}, {"ids": [2, 10], "made": [10, 2]}]},
    boxes: {"xs": [{"tags": LABELS, "ids": INTS, "more": INTS[::-1]}]},
    mixed: {"xs": INTS, "ys": INTS, "zs": INTS},
    keyed: {"xs": {"k": [8, 1], "j": [17, 9, 1]}},
    tuples: {"xs": [[8, 1], [9, 17]]},
}
forms = {}
for fn, raw in CASES.items():
    tool = so.tool(fn)
    forms[fn.__name__] = tool.approved_form(tool.validate(raw))
print(json.dumps(forms))
"""


def _old_source(tmp_path: Path) -> Path:
    """`src` of `BEFORE`, from the repository's history."""
    found = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{BEFORE}^{{commit}}"])
    if found.returncode != 0:
        pytest.skip(f"no git history with {BEFORE} to build the old forms with")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", BEFORE, "src"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive.stdout, check=True)
    return tmp_path / "src"


def _in_process(src: Path, seed: str, code: str, *args: str) -> Any:
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": f"{src}:{ROOT}"}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_forms_stable_before_are_kept_byte_for_byte(tmp_path: Path) -> None:
    """A form the older signoff built alike in every process (sets of numbers: their hashes are
    no seed's) is built the same now, so its approval still binds; only sets whose order was
    another in each process (text, dates, items holding them) are sorted anew."""
    old = {seed: _in_process(_old_source(tmp_path), seed, _FORMS) for seed in ("1", "2")}
    new = {seed: _in_process(ROOT / "src", seed, _FORMS) for seed in ("1", "2")}
    assert new["1"] == new["2"]  # every form now the same in every process
    stable = {name for name, form in old["1"].items() if form == old["2"][name]}
    assert stable == {
        "declared_ints",
        "declared_text",  # declared: by JSON text
        "nested_ints",
        "written_ints",
        "made_ints",
        "lots",
        "boxes",
        "mixed",
        "keyed",
        "tuples",
    }
    for name in stable:
        assert json.dumps(new["1"][name]) == json.dumps(old["1"][name]), name


_ASK_BEFORE = """
import asyncio, json, sys, warnings
warnings.simplefilter("ignore")
from typing import Annotated
from pydantic import AfterValidator, PlainSerializer
import signoff as so
from signoff.testing import call_tools, reply, scripted_agent

ALICE = so.Principal(authenticator="test", principal_id="alice")
INTS = [8, 1, 17, 9, 100, 3]

@so.tool(approval=so.always())
async def nested(xs: set[frozenset[int]]) -> str:
    return repr(sorted(sorted(x) for x in xs))

@so.tool(approval=so.always())
async def written(xs: Annotated[set[int], PlainSerializer(list)]) -> str:
    return repr(sorted(xs))

@so.tool(approval=so.always())
async def made(xs: Annotated[list[int], AfterValidator(set)]) -> str:
    return repr(sorted(xs))

async def main(url, session_id=""):
    proposal = call_tools(
        so.ToolCall(id="c1", name="nested", input={"xs": [[8, 1], [17, 9, 3]]}),
        so.ToolCall(id="c2", name="written", input={"xs": INTS}),
        so.ToolCall(id="c3", name="made", input={"xs": INTS}),
    )
    agent = scripted_agent("a", [proposal, reply("ok")], tools=[nested, written, made])
    async with so.Runtime([agent], store=url) as rt:
        if not session_id:
            r = await rt.generate("a", prompt="go", auth=ALICE)
            print(json.dumps(r.session_id))
            return
        pending = (await rt.state(session_id)).pending_requests()
        approve = [so.Decision(id=p.id, approved=True) for p in pending]
        await rt.generate(session_id=session_id, approvals=approve, auth=ALICE)
        events = [e async for e in rt.events(session_id, follow=False)]
        print(json.dumps([[e.data["status"], e.data["result"]] for e in events
                          if e.type == "tool.completed"]))

asyncio.run(main(*sys.argv[1:]))
"""


def test_an_approval_asked_before_binds_now(tmp_path: Path) -> None:
    """Asked by the older signoff, approved by this one (in a process of another seed): each
    call runs, none "validates now to other input than was approved"."""
    url = f"sqlite:///{tmp_path}/state.db"
    session_id = _in_process(_old_source(tmp_path), "1", _ASK_BEFORE, url)
    done = _in_process(ROOT / "src", "2", _ASK_BEFORE, url, session_id)
    ints = repr(sorted([8, 1, 17, 9, 100, 3]))
    assert done == [["ok", "[[1, 8], [3, 9, 17]]"], ["ok", ints], ["ok", ints]]


@so.tool(approval=so.always())
async def numbered(ids: Annotated[list[int], AfterValidator(set)]) -> str:
    """Number, each once."""
    ran.append(ids)
    return ",".join(map(str, sorted(ids)))


@MADE_WARNS
async def test_an_edit_of_a_set_shown_in_its_own_order_is_no_change(tmp_path: Path) -> None:
    """A set of numbers is shown in its own order, as before ({1, 8} as [8, 1]): an edit giving
    its items in another is the same set, taken."""
    ran.clear()
    proposal = call_tools(so.ToolCall(id="c1", name="numbered", input={"ids": [3]}))
    agent = scripted_agent("a", [proposal, reply("done")], tools=[numbered])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        assert _form(numbered, {"ids": [1, 8]}) == {"ids": [8, 1]}
        edit = so.Decision(id=req.id, approved=True, edited_input={"ids": [1, 8]})
        done = await rt.generate(session_id=r.session_id, approvals=[edit], auth=ALICE)
        assert done.status == "completed", done
    assert ran == [{1, 8}]


def test_which_sets_iterate_alike_in_every_process() -> None:
    """Numbers (an `IntEnum`'s are `int`'s), UUIDs, and tuples and frozensets of them: their
    hashes are no seed's. Text, bytes, dates, a `StrEnum`, NaN (its address) are."""
    import datetime as dt
    import enum
    import uuid

    from signoff._input_sets import _seeded

    class Level(enum.IntEnum):
        LOW = 1

    class Tone(enum.StrEnum):
        RED = "red"

    alike: list[set[Any]] = [
        {1, 2},
        {True},
        {Level.LOW},
        {(1, 2.5)},
        {frozenset({1})},
        {uuid.UUID(int=7)},
    ]
    varying: list[set[Any]] = [
        {"a"},
        {b"a"},
        {Tone.RED},
        {(1, "a")},
        {frozenset({"a"})},
        {dt.date(2024, 5, 1)},
    ]
    assert not any(_seeded(s) for s in alike)
    assert all(_seeded(s) for s in varying + [{float("nan")}])


@pytest.mark.parametrize("version", [(3, 11, 7), (3, 12, 0), (3, 13, 1)])
def test_a_set_holding_none_is_sorted_on_every_python(
    version: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """None's hash was its address before Python 3.12 and is fixed since: a set holding it was
    sorted on 3.11 and shown in its own order on 3.12, so one input had two forms by version.
    It is sorted on every version (the module loaded afresh as each version would load it)."""
    import importlib.util

    monkeypatch.setattr(sys, "version_info", version)
    spec = importlib.util.find_spec("signoff._input_sets")
    assert spec is not None and spec.loader is not None
    fresh = importlib.util.module_from_spec(spec)  # not registered: signoff keeps its own
    spec.loader.exec_module(fresh)
    assert fresh._seeded({None}) and fresh._seeded({8, None, 1})
    assert fresh._seeded({(1, None)}) and not fresh._seeded({8, 1})


def test_an_approval_asked_before_under_a_pinned_seed_binds_now(tmp_path: Path) -> None:
    """A deploy that pins PYTHONHASHSEED: the older signoff showed a set of text a validator made
    (or a serializer wrote) in its own order, the same in each of its processes, so approvals
    ran there. Asked by it and approved by this one, which shows the set sorted, each call runs:
    a set binds by its items, not their order."""
    url = f"sqlite:///{tmp_path}/state.db"
    session_id, shown = _in_process(_old_source(tmp_path), "0", _ASK_OR_APPROVE, url)
    labels = sorted(LABELS)
    assert shown[0]["labels"] != labels and sorted(shown[0]["labels"]) == labels  # its own order
    tagged = ",".join(labels)
    done = _in_process(ROOT / "src", "0", _ASK_OR_APPROVE, url, session_id)
    assert done == [["ok", tagged], ["ok", tagged], ["ok", tagged]]
