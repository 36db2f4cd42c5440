"""What the dashboard shows of untrusted content: huge inputs clipped with a way to see them
whole, and invisible or reordering characters made visible."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import httpx

import signoff as so
from signoff.server import TokenAuth, create_app

from ._dashboard import csrf_of, signed_in
from .test_server_common import ALICE, PLAIN, TOKENS, auth, running


def test_a_huge_input_is_shown_clipped_with_a_link_to_all_of_it(tmp_path: Path) -> None:
    """A 1 MB tool input keeps the pages small (the Approve button near the top): each shows the
    start of it and links to the whole, which only a reviewer who may see the request reads."""
    blob = "<b>" + "x" * 1_000_000 + "</b>"

    @so.tool(approval=so.always())
    async def upload(blob: str) -> str:
        """Upload a file."""
        return "stored"

    script = [so.ModelResponse(tool_calls=[so.ToolCall(name="upload", input={"blob": blob})])]
    agent = so.Agent(name="files", model=so.models.Scripted(script), tools=[upload])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/big.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base:
        r = httpx.post(
            f"{base}/v1/sessions",
            json={"agent": "files", "message": "store it"},
            headers=auth("alice-token"),
            timeout=30,
            verify=PLAIN,
        )
        sid, rid = r.json()["session_id"], r.json()["pending"][0]["id"]
        with signed_in(base) as c:
            queue = c.get("/_signoff/")
            assert len(queue.content) < 100_000
            assert "Approve</button>" in queue.text
            assert "edited_input" not in queue.text  # too large to edit in a text box
            link = f"/_signoff/requests/{rid}/input"
            assert f'href="{link}"' in queue.text
            whole = c.get(link)
            assert whole.status_code == 200
            assert whole.headers["content-type"].startswith("text/plain")
            assert json.loads(whole.text) == {"blob": blob}
            page = c.get(f"/_signoff/sessions/{sid}")
            assert len(page.content) < 200_000
            links = re.findall(rf'href="(/_signoff/sessions/{sid}/events/\d+)"', page.text)
            assert links, "no link to a clipped event"
            assert blob in c.get(links[0]).text
            for seq in ("999", "0", "x", "-1"):
                assert c.get(f"/_signoff/sessions/{sid}/events/{seq}").status_code == 404
            fragment = c.get(f"/_signoff/fragments/sessions/{sid}?after=0")
            assert len(fragment.content) < 200_000
            # the clipped input still approves
            r = c.post(
                f"/_signoff/requests/{rid}/respond",
                data={"option": "approve", "csrf": csrf_of(queue.text)},
                headers={"Accept": "application/json"},
            )
            assert r.json()["outcome"] == "approved"
        with signed_in(base, "mallory-token") as m:
            assert m.get(link).status_code == 404
            assert m.get(links[0]).status_code == 404
            assert m.get("/_signoff/requests/req_nope/input").status_code == 404
            assert m.get(f"/_signoff/sessions/{sid}/events/999").status_code == 404


def test_a_tools_payload_is_shown_beside_its_input_and_whole_behind_a_link(
    tmp_path: Path,
) -> None:
    """What `ctx.request_approval(payload)` asks about is the reviewer's main signal: the card
    shows it above the call's input, clipped when long, with a link to all of it that only a
    reviewer who may see the request reads."""
    note = "<i>" + "y" * 20_000 + "</i>"

    @so.tool
    async def issue_refund(ctx: so.ToolContext, order_id: str) -> str:
        """Issue a refund for an order."""
        ctx.request_approval({"action": "refund", "note": note})

    script = [
        so.ModelResponse(tool_calls=[so.ToolCall(name="issue_refund", input={"order_id": "o9"})])
    ]
    agent = so.Agent(name="shop", model=so.models.Scripted(script), tools=[issue_refund])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/payload.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base:
        r = httpx.post(
            f"{base}/v1/sessions",
            json={"agent": "shop", "message": "refund o9"},
            headers=auth("alice-token"),
            timeout=10,
            verify=PLAIN,
        )
        sid, rid = r.json()["session_id"], r.json()["pending"][0]["id"]
        with signed_in(base) as c:
            for page in (c.get("/_signoff/").text, c.get(f"/_signoff/sessions/{sid}").text):
                card = page[page.index(f'id="{rid}"') :]
                card = card[: card.index("</article>")]
                assert card.index('aria-label="Payload"') < card.index('aria-label="Tool input"')
                assert "&#34;o9&#34;" in card and "<i>" not in card
                link = f"/_signoff/requests/{rid}/payload"
                assert f'href="{link}"' in card
            whole = c.get(link)
            assert whole.status_code == 200
            assert whole.headers["content-type"].startswith("text/plain")
            assert json.loads(whole.text) == {"action": "refund", "note": note}
            assert json.loads(c.get(f"/_signoff/requests/{rid}/input").text) == {"order_id": "o9"}
        with signed_in(base, "mallory-token") as m:
            assert m.get(link).status_code == 404
            assert m.get("/_signoff/requests/req_nope/payload").status_code == 404


def test_invisible_and_bidi_characters_in_an_input_are_shown_escaped(tmp_path: Path) -> None:
    """A right-to-left override or a zero-width character in a tool input cannot make the input
    read differently from what runs: the page shows them as JSON escapes, and the edit box's text
    still parses to the same arguments (approving it unchanged is not an edit)."""
    sneaky = {
        "to": "ACME \u202eHbmG\u202c",
        "memo": "pay\u200bnow\u2066x\u2069",
        "tag": "\U000e0041\ufeff\u0085\u2028",
    }

    @so.tool(approval=so.always())
    async def wire(to: str, memo: str, tag: str) -> str:
        """Wire money."""
        return "sent"

    script = [so.ModelResponse(tool_calls=[so.ToolCall(name="wire", input=sneaky)])]
    agent = so.Agent(name="bank", model=so.models.Scripted(script), tools=[wire])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/bidi.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base:
        r = httpx.post(
            f"{base}/v1/sessions",
            json={"agent": "bank", "message": "pay"},
            headers=auth("alice-token"),
            timeout=10,
            verify=PLAIN,
        )
        sid, rid = r.json()["session_id"], r.json()["pending"][0]["id"]
        with signed_in(base) as c:
            queue = c.get("/_signoff/").text
            for page in (queue, c.get(f"/_signoff/sessions/{sid}").text):
                for char in "\u202e\u202c\u200b\u2066\u2069\U000e0041\ufeff\u0085\u2028":
                    assert char not in page, hex(ord(char))
            assert "ACME \\u202eHbmG\\u202c" in queue
            box = re.search(r'name="edited_input"[^>]*>([^<]*)</textarea>', queue)
            assert box, "no edit box"
            shown = box.group(1).replace("&#34;", '"').replace("&quot;", '"')
            assert json.loads(shown) == sneaky
            r = c.post(
                f"/_signoff/requests/{rid}/respond",
                data={"option": "approve", "edited_input": shown, "csrf": csrf_of(queue)},
                headers={"Accept": "application/json"},
            )
            assert r.json()["outcome"] == "approved" and r.json()["edited"] is False


def test_a_long_session_shows_its_newest_events_with_a_way_back(tmp_path: Path) -> None:
    """A session of thousands of events made a page of megabytes: the page shows the newest
    `TRACE_ROWS`, links to the ones before, and each older page links on, back and forward."""
    from signoff.server._page_data import TRACE_ROWS

    agent = so.Agent(
        name="chat",
        model=so.models.Scripted([so.ModelResponse(text="noted")], repeat_last=True),
    )
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/long.db")
    first = runtime.generate_sync("chat", "message 0", auth=ALICE)
    sid = first.session_id
    while runtime.state_sync(sid).seq < 2 * TRACE_ROWS + 20:
        runtime.generate_sync(session_id=sid, prompt="again", auth=ALICE)
    head = runtime.state_sync(sid).seq
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base, signed_in(base) as c:
        page = c.get(f"/_signoff/sessions/{sid}").text
        shown = [int(s) for s in re.findall(r'data-seq="(\d+)"', page) if s != str(head)]
        assert sorted(set(shown)) == list(range(head - TRACE_ROWS + 1, head))
        assert f'data-live-session="{sid}"' in page
        earlier = head - TRACE_ROWS
        assert f"{earlier} earlier events not shown" in page
        assert f'href="/_signoff/sessions/{sid}?upto={earlier}"' in page

        older = c.get(f"/_signoff/sessions/{sid}?upto={earlier}").text
        seqs = [int(s) for s in re.findall(r'<li class="event[^"]*" data-seq="(\d+)"', older)]
        assert seqs == list(range(earlier - TRACE_ROWS + 1, earlier + 1))
        assert "data-live-session" not in older  # a page of the past is not followed live
        assert f"Events {earlier + 1} to {head} not shown" in older
        assert f'?upto={earlier + TRACE_ROWS}"' in older

        oldest = c.get(f"/_signoff/sessions/{sid}?upto={earlier - TRACE_ROWS}").text
        seqs = [int(s) for s in re.findall(r'<li class="event[^"]*" data-seq="(\d+)"', oldest)]
        assert seqs == list(range(1, earlier - TRACE_ROWS + 1))
        assert "earlier event" not in oldest

        live = c.get(f"/_signoff/fragments/sessions/{sid}?after=1").json()
        assert live["seq"] == 1 + TRACE_ROWS and live["more"] is True
        assert c.get(f"/_signoff/fragments/sessions/{sid}?after={head - 1}").json()["more"] is False


def test_a_models_text_with_a_lone_surrogate_or_bidi_override_is_shown(tmp_path: Path) -> None:
    """A model's text (JSON carries a lone surrogate; UTF-8 cannot) made the session page and
    its live fragment a 500, and a right-to-left override in a question read backwards. Prose
    shows a surrogate as U+FFFD and reordering characters as escapes, as Slack does."""
    ask = so.ToolCall(
        name="ask_question",
        input={
            "question": "Refund \u202e0001$\u202c to order 42?",
            "options": [
                {"label": "Yes \u202eon", "description": "Go \u2067ahead\u2069."},
                {"label": "No", "description": "Stop."},
            ],
        },
    )
    said = so.ModelResponse(text="I will ask\ud800 first \u202eksa", tool_calls=[ask])
    agent = so.Agent(name="asker", model=so.models.Scripted([said]), tools=[so.ask_question()])
    store = f"sqlite:///{tmp_path}/prose.db"
    state = asyncio.run(so.Runtime([agent], store=store).generate("asker", prompt="hi", auth=ALICE))
    assert state.status == "waiting"
    runtime = so.Runtime([agent], store=store)
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base, signed_in(base) as c:
        for path in ("/_signoff/", f"/_signoff/sessions/{state.session_id}"):
            r = c.get(path)
            assert r.status_code == 200, path
            for char in "\u202e\u202c\u2067\u2069\ud800":
                assert char not in r.text, (path, hex(ord(char)))
            assert "Refund \\u202e0001$\\u202c to order 42?" in r.text, path
        assert "I will ask\ufffd first \\u202eksa" in r.text
        r = c.get(f"/_signoff/fragments/sessions/{state.session_id}")
        assert r.status_code == 200 and "\\\\u202eksa" in r.text


def test_a_question_of_many_choices_is_answered_from_one_menu(tmp_path: Path) -> None:
    """A question of 30 choices showed 30 buttons after the 30 listed choices, each label again
    in its button and its tooltip (a question of 200 long choices: 400 KB of one card). Past 12
    the list is numbered and one menu, numbered alike, takes the answer; a form sent with no
    choice and no text is refused, nothing recorded."""
    labels = [f"Warehouse {n:02d}: " + "ships within two days, " * 8 for n in range(1, 31)]

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Pick a warehouse."""
        answer = await ctx.ask("Ship from where?", options=labels, allow_text=False)
        return str(answer.value)

    script = [
        so.ModelResponse(tool_calls=[so.ToolCall(name="pick", input={})]),
        so.ModelResponse(text="Shipping."),
    ]
    agent = so.Agent(name="depot", model=so.models.Scripted(script), tools=[pick])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/many.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base:
        r = httpx.post(
            f"{base}/v1/sessions",
            json={"agent": "depot", "message": "ship it"},
            headers=auth("alice-token"),
            timeout=10,
            verify=PLAIN,
        )
        sid, request = r.json()["session_id"], r.json()["pending"][0]
        rid, options = request["id"], request["options"]
        with signed_in(base) as c:
            page = c.get("/_signoff/").text
            card = page[page.index(f'id="{rid}"') :]
            card = card[: card.index("</article>")]
            assert 'class="btn option' not in card
            assert '<ol class="options">' in card
            menu = card[card.index("<select") : card.index("</select>")]
            assert 'name="option"' in menu and " required" in menu
            assert re.findall(r'<option value="([^"]*)"', menu) == ["", *[o["id"] for o in options]]
            assert "30. Warehouse 30" in menu
            # Listed whole, and in the menu: its value (the id, here the label) and its text, cut;
            # four times before (the list, the button's value, its tooltip and its text).
            assert card.count(labels[0][:40]) == 3
            url = f"/_signoff/requests/{rid}/respond"
            blank = c.post(url, data={"option": "", "csrf": csrf_of(page)})
            assert blank.status_code >= 400
            assert [p.id for p in runtime.pending_sync(session_id=sid)] == [rid]
            chosen = c.post(url, data={"option": options[4]["id"], "csrf": csrf_of(page)})
            assert chosen.status_code in (200, 303), chosen.text
    with so.Runtime([agent], store=f"sqlite:///{tmp_path}/many.db") as rt:
        (done,) = [e for e in rt.events_sync(sid) if e.type == "tool.completed"]
        assert done.data["status"] == "ok" and done.data["result"] == labels[4]
