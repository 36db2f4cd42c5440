"""The escapes of text shown to people: one set for the dashboard and for Slack; dates past the
years a datetime holds."""

from __future__ import annotations

import json
import math

from signoff._text import (
    BIDI,
    HIDDEN,
    escape_as_json,
    in_utc,
    is_blank,
    is_utf8,
    utc_text,
    visible,
)
from signoff.channels.slack._blocks import sendable
from signoff.server._pages import pretty


def test_hidden_characters_become_the_escapes_json_would_write() -> None:
    text = "a\u202eb\u200bc\U000e0041d\ud800e"
    escaped = HIDDEN.sub(escape_as_json, text)
    assert escaped == "a\\u202eb\\u200bc\\udb40\\udc41d\\ud800e"
    assert json.loads(f'"{escaped}"') == text  # inside a JSON string, the same value
    assert BIDI.sub(escape_as_json, "x\u2066y") == "x\\u2066y"


def test_visible_drops_what_draws_nothing_but_keeps_what_parts_words() -> None:
    """A reply is read as it shows: a zero-width space, a bidirectional mark, a variation
    selector or a tag character go; a line separator stays, as it parts words as a space does."""
    assert visible("\u200fy\u200be\ufe0fs\U000e0041\xad") == "yes"
    assert visible("yes\u2028no\x85maybe") == "yes\u2028no\x85maybe"
    assert is_blank(visible("\u200b\u2066 \ufeff")) and visible("\u2764\ufe0f") == "\u2764"


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


# Unicode's Default_Ignorable_Code_Point characters that are assigned: a renderer draws none of
# them (DerivedCoreProperties.txt), whatever script they belong to.
IGNORABLE = [
    *"\xad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180e\u180f",
    *(chr(c) for c in range(0x200B, 0x2010)),
    *(chr(c) for c in range(0x202A, 0x202F)),
    *(chr(c) for c in range(0x2060, 0x2070)),
    *"\u3164\ufeff\uffa0",
    *(chr(c) for c in range(0xFE00, 0xFE10)),
    *(chr(c) for c in range(0x1BCA0, 0x1BCA4)),
    *(chr(c) for c in range(0x1D173, 0x1D17B)),
    *(chr(c) for c in range(0xE0000, 0xE1000)),
]


def test_every_default_ignorable_character_is_hidden_and_says_nothing() -> None:
    """The halfwidth Hangul filler (U+FFA0) passed for a visible character where the full-width
    one (U+3164) did not: a prompt of it started a turn, and a page showed it unescaped."""
    missed = [f"U+{ord(c):04X}" for c in IGNORABLE if not HIDDEN.fullmatch(c) or not is_blank(c)]
    assert missed == []


def test_text_of_any_script_with_its_joiners_and_marks_says_something() -> None:
    for text in [
        "\ud55c\uad6d\uc5b4",  # Hangul syllables
        "\u1100\u1161",  # conjoining jamo
        "\u115f\u1161",  # a filler and the vowel it carries
        "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22",  # Thai
        "\u0915\u094d\u200d\u0937",  # Devanagari, a virama and a joiner
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian with a non-joiner
        "\u05e9\u05c1\u05b8\u05dc\u05d5\u05b9\u05dd",  # Hebrew with points
        "\U0001f468\u200d\U0001f469\u200d\U0001f467",  # an emoji ZWJ sequence
        "\u2764\ufe0f",
        "1\ufe0f\u20e3",
        "\u1820\u180b",  # Mongolian with a variation selector
        "\u0301",  # a lone combining mark still draws (on a dotted circle)
    ]:
        assert not is_blank(text), repr(text)


def test_a_time_past_the_years_a_datetime_holds_is_named_by_its_bound() -> None:
    """A deadline `expires_in=1e12` away (or a clock gone wild) is text, not "year out of
    range"; NaN is no time either way."""
    assert in_utc(0, "%Y-%m-%d %H:%M UTC") == "1970-01-01 00:00 UTC"
    assert utc_text(253402300799, "%Y-%m-%d") == "9999-12-31"
    for at in (253402300800, 1e12 + 1.7e9, 1e300, math.inf):
        assert in_utc(at, "%Y") is None
        assert utc_text(at, "%Y") == "after 9999-12-31"
    for at in (-1e12, -1e300, -math.inf):
        assert utc_text(at, "%Y") == "before 0001-01-01"
    assert in_utc(math.nan, "%Y") is None


def test_text_holding_a_lone_surrogate_has_no_utf8_form() -> None:
    """`is_utf8` tells text a store can look up from text it cannot (`"\\ud800"` alone, or the
    two halves of a pair as two code points); every other character has a UTF-8 form."""
    assert is_utf8("ses_1") and is_utf8("\U0001f600 \x00 \ufffd") and is_utf8("")
    assert not is_utf8("ses_\ud800") and not is_utf8("\ud83d\ude00")
