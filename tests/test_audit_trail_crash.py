"""A process SIGKILLed right before or right after it records audit entries no event carries: a
tool's changed approval setting (written as a runtime opens), whose next opening records the
change once, and a dashboard sign-out, which every process sees once it was recorded and none
before. The trail verifies after each."""

from __future__ import annotations

import signal

import pytest

import signoff as so
from signoff.server._sign_ins import Grant, SignOuts
from signoff.stores._base import AUDIT_RECORDED

from . import _proof
from ._forks import Scripts
from .test_sqlite_upgrade import _child_env

# Opens a runtime whose tool `refund` is gated (`always`) or not (`auto`); with a third argument
# the store's fault hook SIGKILLs the process before or after its audit entries are recorded.
_OPEN = f"""
import asyncio, os, signal, sys
import signoff as so
from signoff.stores import open_store
url, setting = sys.argv[1], sys.argv[2]
kill = sys.argv[3] if len(sys.argv) > 3 else None
approval = so.always() if setting == "always" else so.never()
@so.tool(approval=approval)
async def refund(order_id: str) -> str:
    "Refund an order."
    return order_id
agent = so.Agent(name="ops", model=so.models.Scripted([]), tools=[refund])
def hook(when, label):
    if when == kill and label == {AUDIT_RECORDED!r}:
        os.kill(os.getpid(), signal.SIGKILL)
async def main():
    store = open_store(url)
    store.set_fault_hook(hook)
    async with so.Runtime([agent], store=store):
        pass
asyncio.run(main())
"""


def open_with(scripts: Scripts, url: str, setting: str, kill: str | None = None) -> int:
    done = scripts.run(_OPEN, url, setting, *([kill] if kill else []), env=_child_env())
    if kill is None:
        assert done.returncode == 0, done.stderr
    return done.returncode


async def settings(url: str) -> tuple[list[tuple[str | None, str]], list[so.AuditProblem]]:
    """The recorded changes of `refund`'s setting, oldest first, and what verification finds."""
    async with so.Runtime([], store=url) as rt:
        entries = await rt.audit(stream="tools:ops.refund")
        return [(e.data["old"], e.data["new"]) for e in entries], await rt.verify_audit()


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_setting_change_killed_around_its_record_is_recorded_once(
    store_url: str, scripts: Scripts, when: str
) -> None:
    open_with(scripts, store_url, "always")
    first, problems = await settings(store_url)
    assert len(first) == 1 and first[0][0] is None and problems == []
    gated = first[0][1]

    assert open_with(scripts, store_url, "never", kill=when) == -signal.SIGKILL
    _proof.record("crash-outside:kills")
    killed, problems = await settings(store_url)
    assert problems == []
    # before: nothing of it is stored; after: all of it, in one transaction
    assert len(killed) == (1 if when == "before" else 2)

    open_with(scripts, store_url, "never")  # the restart
    open_with(scripts, store_url, "never")  # and one more opening: nothing left to record
    final, problems = await settings(store_url)
    assert problems == []
    assert len(final) == 2 and final[0] == (None, gated)
    assert final[1][0] == gated and final[1][1] != gated
    if when == "after":
        assert final == killed  # what the killed process recorded stands, not doubled


# Signs out one dashboard sign-in as the server does; the fault hook may kill it around that.
_SIGN_OUT = f"""
import asyncio, os, signal, sys
import signoff as so
from signoff.server._sign_ins import Grant, SignOuts
from signoff.stores import open_store
url, sign_in, kill = sys.argv[1], sys.argv[2], sys.argv[3]
def hook(when, label):
    if when == kill and label == {AUDIT_RECORDED!r}:
        os.kill(os.getpid(), signal.SIGKILL)
async def main():
    store = open_store(url)
    store.set_fault_hook(hook)
    who = so.Principal(authenticator="token", principal_id="ops")
    await SignOuts(3600).revoke(store, Grant(sign_in, 1_000, who), 1_500.0)
    await store.close()
asyncio.run(main())
"""


async def signed_out(url: str, sign_in: str) -> bool:
    """Whether a process that never saw the sign-out refuses the sign-in."""
    who = so.Principal(authenticator="token", principal_id="ops")
    async with so.Runtime([], store=url) as rt:
        assert await rt.verify_audit() == []
        return await SignOuts(3600).revoked(rt.store, Grant(sign_in, 1_000, who), 1_600.0)


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_sign_out_killed_around_its_record_holds_only_once_recorded(
    store_url: str, scripts: Scripts, when: str
) -> None:
    def sign_out(kill: str) -> int:
        done = scripts.run(_SIGN_OUT, store_url, "si_1", kill, env=_child_env())
        assert done.returncode in (0, -signal.SIGKILL), done.stderr
        return done.returncode

    assert await signed_out(store_url, "si_1") is False
    assert sign_out(when) == -signal.SIGKILL
    _proof.record("crash-outside:kills")
    # Killed before: the browser got no answer and the sign-in stands; after: it is gone for all.
    assert await signed_out(store_url, "si_1") is (when == "after")
    assert sign_out("never") == 0  # the browser signs out again
    assert await signed_out(store_url, "si_1") is True
    assert await signed_out(store_url, "si_2") is False
