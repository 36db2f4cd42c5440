"""Whether an approved call runs with the input approved (`_bound_input`): a value generated for
what the model left out (a `default_factory`) is the one the reviewer saw, also when a validator
reorders or reshapes the model's input or a secret has a fixed default; a deploy that changes
what the input validates to is still refused."""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Annotated, Any

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
