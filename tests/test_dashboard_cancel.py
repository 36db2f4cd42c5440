"""Cancelling a turn from its session's dashboard page: offered while the turn runs or waits on
people, to whoever may see (and so cancel) the session, for that turn only: the form names it,
so one sent again, or from a page shown before, cancels no later turn and the page says so once.
CSRF-checked; another tenant's session, or a form naming no turn, is refused, nothing done."""

from __future__ import annotations

from pathlib import Path

import signoff as so

from ._dashboard import csrf_of, signed_in
from .test_dashboard_deletion import HTML, JSON, _api, _start, served
from .test_server_common import make_runtime

NOTE = "That turn had ended already: nothing was cancelled."


def _turn_of(page: str) -> str:
    """The turn id the page's cancel form names."""
    marker = '<input type="hidden" name="turn" value="'
    assert marker in page
    return page.split(marker, 1)[1].split('"', 1)[0]


def test_a_waiting_turn_is_cancelled_from_its_page_as_the_viewer(tmp_path: Path) -> None:
    rt = make_runtime(f"sqlite:///{tmp_path / 's.db'}")
    with served(rt) as base:
        started = _start(base)
        sid, turn = started["session_id"], started["turn_id"]
        with signed_in(base) as alice, signed_in(base, "mallory-token") as mallory:
            page = alice.get(f"/_signoff/sessions/{sid}").text
            assert f'action="/_signoff/sessions/{sid}/cancel"' in page and _turn_of(page) == turn
            assert "/delete" not in page  # not while it waits
            assert "Cancel its turn first" in page and NOTE not in page
            fragment = alice.get(f"/_signoff/fragments/sessions/{sid}").json()["delete"]
            assert f"/sessions/{sid}/cancel" in fragment  # the live page redraws it
            url = f"/_signoff/sessions/{sid}/cancel"
            # another tenant's person: the session does not exist for their post
            r = mallory.post(
                url, data={"csrf": csrf_of(mallory.get("/_signoff/").text), "turn": turn}
            )
            assert r.status_code == 404 and "unknown_session" in r.text
            # without the page's token, or without the turn: nothing cancelled
            r = alice.post(url, data={"turn": turn}, headers=HTML)
            assert r.status_code == 403 and "csrf" in r.text
            r = alice.post(url, data={"csrf": csrf_of(page)}, headers=HTML)
            assert r.status_code == 422 and "names no turn to cancel" in r.text
            with _api(base) as api:
                assert api.get(f"/v1/sessions/{sid}").json()["status"] == "waiting"
            r = alice.post(
                url,
                data={"csrf": csrf_of(page), "turn": turn, "reason": "  customer left "},
                headers=HTML,
            )
            assert r.status_code == 303 and r.headers["location"] == f"/_signoff/sessions/{sid}"
            page = alice.get(f"/_signoff/sessions/{sid}").text
            assert "data-session-status>cancelled<" in page and NOTE not in page
            assert f"/sessions/{sid}/delete" in page and f"/sessions/{sid}/cancel" not in page
    [cancelled] = [e for e in rt.events_sync(sid) if e.type == "turn.cancelled"]
    assert cancelled.turn_id == turn and cancelled.data["reason"] == "customer left"
    assert cancelled.data["by"]["principal_id"] == "alice"
    rt.close_sync()


def _always_asking() -> so.Agent:
    """Proposes a refund that needs approval at every turn: each turn waits on a person."""

    @so.tool(approval=True)
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return f"refunded {order_id}"

    proposal = so.ModelResponse(
        tool_calls=[so.ToolCall(name="issue_refund", input={"order_id": "1042"})]
    )
    return so.Agent(
        name="support",
        model=so.models.Scripted([proposal], repeat_last=True),
        tools=[issue_refund],
    )


def test_a_form_for_a_turn_that_ended_cancels_no_later_turn_and_says_so(tmp_path: Path) -> None:
    """The page was shown while the first turn waited; it was cancelled elsewhere and a message
    started another, which waits too. The old form, sent, used to cancel the new turn."""
    rt = so.Runtime([_always_asking()], store=f"sqlite:///{tmp_path / 's.db'}")
    with served(rt) as base:
        started = _start(base)
        sid = started["session_id"]
        with signed_in(base) as alice:
            old = alice.get(f"/_signoff/sessions/{sid}").text
            with _api(base) as api:
                assert api.post(f"/v1/sessions/{sid}/cancel").json()["status"] == "cancelled"
                later = api.post(f"/v1/sessions/{sid}/messages", json={"text": "Refund 1042"})
                assert later.status_code == 200, later.text
            assert later.json()["status"] == "waiting"
            page = alice.get(f"/_signoff/sessions/{sid}").text
            assert _turn_of(page) == later.json()["turn_id"] != started["turn_id"]
            form = {"csrf": csrf_of(old), "turn": started["turn_id"]}
            r = alice.post(f"/_signoff/sessions/{sid}/cancel", data=form, headers=JSON)
            assert r.status_code == 200 and r.json()["cancelled"] is False
            r = alice.post(f"/_signoff/sessions/{sid}/cancel", data=form, headers=HTML)
            assert r.status_code == 303
            assert NOTE in alice.get(f"/_signoff/sessions/{sid}").text
            assert NOTE not in alice.get(f"/_signoff/sessions/{sid}").text  # told once
            with _api(base) as api:
                now = api.get(f"/v1/sessions/{sid}").json()
            assert now["turn"]["id"] == later.json()["turn_id"] and now["status"] == "waiting"
    rt.close_sync()


def test_a_subagents_waiting_turn_may_be_cancelled_from_its_page(tmp_path: Path) -> None:
    from .test_subagents_spend import orders, support, tokens

    rt = so.Runtime([support(), orders(tokens(40))], store=f"sqlite:///{tmp_path / 's.db'}")
    with served(rt) as base:
        child = _start(base, "support", "refund 3")["pending"][0]["child"]["session_id"]
        with signed_in(base) as alice:
            page = alice.get(f"/_signoff/sessions/{child}").text
            assert f"/sessions/{child}/cancel" in page and "its parent session" in page
            r = alice.post(
                f"/_signoff/sessions/{child}/cancel",
                data={"csrf": csrf_of(page), "turn": _turn_of(page)},
                headers=JSON,
            )
            assert r.status_code == 200 and r.json()["cancelled"] is True, r.text
    rt.close_sync()


def test_a_form_sent_twice_cancels_once_and_the_second_says_so(tmp_path: Path) -> None:
    """A double submit without JavaScript, or a second tab's form for the same turn: the second
    post found the turn cancelled by the first and answered `cancelled: true` as well, its
    reason dropped without a word. It cancels nothing, and says so as a later turn's does."""
    rt = so.Runtime([_always_asking()], store=f"sqlite:///{tmp_path / 's.db'}")
    with served(rt) as base:
        started = _start(base)
        sid, turn = started["session_id"], started["turn_id"]
        with signed_in(base) as alice:
            page = alice.get(f"/_signoff/sessions/{sid}").text
            url = f"/_signoff/sessions/{sid}/cancel"
            form = {"csrf": csrf_of(page), "turn": turn, "reason": "first"}
            r = alice.post(url, data=form, headers=JSON)
            assert r.status_code == 200 and r.json()["cancelled"] is True, r.text
            r = alice.post(url, data={**form, "reason": "second"}, headers=JSON)
            assert r.status_code == 200 and r.json()["cancelled"] is False, r.text
            assert r.json()["status"] == "cancelled"
            r = alice.post(url, data={**form, "reason": "third"}, headers=HTML)
            assert r.status_code == 303
            assert NOTE in alice.get(f"/_signoff/sessions/{sid}").text
    [cancelled] = [e for e in rt.events_sync(sid) if e.type == "turn.cancelled"]
    assert cancelled.turn_id == turn and cancelled.data["reason"] == "first"
    rt.close_sync()


def test_a_failed_turn_a_retry_could_resume_is_offered_cancel_and_a_retry_reads_running(
    tmp_path: Path,
) -> None:
    """A turn failed in a way a retry could resume holds back a message anyone but its person
    sends, until a retry or a cancel ends it: the page offered no Cancel turn, so a reviewer's
    message could wait for ever. And while a retry takes it up (`turn.resumed`: running), the
    header still said "Turn failed" beside the running badge."""
    from signoff.testing import reply, scripted_agent

    agent = scripted_agent("support", [RuntimeError("the model broke"), reply("ok")])
    store = f"sqlite:///{tmp_path / 's.db'}"
    rt = so.Runtime([agent], store=store, poll_interval=0.05, inline=False)
    with served(rt) as base:
        started = _start(base)
        sid = started["session_id"]
        failed = so.Runtime([agent], store=store).generate_sync(session_id=sid)
        assert failed.status == "failed"
        with signed_in(base) as alice:
            page = alice.get(f"/_signoff/sessions/{sid}").text
            assert "data-session-status>failed<" in page and "Turn failed: " in page
            assert f'action="/_signoff/sessions/{sid}/cancel"' in page
            assert "This ends the failed turn, which a retry could still resume" in page
            with _api(base) as api:  # another of the same kind, cancelled from its page
                other = _start(base)["session_id"]
                failed_too = so.Runtime([agent], store=store).generate_sync(session_id=other)
                assert failed_too.status == "failed"
                shown = alice.get(f"/_signoff/sessions/{other}").text
                r = alice.post(
                    f"/_signoff/sessions/{other}/cancel",
                    data={"csrf": csrf_of(shown), "turn": _turn_of(shown)},
                    headers=HTML,
                )
                assert r.status_code == 303
                assert api.get(f"/v1/sessions/{other}").json()["status"] == "cancelled"
            retry = rt.generate_sync(session_id=sid)  # inline=False: recorded running, not driven
            assert retry.status == "running"
            page = alice.get(f"/_signoff/sessions/{sid}").text
            assert "data-session-status>running<" in page and "Turn failed: " not in page
            assert "Retrying the failed turn" in page
            r = alice.post(
                f"/_signoff/sessions/{sid}/cancel",
                data={"csrf": csrf_of(page), "turn": _turn_of(page)},
                headers=HTML,
            )
            assert r.status_code == 303
            page = alice.get(f"/_signoff/sessions/{sid}").text
            assert "data-session-status>cancelled<" in page
