"""Property tests of answering: the follow-up-message matcher, approval replies, option matching
by id, label and index, and the options `ctx.ask()` takes or refuses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import signoff as so
from signoff._answers import match
from signoff._option_names import folded, match_option
from signoff._text import visible
from signoff._types import APPROVAL_OPTIONS, Option

from . import _proof
from ._properties import AGENT

# -- the follow-up-message matcher and option matching ------------------------------------------

labels = st.text(min_size=1, max_size=20).filter(lambda s: s.strip() != "")
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


class Parked(Exception):
    """Raised by the fake journal where the engine would park the turn."""


class OneQuestion:
    """A journal that records the question `ctx.ask()` opens, then parks."""

    can_ask = True
    keyed = True

    def __init__(self) -> None:
        self.options: list[Option] | None = None

    def entries(self) -> list[dict[str, Any] | None]:
        return []

    def lookup(self, request_id: str) -> tuple[str, dict[str, Any] | None]:
        return "pending", None

    def asked(self, request_id: str) -> tuple[list[Option], bool] | None:
        return None

    async def run_step(
        self,
        index: int,
        name: str,
        run: Callable[[], Awaitable[Any]],
        *,
        plain: bool = False,
        child: bool = False,
    ) -> Any:
        raise AssertionError("no steps here")

    def lost(self) -> bool:
        return False

    def bound_question(self, question: str, options: list[Option]) -> None:
        pass

    async def open_question(
        self, index: int, question: str, options: list[Option], allow_text: bool
    ) -> str:
        self.options = options
        return "req_1"

    async def park(self) -> NoReturn:
        raise Parked

    async def settle(self) -> None:
        pass


option_specs = st.lists(
    st.one_of(labels, st.fixed_dictionaries({"label": labels}), json_values), max_size=5
)


@given(raw=option_specs)
@settings(deadline=None)
def test_ask_takes_any_options_or_refuses_them_as_usage_errors(raw: list[Any]) -> None:
    """`ctx.ask(options=...)` with anything: the question opens with distinct option ids that
    each round-trip by id, or the call is refused as a UsageError."""
    _proof.record("hypothesis:test_ask_options:examples")
    journal = OneQuestion()
    auth = so.SessionAuth(current=None, initiator=None)
    ctx = so.ToolContext(
        session=so.SessionInfo(id="ses_1", agent=AGENT, turn="trn_1", auth=auth),
        call_id="call_1",
        tool_name="ship",
        idempotency_key="ses_1:1:call_1",
        journal=journal,
    )
    try:
        asyncio.run(ctx.ask("Which one?", options=raw, allow_text=True))
    except so.UsageError as exc:
        assert str(exc).startswith("ctx.ask(): "), exc
        return
    except Parked:
        pass
    assert journal.options is not None and len(journal.options) == len(raw)
    ids = [o.id for o in journal.options]
    assert len(set(ids)) == len(ids)
    options = journal.options
    for i, o in enumerate(options):
        # Typing an option's id picks that option, unless the same text also names another
        # option (its label or id, compared folded, or its 1-based number): then it picks none
        # rather than guess.
        t = visible(o.id).strip()
        also = [
            p
            for j, p in enumerate(options)
            if j != i
            and (
                folded(t) in (folded(p.label), folded(p.id))
                or (t.isdecimal() and len(t) <= 9 and int(t) == j + 1)
            )
        ]
        got = match_option(options, o.id)
        if also:
            assert got is None, (o, also)
        else:
            assert got is not None and got.id == o.id, (o, got)


replies = st.one_of(
    st.text(max_size=40),
    # with what draws nothing about it: a zero-width space, a right-to-left mark, U+FE0F
    st.from_regex(
        "\\s*[\u200b\u200f]?(approve|deny|cancel|[0-9²³¹①١٢]{1,3})\ufe0f?\\s*", fullmatch=True
    ),
)


@given(text=replies)
@settings(deadline=None)
def test_approval_replies_never_crash(text: str) -> None:
    """Any text either names approve/deny by id, label (any case or width, padded, with what
    draws nothing) or index, or nothing."""
    _proof.record("hypothesis:test_approval_replies:examples")
    option = match_option(APPROVAL_OPTIONS, text)
    t = visible(text).strip()
    expected = {"approve": "approve", "deny": "cancel", "cancel": "cancel"}.get(folded(t))
    if t.isdecimal() and int(t) in (1, 2):
        expected = ["approve", "cancel"][int(t) - 1]
    assert (None if option is None else option.id) == expected


@pytest.mark.parametrize("text", ["²", "³", "①", "2²"])
def test_a_digit_that_is_not_a_number_is_no_index(text: str) -> None:
    # Regression: str.isdigit() accepts superscripts, which int() refuses (ValueError escaped).
    assert match_option(APPROVAL_OPTIONS, text) is None


unique_options = st.lists(
    st.builds(
        Option,
        id=st.text(min_size=1, max_size=12).filter(lambda s: s.strip() != ""),
        label=st.text(min_size=1, max_size=20).filter(lambda s: s.strip() != ""),
    ),
    min_size=1,
    max_size=5,
    unique_by=lambda o: o.id,
)


@given(options=unique_options, data=st.data())
@settings(deadline=None)
def test_an_option_round_trips_by_id_label_and_index(options: list[Option], data: Any) -> None:
    """Typing an option's id, label (any case, any surrounding whitespace) or 1-based index picks
    the one option that answers to that text; when two different options answer to it (one's
    label is another's id or number, two share a label), it picks none rather than guess."""
    _proof.record("hypothesis:test_option_round_trip:examples")
    i = data.draw(st.integers(0, len(options) - 1))
    o = options[i]
    pad = data.draw(st.sampled_from(["", " ", "\t", "  \n", "\u200b", " \u200f"]))

    def answering(typed: str) -> set[str]:
        """The ids of the options that answer to the typed text: its id or label compared
        folded (no case, Unicode's compatibility form: `²` reads as `2`, nothing that draws
        nothing), or its number as it shows."""
        t = visible(typed).strip()
        return {
            p.id
            for j, p in enumerate(options)
            if folded(t) in (folded(p.id), folded(p.label))
            or (t.isdecimal() and len(t) <= 9 and int(t) == j + 1)
        }

    for typed in (o.id, o.label):
        for variant in (typed, typed.upper(), typed.lower(), typed.swapcase()):
            got = match_option(options, pad + variant + pad)
            if folded(variant) != folded(typed):
                continue  # casing changed the text itself (e.g. ß -> SS): not the same reply
            who = answering(pad + variant + pad)
            assert o.id in who
            if len(who) == 1:
                assert got is o, (variant, options)
            else:
                assert got is None, (variant, options, who)
    index = match_option(options, f" {i + 1} ")
    who = answering(str(i + 1))
    assert index is (o if who == {o.id} else None), (i, options, who)


def test_a_number_that_also_folds_to_an_id_picks_none() -> None:
    """Found by the property above: `2` is the second option's number, and also, folded, the
    first option's id `²`; two options answer to it, so it picks neither."""
    options = [Option(id="²", label="0"), Option(id="0", label="zero")]
    assert match_option(options, " 2 ") is None
    assert match_option(options, "²") is options[0]  # typed as it is shown, it is that id
    assert match_option(options, "zero") is options[1]


@given(text=st.text(max_size=60), allow_text=st.booleans(), options=unique_options)
@settings(deadline=None)
def test_the_message_matcher_answers_or_passes(
    text: str, allow_text: bool, options: list[Option]
) -> None:
    """A follow-up message either names an option, is free text the question accepts, or is
    not an answer at all (None); it never raises."""
    _proof.record("hypothesis:test_message_matcher:examples")
    request = so.InputRequest(
        kind="question",
        id="req_1",
        session_id="ses_1",
        turn_id="trn_1",
        agent=AGENT,
        question="Which one?",
        options=options,
        allow_text=allow_text,
        created_at=0.0,
    )
    got = match(request, text)
    option = match_option(options, text)
    if option is not None:
        assert got is not None and got.option_id == option.id and got.text is None
    elif allow_text:
        assert got is not None and got.option_id is None and got.text == text
    else:
        assert got is None
