"""The escapes of text shown to people: one set for the dashboard and for Slack."""

from __future__ import annotations

import json

from signoff._text import BIDI, HIDDEN, escape_as_json
from signoff.channels.slack._blocks import sendable
from signoff.server._pages import pretty


def test_hidden_characters_become_the_escapes_json_would_write() -> None:
    text = "a\u202eb\u200bc\U000e0041d\ud800e"
    escaped = HIDDEN.sub(escape_as_json, text)
    assert escaped == "a\\u202eb\\u200bc\\udb40\\udc41d\\ud800e"
    assert json.loads(f'"{escaped}"') == text  # inside a JSON string, the same value
    assert BIDI.sub(escape_as_json, "x\u2066y") == "x\\u2066y"


def test_a_page_shows_a_lone_surrogate_escaped_so_it_can_be_sent() -> None:
    """A tool input holding a lone surrogate (a model can send one) was put in the page raw,
    and UTF-8 cannot encode it; it is shown escaped, and the text still parses to the input."""
    value = {"memo": "x\ud800y", "to": "ACME \u202e"}
    shown = pretty(value)
    shown.encode("utf-8")  # raised UnicodeEncodeError before
    assert json.loads(shown) == value
    assert "\\ud800" in shown and "\\u202e" in shown


def test_slack_prose_replaces_what_it_cannot_send_and_escapes_bidi() -> None:
    assert sendable("a\ud800b\x00c\u202ed") == "a\ufffdb\ufffdc\\u202ed"
