"""A question's option whose id a browser would change on the way (a line break, which a form
sends as CRLF; a lone CR or a NUL, which the page's parser turns into LF or U+FFFD; a
bidirectional control, which the page shows escaped) is answered from the dashboard's buttons and
menu all the same: the form carries such an id as a JSON string, read back as the id."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.server._option_values import chosen_option, option_value

from ._dashboard import csrf_of, signed_in
from .test_server_common import PLAIN, TOKENS, auth, running

__all__ = ["ASKED", "FILLER", "asking_app", "asked_for", "sent_as"]

# Ids as a plain string option makes them (its label): each one a browser would change on the
# way, or one that begins as a JSON string does, and one it sends as it is.
ASKED = [
    "Ship now\n(costs $20)",
    "lone\rCR",
    "nul\x00byte",
    "\u202eright to left",
    '"quoted"',
    "Wait",
]
FILLER = [f"Warehouse {n:02d}" for n in range(1, 11)]  # past 12 options: a menu, not buttons


@contextmanager
def asking_app(tmp_path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """A served runtime whose agent `few` asks with `ASKED` (a button each) and `many` with
    `ASKED` and `FILLER` (a menu), and the option id each session's question got, by session."""
    answered: dict[str, Any] = {}

    def agent(name: str, options: list[str]) -> so.Agent:
        @so.tool
        async def pick(ctx: so.ToolContext) -> str:
            """Ask which."""
            answer = await ctx.ask("Ship it?", options=options, allow_text=True)
            answered[ctx.session.id] = answer.option_id
            return "asked"

        script = [
            so.ModelResponse(tool_calls=[so.ToolCall(name="pick", input={})]),
            so.ModelResponse(text="done"),
        ]
        return so.Agent(name=name, model=so.models.Scripted(script), tools=[pick])

    agents = [agent("few", ASKED), agent("many", ASKED + FILLER)]
    runtime = so.Runtime(agents, store=f"sqlite:///{tmp_path}/options.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base:
        yield base, answered


def start(base: str, agent: str) -> tuple[str, str]:
    """A session of `agent` waiting on its question: its id and the request's."""
    r = httpx.post(
        f"{base}/v1/sessions",
        json={"agent": agent, "message": "go"},
        headers=auth("alice-token"),
        timeout=10,
        verify=PLAIN,
    )
    assert r.status_code == 201, r.text
    return r.json()["session_id"], r.json()["pending"][0]["id"]


def asked_for(base: str, sid: str, answered: dict[str, Any]) -> Any:
    """The option id the session's question got (None while the question is still open)."""
    r = httpx.get(f"{base}/v1/sessions/{sid}", headers=auth("alice-token"), verify=PLAIN)
    if r.json()["pending"]:
        return None
    deadline = time.monotonic() + 10  # the turn resumes after the answer is taken
    while sid not in answered and time.monotonic() < deadline:
        time.sleep(0.02)
    return answered.get(sid)


class _Values(HTMLParser):
    """The `option` values of one request's card, as the page's parser reads its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "button" and named.get("name") == "option":
            self.values.append(named.get("value") or "")
        elif tag == "option" and named.get("value"):
            self.values.append(named["value"] or "")


def sent_as(card: str) -> list[str]:
    """The `option` values a browser posts from `card`'s buttons or menu: its parser turns CRLF
    and a lone CR into LF and a NUL into U+FFFD, and its form encoding each LF into CRLF."""
    parser = _Values()
    parser.feed(card)
    read = [re.sub("\r\n?", "\n", v).replace("\x00", "\ufffd") for v in parser.values]
    return [v.replace("\n", "\r\n") for v in read]


def card_of(page: str, rid: str) -> str:
    card = page[page.index(f'id="{rid}"') :]
    return card[: card.index("</article>")]


@pytest.mark.parametrize("agent", ["few", "many"], ids=["buttons", "menu"])
def test_every_option_is_answered_as_the_browser_sends_it(tmp_path: Path, agent: str) -> None:
    """The form's value for "Ship now\\n(costs $20)" came back as "Ship now\\r\\n(costs $20)",
    which the server refused as no option of the request ("options: Ship now (costs $20),
    Wait"): the question could not be answered from the dashboard at all."""
    with asking_app(tmp_path) as (base, answered), signed_in(base) as c:
        for at, option_id in enumerate(ASKED):
            sid, rid = start(base, agent)
            page = c.get(f"/_signoff/sessions/{sid}").text
            sent = sent_as(card_of(page, rid))
            assert len(sent) == len(ASKED) + (len(FILLER) if agent == "many" else 0)
            r = c.post(
                f"/_signoff/requests/{rid}/respond",
                data={"option": sent[at], "csrf": csrf_of(page)},
            )
            assert r.status_code == 303, (option_id, r.text)
            assert asked_for(base, sid, answered) == option_id


def test_a_value_naming_no_option_is_refused_and_nothing_is_recorded(tmp_path: Path) -> None:
    """The id as the browser changed it, a JSON string of an id the request lacks or one cut
    short: each is refused, naming the request's options, and the question stays open. A plain
    id is still taken as it is."""
    with asking_app(tmp_path) as (base, answered), signed_in(base) as c:
        sid, rid = start(base, "few")
        page = c.get(f"/_signoff/sessions/{sid}").text
        url = f"/_signoff/requests/{rid}/respond"
        json_headers = {"Accept": "application/json"}
        for value in ("Ship now\r\n(costs $20)", '"Ship later"', '"Ship now\\n(costs'):
            r = c.post(url, data={"option": value, "csrf": csrf_of(page)}, headers=json_headers)
            assert r.status_code == 422, r.text
            assert "has no option" in r.json()["error"]["message"]
            assert asked_for(base, sid, answered) is None
        r = c.post(url, data={"option": "Wait", "csrf": csrf_of(page)})
        assert r.status_code == 303, r.text
        assert asked_for(base, sid, answered) == "Wait"


@pytest.mark.parametrize(
    "option_id",
    [*ASKED, "Wait\r\nor not", '"', "\ud800 lone", "approve", "\\n", " spaced "],
)
def test_an_option_value_names_its_id_and_is_printable_where_the_id_is_not(
    option_id: str,
) -> None:
    value = option_value(option_id)
    assert chosen_option(value) == option_id
    if value != option_id:
        assert value.startswith('"') and value.isascii() and value.isprintable()
    else:
        assert not option_id.startswith('"') and "\n" not in option_id
