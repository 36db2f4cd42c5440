"""`_child_sessions`: counting a cancelled subagent's spend in the parent that owes it finds the
tree deleted meanwhile (another process's prune, once the child's turn ended): nothing is owed,
and the call on the child stands rather than failing on a session its caller never named."""

from __future__ import annotations

import pytest

import signoff as so

from ._subagents import ALICE
from .test_child_drives import _deleted_once_settled
from .test_subagents_spend import orders, support, tokens, waiting_child


@pytest.mark.parametrize("how", ["cancel", "respond"])
async def test_a_call_on_an_orphan_whose_tree_is_deleted_as_its_spend_is_counted_stands(
    store_url: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The parent was cancelled by a runtime without the child's agent, so it owes the child's
    spend; a cancel of the child, or an answer to it (which cancels the orphan), by a runtime
    with the agent counts it, and the tree is deleted between the child's cancel and the count:
    the write to the parent raised UnknownSession naming the parent. Now the cancel stands, and
    the answer is told that the child it named is gone."""
    async with (
        so.Runtime([support(), orders(tokens(40))], store=store_url) as rt,
        so.Runtime([support()], store=store_url) as agentless,
        so.Runtime([support(), orders(tokens(40))], store=store_url) as other,
    ):
        parent, child = await waiting_child(rt)
        await agentless.cancel(parent, principal=ALICE)
        [request] = await rt.pending(session_id=child)
        deleted = _deleted_once_settled(monkeypatch, other, parent, child)
        if how == "cancel":
            cancelled = await rt.cancel(child, principal=ALICE)
            assert cancelled.cancelled
        else:
            approve = so.InputResponse(request_id=request.id, option_id="approve")
            with pytest.raises(so.UnknownSession) as caught:  # gone once its orphan was cancelled
                await rt.respond(child, [approve], principal=ALICE)
            assert caught.value.session_id == child  # the session asked about, not its parent
        assert deleted == [[parent, child]]
        assert await rt.sessions() == []
