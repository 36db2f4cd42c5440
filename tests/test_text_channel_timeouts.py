"""What a `TextChannel` says of a deadline that approves the call (`on_timeout="approve"`):
the request shown says so, and the call it approved, which ran, is told as approved, not as
expired."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._channels import Texts, manual


def _deploying(runs: list[str]) -> so.Agent:
    """An agent deploying to prod once, by a tool its deadline approves after 60 s: `runs`
    records each deployment."""

    @so.tool(approval=so.always(expires_in=60, on_timeout="approve"))
    async def deploy(env: str) -> str:
        """Deploy."""
        runs.append(env)
        return "deployed"

    return scripted_agent(
        "ops", [call_tools(call("deploy", env="prod")), reply("Deployed.")], tools=[deploy]
    )


async def test_a_call_its_deadline_approved_is_told_as_approved_not_expired(
    tmp_path: Path,
) -> None:
    """Before, the request read "Expires <date>." and its close "deploy expired at …", as for
    a call that never ran, though the deadline approved it and it ran."""
    runs: list[str] = []
    agent = _deploying(runs)
    clock = ManualClock(1_750_000_000.0)
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt:
        sms = Texts()
        async with manual(ChannelHub(rt, [sms], clock=clock)) as hub:
            await rt.generate("ops", prompt="Deploy")
            await hub.poll()
            (shown,) = sms.sent
            assert "\nExpires 2025-06-15 15:07 UTC; then it is approved automatically.\n" in shown
            clock.advance(61)
            assert await rt.expire_due() == 1
            await hub.poll()
        assert runs == ["prod"]
        assert sms.sent[1:] == [
            "deploy was approved automatically when its deadline passed at 2025-06-15 15:07 UTC "
            "(no one decided before the deadline)."
        ]


async def test_a_reply_after_the_deadline_approved_the_call_is_told_so(tmp_path: Path) -> None:
    """A reply to the request still shown once its deadline approved the call (the hub not yet
    caught up) was told `This request can no longer be answered: request … is expired`, as if
    the call had not run; it is told the call was approved automatically."""
    runs: list[str] = []
    agent = _deploying(runs)
    clock = ManualClock(1_750_000_000.0)
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt:
        sms = Texts()
        async with manual(ChannelHub(rt, [sms], clock=clock)) as hub:
            r = await rt.generate("ops", prompt="Deploy")
            (asked,) = r.pending
            await hub.poll()
            clock.advance(61)
            assert (
                await sms.reply("yes", so.Principal(authenticator="sms", principal_id="+1")) is None
            )
        stored = await rt.store.get_request(asked.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["on_timeout"] == "approve"  # the call runs on its drive
        assert sms.sent[-1] == (
            f"This request can no longer be answered: request {asked.id} was approved "
            "automatically when its deadline passed (on_timeout='approve'); it takes no answers"
        )


async def _swept_late(
    tmp_path: Path, spec: so.ApprovalPolicy, limits: so.Limits | None, shown: str, hours: int
) -> list[str]:
    """What a text channel is sent for a `deploy` call gated by `spec`: its request (which must
    show the deadline `shown`), then what it is told once a sweep `hours` later records the
    lapse (no worker recorded it before)."""

    @so.tool(approval=spec)
    async def deploy(env: str) -> str:
        """Deploy."""
        return "deployed"

    steps = [call_tools(call("deploy", env="prod")), reply("Deployed.")]
    agent = scripted_agent("ops", steps, tools=[deploy], limits=limits)
    clock = ManualClock(1_750_000_000.0)
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt:
        sms = Texts()
        async with manual(ChannelHub(rt, [sms], clock=clock)) as hub:
            await rt.generate("ops", prompt="Deploy")
            await hub.poll()
            assert f"\nExpires {shown}" in sms.sent[0]
            clock.advance(hours * 3600)
            assert await rt.expire_due() == 1
            await hub.poll()
    return sms.sent


@pytest.mark.parametrize(
    ("on_timeout", "told"),
    [
        ("deny", "deploy expired at 2025-06-15 15:07 UTC"),
        (
            "approve",
            "deploy was approved automatically when its deadline passed at 2025-06-15 15:07 UTC",
        ),
    ],
    ids=["deny", "approve"],
)
async def test_a_lapse_recorded_late_is_told_at_its_deadline(
    tmp_path: Path, on_timeout: Literal["deny", "approve"], told: str
) -> None:
    """No worker recorded the lapse for three hours: the close read "expired at 18:06" (or
    "approved automatically when its deadline passed at 18:06"), when it was recorded, where
    the request had said it expires at 15:07. It is told at the deadline."""
    spec = so.always(expires_in=60, on_timeout=on_timeout)
    sent = await _swept_late(tmp_path, spec, None, "2025-06-15 15:07 UTC", 3)
    assert sent[1:] == [f"{told} (no one decided before the deadline)."]


async def test_a_session_lapse_recorded_late_is_told_when_recorded_not_at_the_deadline(
    tmp_path: Path,
) -> None:
    """A session's TTL (an hour) passed before its request's deadline (two), and a sweep
    recorded it at five: the close was dated at the request's deadline, which never closed it.
    Only a close the deadline made is told at the deadline; this one when it was recorded."""
    spec = so.always(expires_in=7200)
    sent = await _swept_late(tmp_path, spec, so.Limits(ttl=3600), "2025-06-15 17:06 UTC", 5)
    assert len(sent) == 2 and "2025-06-15 20:06 UTC" in sent[1], sent
