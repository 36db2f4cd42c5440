"""A tool taking a set of hashable models or dataclasses (`set[Item]`, `Item` a frozen model):
pydantic validates its input, but its Python dump, which `Tool.validate` checks (`unwritable`),
fails (a set of dicts: "unhashable type"), so every call was invalid input and the model retried
for nothing. Such a set is dumped as its items' dumps now (`python_dump`): the tool runs, gated
too, approved in another process of another hash seed."""

# No `from __future__ import annotations`: the tools' hints name types local to a test.
import dataclasses
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

import signoff as so
from signoff._input_sets import SetItems, python_dump
from signoff.testing import call_tools, reply, scripted_agent, sqlite_runtime, tool_results

from ._approved_elsewhere import approved_elsewhere

ALICE = so.Principal(authenticator="test", principal_id="alice")
SKUS = ["teal", "red", "amber", "plum", "sand", "blue", "ochre", "green"]
ran: list[Any] = []


class Item(BaseModel):
    model_config = ConfigDict(frozen=True)
    sku: str
    tags: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class Pt:
    x: int
    y: float = 0.0


@so.tool
async def order(items: set[Item]) -> str:
    """Order items."""
    ran.append(items)
    return ",".join(sorted(i.sku for i in items))


@so.tool
async def plot(points: frozenset[Pt]) -> str:
    """Plot points."""
    ran.append(points)
    return ",".join(str(p.x) for p in sorted(points, key=lambda p: p.x))


@so.tool(approval=so.always())
async def gated_order(items: set[Item], rush: bool = False) -> str:
    """Order items, once approved."""
    return ",".join(sorted(i.sku for i in items)) + (" rush" if rush else "")


def _items(skus: list[str]) -> list[dict[str, Any]]:
    return [{"sku": s, "tags": [s.upper(), s]} for s in skus]


async def test_a_set_of_models_or_dataclasses_runs(tmp_path: Path) -> None:
    """Each call ran its body: it was invalid input ("unhashable type: 'dict'")."""
    ran.clear()
    calls = call_tools(
        so.ToolCall(id="c1", name="order", input={"items": _items(["b", "a"])}),
        so.ToolCall(id="c2", name="plot", input={"points": [{"x": 2}, {"x": 1, "y": 0.5}]}),
    )
    agent = scripted_agent("a", [calls, reply("done")], tools=[order, plot])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed", r
        messages = (await rt.state(r.session_id)).messages or []
    results = tool_results(messages)
    assert [(t.is_error, t.content) for t in results] == [(False, "a,b"), (False, "1,2")]
    assert ran == [
        {Item(sku="b", tags=frozenset({"B", "b"})), Item(sku="a", tags=frozenset({"A", "a"}))},
        frozenset({Pt(2), Pt(1, 0.5)}),
    ]


def test_its_form_is_sorted_whatever_the_order_given() -> None:
    """The approved form lists the set's items by their JSON text, sets in them sorted too: the
    same form (and hash) in each process, whatever order a set's own iteration gives."""
    forms = [
        gated_order.shown_form(gated_order.validate({"items": _items(skus)}))
        for skus in (SKUS, list(reversed(SKUS)))
    ]
    by_text = sorted(SKUS)  # by JSON text: no sku here begins another
    assert (
        forms[0]
        == forms[1]
        == {
            "items": [{"sku": s, "tags": sorted([s.upper(), s])} for s in by_text],
            "rush": False,
        }
    )


def test_a_gated_set_of_models_is_approved_in_another_process(tmp_path: Path) -> None:
    """Asked under one hash seed, approved under another: the call runs as approved."""
    url = f"sqlite:///{tmp_path}/state.db"
    given = {"items": _items(SKUS), "rush": True}
    done = approved_elsewhere(url, __name__, "gated_order", given, seeds=("1", "2"))
    assert done == f"ok {','.join(sorted(SKUS))} rush"


def test_its_checks_still_see_inside_the_set() -> None:
    """What JSON cannot write is still found in an item of such a set: NaN, as pydantic reads
    "NaN", would reach a reviewer as null."""
    try:
        plot.validate({"points": [{"x": 1, "y": "NaN"}]})
    except ValidationError as exc:
        [error] = exc.errors()
    else:
        raise AssertionError("NaN taken")
    assert (error["type"], error["loc"]) == ("finite_number", ("points", 0, "y"))


def test_the_dump_keeps_what_pydantic_dumps_elsewhere() -> None:
    """Only a set pydantic cannot dump is its items' dumps (`SetItems`); each other field, an
    alias, an excluded field and a secret as `model_dump` gives them."""

    class Shown(BaseModel):
        items: set[Item]
        key: SecretStr
        label: str = Field(serialization_alias="Label")
        hidden: int = Field(default=0, exclude=True)
        plain: set[int] = Field(default_factory=set)

    shown = Shown(items=_items(["a"]), key="k", label="x", plain=[1])
    dumped = python_dump(shown, by_alias=True)
    assert type(dumped["items"]) is SetItems
    assert dumped["items"] == [{"sku": "a", "tags": frozenset({"A", "a"})}]
    assert isinstance(dumped.pop("key"), SecretStr)
    assert dumped == {"items": dumped["items"], "Label": "x", "plain": {1}}
    assert python_dump(shown, include={"label"}) == {"label": "x"}


def test_a_set_of_models_may_be_a_default() -> None:
    """Its default was checked by its dump at `@tool`, which raised a bare `TypeError`."""

    def stocked(items: frozenset[Item] = frozenset({Item(sku="a")})) -> str:
        """Stock."""
        return ""

    made = so.tool(stocked)
    assert made.approved_form(made.validate({})) == {"items": [{"sku": "a", "tags": []}]}


async def test_an_edit_of_such_a_set_may_give_its_items_in_any_order(tmp_path: Path) -> None:
    """Its items in another order are no change of the call; other items are an edit it runs."""
    done: list[str] = []
    for edited in (_items(list(reversed(SKUS))), _items(["zz", "a"])):
        proposal = call_tools(
            so.ToolCall(id="c1", name="gated_order", input={"items": _items(SKUS)})
        )
        agent = scripted_agent("a", [proposal, reply("ok")], tools=[gated_order])
        async with sqlite_runtime(tmp_path / str(len(done)), agent) as rt:
            r = await rt.generate("a", prompt="go", auth=ALICE)
            edit = so.Decision(id=r.pending[0].id, approved=True, edited_input={"items": edited})
            r = await rt.generate(session_id=r.session_id, approvals=[edit], auth=ALICE)
            assert r.status == "completed", r
            events = [e async for e in rt.events(r.session_id, follow=False)]
        [result] = [e.data["result"] for e in events if e.type == "tool.completed"]
        done.append(result if isinstance(result, str) else result["result"])
    assert done == [",".join(sorted(SKUS)), "a,zz"]
