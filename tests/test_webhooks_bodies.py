"""Webhook bodies: a close whose reason or question is long still fits a capped receiver, and an
approval with an edited input says what was approved."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub, WebhookChannel
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from .test_webhooks import SECRET, Receiver, manual


@so.tool(approval=so.always())
def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    return f"refunded {amount}"


def refund_agent() -> so.Agent:
    return scripted_agent(
        "billing",
        [call_tools(call("refund", order_id="1000", amount=180.0)), reply("Done.")],
        tools=[refund],
    )


async def closes(tmp_path: Path, receiver: Receiver, answer: so.InputResponse) -> list[Any]:
    """The bodies `receiver` accepted for one refund opened, then answered with `answer`."""
    async with so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        hooks = WebhookChannel(receiver.url, SECRET, max_attempts=1)
        async with manual(ChannelHub(rt, [hooks])) as hub:
            r = await rt.generate("billing", prompt="refund order 1000")
            (request,) = r.pending
            await hub.poll()
            await hooks.drain()
            await rt.respond(r.session_id, [answer.model_copy(update={"request_id": request.id})])
            await hub.poll()
            await hooks.drain()
        assert await hooks.refusals() == []
    return [json.loads(body) for _, body in receiver.accepted]


async def test_a_denial_with_a_reason_of_megabytes_reaches_a_receiver_capped_at_1_mib(
    tmp_path: Path,
) -> None:
    """A denial's reason may be 4 MiB (a pasted log): its `request.resolved` was sent whole,
    1.2 MB, and a receiver taking 1 MiB (aiohttp's default) answered 413, a refusal never sent
    again, so it never heard the request closed. The reason is cut to its first 500 characters
    (named in `clipped`), as the body must fit `max_body_bytes`."""
    reason = "log line " * 140_000  # 1.26 MB
    async with Receiver([]) as receiver:
        bodies = await closes(
            tmp_path, receiver, so.InputResponse(request_id="", option_id="cancel", text=reason)
        )
    assert [b["type"] for b in bodies] == ["request.opened", "request.resolved"]
    resolved = bodies[1]
    assert resolved["resolution"]["outcome"] == "cancelled"
    assert resolved["clipped"] == ["resolution.reason"]
    assert resolved["resolution"]["reason"] == reason[:500]
    assert len(receiver.accepted[1][1]) <= 256 * 1024


async def test_a_receiver_capping_below_a_long_reason_gets_it_cut_at_once(
    tmp_path: Path,
) -> None:
    """Under `max_body_bytes` but over a receiver's own cap (Express takes 100 KB): the 413 is
    answered at once with the body at its smallest, the reason cut."""
    reason = "why " * 40_000  # 160 KB
    async with Receiver([], max_size=100_000) as receiver:
        bodies = await closes(
            tmp_path, receiver, so.InputResponse(request_id="", option_id="cancel", text=reason)
        )
    assert [b["type"] for b in bodies] == ["request.opened", "request.resolved"]
    assert bodies[1]["resolution"]["reason"] == reason[:500]
    assert "resolution.reason" in bodies[1]["clipped"]


def test_a_payload_of_text_is_sent_as_null_not_cut() -> None:
    """Only text that says why (a reason, a question) is cut to its first 500 characters: a
    tool's payload, input or answer cut would read as whole, so it is sent as null."""
    from signoff.channels._webhook_bodies import within

    body = {"request": {"payload": "+ line\n" * 60_000, "question": "why? " * 1000}}
    clipped = within(body, 10_000)
    assert clipped["request"]["payload"] is None
    assert clipped["clipped"] == ["request.payload"]
    assert within(clipped, 1_000)["request"]["question"] == ("why? " * 1000)[:500]
    assert clipped["clipped"] == ["request.payload", "request.question"]


async def test_an_approval_with_an_edited_input_says_what_was_approved(tmp_path: Path) -> None:
    """Approved with the amount edited from 180 to 50, the call ran with 50, but the receiver
    read "approved" beside the proposed 180, and no edit: `resolution.edited_input` now holds
    the input approved (null when approved as proposed, and for every other event)."""
    edited = {"order_id": "1000", "amount": 50.0}
    async with Receiver([]) as receiver:
        bodies = await closes(
            tmp_path,
            receiver,
            so.InputResponse(request_id="", option_id="approve", edited_input=edited),
        )
    opened, resolved = bodies
    assert opened["resolution"] is None
    assert resolved["resolution"]["outcome"] == "approved"
    assert resolved["resolution"]["edited_input"] == edited
    assert resolved["request"]["action"]["input"] == {"order_id": "1000", "amount": 180.0}


async def test_an_approval_as_proposed_has_no_edited_input(tmp_path: Path) -> None:
    """Every resolution has the same keys: `edited_input` is null without an edit."""
    async with Receiver([]) as receiver:
        bodies = await closes(
            tmp_path, receiver, so.InputResponse(request_id="", option_id="approve")
        )
    assert bodies[1]["resolution"]["outcome"] == "approved"
    assert bodies[1]["resolution"]["edited_input"] is None
    assert "clipped" not in bodies[1]


def test_a_body_clipped_to_fit_fits_with_the_names_of_what_was_clipped() -> None:
    """A body one byte over the limit with a reason of 501 characters: cutting the reason saved
    one byte, so the body was taken to fit, and the `clipped` list then added after it sent it
    30 bytes over `max_body_bytes` (a receiver capped there answered 413, never sent again)."""
    from signoff.channels._base import Resolution
    from signoff.channels._webhook_bodies import delivery_body, json_bytes, within

    limit = 1024
    resolution = Resolution(
        request_id="req_1", outcome="cancelled", status="settled", at=1.0, reason="r" * 501
    )
    request = {"id": "req_1", "session_id": "ses_1", "question": None, "pad": ""}
    body = delivery_body("request.resolved", "req_1", request, resolution, None, 1.0)
    body["request"]["pad"] = "x" * (limit - len(json_bytes(body)) + 1)
    assert len(json_bytes(body)) == limit + 1
    clipped = within(body, limit)
    assert len(json_bytes(clipped)) <= limit
    assert "resolution.reason" in clipped["clipped"]


async def test_a_call_its_deadline_approved_says_so_in_its_resolution(tmp_path: Path) -> None:
    """`on_timeout="approve"`: the call ran, though its request closed as `expired`, as one
    denied at its deadline does; `resolution.on_timeout` tells them apart (null when no
    deadline closed it, as in `test_an_approval_as_proposed_has_no_edited_input`). Before, the
    resolution had no such key."""

    @so.tool(approval=so.always(expires_in=60, on_timeout="approve"))
    def deploy(env: str) -> str:
        """Deploy."""
        return "deployed"

    agent = scripted_agent(
        "ops", [call_tools(call("deploy", env="prod")), reply("Deployed.")], tools=[deploy]
    )
    clock = ManualClock()
    async with Receiver([]) as receiver:
        store = f"sqlite:///{tmp_path / 's.db'}"
        async with so.Runtime([agent], store=store, clock=clock) as rt:
            hooks = WebhookChannel(receiver.url, SECRET, max_attempts=1)
            async with manual(ChannelHub(rt, [hooks], clock=clock)) as hub:
                await rt.generate("ops", prompt="Deploy")
                clock.advance(61)
                assert await rt.expire_due() == 1
                await hub.poll()
                await hooks.drain()
        bodies = [json.loads(body) for _, body in receiver.accepted]
    assert [b["type"] for b in bodies] == ["request.opened", "request.resolved"]
    resolution = bodies[1]["resolution"]
    assert (resolution["outcome"], resolution["on_timeout"]) == ("expired", "approve")


def _opened(**request: Any) -> dict[str, Any]:
    """A `request.opened` body for a request showing `request`."""
    from signoff.channels._webhook_bodies import delivery_body

    return delivery_body("request.opened", "req_1", {"id": "req_1", **request}, None, None, 1.0)


def test_an_input_of_fewer_than_500_bytes_of_cjk_is_not_clipped() -> None:
    """An input of 150 CJK characters is 458 bytes as sent (UTF-8), as an ASCII one of 450
    characters is: clipping a long question is enough for both. Before, the CJK one was
    measured with `\\u` escapes (906), over the 500 bytes of what is never clipped, and
    nulled."""
    from signoff.channels._webhook_bodies import json_bytes, within

    for text in ("a" * 450, "漢" * 150, "🙂" * 112):
        inp = {"t": text}
        assert len(json_bytes(inp)) <= 458
        body = within(_opened(question="q" * 3000, action={"input": inp}), 1024)
        assert body["clipped"] == ["request.question"], text[0]
        assert body["request"]["action"]["input"] == inp
        assert len(json_bytes(body)) <= 1024


def test_the_largest_part_as_sent_is_clipped_first() -> None:
    """An input of 300 CJK characters (908 bytes as sent) and a payload of 1208 bytes of
    ASCII: the payload is the larger, and clipping it alone fits. Before, the input measured
    with `\\u` escapes (1808) went first."""
    from signoff.channels._webhook_bodies import json_bytes, within

    inp, payload = {"t": "漢" * 300}, {"t": "a" * 1200}
    body = within(_opened(action={"input": inp}, payload=payload), 1500)
    assert body["clipped"] == ["request.payload"]
    assert body["request"]["action"]["input"] == inp
    assert len(json_bytes(body)) <= 1500


async def test_a_body_over_a_low_max_body_bytes_once_clipped_is_logged_as_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`max_body_bytes=1024` is taken, but a body with all it can clip clipped is still over
    it (its ids, names and parts of 500 bytes or fewer are never clipped): an opening went out
    at 1127 bytes and a close whose reason was cut at 1338, nothing saying the bound was not
    kept. They are still sent (the receiver may take them); the first is logged as a warning
    naming it, its size and the bound, once per channel."""
    async with Receiver([]) as receiver:
        async with so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
            hooks = WebhookChannel(receiver.url, SECRET, max_attempts=1, max_body_bytes=1024)
            async with manual(ChannelHub(rt, [hooks])) as hub:
                with caplog.at_level(logging.WARNING, logger="signoff"):
                    r = await rt.generate("billing", prompt="refund order 1000")
                    await hub.poll()
                    await hooks.drain()
                    answer = so.InputResponse(
                        request_id=r.pending[0].id, option_id="cancel", text="x" * 3000
                    )
                    await rt.respond(r.session_id, [answer])
                    await hub.poll()
                    await hooks.drain()
    (_, opened), (_, closed) = receiver.accepted
    assert json.loads(closed)["clipped"] == ["resolution.reason"]
    assert len(opened) > 1024 and len(closed) > 1024
    (warning,) = [r for r in caplog.records if "max_body_bytes=1024" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    shown = f"{json.loads(opened)['id']} (request.opened) is {len(opened)} bytes"
    assert shown in warning.getMessage()
