"""A dashboard whose runtime lacks the agent of sessions another runtime started on its store:
their requests, turns and messages can be answered, cancelled and sent only where that agent
runs, so their pages say so instead of offering forms that could only fail (`unknown_agent`);
a finished one can still be deleted here. So does a mirror whose parent's delegate tool a deploy
took away (`unknown_tool`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.testing import store_contents

from . import _subagents as subagents
from . import test_subagents_tool_gone as gone
from ._dashboard import csrf_of, signed_in
from .test_server_common import ALICE, TOKENS, auth, make_agents, running

JSON = {"Accept": "application/json"}


def _parked(url: str) -> dict[str, str]:
    """Sessions started where their agents run: waiting on an approval, on a question, and one
    whose turn was cancelled (finished)."""
    rt = so.Runtime(make_agents(), store=url)
    try:
        sids = {a: rt.generate_sync(a, "go", auth=ALICE).session_id for a in ("support", "helper")}
        done = rt.generate_sync("support", "go", auth=ALICE).session_id
        rt.cancel_sync(done, "done", principal=ALICE)
        return {**sids, "done": done}
    finally:
        rt.close_sync()


def _card(page: str, rid: str) -> str:
    card = page[page.index(f'data-request-id="{rid}"') :]
    return card[: card.index("</article>")]


def test_requests_and_turns_of_an_agent_the_server_lacks_offer_no_forms(tmp_path: Path) -> None:
    """The queue and session pages offered Approve, Deny, a question's options, Cancel turn and
    the message box for these sessions, each refused 422 `unknown_agent` with the session left
    waiting: the cards are barred with where to answer them, the session page says where to
    cancel and send, and the runtime's refusal is as before."""
    url = f"sqlite:///{tmp_path}/s.db"
    sids = _parked(url)
    runtime = so.Runtime([], store=url)
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base, signed_in(base) as c:
        queue = c.get("/_signoff/").text
        for agent in ("support", "helper"):
            sid = sids[agent]
            page = c.get(f"/_signoff/sessions/{sid}").text
            fragment = c.get(f"/_signoff/fragments/sessions/{sid}").json()
            [rid] = [r.id for r in runtime.pending_sync() if r.session_id == sid]
            for shown in (_card(queue, rid), _card(page, rid), fragment["pending"]):
                assert "/respond" not in shown and 'name="option"' not in shown, shown
                assert "data-not-allowed" in shown and "You may not answer this" in shown
                assert f"answer it from a runtime that runs agent &#39;{agent}&#39;" in shown
            assert 'id="send"' not in page and "/messages" not in page
            assert f"This server does not run agent <bdi>{agent}</bdi>: send messages" in page
            for shown in (page, fragment["delete"]):
                assert "/cancel" not in shown and 'name="turn"' not in shown
                assert "cancel its waiting turn from a runtime that runs it" in shown
            # what the forms offered would have been refused, nothing changed
            form = {"option": "approve", "csrf": csrf_of(page)}
            r = c.post(f"/_signoff/requests/{rid}/respond", data=form, headers=JSON)
            assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_agent"
            sent = {"message": "hello", "csrf": csrf_of(page)}
            r = c.post(f"/_signoff/sessions/{sid}/messages", data=sent, headers=JSON)
            assert r.status_code == 422 and r.json()["error"]["code"] == "unknown_agent"
            assert runtime.state_sync(sid).status == "waiting"
    runtime.close_sync()


def test_a_finished_session_of_an_agent_the_server_lacks_is_deleted_here(tmp_path: Path) -> None:
    """Deleting needs no agent: a finished session's page offers it (and no message box), and
    it deletes."""
    url = f"sqlite:///{tmp_path}/s.db"
    sid = _parked(url)["done"]
    runtime = so.Runtime([], store=url)
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base, signed_in(base) as c:
        page = c.get(f"/_signoff/sessions/{sid}").text
        assert 'id="send"' not in page and "This server does not run agent" in page
        assert f"/sessions/{sid}/delete" in page and "/cancel" not in page
        form = {"confirm": "yes", "csrf": csrf_of(page)}
        r = c.post(f"/_signoff/sessions/{sid}/delete", data=form, headers=JSON)
        assert r.status_code == 200 and r.json()["deleted"] == [sid], r.text
        assert c.get(f"/_signoff/sessions/{sid}").status_code == 404
    runtime.close_sync()


@asynccontextmanager
async def _browsing(rt: so.Runtime) -> AsyncIterator[httpx.AsyncClient]:
    """A dashboard on `rt`, read in-process by the subagent tests' Alice (who started them)."""
    okta = TokenAuth({"okta": subagents.ALICE})
    app = create_app(rt, auth=okta, sweep_every=None, close_runtime=True)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t", headers=auth("okta")) as c,
    ):
        yield c


async def test_a_mirror_whose_delegate_tool_is_gone_offers_no_buttons(tmp_path: Path) -> None:
    """A deploy renamed the parent's delegate tool while its call waited on the child's
    approval: the mirror's card (queue, parent's page, its live read) offered Approve, Deny and
    Edit, each refused 422 `unknown_tool`. It says why, with a link to the child's request,
    whose own card in the child's session offers the buttons; the pages write nothing."""
    url = f"sqlite:///{tmp_path}/s.db"
    r, mirror, *_, parent, child = await gone._parked(url)
    assert mirror.child is not None
    kid = mirror.child
    rt = so.Runtime([parent, child], store=url)
    async with _browsing(rt) as c:
        before = [await store_contents(rt.store, s) for s in (r.session_id, kid.session_id)]
        queue = (await c.get("/_signoff/")).text
        page = (await c.get(f"/_signoff/sessions/{r.session_id}")).text
        fragment = (await c.get(f"/_signoff/fragments/sessions/{r.session_id}")).json()
        for shown in (_card(queue, mirror.id), _card(page, mirror.id), fragment["pending"]):
            assert "/respond" not in shown and 'name="option"' not in shown, shown
            assert "data-not-allowed" in shown and "unknown tool &#39;billing&#39;" in shown
            assert "as a delegate tool (its delegate tools: billing_agent)" in shown
            link = f'href="/_signoff/sessions/{kid.session_id}#{kid.request_id}"'
            assert link in shown and "Answer <bdi>billing</bdi>'s request" in shown
        there = _card((await c.get(f"/_signoff/sessions/{kid.session_id}")).text, kid.request_id)
        assert "/respond" in there and 'value="approve"' in there and "data-answer-in" not in there
        after = [await store_contents(rt.store, s) for s in (r.session_id, kid.session_id)]
        assert after == before
        # What the card offered is refused as before.
        body = {"inputResponses": [{"requestId": mirror.id, "optionId": "approve"}]}
        got = await c.post(f"/v1/sessions/{r.session_id}/responses", json=body)
        assert got.status_code == 422 and got.json()["error"]["code"] == "unknown_tool"


async def test_a_mirror_whose_middle_lost_its_delegate_tool_offers_no_buttons(
    tmp_path: Path,
) -> None:
    """top -> mid -> leaf, mid's delegate tool renamed: the top's mirror is refused for mid's
    call, which its card says, linking to the leaf's request; mid's own mirror too."""
    url = f"sqlite:///{tmp_path}/s.db"
    ran: list[dict[str, Any]] = []
    r = await gone._chain_parked(url, ran)
    [mirror] = r.pending
    assert mirror.child is not None
    rt = so.Runtime(gone._chain(ran, mid_tool="leaf_agent"), store=url)
    async with _browsing(rt) as c:
        stored = await rt.store.get_request(mirror.child.request_id)
        assert stored is not None and stored.request.child is not None
        mid, leaf = stored.request, stored.request.child
        queue = (await c.get("/_signoff/")).text
        for rid in (mirror.id, mid.id):
            shown = _card(queue, rid)
            assert "/respond" not in shown and "unknown tool &#39;leaf&#39;" in shown, shown
            assert "delegate call m1" in shown
            assert f'href="/_signoff/sessions/{leaf.session_id}#{leaf.request_id}"' in shown
        assert "/respond" in _card(queue, leaf.request_id)
