"""Whether an approved call runs with the input approved (`_bound_input`): a value generated for
what the model left out (a `default_factory`) is the one the reviewer saw, also when a validator
reorders or reshapes the model's input or a secret has a fixed default; a deploy that changes
what the input validates to is still refused."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator, BaseModel, Field, SecretStr, model_validator

import signoff as so
from signoff.testing import Capture, call_tools, reply, scripted_agent, sqlite_runtime, tool_results

ALICE = so.Principal(authenticator="test", principal_id="alice")


class Item(BaseModel):
    name: str
    id: str = Field(default_factory=lambda: uuid.uuid4().hex)


class Recipient(BaseModel):
    email: str
    token: str = Field(default_factory=lambda: uuid.uuid4().hex)

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, value: Any) -> Any:
        return {"email": value} if isinstance(value, str) else value


_API_KEY = SecretStr("sk-live-123")


def _by_name(items: list[Item]) -> list[Item]:
    return sorted(items, key=lambda item: item.name)


def _by_name_reversed(items: list[Item]) -> list[Item]:
    return sorted(items, key=lambda item: item.name, reverse=True)


async def _ask(tmp_path: Path, tool: so.Tool, proposed: dict[str, Any]) -> so.InputRequest:
    """Propose one call of `tool` with `proposed` input and return the request it asks."""
    proposal = call_tools(so.ToolCall(id="c1", name=tool.name, input=proposed))
    async with sqlite_runtime(tmp_path, scripted_agent("a", [proposal], tools=[tool])) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert r.status == "waiting"
        [req] = r.pending
    return req


async def _approve(
    tmp_path: Path, tool: so.Tool, proposed: dict[str, Any], req: so.InputRequest
) -> so.ToolResultMessage:
    """Approve `req` with `tool` (as deployed now) and return the result the model read."""
    seen = Capture(reply("ok"))
    proposal = call_tools(so.ToolCall(id="c1", name=tool.name, input=proposed))
    agent = scripted_agent("a", [proposal, seen], tools=[tool])
    async with sqlite_runtime(tmp_path, agent) as rt:
        approve = so.Decision(id=req.id, approved=True)
        done = await rt.generate(session_id=req.session_id, approvals=[approve], auth=ALICE)
        assert done.status == "completed"
    [result] = tool_results(seen.last)
    return result


async def test_a_list_a_validator_sorts_runs_with_the_ids_shown(tmp_path: Path) -> None:
    """A validator that sorts the model's items gives them back in another order than the model
    wrote them: each runs with the id the reviewer saw beside it, not another item's."""
    got: list[list[Item]] = []

    @so.tool(approval=so.always())
    async def ship(items: Annotated[list[Item], AfterValidator(_by_name)]) -> str:
        """Ship items, in name order."""
        got.append(items)
        return "shipped"

    proposed = {"items": [{"name": "b"}, {"name": "a"}]}
    req = await _ask(tmp_path, ship, proposed)
    result = await _approve(tmp_path, ship, proposed, req)
    assert not result.is_error, result.content
    [items] = got
    assert [item.model_dump() for item in items] == req.input["items"]
    assert [item.name for item in items] == ["a", "b"]


async def test_a_text_a_validator_makes_an_object_of_runs_with_the_value_shown(
    tmp_path: Path,
) -> None:
    """The model gives a recipient as text, which a validator makes an object with a generated
    token: the call runs with the token the reviewer saw."""
    got: list[list[Recipient]] = []

    @so.tool(approval=so.always())
    async def invite(to: list[Recipient]) -> str:
        """Invite people, by email or as objects."""
        got.append(to)
        return "invited"

    proposed = {"to": ["a@x.io"]}
    req = await _ask(tmp_path, invite, proposed)
    result = await _approve(tmp_path, invite, proposed, req)
    assert not result.is_error, result.content
    [to] = got
    assert [r.model_dump() for r in to] == req.input["to"]


async def test_a_secret_s_fixed_default_runs_beside_a_generated_time(tmp_path: Path) -> None:
    """A secret with a fixed default is shown masked; the form's mask is not the secret, its
    default is: the call runs with it and with the time the reviewer saw."""
    got: list[tuple[str, str, dt.datetime]] = []

    @so.tool(approval=so.always())
    async def search(
        q: str,
        at: Annotated[dt.datetime, Field(default_factory=dt.datetime.now)],
        api_key: SecretStr = _API_KEY,
    ) -> str:
        """Search."""
        got.append((q, api_key.get_secret_value(), at))
        return "found"

    proposed = {"q": "x"}
    req = await _ask(tmp_path, search, proposed)
    assert req.input["api_key"] == "**********"
    result = await _approve(tmp_path, search, proposed, req)
    assert not result.is_error, result.content
    assert got == [("x", "sk-live-123", dt.datetime.fromisoformat(req.input["at"]))]


async def test_a_deploy_that_changes_what_the_input_validates_to_is_refused(
    tmp_path: Path,
) -> None:
    """A deploy whose validator orders the items otherwise than the reviewer saw them: neither
    the model's input nor the approved form validates to the input approved, and the call does
    not run."""
    got: list[list[Item]] = []

    async def ship(items: Annotated[list[Item], AfterValidator(_by_name)]) -> str:
        """Ship items, in name order."""
        return "shipped"

    async def ship_v2(items: Annotated[list[Item], AfterValidator(_by_name_reversed)]) -> str:
        """Ship items, in reverse name order."""
        got.append(items)
        return "shipped"

    proposed = {"items": [{"name": "b"}, {"name": "a"}]}
    req = await _ask(tmp_path, so.Tool(ship, approval=so.always()), proposed)
    v2 = so.Tool(ship_v2, name="ship", approval=so.always())
    result = await _approve(tmp_path, v2, proposed, req)
    assert got == [] and result.is_error
    assert "validates now to other input than was approved" in result.content["error"]


def _set_tools() -> dict[str, so.Tool]:
    async def label(labels: Annotated[list[str], AfterValidator(set)]) -> str:
        """Label, each label once."""
        return ""

    async def tag(labels: set[str], order: list[str]) -> str:
        """Tag, in an order."""
        return ""

    async def group(groups: set[frozenset[str]], pairs: set[tuple[str, str]]) -> str:
        """Group."""
        return ""

    return {
        "label": so.Tool(label, approval=so.always()),
        "tag": so.Tool(tag, approval=so.always()),
        "group": so.Tool(group, approval=so.always()),
    }


def _bound(tool: so.Tool, stored: dict[str, Any], raw: dict[str, Any]) -> bool:
    """Whether `raw` validated binds an approval of `stored` (as an older signoff hashed it)."""
    from signoff._bound_input import still_bound

    return still_bound(so.Action.of("c1", tool.name, stored), tool, tool.validate(raw))


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")  # list[str] a set
def test_a_set_shown_in_its_own_order_binds_by_its_items() -> None:
    """An older signoff showed a set a validator made in its own order (the same in each of its
    processes where PYTHONHASHSEED is pinned), and bound that form; this one shows it sorted.
    The same items in another order are the same set: the approval binds. So for a declared
    set, and sets inside a set."""
    tools = _set_tools()
    seeded = sorted(["red", "green", "blue", "amber"], reverse=True)  # not as shown now
    assert tools["label"].approved_form(tools["label"].validate({"labels": seeded})) == {
        "labels": sorted(seeded)
    }
    assert _bound(tools["label"], {"labels": seeded}, {"labels": seeded})
    shown = {"labels": ["b", "a"], "order": ["x", "y"]}
    assert _bound(tools["tag"], shown, {"labels": ["a", "b"], "order": ["x", "y"]})
    groups = {"groups": [["b", "a"], ["d", "c"]], "pairs": [["b", "a"]]}
    raw = {"groups": [["c", "d"], ["a", "b"]], "pairs": [["b", "a"]]}
    assert _bound(tools["group"], groups, raw)


def test_a_list_in_another_order_still_does_not_bind() -> None:
    """Only a set's items may come in another order: a list (beside a set, or a tuple in a set)
    reordered, other items, or a form that is not the one hashed, do not bind."""
    tools = _set_tools()
    tag, group = tools["tag"], tools["group"]
    assert not _bound(
        tag,
        {"labels": ["a", "b"], "order": ["y", "x"]},
        {"labels": ["a", "b"], "order": ["x", "y"]},
    )
    assert not _bound(
        tag, {"labels": ["a", "c"], "order": ["x"]}, {"labels": ["a", "b"], "order": ["x"]}
    )
    pairs = {"groups": [], "pairs": [["a", "b"]]}
    assert not _bound(group, pairs, {"groups": [], "pairs": [["b", "a"]]})
    assert not _bound(
        group, {"groups": [["a", "b"]], "pairs": []}, {"groups": [["a"], ["b"]], "pairs": []}
    )
    from signoff._bound_input import still_bound

    forged = so.Action.of("c1", "tag", {"labels": ["b", "a"], "order": ["x"]})
    forged = forged.model_copy(update={"input": {"labels": ["b", "a"], "order": ["y"]}})
    validated = tag.validate({"labels": ["a", "b"], "order": ["y"]})
    assert not still_bound(forged, tag, validated)  # its hash is another form's


def test_a_number_a_deploy_made_another_kind_of_does_not_bind_as_a_set_order_does() -> None:
    """A deploy that makes a float parameter an int (or back): the form shows `5` where the
    approval bound `5.0`, which its hash tells apart. The fallback that binds a set by its items
    compared other values by number and bound it, no set anywhere: the call ran with input no
    one saw. So it does not, at the top or inside a set."""

    @so.tool(approval=so.always())
    async def pay(amount: int, to: str) -> str:
        """Pay."""
        return to

    @so.tool(approval=so.always())
    async def tally(amounts: set[int]) -> str:
        """Tally."""
        return ""

    assert not _bound(pay, {"amount": 5.0, "to": "bob"}, {"amount": 5, "to": "bob"})
    assert not _bound(tally, {"amounts": [2.0, 1.0]}, {"amounts": [1, 2]})
    assert _bound(tally, {"amounts": [2, 1]}, {"amounts": [1, 2]})  # a set's order, as before
