"""`delete_session` and `prune` of a session whose TTL passed while a subagent under it waited
on a person, on both stores: its expiry is recorded first as its agent records it (the
delegated turns it waited on cancelled, its requests expired), by a runtime without the agents
too, and the tree is deleted; one a subagent's own turn keeps waiting is refused with nothing
recorded."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff.stores._deletions import DELETIONS_STREAM
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from .test_deletion import ALICE, OPS


@so.tool(approval=so.always())
async def refund(order_id: str) -> str:
    """Refund an order."""
    return "refunded"


def asked(conversation: list[Any]) -> str | None:
    """The user message the conversation ends with, if it does."""
    last = conversation[-1]
    return last.text if isinstance(last, so.UserMessage) else None


def nested_desks(ttl_of: str) -> list[so.Agent]:
    """`front` delegates to `desk` (asking it `ask:refund 4`), `desk` asks `helper` what
    follows `ask:` and refunds itself when asked to, `helper` refunds when asked to and
    answers otherwise; each refund asks for approval. `ttl_of`'s sessions live 60 s."""

    def front(conversation: list[Any]) -> so.ModelResponse:
        if asked(conversation) is None:
            return reply("done")
        return call_tools(call("desk", message="ask:refund 4"))

    def desk(conversation: list[Any]) -> so.ModelResponse:
        text = asked(conversation)
        if text is None:
            return reply("done")
        if text.startswith("ask:"):
            return call_tools(call("helper", message=text[4:]))
        return call_tools(call("refund", order_id="5"))

    def helper(conversation: list[Any]) -> so.ModelResponse:
        text = asked(conversation)
        if text is not None and "refund" in text:
            return call_tools(call("refund", order_id="6"))
        return reply("order 3 is shipped")

    made = [
        scripted_agent("front", [front], tools=[so.delegate("desk")], repeat_last=True),
        scripted_agent("desk", [desk], tools=[so.delegate("helper"), refund], repeat_last=True),
        scripted_agent("helper", [helper], tools=[refund], repeat_last=True),
    ]
    for a in made:
        if a.name == ttl_of:
            a.limits = so.Limits(ttl=60)
    return made


async def _refused_unchanged(
    runtime: so.Runtime, desk: str, helper: str, before: list[int | None]
) -> None:
    """Deleting `desk` is refused `SessionWaiting` on `helper`'s request and a prune skips it,
    with nothing recorded: the heads are `before`, and no deletion is in the audit trail."""
    async with runtime as rt:
        with pytest.raises(so.SessionWaiting) as refused:
            await rt.delete_session(desk, by=OPS)
        assert helper in refused.value.held_by
        assert await rt.prune(older_than=60, by=OPS) == []
        assert await _heads(rt, [desk, helper]) == before
        assert await rt.audit(stream=DELETIONS_STREAM) == []


async def _heads(rt: so.Runtime, ids: list[str]) -> list[int | None]:
    """The last event of each session, as the store keeps it (`state` would record a TTL)."""
    return [await rt.store.head(s) for s in ids]


@pytest.mark.parametrize("how", ["delete", "prune"])
@pytest.mark.parametrize("loaded", ["none", "front", "all"])
async def test_an_expired_tree_whose_subagent_waits_is_deleted_whole(
    store_url: str, how: str, loaded: str
) -> None:
    """`front` (TTL 60 s) waits on `desk`, which waits on `helper`, which waits on a person;
    the TTL passes. A runtime without the agents (the CLI's on --store), or without the
    subagents', recorded the parent's expiry and no more: `delete_session` then refused the
    tree (`SessionWaiting`, the subagent's request still open) having changed it, and every
    prune skipped it for ever. Its delegated turns are cancelled as its agent cancels them."""
    clock = ManualClock()
    agents = nested_desks("front")
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        r = await rt.generate("front", prompt="go", auth=ALICE)
        assert r.status == "waiting"
        found = {s.agent: s.id for s in await rt.sessions()}
        tree = {a: found[a] for a in ("front", "desk", "helper")}
    clock.advance(120)
    here = {"none": [], "front": agents[:1], "all": agents}[loaded]
    async with so.Runtime(here, store=store_url, clock=clock) as rt:
        if how == "delete":
            got = await rt.delete_session(tree["front"], by=OPS)
            assert got == [tree["front"], tree["desk"], tree["helper"]]
        else:
            assert await rt.prune(older_than=60, by=OPS) == [tree["front"]]
        assert await rt.sessions() == []
        assert await rt.pending() == []
        [entry] = await rt.audit(stream=DELETIONS_STREAM)
        assert [s["id"] for s in entry.data["sessions"]] == list(tree.values())
        assert await rt.verify_audit() == []


@pytest.mark.parametrize("loaded", [False, True])
async def test_an_expired_tree_a_subagents_own_turn_holds_is_refused_unchanged(
    store_url: str, loaded: bool
) -> None:
    """`desk` (TTL 60 s) waits on its own refund's approval; `helper`, its subagent from an
    earlier turn, waits on a refund a message to it asked for: that turn is the helper's own,
    which the desk's expiry leaves alone. The deletion is refused, as it was, but only after
    recording the desk's expiry: now nothing is recorded, and a prune skips it likewise."""
    clock = ManualClock()
    agents = nested_desks("desk")
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        r = await rt.generate("desk", prompt="ask:where is order 3?", auth=ALICE)
        assert r.status == "completed"
        desk = r.session_id
        [helper] = [s.id for s in await rt.sessions(agent="helper")]
        assert (await rt.generate(session_id=desk, prompt="refund 5", auth=ALICE)).pending
        assert (await rt.generate(session_id=helper, prompt="refund 6", auth=ALICE)).pending
        before = await _heads(rt, [desk, helper])
    clock.advance(120)
    await _refused_unchanged(
        so.Runtime(agents if loaded else [], store=store_url, clock=clock), desk, helper, before
    )


@pytest.mark.parametrize("how", ["delete", "prune"])
@pytest.mark.parametrize("loaded", [False, True])
async def test_a_finished_tree_whose_subagents_own_turn_expired_is_deleted_whole(
    store_url: str, how: str, loaded: bool
) -> None:
    """`desk`'s turn ended; `helper` (TTL 60 s), its subagent, waits on a refund a message to it
    asked for, and its own TTL passes. Only the desk's expiry was recorded (it has none): the
    deletion was refused naming the helper's dead request, and every prune skipped the tree,
    until something read the helper. Its expiry is recorded as its agent records it, and the
    tree goes."""
    clock = ManualClock()
    agents = nested_desks("helper")
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        r = await rt.generate("desk", prompt="ask:where is order 3?", auth=ALICE)
        assert r.status == "completed"
        desk = r.session_id
        [helper] = [s.id for s in await rt.sessions(agent="helper")]
        assert (await rt.generate(session_id=helper, prompt="refund 6", auth=ALICE)).pending
    clock.advance(120)
    async with so.Runtime(agents if loaded else [], store=store_url, clock=clock) as rt:
        if how == "delete":
            assert await rt.delete_session(desk, by=OPS) == [desk, helper]
        else:
            assert await rt.prune(older_than=60, by=OPS) == [desk]
        assert await rt.sessions() == []
        assert await rt.pending() == []
        [entry] = await rt.audit(stream=DELETIONS_STREAM)
        assert [s["id"] for s in entry.data["sessions"]] == [desk, helper]
        assert await rt.verify_audit() == []


@pytest.mark.parametrize("loaded", [False, True])
async def test_a_tree_whose_delegated_subagent_expired_under_a_live_turn_is_refused_unchanged(
    store_url: str, loaded: bool
) -> None:
    """`desk` (no TTL) waits on `helper` (TTL 60 s), which waits on a person; the helper's TTL
    passes. Its expiry would let the desk's turn go on, so the deletion is refused with nothing
    recorded, and a prune skips it."""
    clock = ManualClock()
    agents = nested_desks("helper")
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        r = await rt.generate("desk", prompt="ask:refund 4", auth=ALICE)
        assert r.status == "waiting"
        desk = r.session_id
        [helper] = [s.id for s in await rt.sessions(agent="helper")]
        before = await _heads(rt, [desk, helper])
    clock.advance(120)
    await _refused_unchanged(
        so.Runtime(agents if loaded else [], store=store_url, clock=clock), desk, helper, before
    )


def _own_delegation() -> list[so.Agent]:
    """`top` asks `mid` a question (`mid` answers); `mid` (TTL 60 s), told `go`, delegates to
    `low`, which asks for a refund's approval."""

    def top(conversation: list[Any]) -> so.ModelResponse:
        return call_tools(call("mid", message="hi")) if asked(conversation) else reply("done")

    def mid(conversation: list[Any]) -> so.ModelResponse:
        text = asked(conversation)
        if text is None:
            return reply("done")
        return call_tools(call("low", message="refund")) if text == "go" else reply("hello")

    def low(conversation: list[Any]) -> so.ModelResponse:
        return call_tools(call("refund", order_id="1")) if asked(conversation) else reply("ok")

    return [
        scripted_agent("top", [top], tools=[so.delegate("mid")], repeat_last=True),
        scripted_agent(
            "mid", [mid], tools=[so.delegate("low")], repeat_last=True, limits=so.Limits(ttl=60)
        ),
        scripted_agent("low", [low], tools=[refund], repeat_last=True),
    ]


@pytest.mark.parametrize("how", ["delete", "prune"])
@pytest.mark.parametrize("loaded", [False, True])
async def test_a_subagents_own_expired_turn_ends_the_delegated_turn_it_waits_on(
    store_url: str, how: str, loaded: bool
) -> None:
    """`top`'s turn ended; a message to `mid`, its subagent, started a turn of `mid`'s own that
    delegates to `low`, which waits on a person; `mid`'s TTL passes. Its expiry, recorded as
    its agent records it, cancels the delegated turn under it, and the tree goes."""
    clock = ManualClock()
    agents = _own_delegation()
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        r = await rt.generate("top", prompt="ask", auth=ALICE)
        assert r.status == "completed"
        [mid] = [s.id for s in await rt.sessions(agent="mid")]
        assert (await rt.generate(session_id=mid, prompt="go", auth=ALICE)).status == "waiting"
        [low] = [s.id for s in await rt.sessions(agent="low")]
    clock.advance(120)
    async with so.Runtime(agents if loaded else [], store=store_url, clock=clock) as rt:
        if how == "delete":
            assert await rt.delete_session(r.session_id, by=OPS) == [r.session_id, mid, low]
        else:
            assert await rt.prune(older_than=60, by=OPS) == [r.session_id]
        assert await rt.sessions() == []
        assert await rt.pending() == []
        assert await rt.verify_audit() == []


@pytest.mark.parametrize("how", ["delete", "prune"])
@pytest.mark.parametrize("loaded", [False, True])
async def test_a_tree_a_live_turn_keeps_is_refused_before_a_subagents_expiry_is_recorded(
    store_url: str, how: str, loaded: bool
) -> None:
    """`front`'s turn ended; `helper` (TTL 60 s), a subagent under it, waits on a refund a
    message to it asked for, and its TTL passes; a message to `desk` (no TTL), between them,
    left its turn with work to do (no drive took it: `inline=False`). The deletion recorded the
    helper's expiry, then was refused all the same (`SessionBusy`, the desk's turn), and a
    prune did the same to a tree it then skipped: refused as it was (`SessionWaiting`), with
    nothing recorded."""
    clock = ManualClock()
    agents = nested_desks("helper")
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        r = await rt.generate("front", prompt="go", auth=ALICE)
        [mirror] = r.pending
        approve = so.InputResponse(request_id=mirror.id, option_id="approve")
        assert (await rt.respond(r.session_id, [approve], principal=ALICE)).status == "completed"
        found = {s.agent: s.id for s in await rt.sessions()}
        front, desk, helper = (found[a] for a in ("front", "desk", "helper"))
        assert (await rt.generate(session_id=helper, prompt="refund 6", auth=ALICE)).pending
    async with so.Runtime(agents, store=store_url, clock=clock, inline=False) as rt:
        assert (await rt.generate(session_id=desk, prompt="hi", auth=ALICE)).status == "running"
        before = await _heads(rt, [front, desk, helper])
    clock.advance(120)
    async with so.Runtime(agents if loaded else [], store=store_url, clock=clock) as rt:
        if how == "delete":
            with pytest.raises(so.SessionWaiting) as refused:
                await rt.delete_session(front, by=OPS)
            assert refused.value.held_by == [helper]
            assert refused.value.unfinished == [desk]
        else:
            assert await rt.prune(older_than=60, by=OPS) == []
        assert await _heads(rt, [front, desk, helper]) == before
        assert await rt.audit(stream=DELETIONS_STREAM) == []


@pytest.mark.parametrize("agents", ["with-agent", "without"])
async def test_an_expiry_the_store_fails_to_record_is_its_error_not_cancel_it_first(
    store_url: str, agents: str
) -> None:
    """A session waiting past its TTL whose expiry's commits fail (a statement timeout): the
    error was swallowed and the caller told `SessionWaiting` ("cancel it first"), though
    nothing waits on people; it is the store's error, and a retry deletes it. (With its agent,
    a record that failed once is tried again as a stand-in.)"""

    solo = scripted_agent(
        "solo",
        [call_tools(call("refund", order_id="1")), reply("done")],
        tools=[refund],
        limits=so.Limits(ttl=5),
    )
    clock = ManualClock()
    async with so.Runtime([solo], store=store_url, clock=clock) as rt:
        sid = (await rt.generate("solo", prompt="refund 1")).session_id
    clock.advance(10)  # its TTL passed, unrecorded
    async with so.Runtime(
        [solo] if agents == "with-agent" else [], store=store_url, clock=clock
    ) as rt:
        store: Any = rt.store
        commit = store.commit

        async def timed_out(*args: Any, **kw: Any) -> Any:
            raise so.StoreError("canceling statement due to statement timeout (simulated)")

        store.commit = timed_out
        with pytest.raises(so.StoreError, match="statement timeout") as caught:
            await rt.delete_session(sid)
        assert not isinstance(caught.value, so.SessionWaiting)
        assert await rt.prune(older_than=0) == []  # a prune skips it, for the next to try
        store.commit = commit
        assert await rt.delete_session(sid) == [sid]
