"""The approval queue across sessions (`Runtime.pending`)."""

import json
from pathlib import Path

from typer.testing import CliRunner

import signoff as so
from signoff import cli
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent


@so.tool(approval=so.always())
async def wipe(disk: str) -> str:
    """Wipe a disk."""
    return f"wiped {disk}"


async def test_requests_of_a_lapsed_session_leave_the_queue(tmp_path: Path) -> None:
    clock = ManualClock()
    agent = scripted_agent(
        "ops", [call_tools(call("wipe", disk="sda"))], tools=[wipe], limits=so.Limits(ttl=60)
    )
    rt = so.Runtime([agent], store=f"sqlite:///{tmp_path}/q.db", clock=clock)
    async with rt:
        r = await rt.generate("ops", prompt="wipe sda")
        assert [p.id for p in await rt.pending()] == [r.pending[0].id]
        clock.advance(59)
        assert len(await rt.pending()) == 1
        clock.advance(2)
        # Nobody can answer it any more: the session's TTL passed.
        assert await rt.pending() == []
        try:
            await rt.respond(
                r.session_id, [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
            )
        except so.SessionExpired as exc:
            assert exc.pending == [r.pending[0].id]
        else:
            raise AssertionError("answering a lapsed session must raise SessionExpired")


async def test_queue_filters_and_pages(tmp_path: Path) -> None:
    agent = scripted_agent("ops", [call_tools(call("wipe", disk="sda"))], tools=[wipe])
    other = scripted_agent("other", [call_tools(call("wipe", disk="sdb"))], tools=[wipe])
    async with so.Runtime([agent, other], store=f"sqlite:///{tmp_path}/q.db") as rt:
        ids = [(await rt.generate("ops", prompt=f"wipe {i}")).pending[0].id for i in range(3)]
        theirs = (await rt.generate("other", prompt="wipe")).pending[0].id
        assert [p.id for p in await rt.pending(agent="ops")] == ids
        assert [p.id for p in await rt.pending(agent="other")] == [theirs]
        assert [p.id for p in await rt.pending(agent="ops", limit=2, offset=1)] == ids[1:]
        assert [p.id for p in await rt.pending(tool_name="wipe", kind="tool-approval")] == [
            *ids,
            theirs,
        ]
        assert await rt.pending(kind="question") == []


async def test_sessions_are_listed_most_recent_first(store_url: str) -> None:
    agent = scripted_agent("ops", [call_tools(call("wipe", disk="sda"))], tools=[wipe])
    quiet = scripted_agent("quiet", [reply("hello")])
    async with so.Runtime([agent, quiet], store=store_url) as rt:
        waiting = await rt.generate("ops", prompt="wipe sda")
        idle = await rt.generate("quiet", prompt="hi")
        listed = await rt.sessions()
        assert [s.id for s in listed] == [idle.session_id, waiting.session_id]
        assert [(s.agent, s.status) for s in listed] == [("quiet", "idle"), ("ops", "waiting")]
        assert [s.id for s in await rt.sessions(status="waiting")] == [waiting.session_id]
        assert [s.id for s in await rt.sessions(agent="quiet")] == [idle.session_id]
        assert [s.id for s in await rt.sessions(limit=1, offset=1)] == [waiting.session_id]
        assert listed[1].head == (await rt.state(waiting.session_id)).seq


def test_signoff_sessions_command(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/q.db"
    agent = scripted_agent("ops", [call_tools(call("wipe", disk="sda"))], tools=[wipe])
    rt = so.Runtime([agent], store=url)
    sid = rt.generate_sync("ops", prompt="wipe sda").session_id
    rt.close_sync()
    result = CliRunner().invoke(cli.app, ["sessions", "--store", url, "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["id"], r["agent"], r["status"]) for r in rows] == [(sid, "ops", "waiting")]
    table = CliRunner().invoke(cli.app, ["sessions", "--store", url])
    assert sid in table.output and "waiting" in table.output


async def test_a_reviewer_queue_does_not_load_every_parked_session(tmp_path: Path) -> None:
    """A non-admin's queue is filtered by each session's initiator: it loaded the whole state of
    every parked session for every page (seconds at 10,000); now the first event, once."""
    from signoff.server import TokenAuth
    from signoff.server._auth import default_access
    from signoff.server._context import ServerContext
    from signoff.stores import PendingFilter

    agent = scripted_agent("ops", [call_tools(call("wipe", disk="sda"))], tools=[wipe])
    rt = so.Runtime([agent], store=f"sqlite:///{tmp_path}/q.db")
    acme = so.Principal(authenticator="token", principal_id="alice", attributes={"tenant": "acme"})
    evil = so.Principal(
        authenticator="token", principal_id="mallory", attributes={"tenant": "evil"}
    )
    async with rt:
        for i in range(30):
            await rt.generate("ops", prompt=f"wipe {i}", auth=acme if i % 3 else evil)
        ctx = ServerContext(runtime=rt, auth=TokenAuth({}), access=default_access, secret=b"k" * 32)
        first, total = await ctx.visible_requests(acme, PendingFilter(limit=100))
        assert total == len(first) == 20
        loads: list[str] = []
        real_state, real_read = rt.state, rt.store.read_events

        async def state(session_id: str) -> so.SessionState:
            loads.append(session_id)
            return await real_state(session_id)

        async def read_events(session_id: str, *args: object, **kw: object) -> list[so.Event]:
            loads.append(session_id)
            return await real_read(session_id, *args, **kw)  # type: ignore[arg-type]

        rt.state = state  # type: ignore[method-assign]
        rt.store.read_events = read_events  # type: ignore[method-assign]
        again, total = await ctx.visible_requests(acme, PendingFilter(limit=100))
        assert [r.id for r in again] == [r.id for r in first] and total == 20
        assert loads == []
        seen, total = await ctx.visible_requests(evil, PendingFilter(limit=100))
        assert total == 10 and {r.session_id for r in seen}.isdisjoint(r.session_id for r in first)
