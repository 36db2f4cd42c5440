"""`budget_left` and `by_budget`: what a session may still spend, by budget."""

from __future__ import annotations

from signoff import Usage
from signoff._budgets import budget_left, by_budget
from signoff._state import SessionState, TurnState


def _state(*, first_seq: int = 5, **fields: object) -> SessionState:
    state = SessionState(id="s1", **fields)  # type: ignore[arg-type]
    state.turn = TurnState(id="t1", first_seq=first_seq)
    return state


def test_own_budgets_less_what_was_spent_and_raised_by_each_continue() -> None:
    state = _state(usage=Usage(input_tokens=300, output_tokens=100, cost_usd=0.25))
    assert budget_left(state, 1000, 1.0) == {"max_tokens": 600, "max_cost_usd": 0.75}
    state.limit_grants = 2  # two `continue` answers: three times each budget
    assert budget_left(state, 1000, 1.0) == {"max_tokens": 2600, "max_cost_usd": 2.75}
    assert budget_left(state, None, None) == {}


def test_what_subagents_spent_counts_and_nothing_is_below_zero() -> None:
    state = _state(
        usage=Usage(input_tokens=500, output_tokens=0),
        delegated=Usage(input_tokens=700, output_tokens=0, cost_usd=2.0),
    )
    assert budget_left(state, 1000, 1.0) == {"max_tokens": 0, "max_cost_usd": 0}


def test_a_delegated_turn_is_bound_by_the_parents_headroom_too() -> None:
    delegated = _state(
        first_seq=2, usage=Usage(input_tokens=100, output_tokens=0), headroom={"max_tokens": 250}
    )
    assert budget_left(delegated, 1000, None) == {"max_tokens": 150}  # 250 - 100, not 900
    assert budget_left(delegated, None, None) == {"max_tokens": 150}  # the parent's alone
    own = _state(
        first_seq=9, usage=Usage(input_tokens=100, output_tokens=0), headroom={"max_tokens": 250}
    )
    assert budget_left(own, 1000, None) == {"max_tokens": 900}  # a later turn is the child's


def test_by_budget_counts_tokens_and_cost_as_each_budget_does() -> None:
    usage = Usage(input_tokens=40, output_tokens=2, cost_usd=0.5)
    assert by_budget(usage, ["max_tokens", "max_cost_usd"]) == {
        "max_tokens": 42,
        "max_cost_usd": 0.5,
    }
    assert by_budget(usage, []) == {}
