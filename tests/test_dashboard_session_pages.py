"""A session page's open requests come a page at a time, as the queue's: a session that asked
thousands at once made a page, and every live read of it, of megabytes. An expired session's
page offers no message box."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, _page_data, create_app
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent, store_contents

from .test_server_common import ALICE, TOKENS, auth


@so.tool(approval=so.always())
async def tag(item: int) -> str:
    """Tag an item."""
    return f"tagged {item}"


def bulk() -> so.Agent:
    many = so.ModelResponse(
        tool_calls=[so.ToolCall(name="tag", input={"item": i}) for i in range(5)]
    )
    return so.Agent(name="bulk", model=so.models.Scripted([many], repeat_last=True), tools=[tag])


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, str, list[str]]]:
    async with so.Runtime([bulk()], store=f"sqlite:///{tmp_path}/s.db") as rt:
        result = await rt.generate("bulk", prompt="tag them all")
        ids = [r.id for r in result.pending]
        assert len(ids) == 5
        transport = httpx.ASGITransport(app=create_app(rt, dev=True))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            yield c, result.session_id, ids


def shown(html: str, ids: list[str]) -> list[str]:
    return [i for i in ids if f'data-request-id="{i}"' in html]


async def test_a_sessions_open_requests_are_paged(
    client: tuple[httpx.AsyncClient, str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two a page here: the first two, a pager to the rest that needs no script, and a count of
    them all; a page past the end (an old link) is the last."""
    monkeypatch.setattr(_page_data, "PAGE_SIZE", 2)
    c, sid, ids = client
    page = (await c.get(f"/_signoff/sessions/{sid}")).text
    assert shown(page, ids) == ids[:2]
    assert "Page 1 of 3" in page and 'href="?page=2"' in page
    assert "data-pending-total>5<" in page
    page = (await c.get(f"/_signoff/sessions/{sid}?page=2")).text
    assert shown(page, ids) == ids[2:4]
    # A card's form comes back to the page it was on.
    assert f'name="next" value="/_signoff/sessions/{sid}?page=2"' in page
    page = (await c.get(f"/_signoff/sessions/{sid}?page=9")).text
    assert shown(page, ids) == ids[4:] and "Page 3 of 3" in page
    assert "Page 9 is gone (fewer are open now): showing page 3." in page  # and says so
    assert "is gone" not in (await c.get(f"/_signoff/sessions/{sid}?page=3")).text


async def test_a_sessions_live_read_brings_the_page_it_shows(
    client: tuple[httpx.AsyncClient, str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fragment a live page reads holds the page `?page=` asks, its pager and the count; an
    earlier trace kept by `?upto=` stays in the pager's links."""
    monkeypatch.setattr(_page_data, "PAGE_SIZE", 2)
    c, sid, ids = client
    data = (await c.get(f"/_signoff/fragments/sessions/{sid}?after=1&page=2")).json()
    assert shown(data["pending"], ids) == ids[2:4]
    assert 'data-query="page=2"' in data["pager"] and "Page 2 of 3" in data["pager"]
    assert data["total"] == 5
    assert f'value="/_signoff/sessions/{sid}?page=2"' in data["pending"]
    page = (await c.get(f"/_signoff/sessions/{sid}?upto=2&page=2")).text
    assert 'href="?upto=2&amp;page=3"' in page


async def test_where_an_open_request_is_listed_now(
    client: tuple[httpx.AsyncClient, str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A card written in that left its page was said closed elsewhere, though its request had
    only moved to another page: the page asks where the list shows it now, if anywhere."""
    monkeypatch.setattr(_page_data, "PAGE_SIZE", 2)
    c, sid, ids = client

    async def place(rid: str, query: str = "") -> object:
        r = await c.get(f"/_signoff/requests/{rid}/place{query}")
        assert r.status_code == 200, r.text
        return r.json()

    assert await place(ids[3], "?in=session&page=1") == {
        "open": True,
        "page": 2,
        "url": f"/_signoff/sessions/{sid}?page=2",
    }
    assert await place(ids[0], "?in=session") == {
        "open": True,
        "page": 1,
        "url": f"/_signoff/sessions/{sid}",
    }
    # The queue's place keeps its filters; a request its filter leaves out is not open there.
    assert await place(ids[4], "?agent=bulk&page=1") == {
        "open": True,
        "page": 3,
        "url": "/_signoff/?agent=bulk&page=3",
    }
    assert await place(ids[1]) == {"open": True, "page": 1, "url": "/_signoff/"}
    nowhere = {"open": False, "page": None, "url": None}
    assert await place(ids[1], "?agent=other") == nowhere
    assert await place(ids[1], "?kind=question") == nowhere
    assert await place("req_unknown") == nowhere
    denied = await c.post(
        f"/v1/sessions/{sid}/responses",
        json={"inputResponses": [{"requestId": ids[0], "optionId": "cancel"}]},
    )
    assert denied.status_code == 200, denied.text
    assert await place(ids[0]) == nowhere
    assert await place(ids[0], "?in=session") == nowhere
    assert await place(ids[2], "?in=session") == {
        "open": True,
        "page": 1,
        "url": f"/_signoff/sessions/{sid}",
    }


@so.tool(approval=so.always())
async def refund(order_id: str) -> str:
    """Refund an order."""
    return "ok"


async def test_an_expired_sessions_page_offers_no_message_box(tmp_path: Path) -> None:
    """Past its TTL a session takes no message (410 `session_expired`), yet its page offered
    the message box, and an idle one (its status still `idle`: nothing is recorded of an expiry
    that closed nothing) showed no sign of its expiry. The page says it expired, when, and to
    start a new conversation, writing nothing; before that its header says when it expires."""
    clock = ManualClock()
    ttl = so.Limits(ttl=60)
    idle = scripted_agent("support", [reply("done")], repeat_last=True, limits=ttl)
    parked = scripted_agent(
        "desk",
        [call_tools(call("refund", order_id="1")), reply("done")],
        tools=[refund],
        limits=ttl,
    )
    rt = so.Runtime([idle, parked], store=f"sqlite:///{tmp_path}/s.db", clock=clock)
    app = create_app(rt, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t", headers=auth("alice-token")
        ) as c,
    ):
        sid = (await rt.generate("support", prompt="hi", auth=ALICE)).session_id
        waiting = (await rt.generate("desk", prompt="refund", auth=ALICE)).session_id
        page = (await c.get(f"/_signoff/sessions/{sid}")).text
        assert 'id="send"' in page and "data-session-expired" not in page
        assert "<dt>Expires</dt>" in page and ">in a minute</time>" in page
        # A live page redraws its message box from the fragment's `send`: a box with a token.
        send = (await c.get(f"/_signoff/fragments/sessions/{sid}")).json()["send"]
        assert 'id="send"' in send and 'name="form" value="' in send
        clock.advance(120)
        before = await store_contents(rt.store, sid)
        page = (await c.get(f"/_signoff/sessions/{sid}")).text
        fragment = (await c.get(f"/_signoff/fragments/sessions/{sid}")).json()
        header, send = fragment["header"], fragment["send"]
        assert await store_contents(rt.store, sid) == before  # a read: nothing recorded
        assert 'id="send"' not in page and "/messages" not in page
        for shown in (page, send):
            assert "This session expired at" in shown and "it takes no more messages" in shown
            assert 'href="/_signoff/new?agent=support">Start a new conversation</a>' in shown
        assert 'id="send"' not in send and 'id="send-expired"' in send
        for shown in (page, header):
            assert "data-session-status>idle<" in shown and "data-session-expired>expired<" in shown
            assert "<dt>Expired</dt>" in shown and ">a minute ago</time>" in shown
        sent = await c.post(f"/v1/sessions/{sid}/messages", json={"text": "one more thing"})
        assert sent.status_code == 410 and sent.json()["error"]["code"] == "session_expired"
        # A waiting turn's expiry is recorded by the page's read, as before: failed, expired.
        page = (await c.get(f"/_signoff/sessions/{waiting}")).text
        assert "data-session-status>failed<" in page and "data-session-expired>" in page
        assert 'id="send"' not in page and "This session expired at" in page
        assert (await rt.state(waiting)).status == "failed"
