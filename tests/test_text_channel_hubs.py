"""A text channel of a standby hub (on the state file of the hub that delivers) still answers:
a reply reaching its process answers the request the person was shown, not "nothing waits"."""

from __future__ import annotations

from pathlib import Path

import signoff as so
from signoff.channels import ChannelHub

from ._channels import Texts, manual, runtime, three_refunds

BOB = so.Principal(authenticator="sms", principal_id="+15550100")


async def test_a_standby_text_channel_answers_the_request_shown(tmp_path: Path) -> None:
    runs: list[str] = []
    async with runtime(tmp_path, three_refunds(runs)) as rt:
        state = tmp_path / "channels.db"
        shown, standing = Texts(), Texts()
        async with (
            manual(ChannelHub(rt, [shown], state=state)) as one,
            manual(ChannelHub(rt, [standing], state=state)) as two,
        ):
            r = await rt.generate("support", prompt="Refund A, B and C")
            a, b, _ = r.pending
            await one.poll()
            await two.poll()
            assert shown.sent == [shown.render(a)] and standing.sent == []
            outcome = await standing.reply("yes", BOB)  # the SMS reached the standby's process
            assert outcome is not None and outcome.outcome == "approved"
            assert standing.sent == []
            stored = await rt.store.get_request(a.id)
            assert stored is not None and stored.outcome == "approved"
            await one.poll()
            assert shown.sent[-1] == shown.render(b)  # the delivering hub shows the next
            assert await standing.reply("maybe", BOB) is None  # b, shown now: a hint
            assert standing.sent == [standing._hint(b)]
