"""`ServerContext`'s rules read directly: an admin under a custom access rule sees only what the
rule lets them, a request read alone has its passed deadline recorded as the queue records it,
requests of a session whose TTL passed are in no one's queue, and a stream's sign-in is not
ended by the store failing for a moment."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import signoff as so
from signoff.server import TokenAuth, _auth, _context
from signoff.server._auth import default_access
from signoff.server._context import ServerContext
from signoff.server._sign_ins import Grant
from signoff.stores import PendingFilter
from signoff.testing import Capture, ManualClock, call, call_tools, reply, scripted_agent

from ._ttl import ttl_agent
from .test_server_common import ADMIN, ALICE, BOB, MALLORY, make_agents
from .test_server_errors import deadline_agent


def _ctx(runtime: so.Runtime, access: Any = default_access) -> ServerContext:
    return ServerContext(runtime=runtime, auth=TokenAuth({}), access=access, secret=b"k" * 32)


def _own_only(caller: so.Principal, initiator: so.Principal | None) -> bool:
    """A custom rule: a session is its initiator's alone, admin or not."""
    return initiator is not None and caller.same_as(initiator)


async def test_an_admin_under_a_custom_rule_sees_only_what_the_rule_allows(
    store_url: str,
) -> None:
    """`admin: true` means "sees everything" only under the default rule: with a rule of the
    application's own, an admin's queue and listing are filtered by it like anyone's."""
    async with so.Runtime([ttl_agent()], store=store_url) as rt:
        mine = await rt.generate("desk", prompt="reset", auth=ADMIN)
        theirs = await rt.generate("desk", prompt="reset", auth=ALICE)
        ctx = _ctx(rt, _own_only)
        assert not ctx.sees_every_request(ADMIN)
        items, total = await ctx.visible_requests(ADMIN, PendingFilter(limit=50))
        assert [r.id for r in items] == [r.id for r in mine.pending] and total == 1
        rows, total = await ctx.visible_sessions(ADMIN, limit=50, offset=0)
        assert [r.id for r in rows] == [mine.session_id] and total == 1
        # the default rule lets the admin see both
        ctx = _ctx(rt)
        items, total = await ctx.visible_requests(ADMIN, PendingFilter(limit=50))
        assert total == 2 and {r.session_id for r in items} == {
            mine.session_id,
            theirs.session_id,
        }


async def test_a_rule_that_returns_an_awaitable_shows_no_session(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain rule that calls an async one (`lambda c, i: rule(c, i)`), which `create_app`
    cannot tell from a plain rule, returns a coroutine: its truth showed every session to every
    caller, another tenant's included. It is no answer now: the session is not shown, and the
    log says why, once."""
    monkeypatch.setattr(_auth, "_told", set())

    async def own_only(caller: so.Principal, initiator: so.Principal | None) -> bool:
        return _own_only(caller, initiator)

    async with so.Runtime([ttl_agent()], store=f"sqlite:///{tmp_path}/s.db") as rt:
        theirs = await rt.generate("desk", prompt="reset", auth=ALICE)
        ctx = _ctx(rt, lambda caller, initiator: own_only(caller, initiator))
        with pytest.raises(so.UnknownSession):
            await ctx.session(theirs.session_id, MALLORY)
        rows, total = await ctx.visible_sessions(MALLORY, limit=50, offset=0)
        assert (rows, total) == ([], 0)
        assert await ctx.visible_requests(MALLORY, PendingFilter(limit=50)) == ([], 0)
    assert caplog.text.count("the access rule returned <coroutine object") == 1


@pytest.mark.parametrize("answer", ["no", 1, None, [False]], ids=["text", "one", "none", "list"])
async def test_a_rule_that_returns_no_bool_shows_no_session(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, answer: Any
) -> None:
    """A rule's answer is True or False: a string such as "no" (or 1, a list) was read by its
    truth, and showed the session to every caller. Only True shows it; the log says why, once."""
    monkeypatch.setattr(_auth, "_told", set())
    async with so.Runtime([ttl_agent()], store=f"sqlite:///{tmp_path}/s.db") as rt:
        theirs = await rt.generate("desk", prompt="reset", auth=ALICE)
        ctx = _ctx(rt, lambda caller, initiator: answer)
        for caller in (MALLORY, ALICE):
            with pytest.raises(so.UnknownSession):
                await ctx.session(theirs.session_id, caller)
            rows, total = await ctx.visible_sessions(caller, limit=50, offset=0)
            assert (rows, total) == ([], 0)
            assert await ctx.visible_requests(caller, PendingFilter(limit=50)) == ([], 0)
    said = f"the access rule returned {answer!r}, not True or False"
    assert caplog.text.count(said) == 1


@pytest.mark.parametrize("caller", [ADMIN, ALICE], ids=["admin", "initiator"])
async def test_requests_of_a_session_past_its_ttl_are_in_no_queue(
    tmp_path: Path, caller: so.Principal
) -> None:
    """No one can answer a request of a session whose TTL passed: the queue leaves it out (and
    out of the total) even before anything records the expiry, for an admin too."""
    now = [1_000_000.0]
    async with so.Runtime(
        [ttl_agent()], store=f"sqlite:///{tmp_path}/ttl.db", clock=lambda: now[0]
    ) as rt:
        await rt.generate("desk", prompt="reset", auth=ALICE)
        ctx = _ctx(rt)
        assert (await ctx.visible_requests(caller, PendingFilter(limit=50)))[1] == 1
        now[0] += 61
        assert await ctx.visible_requests(caller, PendingFilter(limit=50)) == ([], 0)


async def test_reading_a_request_past_its_deadline_records_what_the_deadline_did(
    tmp_path: Path,
) -> None:
    """A request read alone past its deadline (no sweep yet) has the deadline applied in the
    store, as the queue does: denied ones are expired, escalated ones escalated."""
    now = [1_000_000.0]
    agents = [deadline_agent("desk", "reset_password"), deadline_agent("locks", "unlock_account")]
    async with so.Runtime(agents, store=f"sqlite:///{tmp_path}/due.db", clock=lambda: now[0]) as rt:
        denied = (await rt.generate("desk", prompt="help", auth=ALICE)).pending[0].id
        escalated = (await rt.generate("locks", prompt="help", auth=ALICE)).pending[0].id
        ctx = _ctx(rt)
        now[0] += 60
        read = await ctx.request(denied, ALICE)
        assert read.status == "expired"
        stored = await rt.store.get_request(denied)
        assert stored is not None and stored.status == "expired"
        read = await ctx.request(escalated, ALICE)
        assert (read.status, read.request.escalated_to) == ("pending", "security")
        stored = await rt.store.get_request(escalated)
        assert stored is not None and stored.request.escalated_to == "security"
        # someone who may not see the session is told it does not exist, deadline or not
        with pytest.raises(so.UnknownRequest):
            await ctx.request(denied, MALLORY)


async def test_a_streams_sign_in_survives_the_store_failing_for_a_moment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream asks every heartbeat whether its sign-in was signed out: a store that cannot say
    (down for a moment) does not end it, while a sign-in past its lifetime does."""
    now = [1_000_000.0]
    async with so.Runtime(
        [ttl_agent()], store=f"sqlite:///{tmp_path}/s.db", clock=lambda: now[0]
    ) as rt:
        ctx = _ctx(rt)
        grant = Grant(id="abc", issued=int(now[0]), principal=ALICE)
        request: Any = SimpleNamespace(state=SimpleNamespace(signoff_sign_in=grant))
        assert await ctx.sign_in_ended(request) is False

        async def down(*args: object, **kwargs: object) -> object:
            raise so.StoreUnavailable("the database is down")

        monkeypatch.setattr(rt.store, "audit_heads", down)
        assert await ctx.sign_in_ended(request) is False
        now[0] += ctx.sign_in_lifetime
        assert await ctx.sign_in_ended(request) is True
        # a request signed in with a bearer token has no sign-in to end
        assert await ctx.sign_in_ended(SimpleNamespace(state=SimpleNamespace())) is False  # type: ignore[arg-type]


async def test_a_queue_of_more_requests_than_one_read_is_paged_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller's queue is read from the store `REQUEST_CHUNK` requests at a time and filtered
    by who may see each session: more requests than one read holds are listed whole, paged
    across the reads' seams without a request lost or repeated, and another tenant sees none."""
    monkeypatch.setattr(_context, "REQUEST_CHUNK", 5)

    @so.tool(approval=so.always())
    async def wipe(disk: int) -> str:
        """Wipe a disk."""
        return "wiped"

    calls = [so.ToolCall(name="wipe", input={"disk": n}) for n in range(12)]
    agent = so.Agent(
        name="ops",
        model=so.models.Scripted([so.ModelResponse(tool_calls=calls)]),
        tools=[wipe],
    )
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/q.db") as rt:
        asked = await rt.generate("ops", prompt="wipe them all", auth=ALICE)
        ids = [r.id for r in asked.pending]
        assert len(ids) == 12
        ctx = _ctx(rt)
        items, total = await ctx.visible_requests(ALICE, PendingFilter(limit=50))
        assert total == 12 and sorted(r.id for r in items) == sorted(ids)
        everything = [r.id for r in items]
        for offset in range(12):
            page, total = await ctx.visible_requests(ALICE, PendingFilter(limit=3, offset=offset))
            assert [r.id for r in page] == everything[offset : offset + 3] and total == 12
        assert await ctx.visible_requests(MALLORY, PendingFilter(limit=50)) == ([], 0)


async def test_a_queue_read_past_a_deleted_sessions_request_lists_each_request_once(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a rule of the application's own, the queue is read in keyset chunks: the session
    whose request ends one chunk deleted before the next is read, the store lists that moment's
    other requests again (none skipped). They were listed and counted twice (8 of 6)."""
    monkeypatch.setattr(_context, "REQUEST_CHUNK", 4)
    questions = [call("ask_question", call_id=f"q{i}", question=f"Q{i}?") for i in range(3)]
    agent = scripted_agent(
        "a", [call_tools(*questions), Capture(reply("ok"))], tools=[so.ask_question()]
    )
    async with so.Runtime([agent], store=store_url, clock=ManualClock()) as rt:
        for _ in range(3):  # nine requests of one moment
            await rt.generate("a", prompt="go", auth=ALICE)
        real = rt.store.pending

        async def deleting(flt: PendingFilter) -> list[so.InputRequest]:
            page = await real(flt)
            if flt.after is None and page:  # the first chunk
                await rt.delete_session(page[-1].session_id, by=ALICE, force=True)
            return page

        monkeypatch.setattr(rt.store, "pending", deleting)
        items, total = await _ctx(rt, _own_only).visible_requests(ALICE, PendingFilter(limit=50))
        monkeypatch.setattr(rt.store, "pending", real)
        ids = [r.id for r in items]
        assert len(set(ids)) == len(ids) == total
        assert {r.id for r in await rt.pending()} <= set(ids)


async def test_the_queue_version_changes_when_the_newest_request_is_replaced(
    tmp_path: Path,
) -> None:
    """The dashboard redraws its queue when `open_requests_version` changes: a request closed
    and another opened between two polls leave the count and the oldest alone, so the newest
    must tell them apart."""
    async with so.Runtime([ttl_agent()], store=f"sqlite:///{tmp_path}/v.db") as rt:
        await rt.generate("desk", prompt="reset", auth=ALICE)
        newest = await rt.generate("desk", prompt="reset", auth=ALICE)
        ctx = _ctx(rt)
        total, before = await ctx.open_requests_version()
        assert total == 2
        await rt.cancel(newest.session_id, "not needed")
        await rt.generate("desk", prompt="reset", auth=ALICE)
        total, after = await ctx.open_requests_version()
        assert total == 2 and after != before
        assert await ctx.queue_version(ADMIN) == (2, after)


async def test_the_queue_version_changes_when_a_vote_is_counted(store_url: str) -> None:
    """A vote toward a two-person approval leaves the set of open requests and its ends as they
    were, so no queue stream told the page, whose card said "0 of 2" until reloaded. Each kind
    of caller's version changes with a vote in a session they see, and the default rule's only
    then: a vote in another's session is not theirs to hear of."""
    async with so.Runtime(make_agents(), store=store_url) as rt:
        mine = await rt.generate("treasury", prompt="wire it", auth=ALICE)
        theirs = await rt.generate("treasury", prompt="wire it", auth=MALLORY)
        ctxs = {"admin": (_ctx(rt), ADMIN), "own": (_ctx(rt), ALICE)}
        ctxs["rule"] = (_ctx(rt, _own_only), ALICE)  # a scan of what the rule lets it see

        async def versions() -> dict[str, tuple[int, str]]:
            return {name: await ctx.queue_version(who) for name, (ctx, who) in ctxs.items()}

        before = await versions()
        assert {name: total for name, (total, _) in before.items()} == {
            "admin": 2,
            "own": 1,
            "rule": 1,
        }
        approve = {"request_id": theirs.pending[0].id, "option_id": "approve"}
        counted = await rt.respond(theirs.session_id, [approve], principal=ADMIN)
        assert counted.status == "waiting"
        after = await versions()
        assert after["admin"] != before["admin"]
        assert after["own"] == before["own"] and after["rule"] == before["rule"]
        approve = {"request_id": mine.pending[0].id, "option_id": "approve"}
        counted = await rt.respond(mine.session_id, [approve], principal=BOB)
        assert counted.status == "waiting"
        last = await versions()
        assert all(last[name] != after[name] for name in ctxs), (after, last)
        assert {name: total for name, (total, _) in last.items()} == {
            "admin": 2,
            "own": 1,
            "rule": 1,
        }
