"""Interactions (button presses, select menus, modal submissions) are saved before Slack gets its
200: one acknowledged and then lost to a crash is settled by the next start, once.

Requests are posted to the loopback fake Slack of `_slack` through the real `slack_sdk`
client; interactions are signed like Slack signs them and handed to the channel's endpoint, in
this process or in a child process that SIGKILLs itself right after acknowledging one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.state import RetryState

import signoff as so
from signoff.channels import ChannelHub, ChannelState, InvalidSignature
from signoff.channels.slack._adopt import retry_handlers
from signoff.channels.slack._clicks import Interaction
from signoff.channels.slack._inbox import ACK_WITHIN
from signoff.testing import call, call_tools, reply, scripted_agent

from ._procs import ROOT, make_agent, read_executions
from ._slack import (
    ALICE,
    PATH,
    TEAM,
    FakeSlack,
    asgi_client,
    channel,
    click,
    fake,
    manual,
    question_agent,
    refused_while_locked,
    serving,
    sign,
    state_locked,
    submission,
)

FIRST_TS = "1700000000.000001"  # the fake's first post
USER = "U045EF6GH"

__all__ = ["fake"]  # the fixture, used by name


def approve(rid: str, user: str = USER, at: str = "1700000100.000001") -> bytes:
    """A press of a request's Approve button (`at`: Slack's time of the press)."""
    action = {"action_id": "signoff.approve", "value": rid, "type": "button", "action_ts": at}
    return click(action, user=user)


def deny(rid: str, reason: str = "over the limit", user: str = USER) -> bytes:
    """The submission of Deny's reason modal."""
    meta = {"request_id": rid, "channel": "C42", "user": user}
    values = {"signoff.reason": {"reason": {"type": "plain_text_input", "value": reason}}}
    return submission("signoff.deny", meta, values, user=user)


def choose(rid: str, value: str = "2") -> bytes:
    """A choice in a question's select menu."""
    action = {
        "type": "static_select",
        "action_id": "signoff.option",
        "block_id": f"signoff:{rid}",
        "selected_option": {"value": value},
    }
    return click(action, user="U5")


def typed(rid: str, text: str = "the 500 ml one") -> bytes:
    """The submission of a question's free-text modal."""
    meta = {"request_id": rid, "channel": "C42", "user": "U5"}
    return submission("signoff.text", meta, {"signoff.answer": {"answer": {"value": text}}}, "U5")


@asynccontextmanager
async def refund_asked(
    tmp_path: Path, records: str
) -> AsyncIterator[tuple[so.Runtime, so.InputRequest]]:
    """A runtime on a SQLite store in `tmp_path` whose agent (its tool runs kept in `records`)
    has asked approval to refund order 1042: the runtime and the request."""
    async with so.Runtime([make_agent(records)], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        (req,) = r.pending
        yield rt, req


async def handed(slack: Any, body: bytes) -> dict[str, Any] | None:
    """Hand a signed interaction to the channel's endpoint and wait for what it starts."""
    answer: dict[str, Any] | None = await slack.handle(body, sign(body, int(time.time())))
    await slack.idle()
    return answer


async def crash_after_acknowledging(
    tmp_path: Path, fake: FakeSlack, store: str, body: bytes
) -> None:
    """Run a hub in a child process that posts the open request, takes the interaction `body`
    and is SIGKILLed as soon as Slack would have its 200."""
    (tmp_path / "click.form").write_bytes(body)
    argv = [store, str(tmp_path / "runs.jsonl"), str(tmp_path / "hub.db"), fake.url]
    with (tmp_path / "child.err").open("w") as err:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests._slack_child",
            *argv,
            "--interaction",
            str(tmp_path / "click.form"),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
        )
        out, _ = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == -signal.SIGKILL, (out, (tmp_path / "child.err").read_text())
    assert json.loads(out) == {"event": "acknowledged", "answer": None}


@pytest.mark.parametrize("kind", ["approve", "deny"])
async def test_a_click_acknowledged_before_a_crash_is_settled_by_the_next_start_once(
    store_url: str, tmp_path: Path, fake: FakeSlack, kind: str
) -> None:
    """A process SIGKILLed right after acknowledging Approve (or Deny's modal): the restarted
    hub settles it as the person who clicked, once, the call runs (or not) once and the message
    shows the decision. Killed again after settling and before noting it, the next start
    settles nothing twice and tells nobody anything."""
    records = str(tmp_path / "runs.jsonl")
    async with so.Runtime([make_agent(records)], store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund order 1042")  # anyone may answer
        (req,) = r.pending
    body = approve(req.id) if kind == "approve" else deny(req.id)
    await crash_after_acknowledging(tmp_path, fake, store_url, body)
    assert len(fake.of("chat.postMessage")) == 1
    state_file = tmp_path / "hub.db"
    async with so.Runtime([make_agent(records)], store=store_url) as rt:
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"  # it never settled
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=state_file)) as hub:
            ((key, saved),) = slack.memos("click:")
            await slack.idle()  # the start settled it
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.status == "settled"
            assert stored.resolution is not None
            assert stored.resolution["by"]["principal_id"] == f"slack:{TEAM}:{USER}"
            await hub.poll()
            assert slack.recall(key)["state"] == "done"
            # Killed after settling and before marking it done: run again, it changes nothing.
            slack.remember(key, {**saved, "tries": 1})
        again = channel(fake)
        async with manual(ChannelHub(rt, [again], state=state_file)) as hub:
            await again.idle()
            await hub.poll()
            assert again.recall(key)["state"] == "done"
        stored = await rt.store.get_request(req.id)
        assert stored is not None
        assert stored.outcome == ("approved" if kind == "approve" else "cancelled")
        if kind == "deny":
            assert stored.resolution is not None
            assert stored.resolution["reason"] == "over the limit"
        settled = [e for e in await rt.audit() if e.type == "approval.settled"]
        assert len(settled) == 1
    assert len(read_executions(records)) == (1 if kind == "approve" else 0)
    (update,) = fake.of("chat.update")
    assert update["ts"] == FIRST_TS
    assert update["blocks"][-1]["block_id"] == "signoff.resolution"
    assert fake.of("chat.postEphemeral") == []
    assert len(fake.of("chat.postMessage")) == 1


@pytest.mark.parametrize("kind", ["menu", "modal"])
async def test_an_answer_acknowledged_before_its_task_ran_is_settled_by_the_next_start(
    store_url: str, tmp_path: Path, fake: FakeSlack, kind: str
) -> None:
    """A question's select menu or free-text modal, acknowledged by a process that stopped
    before settling it (its task cancelled): the next start answers it."""
    async with so.Runtime([question_agent()], store=store_url) as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        (req,) = r.pending
        state_file = tmp_path / "hub.db"
        slack = channel(fake)
        body = choose(req.id) if kind == "menu" else typed(req.id)
        async with manual(ChannelHub(rt, [slack], state=state_file)) as hub:
            await hub.poll()
            assert await slack.handle(body, sign(body, int(time.time()))) is None
            for task in list(slack._tasks):
                task.cancel()
            await asyncio.gather(*slack._tasks, return_exceptions=True)
            ((_, memo),) = slack.memos("click:")
            assert memo["state"] == "pending" and memo["request_id"] == req.id
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        again = channel(fake)
        async with manual(ChannelHub(rt, [again], state=state_file)) as hub:
            await again.idle()
            await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.resolution is not None
        if kind == "menu":
            assert stored.resolution["answer"] == {"value": "Large", "option_id": "2", "text": None}
        else:
            assert stored.resolution["answer"]["text"] == "the 500 ml one"
        assert stored.resolution["by"]["principal_id"] == f"slack:{TEAM}:U5"
        assert len(fake.of("chat.update")) == 1
        assert fake.of("chat.postEphemeral") == []


async def test_a_click_that_cannot_be_saved_gets_a_503_and_settles_nothing(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The channel state refusing to save an interaction: Slack gets a 503 (and shows the
    person an error, so they click again), nothing is settled, no form is opened, and the
    click is not taken for done: once the state is back, the same click is acted on."""
    records = str(tmp_path / "runs.jsonl")
    async with refund_asked(tmp_path, records) as (rt, req):
        async with serving(rt, fake, tmp_path / "hub.db") as (slack, hub, app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                remember = hub.state.remember
                refusals: list[str] = []

                def refusing(channel_name: str, key: str, value: Any, **hub: str) -> None:
                    if key.startswith("click:"):
                        refusals.append(key)
                        raise so.StoreError("channel state: cannot save a memo: disk I/O error")
                    remember(channel_name, key, value, **hub)

                monkeypatch.setattr(hub.state, "remember", refusing)
                press = click({"action_id": "signoff.deny", "value": req.id, "type": "button"})
                for body in (approve(req.id), deny(req.id), press):
                    response = await http.post(
                        PATH, content=body, headers=sign(body, int(time.time()))
                    )
                    assert response.status_code == 503
                    assert response.json()["error"]["code"] == "store_error"
                await slack.idle()
                assert len(refusals) == 3
                assert slack.memos("click:") == []
                stored = await rt.store.get_request(req.id)
                assert stored is not None and stored.status == "pending"
                assert [e.type for e in await rt.audit()].count("approval.settled") == 0
                assert fake.of("views.open") == []
                # The same click sent again (signed anew) is taken once the state is back.
                monkeypatch.setattr(hub.state, "remember", remember)
                body = approve(req.id)
                response = await http.post(
                    PATH, content=body, headers=sign(body, int(time.time()) + 1)
                )
                assert (response.status_code, response.content) == (200, b"")
                await slack.idle()
            await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "approved"
    assert len(read_executions(records)) == 1
    assert fake.of("chat.postEphemeral") == []


async def test_a_click_retried_with_the_signature_that_got_a_503_is_settled_once(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A click Slack had a 503 for, sent again with the same signature (should Slack not sign
    its retry anew): its signature was forgotten with the 503, so it is taken and settles once;
    sent a third time, after its 200, it is refused as a replay."""
    records = str(tmp_path / "runs.jsonl")
    async with refund_asked(tmp_path, records) as (rt, req):
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            remember = hub.state.remember

            def refusing(channel_name: str, key: str, value: Any, **hub: str) -> None:
                if key.startswith("click:"):
                    raise so.StoreError("channel state: cannot save a memo: disk I/O error")
                remember(channel_name, key, value, **hub)

            body = approve(req.id)
            headers = sign(body, int(time.time()))
            monkeypatch.setattr(hub.state, "remember", refusing)
            with pytest.raises(so.StoreError, match="disk I/O error"):
                await slack.handle(body, headers)
            monkeypatch.setattr(hub.state, "remember", remember)
            assert await slack.handle(body, headers) is None
            await slack.idle()
            with pytest.raises(InvalidSignature, match="replay"):
                await slack.handle(body, headers)
            await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "approved"
        assert [e.type for e in await rt.audit()].count("approval.settled") == 1
    assert len(read_executions(records)) == 1


async def test_a_form_whose_opening_went_unanswered_is_not_opened_again_nor_called_failed(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """Deny's form opened by Slack, whose answer the dropped connection lost: `views.open` is
    not sent again (its single-use trigger would only be refused, over an open form), and the
    person is told to press again only if no form opened. A press acted on again after a crash
    (`again`) whose trigger Slack refuses as used or expired is told the same; a first call's
    expired trigger is a plain failure."""
    records = str(tmp_path / "runs.jsonl")
    async with refund_asked(tmp_path, records) as (rt, req):
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            fake.dropped["views.open"] = 1
            press = {"action_id": "signoff.deny", "value": req.id, "type": "button"}
            body = click(press, trigger="1.2.first")
            assert await slack.handle(body, sign(body, int(time.time()))) is None
            await slack.idle()
            assert [v["trigger_id"] for v in fake.of("views.open")] == ["1.2.first"]
            maybe = (
                "Slack did not confirm that the form opened: if it did not, press the button again."
            )
            assert [e["text"] for e in fake.of("chat.postEphemeral")] == [maybe]
            # the same press run again (a crash cut its first run short): the trigger is used
            work = Interaction("signoff.deny", req.id, TEAM, USER, "C42", trigger_id="1.2.first")
            await slack.clicks._act(work, True)
            fake.failing["views.open"] = "expired_trigger_id"
            await slack.clicks._act(work, True)
            await slack.clicks._act(work, False)
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
    assert [e["text"] for e in fake.of("chat.postEphemeral")] == [
        maybe,
        maybe,
        maybe,
        "Slack could not open the form (expired_trigger_id): press the button again.",
    ]


async def _refused_connection() -> aiohttp.ClientConnectorError:
    """The error aiohttp raises when nothing listens on the port: made by a real attempt, so
    the test does not depend on the fields of aiohttp's private connection key."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with aiohttp.ClientSession() as session:
        try:
            await session.post(f"http://127.0.0.1:{port}/api/views.open")
        except aiohttp.ClientConnectorError as exc:
            return exc
    raise AssertionError(f"something answered on the closed port {port}")


def test_only_a_form_opening_or_post_that_never_reached_slack_is_retried_by_the_client() -> None:
    """The channel's client sends `views.open` and `chat.postMessage` again only when no
    connection was made (nothing was sent); a dropped or reset connection may have opened the
    form or posted the message. Other calls keep slack_sdk's retry of both."""
    handler = retry_handlers()[0]
    refused = asyncio.run(_refused_connection())
    dropped = aiohttp.ServerDisconnectedError()

    def retried(method: str, error: Exception) -> bool:
        request = HttpRequest(method="POST", url=f"https://slack.com/api/{method}", headers={})
        state = RetryState()
        return asyncio.run(handler.can_retry_async(state=state, request=request, error=error))

    assert retried("views.open", refused)
    assert not retried("views.open", dropped)
    assert retried("chat.update", refused) and retried("chat.update", dropped)
    assert retried("chat.postMessage", refused)
    assert not retried("chat.postMessage", dropped)
    reset = aiohttp.ClientOSError(104, "Connection reset by peer")
    assert not retried("chat.postMessage", reset) and not retried("views.open", reset)


async def test_a_click_meeting_a_locked_state_file_gets_a_503_in_time_and_stalls_nothing(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """Another process holding the channel state's write lock: the click waits for it off the
    event loop (another request is answered meanwhile) and gets a 503 before Slack's 3 s, with
    nothing saved or settled; once the lock is gone, Slack's retry is taken, and settles once."""
    records = str(tmp_path / "runs.jsonl")
    # The state waits 30 s for a lock (not 5 s): a click held for it fails the bound by far.
    with contextlib.closing(ChannelState(tmp_path / "hub.db", busy_timeout=30)) as state:
        async with refund_asked(tmp_path, records) as (rt, req):
            async with serving(rt, fake, state) as (slack, hub, app):
                assert slack.clicks.inbox.ack_within == ACK_WITHIN < 3
                async with asgi_client(app) as http:
                    body = approve(req.id)

                    async def press() -> httpx.Response:
                        headers = sign(body, int(time.time()))
                        return await http.post(PATH, content=body, headers=headers)

                    async with state_locked(tmp_path / "hub.db"):
                        await refused_while_locked(http, press, req.id)
                        await slack.idle()
                        assert slack.memos("click:") == []
                    stored = await rt.store.get_request(req.id)
                    assert stored is not None and stored.status == "pending"
                    for retry in (1, 2):  # Slack sends it again (signed anew), then once more
                        response = await http.post(
                            PATH, content=body, headers=sign(body, int(time.time()) + retry)
                        )
                        assert (response.status_code, response.content) == (200, b"")
                        await slack.idle()
                    assert len(slack.memos("click:")) == 1
                await hub.poll()
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.outcome == "approved"
            assert [e.type for e in await rt.audit()].count("approval.settled") == 1
        assert len(read_executions(records)) == 1
        assert fake.of("chat.postEphemeral") == []


async def test_a_click_saved_after_its_503_is_settled_once_and_its_retry_does_nothing(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save that ends after Slack had its 503 (a slow disk, say) still starts its work, once;
    Slack's retry of the click then finds it taken."""
    records = str(tmp_path / "runs.jsonl")
    async with refund_asked(tmp_path, records) as (rt, req):
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            slack.clicks.inbox.ack_within = 0.3
            remember = hub.state.remember

            def slow(channel_name: str, key: str, value: Any, **hub: str) -> None:
                if key.startswith("click:"):
                    time.sleep(0.6)  # in the save's thread: past the deadline
                remember(channel_name, key, value, **hub)

            monkeypatch.setattr(hub.state, "remember", slow)
            body = approve(req.id)
            with pytest.raises(so.StoreError, match="not saved within 0.3s"):
                await slack.handle(body, sign(body, int(time.time())))
            monkeypatch.setattr(hub.state, "remember", remember)
            await slack.idle()  # the save ends, and its work runs
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.outcome == "approved"
            response = await slack.handle(body, sign(body, int(time.time()) + 1))
            assert response is None
            await slack.idle()
            assert len(slack.memos("click:")) == 1
            await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "approved"
        assert [e.type for e in await rt.audit()].count("approval.settled") == 1
    assert len(read_executions(records)) == 1
    assert fake.of("chat.postEphemeral") == []


async def test_a_double_press_settles_once_and_tells_nobody_anything(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    """Approve pressed twice (two interactions, Slack's times apart): both are acknowledged, the
    request settles once, the call runs once, and the second press is not answered with "already
    closed" (the answer that stands is the presser's own). A press by someone else after the
    decision is told who decided."""
    records = str(tmp_path / "runs.jsonl")
    async with so.Runtime([make_agent(records)], store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        (req,) = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            first, second = approve(req.id), approve(req.id, at="1700000100.000002")
            assert first != second
            now = int(time.time())
            assert await slack.handle(first, sign(first, now)) is None
            assert await slack.handle(second, sign(second, now)) is None  # before the first ran
            await slack.idle()
            assert len(slack.memos("click:")) == 2
            assert await handed(slack, approve(req.id, at="1700000100.000003")) is None
            await hub.poll()
            assert fake.of("chat.postEphemeral") == []
            await handed(slack, approve(req.id, user="U078JK9LM"))
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "approved"
        assert stored.resolution is not None
        assert stored.resolution["by"]["principal_id"] == f"slack:{TEAM}:{USER}"
        assert [e.type for e in await rt.audit()].count("approval.settled") == 1
    assert len(read_executions(records)) == 1
    assert len(fake.of("chat.update")) == 1
    (note,) = fake.of("chat.postEphemeral")
    assert note["user"] == "U078JK9LM"
    assert note["text"] == f"Request {req.id} is already closed: approved by slack:{TEAM}:{USER}."


async def test_a_click_whose_settling_meets_a_store_failure_is_settled_on_a_later_tick(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store failing while a saved click is settled (down for a moment): the click stays
    saved and a later scan settles it, instead of the person's answer being dropped."""
    clock = [time.time()]
    records = str(tmp_path / "runs.jsonl")
    async with refund_asked(tmp_path, records) as (rt, req):
        slack = channel(fake, clock=lambda: clock[0])
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            get_request = rt.store.get_request
            failures = [so.StoreError("database is locked")]

            async def flaky(request_id: str) -> Any:
                if failures:
                    raise failures.pop()
                return await get_request(request_id)

            monkeypatch.setattr(rt.store, "get_request", flaky)
            body = approve(req.id)
            assert await slack.handle(body, sign(body, int(clock[0]))) is None
            await slack.idle()
            assert failures == []
            ((key, memo),) = slack.memos("click:")
            assert (memo["state"], memo["tries"]) == ("pending", 1)
            stored = await get_request(req.id)
            assert stored is not None and stored.status == "pending"
            await hub.poll()  # the first scan: it is not old enough to be another's lost click
            await slack.idle()
            clock[0] += 601
            await hub.poll()
            await slack.idle()
            assert slack.recall(key)["state"] == "done"
            await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "approved"
    assert len(read_executions(records)) == 1
    assert fake.of("chat.postEphemeral") == []


async def test_a_counted_approval_run_again_after_a_crash_is_neither_counted_nor_told_twice(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """A quorum's approval counted, then the process died before noting the click done: the
    next start runs it again, which counts nothing new and sends no second note."""
    runs: list[str] = []

    @so.tool(approval=so.always(approvers=2))
    async def delete_account(account_id: str) -> str:
        """Delete an account."""
        runs.append(account_id)
        return "deleted"

    agent = scripted_agent(
        "admin",
        [call_tools(call("delete_account", account_id="acct_7")), reply("Gone.")],
        tools=[delete_account],
    )
    state_file = tmp_path / "hub.db"
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("admin", prompt="Delete acct_7", auth=ALICE)
        (req,) = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=state_file)) as hub:
            await hub.poll()
            body = approve(req.id, user="U1")
            await slack.handle(body, sign(body, int(time.time())))
            ((key, saved),) = slack.memos("click:")  # before its task ran
            await slack.idle()
            assert slack.recall(key)["state"] == "done"
            slack.remember(key, {**saved, "tries": 1})  # as a process killed before that left it
        again = channel(fake)
        async with manual(ChannelHub(rt, [again], state=state_file)) as hub:
            await again.idle()
            await hub.poll()
            assert again.recall(key)["state"] == "done"
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        candidates = [e for e in await rt.audit() if e.type == "approval.candidate"]
        assert [c.data["outcome"] for c in candidates] == ["counted"]
    assert runs == []
    assert [e["text"] for e in fake.of("chat.postEphemeral")] == [
        "Your approval was counted (1 of 2)."
    ]
