"""What a run sees of a value is what a resumed run sees, in any process: a tool's result and a
step's as the model and the tool read them, a model's call input, an approval payload, a
decision's value and a caller's attributes (tests/_live_resumed.py). Each is either refused by
name where it enters, or seen live as its JSON form, which is what the log gives back."""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent

from . import _proof
from ._live_resumed import CHANNELS, Outcome, is_json, probe, same


class Level(enum.IntEnum):
    HIGH = 3


class Tag(str):
    """Text of a class of its own: JSON gives back a plain `str`."""


ODD = {
    "tuple": ("a", (1, 2.5)),
    "int enum": [Level.HIGH],
    "str subclass": {"k": Tag("x")},
    "ordered dict": OrderedDict([("b", 1), ("a", (2,))]),
}
"""Values that are JSON to `json.dumps` but not of JSON's types: a decision's value, a caller's
attributes and a model's call input reached the live run as they were (a tuple, an IntEnum),
and a resumed one as JSON gave them back (a list, an int)."""


@pytest.mark.parametrize("name", list(ODD))
async def test_values_json_holds_as_other_types_are_seen_as_json_live_and_resumed(
    store_url: str, name: str
) -> None:
    outcomes = await probe(store_url, ODD[name])
    differ = {
        channel: seen
        for channel, seen in outcomes.items()
        if seen.refused is not None or not same(seen.live, seen.resumed) or not is_json(seen.live)
    }
    assert differ == {}
    assert set(outcomes) == set(CHANNELS)


async def test_two_surrogates_a_step_returns_come_back_as_two(store_url: str) -> None:
    """Journaled as two code points, the pair came back to the tool as the one character they
    encode together (the copy went through JSON's `\\u` escapes), live and replayed alike; a
    caller's attributes holding it likewise."""
    outcomes = await probe(store_url, ["\ud83d\ude00", {"k": "\ud83d\ude00"}])
    for channel in ("result", "step", "payload", "principal"):
        seen = outcomes[channel]
        assert same(seen.live, seen.resumed), (channel, seen)
    assert outcomes["step"].live == ["\ud83d\ude00", {"k": "\ud83d\ude00"}]
    assert outcomes["principal"].live == {"v": ["\ud83d\ude00", {"k": "\ud83d\ude00"}]}


async def test_a_callers_attributes_nested_past_what_pydantic_writes_are_refused(
    store_url: str,
) -> None:
    """Attributes 300 levels deep were taken as JSON: the approval their turn asked for failed
    with a bare ValueError out of `generate` (pydantic writes about 250 levels), and the session
    stayed running for good, each resume raising it again. Refused now, as an answer nested
    past 100 levels is, and no session is opened."""

    @so.tool(approval=so.always())
    async def refund(amount: int) -> str:
        """Refund."""
        return "refunded"

    def who(depth: int) -> so.Principal:
        return so.Principal(authenticator="t", principal_id="ann", attributes={"v": nested(depth)})

    agent = scripted_agent("a", [call_tools(call("refund", amount=1)), reply("ok")], tools=[refund])
    async with so.Runtime([agent], store=store_url) as rt:
        with pytest.raises(so.UsageError, match="auth's attributes nest deeper than 100"):
            await rt.generate("a", prompt="go", auth=who(300))
        with pytest.raises(so.UsageError, match="auth's attributes nest deeper than 100"):
            await rt.create_session("a", auth=who(100))
        assert await rt.sessions() == []
        parked = await rt.generate("a", prompt="go", auth=who(99))  # 100 levels with its dict
        assert parked.status == "waiting" and len(parked.pending) == 1


class Color(enum.Enum):
    RED = "red"


class Box(BaseModel):
    data: dict[Any, Any]


def nested(depth: int) -> list[Any]:
    """A list `depth` levels deep: past what an answer or a model's input may nest (100), and
    past what pydantic writes (about 250)."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


TEXT = st.text(st.characters(exclude_categories=()), max_size=4)  # lone surrogates too
HASHABLE = st.none() | st.booleans() | st.integers() | st.floats() | TEXT
KEYS = HASHABLE | st.sampled_from(["1", "null", "None", "true", "NaN", "Infinity", "\ud800"])
LEAVES = (
    HASHABLE
    | st.sampled_from([-0.0, 1e308, 5e-324, 2**70, -(2**64), "\x00", "a\ud800", "\ud83d\ude00"])
    | st.builds(pow, st.just(10), st.just(4300))  # more digits than JSON text may have here
    | st.binary(max_size=3)
    | st.datetimes(timezones=st.none() | st.just(dt.UTC))
    | st.dates()
    | st.decimals(places=2)
    | st.sampled_from([Color.RED, Level.HIGH])
    | st.builds(Tag, TEXT)
)
VALUES = st.recursive(
    LEAVES,
    lambda kids: (
        st.lists(kids, max_size=3)
        | st.lists(kids, max_size=3).map(tuple)
        | st.dictionaries(KEYS, kids, max_size=3)
        | st.dictionaries(TEXT, kids, max_size=3).map(OrderedDict)
        | st.builds(Box, data=st.dictionaries(KEYS, kids, max_size=3))
        | st.frozensets(HASHABLE, max_size=3)
        | st.sets(st.integers(), max_size=3)
    ),
    max_leaves=8,
) | st.integers(95, 300).map(nested)

REFUSALS = {"input": "ModelError", "decision": "InvalidAnswer", "principal": "UsageError"}
"""Where a value handed to signoff is refused by name, nothing of it stored: the ways in of a
tool's or step's result write it as JSON instead (or fail the call or step, alike on replay)."""


def check(outcomes: dict[str, Outcome]) -> None:
    assert set(outcomes) == set(CHANNELS)
    for channel, seen in outcomes.items():
        if seen.refused is not None:
            assert seen.refused == REFUSALS.get(channel), (channel, seen)
            continue
        assert same(seen.live, seen.resumed), (channel, seen)
        raised = channel == "step" and isinstance(seen.live, tuple)  # the step's failure
        assert raised or is_json(seen.live), (channel, seen)


def run_property(url: str, proof: str, examples: int) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(value=VALUES)
    def seen_alike(value: Any) -> None:
        _proof.record(f"hypothesis:{proof}:examples")
        check(asyncio.run(probe(url, value)))

    seen_alike()


def test_every_value_is_seen_alike_live_and_resumed_on_sqlite(tmp_path: Any) -> None:
    """Any value, every way in: refused by name, or seen live as resumed (of the same types,
    keys in the same order, -0.0 and NaN as they are) and as plain JSON."""
    run_property(f"sqlite:///{tmp_path / 'state.db'}", "test_live_resumed", 80)


def test_every_value_is_seen_alike_live_and_resumed_on_postgres(pg_store_url: str) -> None:
    run_property(pg_store_url, "test_live_resumed_postgres", 40)
