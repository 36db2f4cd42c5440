"""`signoff chat` (`_chat`) offers nothing that could only fail: a `--session` past its TTL is
refused before anything is printed, a mirror whose delegate tool a deploy took away is not
asked (`tool_gone`, as the dashboard judges it), nor is the requester four eyes bars from
their own call, and a request left pending in a store of this process's memory is said to be
lost, not to be answered later by a command."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import pytest
from typer.testing import CliRunner

import signoff as so
from signoff.cli import app
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent, store_contents

from . import test_subagents_tool_gone as gone
from ._cli import agent, invoke, treasurer, url

__all__ = ["url"]  # the fixture, used by name

CLOCK = ManualClock()
DEPLOYED: dict[str, Any] = {}
"""The agents of `deployed`'s runtime; each test that chats with it sets them."""


@so.tool(approval=so.always())
async def refund(order_id: str) -> dict[str, str]:
    """Refund an order."""
    return {"refunded": order_id}


TTL = so.Limits(ttl=60)
idle = scripted_agent("idle", [reply("hi")], repeat_last=True, limits=TTL)
waiting = scripted_agent(
    "waiting", [call_tools(call("refund", order_id="1")), reply("done")], tools=[refund], limits=TTL
)


@so.tool(approval=so.always(exclude_requester=True))
async def deploy(service: str) -> str:
    """Deploy a service."""
    return "live"


def _after_deploy(conversation: list[so.Message]) -> so.ModelResponse:
    """Deployed, unless the person said something since the prompt: the model read it."""
    said = [m.text for m in conversation if isinstance(m, so.UserMessage)]
    return reply("deployed" if said == ["deploy api"] else f"read: {said[-1]}")


ops = scripted_agent(
    "ops", [call_tools(call("deploy", service="api")), _after_deploy], tools=[deploy]
)


def four_eyes() -> so.Runtime:
    return so.Runtime([ops], store="sqlite:///unused.db")


def timed() -> so.Runtime:
    """A runtime on `CLOCK` whose agents' sessions live 60 s past their last activity."""
    return so.Runtime([idle, waiting], clock=CLOCK, store="sqlite:///unused.db")


def deployed() -> so.Runtime:
    """The runtime after a deploy: `DEPLOYED`'s agents."""
    return so.Runtime(DEPLOYED["agents"], store="sqlite:///unused.db")


def in_memory() -> so.Runtime:
    return so.Runtime([agent, treasurer], store="sqlite:///:memory:")


async def _contents(url: str, *session_ids: str) -> list[Any]:
    async with so.Runtime([], store=url) as rt:
        return [await store_contents(rt.store, s) for s in session_ids]


@pytest.mark.parametrize("name", ["idle", "waiting"])
def test_a_session_past_its_ttl_is_refused_before_anything_is_printed(
    url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`chat --session` of a session past its TTL printed its header and "(resumed)", then
    refused each message typed (`SessionExpired`), or failed as its waiting turn was taken up.
    It is the one red line alone, exit 1, and nothing is recorded (the expiry is left to the
    next drive, as the dashboard's read leaves it)."""
    monkeypatch.setattr(CLOCK, "now", 1_000_000.0)
    rt = so.Runtime([idle, waiting], clock=CLOCK, store=url)
    try:
        r = rt.generate_sync(name, "refund 1")
    finally:
        rt.close_sync()
    sid = r.session_id
    assert r.status == ("completed" if name == "idle" else "waiting")
    target = ["chat", "tests.test_cli_chat_dead_ends:timed", "--store", url, "--session", sid]
    CLOCK.advance(59)  # within its TTL: resumed, as before
    alive = CliRunner().invoke(app, target, input="")
    assert alive.exit_code == 0, alive.output
    assert f"session {sid} (resumed)" in alive.output, alive.output
    CLOCK.advance(61)
    before = asyncio.run(_contents(url, sid))
    chat = CliRunner().invoke(app, target, input="hello\n")
    assert chat.exit_code == 1, chat.output
    assert chat.stdout == "", chat.stdout
    pending = "" if name == "idle" else f" with pending requests {r.pending[0].id}"
    assert chat.stderr == f"error: SessionExpired: session '{sid}' expired{pending}\n"
    assert asyncio.run(_contents(url, sid)) == before


def _park_gone(url: str) -> gone._Parked:
    parked = asyncio.run(gone._parked(url))
    DEPLOYED["agents"] = [parked.parent, parked.child]
    return parked


def _chat_gone(url: str, session_id: str, *, as_: str = "okta:alice") -> Any:
    args = ["chat", "tests.test_cli_chat_dead_ends:deployed", "--store", url]
    return CliRunner().invoke(app, [*args, "--session", session_id, "--as", as_], input="y\n")


def test_a_mirror_whose_delegate_tool_is_gone_is_not_asked(url: str) -> None:
    """A deploy took the parent's delegate tool while its call waited on the child's approval:
    chat asked `(y/N)` on the mirror, and either answer ended the chat with `error:
    UnknownTool`, exit 1. Chat says why instead of asking, and where the child's request can
    be answered; nothing is recorded. Who may not answer it is asked and refused as before."""
    r, mirror, *_ = _park_gone(url)
    kid = mirror.child
    assert kid is not None
    before = asyncio.run(_contents(url, r.session_id, kid.session_id))
    chat = _chat_gone(url, r.session_id)
    assert chat.exit_code == 0, chat.output
    assert chat.stderr == "", chat.stderr
    assert "(y/N)" not in chat.output, chat.output
    assert f"unknown tool 'billing': request {mirror.id} was asked for delegate call" in chat.output
    assert f"answer billing's request {kid.request_id} in its session" in chat.output
    assert asyncio.run(_contents(url, r.session_id, kid.session_id)) == before
    other = _chat_gone(url, r.session_id, as_="okta:bob")
    assert "(y/N)" in other.output and "NotAllowed" in other.output, other.output
    assert "unknown tool" not in other.output
    assert asyncio.run(_contents(url, r.session_id, kid.session_id)) == before


def test_an_answer_refused_for_a_gone_delegate_tool_does_not_end_chat_with_an_error(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deploy landed between chat's look and the answer (the look stubbed to find the tool
    there): the refusal is one red line in the chat, not `error:` ending it; the mirror is not
    asked again, and chat exits 1, the answer typed not carried out."""
    r, mirror, *_ = _park_gone(url)

    async def there(*_: object) -> None:
        return None

    monkeypatch.setattr("signoff.cli._chat.tool_gone", there)
    chat = _chat_gone(url, r.session_id)
    assert chat.exit_code == 1, chat.output
    assert chat.stderr == "", chat.stderr
    assert chat.output.count("(y/N)") == 1, chat.output
    assert f"UnknownTool: unknown tool 'billing': request {mirror.id}" in chat.output


def test_a_request_left_in_a_store_of_this_process_is_said_to_be_lost(url: str) -> None:
    """Over `sqlite:///:memory:`, chat said to answer a request left pending later with
    `signoff approve REQ --store sqlite:///:memory:`, which opens another, empty, store."""
    for name, typed in (("support", "refund 1042\n"), ("treasurer", "pay ACME\ny\n")):
        args = ["chat", "tests.test_cli_chat_dead_ends:in_memory", "--agent", name]
        chat = CliRunner().invoke(app, args, input=typed)
        assert chat.exit_code == 0, chat.output
        assert "lost when chat exits" in chat.output, chat.output
        assert ":memory:`" not in chat.output and "--session" not in chat.output


@pytest.mark.parametrize("typed", ["/exit\n", ""])
def test_the_requester_of_a_four_eyes_call_is_not_asked_it(url: str, typed: str) -> None:
    """Alice's own call needs someone else (`exclude_requester=True`): chat asked her `(y/N)`,
    refused either answer (`NotAllowed`) and exited 1, the rest of what she typed unread. It
    says someone else must approve it and that a message of hers withdraws it; `/exit` or the
    end of input leaves it to them, as a quorum she voted in (exit 0); nothing is recorded,
    and Bob's approval runs the call."""
    args = ["chat", "tests.test_cli_chat_dead_ends:four_eyes", "--store", url]
    chat = CliRunner().invoke(app, [*args, "--as", "okta:alice"], input=f"deploy api\n{typed}")
    assert chat.exit_code == 0, chat.output
    assert chat.stderr == "", chat.stderr
    assert "(y/N)" not in chat.output and "NotAllowed" not in chat.output, chat.output
    (row,) = json.loads(invoke("pending", "--store", url, "--json").stdout)
    sid, rid = row["session_id"], row["id"]
    assert row["approved_by"] == [] and f"session {sid}\n" in chat.output, chat.output
    said = f"request {rid}: the requester may not approve or deny their own call: someone else"
    assert said in chat.output, chat.output
    assert "type a message to withdraw it and steer the turn, or /exit" in chat.output
    assert f"the turn waits for other people to answer {rid}; " in chat.output
    assert f"--session {sid}` continues it later" in chat.output
    before = asyncio.run(_contents(url, sid))
    again = CliRunner().invoke(app, [*args, "--as", "okta:alice", "--session", sid], input=typed)
    assert again.exit_code == 0 and "(y/N)" not in again.output, again.output
    assert f"the turn waits for other people to answer {rid}; " in again.output
    assert asyncio.run(_contents(url, sid)) == before  # her chats recorded nothing
    bob = CliRunner().invoke(app, [*args, "--as", "okta:bob", "--session", sid], input="y\n")
    assert bob.exit_code == 0, bob.output
    assert "ops: deployed" in bob.output, bob.output


async def _request(url: str, rid: str) -> Any:
    async with so.Runtime([], store=url) as rt:
        return await rt.store.get_request(rid)


@pytest.mark.parametrize(("resumed", "approving"), [(False, False), (True, False), (False, True)])
def test_a_message_from_the_requester_withdraws_their_four_eyes_call(
    url: str, resumed: bool, approving: bool
) -> None:
    """Told that a message of hers withdraws her four-eyes call, Alice could send none: chat
    left at once, `chat --session` too, and no command sends a message. What she types is now
    sent (`send`): the call is withdrawn (`ignored`, never run) and the model reads it (exit
    0). The option `approve` is her approve, refused `NotAllowed`, and chat reads on (exit 1:
    it was not carried out)."""
    args = ["chat", "tests.test_cli_chat_dead_ends:four_eyes", "--store", url, "--as", "okta:alice"]
    typed = ("approve\n" if approving else "") + "no, do not deploy\n"
    if resumed:
        first = CliRunner().invoke(app, args, input="deploy api\n")
        assert first.exit_code == 0, first.output
        (row,) = json.loads(invoke("pending", "--store", url, "--json").stdout)
        chat = CliRunner().invoke(app, [*args, "--session", row["session_id"]], input=typed)
    else:
        chat = CliRunner().invoke(app, args, input=f"deploy api\n{typed}")
    assert chat.exit_code == (1 if approving else 0), chat.output
    assert chat.stderr == "", chat.stderr
    (rid,) = set(re.findall(r"request (req_\w+): the requester may not", chat.output))
    refused = f"NotAllowed: request {rid}: the requester may not approve their own call"
    assert (refused in chat.output) == approving, chat.output
    assert "type a message to withdraw it and steer the turn" in chat.output, chat.output
    assert "ops: read: no, do not deploy" in chat.output, chat.output
    assert "waits for other people" not in chat.output, chat.output
    assert json.loads(invoke("pending", "--store", url, "--json").stdout) == []
    stored = asyncio.run(_request(url, rid))
    assert (stored.status, stored.resolution["outcome"]) == ("withdrawn", "ignored")
