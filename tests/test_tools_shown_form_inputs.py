"""Valid input whose reviewer's form is not itself input is still asked (`Tool.shown_form`,
`revealed`): a `Secret[int]` or a `SecretStr` with a `min_length` (the mask is no int, and too
short), a model with `extra="forbid"` and a computed field (the form shows it), a `Json` field
(the form shows it parsed). Before, validating the form again failed and the call was never
asked, nor cleared by `auto()`."""

# No `from __future__ import annotations`: the tools' hints name types local to a test.
import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Json, Secret, SecretStr, computed_field

import signoff as so
from signoff.testing import call_tools, reply, scripted_agent, sqlite_runtime

ALICE = so.Principal(authenticator="test", principal_id="alice")


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid")
    qty: int

    @computed_field  # type: ignore[prop-decorator]
    @property
    def double(self) -> int:
        return self.qty * 2


async def test_valid_input_whose_form_is_not_input_is_asked_and_runs(tmp_path: Path) -> None:
    """The reviewer sees the masks, the computed field and the parsed JSON; approved, the body
    gets the values the model gave."""
    ran: list[Any] = []

    @so.tool(approval=so.always())
    async def setup(
        pin: Secret[int],
        pw: Annotated[SecretStr, Field(min_length=12)],
        line: _Line,
        cfg: Json[dict[str, int]],
    ) -> str:
        """Set up."""
        ran.append((pin.get_secret_value(), pw.get_secret_value(), line.qty, cfg))
        return "ok"

    proposed = {"pin": 1234, "pw": "correct horse battery", "line": {"qty": 2}, "cfg": '{"a": 1}'}
    agent = scripted_agent(
        "a",
        [call_tools(so.ToolCall(id="c1", name="setup", input=proposed)), reply("ok")],
        tools=[setup],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        [req] = r.pending
        assert req.input == {
            "pin": "**********",
            "pw": "**********",
            "line": {"qty": 2, "double": 4},
            "cfg": {"a": 1},
        }
        approve = so.Decision(id=req.id, approved=True)
        done = await rt.generate(session_id=r.session_id, approvals=[approve], auth=ALICE)
        assert done.status == "completed"
    assert ran == [(1234, "correct horse battery", 2, {"a": 1})]


async def test_auto_reviews_valid_input_whose_form_is_not_input(tmp_path: Path) -> None:
    """`auto()` reviews such a form (masked) and its verdict stands: before, it asked a person
    without calling its model."""
    seen: list[Any] = []

    def clear(messages: list[Any]) -> so.ModelResponse:
        seen.extend(messages)
        return so.ModelResponse(text=json.dumps({"verdict": "clear", "reason": "fine"}))

    reviewer = so.models.Scripted([clear])
    ran: list[Any] = []

    @so.tool(approval=so.auto(reviewer))
    async def unlock(pin: Secret[int], line: _Line) -> str:
        """Unlock."""
        ran.append((pin.get_secret_value(), line.qty))
        return "ok"

    proposed = {"pin": 1234, "line": {"qty": 3}}
    agent = scripted_agent(
        "a",
        [call_tools(so.ToolCall(id="c1", name="unlock", input=proposed)), reply("ok")],
        tools=[unlock],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert r.pending == [] and r.status == "completed"
    assert ran == [(1234, 3)]
    assert seen and "1234" not in json.dumps([m.model_dump(mode="json") for m in seen])


def test_revealed_puts_secrets_back_and_leaves_computed_fields_out() -> None:
    from signoff._tool_json import revealed  # here: code without it fails this test alone

    class Outer(BaseModel):
        lines: list[_Line]
        keys: dict[str, SecretStr]
        cfg: Json[list[int]]

    one = Outer(lines=[_Line(qty=1)], keys={"k": SecretStr("v")}, cfg="[1]")
    assert revealed(one) == {"lines": [{"qty": 1}], "keys": {"k": "v"}, "cfg": "[1]"}
    assert one.model_dump(mode="json")["keys"] == {"k": "**********"}  # the form shows it so
