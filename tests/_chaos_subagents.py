"""The chaos test's checks of subagents, read from the store once every session finished.

`swept` maps each child whose parent's turn the test cancelled (and was told so) to when that
cancel returned: the child's delegated turn must not have completed after it.
"""

from __future__ import annotations

import signoff as so
from signoff.stores import SessionSummary

from ._chaos_procs import CHILD, PARENT

__all__ = ["check_subagents"]

GRACE = 2.0
"""Seconds a child's request may still be answered after its parent's turn was cancelled: the
cancel reaches the child a moment after it records the parent's."""


async def check_subagents(
    front: so.Runtime, sessions: list[SessionSummary], swept: dict[str, float], seed: int
) -> None:
    """Each delegate call's result is its child's turn as it ended (a completed turn's text,
    all its replies said), and no child's turn went on after its parent's turn was cancelled."""
    ended = ("turn.completed", "turn.cancelled", "turn.failed")
    delegated: dict[str, tuple[str, list[so.Event]]] = {}  # child -> (parent, parent's events)
    for s in sessions:
        if s.agent == PARENT:
            events = [e async for e in front.events(s.id, follow=False)]
            for e in events:
                if e.type == "tool.step" and e.data["name"] == "subagent.session":
                    delegated[str(e.data["result"])] = (s.id, events)
    children = [s.id for s in sessions if s.agent == CHILD]
    for child in set(children) - set(delegated):  # created as its parent's turn was cancelled
        state = await front.state(child)
        assert state.parent is not None, (seed, child, state.status)
        # Created with its turn started (one write) by a call whose process died before
        # journaling it, or whose parent's turn ended first. That turn was cancelled (by the
        # parent's cancel, `abandon_child`, a worker about to drive it or the orphan sweep), or
        # a drive ran it to its end while the parent's turn could still take its result. A
        # later turn, a message's, is the child's own.
        own = [e async for e in front.events(child, follow=False)]
        first = next((e.turn_id for e in own if e.type == "turn.started"), None)
        assert first is not None, (seed, child, [e.type for e in own])
        [end] = [e for e in own if e.turn_id == first and e.type in ended]
        theirs = [e async for e in front.events(state.parent, follow=False)]
        made_by = own[0].data.get("parent_turn")
        [over] = [e for e in theirs if e.turn_id == made_by and e.type in ended]
        if end.type != "turn.cancelled":
            assert end.at <= over.at + GRACE, (seed, child, end.type, end.at, over.at)
        assert over.type in ("turn.completed", "turn.cancelled"), (seed, child, over.type)
    assert set(delegated) <= set(children), (seed, children, list(delegated))
    for child, (parent, events) in delegated.items():
        state = await front.state(child)
        assert state.parent == parent, (seed, child, state.parent, parent)
        own = [e async for e in front.events(child, follow=False)]
        [step] = [e for e in events if e.type == "tool.step" and e.data["result"] == child]
        call = (step.turn_id, step.data["call_id"])
        results = [
            e
            for e in events
            if e.type == "tool.completed" and (e.turn_id, e.data["call_id"]) == call
        ]
        parent_end = [e for e in events if e.turn_id == step.turn_id and e.type in ended]
        # Every child is created with its delegated turn started, in one write.
        turn_id = next((e.turn_id for e in own if e.type == "turn.started"), None)
        assert turn_id is not None, (seed, parent, child, [e.type for e in own])
        [end] = [e for e in own if e.turn_id == turn_id and e.type in ended]
        # The turn's text joins what each of its replies said: a message that came while the
        # model wrote the last one (read_through before it) gets a reply of its own.
        said = [e.data["text"] for e in own if e.turn_id == turn_id and e.type == "model.completed"]
        text = "\n\n".join(t for t in said if t)
        if results:
            [result] = results
            assert result.data["status"] == "ok", (seed, parent, child, result.data)
            got = result.data["result"]
            if isinstance(got, str):  # the child's turn completed with this text
                assert end.type == "turn.completed" and got == text, (seed, child, got, said, end)
            else:  # {"cancelled": true} or {"interrupted": true}: the child's turn was cancelled
                assert end.type == "turn.cancelled", (seed, child, got, end)
        else:  # the parent's turn ended first: cancelled, and so the child's turn with it
            assert [e.type for e in parent_end] == ["turn.cancelled"], (seed, parent, parent_end)
            assert end.type != "turn.failed", (seed, child, end)
            # No answer was applied to the child long after (its parent's cancel missed it).
            late = [
                e.data["request_id"]
                for e in own
                if e.turn_id == turn_id
                and e.type == "input.resolved"
                and e.data["status"] == "settled"
                and e.at > parent_end[0].at + GRACE
            ]
            assert late == [], (seed, child, "answered after its parent's cancel", late)
        if child in swept and end.type == "turn.completed":
            assert end.at <= swept[child], (
                seed,
                child,
                "completed after its parent's cancel",
            )
