"""A hub SIGKILLed right before or right after the store's commit of the memo that its text channel
told the person of an escalation (`<hub>.<channel>:escalated:<request>`). The README promises that
an entry the dead hub was delivering is delivered again, nothing skipped, and that a hub going on
(on another state too) does not tell the person an escalation it told: killed after the memo's
commit the person is told once, killed before it once more (the text is sent before its memo)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.testing import ManualClock

from . import _proof
from ._channels import BOB, caught_up, escalating_refund, manual
from ._escalation_crash import CLAIM_TTL, ESCALATED, Told, hub, sent
from ._forks import Scripts
from ._procs import ROOT
from .test_sqlite_upgrade import _child_env

_CHILD = "import sys\nfrom tests._escalation_crash import main\nmain(sys.argv[1:])\n"


def escalations(path: Path) -> list[str]:
    return [text for text in sent(path) if ESCALATED in text]


@pytest.mark.parametrize("restart", ["same state", "another state"])
@pytest.mark.parametrize("when", ["before", "after"])
async def test_an_escalation_is_told_again_only_if_killed_before_its_memo_was_kept(
    store_url: str, tmp_path: Path, scripts: Scripts, when: str, restart: str
) -> None:
    """The first hub shows the request and stops; it escalates; a child hub on the same state
    goes on, tells the escalation and is killed around its memo's commit; a hub restarted on
    the same state file, or on another (a machine lost), goes on from there."""
    texts = tmp_path / "sent.jsonl"
    clock = ManualClock(time.time())
    async with (
        so.Runtime([escalating_refund()], store=store_url, clock=clock) as rt,
        so.Runtime([], store=store_url) as front,  # the hubs', on the machine's clock
    ):
        store: Any = rt.store  # the memos are not part of the `Store` protocol
        first = hub(front, Told(texts), tmp_path / "a.db")
        async with manual(first):
            (a,) = (await rt.generate("support", prompt="Refund A-1")).pending
            await caught_up(first, CLAIM_TTL)
        memo = f"{first.name}.sms:escalated:{a.id}"
        assert sent(texts) == [Told(texts).render(a)]
        clock.advance(61)
        assert await rt.expire_due() == 1  # escalated to finance

        env = {**_child_env(), "PYTHONPATH": f"{_child_env()['PYTHONPATH']}:{ROOT}"}
        done = scripts.run(_CHILD, store_url, str(tmp_path / "a.db"), str(texts), when, env=env)
        assert done.returncode == -signal.SIGKILL, (done.returncode, done.stderr)
        _proof.record("crash-outside:kills")
        assert len(escalations(texts)) == 1  # told, then killed around the memo's commit
        assert await store.channel_memo(memo) == (None if when == "before" else '"finance"')

        sms = Told(texts)
        restarted = hub(front, sms, tmp_path / ("a.db" if restart == "same state" else "b.db"))
        async with manual(restarted):
            await caught_up(restarted, CLAIM_TTL)
            assert [(r.id, r.escalated_to) for r in sms.waiting] == [(a.id, "finance")]
        told = len(escalations(texts))
        # After the memo's commit: told once, for good. Before it: its entry is delivered
        # again (nothing skipped) and nothing kept that it was told, so told once more, once.
        assert told == (2 if when == "before" else 1), sent(texts)
        assert await store.channel_memo(memo) == '"finance"'

        again = hub(front, Told(texts), tmp_path / "b.db")
        async with manual(again):  # one more restart (on b.db): nothing more is told
            await caught_up(again, CLAIM_TTL)
            assert len(escalations(texts)) == told
            r = await rt.respond(
                a.session_id,
                [so.InputResponse(request_id=a.id, option_id="approve")],
                principal=BOB,
            )
            assert r.outcomes[0].outcome == "approved"
            await again.poll()
        assert "approved" in sent(texts)[-1] and len(escalations(texts)) == told
        assert await store.channel_memo(memo) is None  # dropped once the close was told
