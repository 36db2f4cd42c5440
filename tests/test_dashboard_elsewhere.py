"""A dashboard whose runtime lacks the agent of sessions another runtime started on its store:
their requests, turns and messages can be answered, cancelled and sent only where that agent
runs, so their pages say so instead of offering forms that could only fail (`unknown_agent`);
a finished one can still be deleted here."""

from __future__ import annotations

from pathlib import Path

import signoff as so
from signoff.server import TokenAuth, create_app

from ._dashboard import csrf_of, signed_in
from .test_server_common import ALICE, TOKENS, make_agents, running

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
