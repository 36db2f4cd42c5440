"""`budget_left` and `by_budget`: what a session may still spend, by budget; and how far a
`continue` raises the budgets (`continue_to`, `raised_to`)."""

from __future__ import annotations

import math

from signoff import Limits, Usage
from signoff._budgets import (
    budget_left,
    by_budget,
    call_cap,
    continue_to,
    limit_question,
    over_budget,
    own_left,
    raised_to,
)
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


class _Priced:
    """A model at `price_per_mtok` (input, output) USD a million tokens."""

    def __init__(self, price: tuple[float, float] | None = None) -> None:
        self.price_per_mtok = price


def test_a_continue_raises_the_tokens_by_as_many_sizes_as_the_next_call_needs() -> None:
    """A pasted document of 5,000 tokens under max_tokens=1000: the session spent 5010 and its
    next call reads those 5,000 again. A `continue` raised it by one size: ten answers, each a
    new prompt, before the model could run. Now one raises it to 11 sizes, the least that
    leaves the next call an output token."""
    state = _state(usage=Usage(input_tokens=5000, output_tokens=10))
    limits, model = Limits(max_tokens=1000), _Priced()
    assert continue_to(state, limits, model, 5000) == {"max_tokens": 11000}
    assert raised_to({"max_tokens": 11000}) == "max_tokens raised to 11000"
    state.raised = {"max_tokens": 11000}
    assert call_cap(state, limits, model, {}, 5000) == (990, False, 0)
    state.raised = {"max_tokens": 10000}  # one size fewer leaves no output token
    assert call_cap(state, limits, model, {}, 5000)[0] == 0
    state.raised = {}
    state.limit_grants = 3  # raised three sizes before (an older signoff's): to 11 still
    assert continue_to(state, limits, model, 5000) == {"max_tokens": 11000}
    # A reply cut at the budget counts with the request: it is spent too.
    assert continue_to(state, limits, model, 5000, Usage(output_tokens=1000)) == {
        "max_tokens": 12000
    }


def test_a_continue_raises_by_one_size_at_least() -> None:
    """Spent past the budget by little, or asked for a subagent stopped on what this session's
    budget left it (its own not spent): one size, as before; past a budget a continue raised,
    a size more than that."""
    limits, model = Limits(max_tokens=100), _Priced()
    assert continue_to(_state(usage=Usage(output_tokens=120)), limits, model, 0) == {
        "max_tokens": 200
    }
    assert continue_to(_state(usage=Usage(output_tokens=10)), limits, model, 0) == {
        "max_tokens": 200
    }
    assert continue_to(_state(), Limits(), model, 10**9) == {}  # no budget of its own
    raised = _state(usage=Usage(output_tokens=10), raised={"max_tokens": 250})
    assert continue_to(raised, limits, model, 0) == {"max_tokens": 300}
    costly = _state(raised={"max_cost_usd": 0.011})  # 11 of 0.001, as a float holds it
    assert continue_to(costly, Limits(max_cost_usd=0.001), model, 0) == {"max_cost_usd": 0.001 * 12}


def test_a_continue_raises_the_cost_budget_by_what_the_next_call_needs_too() -> None:
    """$1 in and $10 out a million tokens, max_cost_usd=0.001: $0.00501 spent, the next call
    reading 5,000 tokens ($0.005) and one output token ($0.00001) needs $0.01002: 11 sizes;
    each budget is raised by as many of its own sizes as it needs, a size more at least (the
    README's rule), not by as many as the other needs."""
    state = _state(usage=Usage(input_tokens=5000, output_tokens=1, cost_usd=0.00501))
    model = _Priced((1.0, 10.0))
    limits = Limits(max_cost_usd=0.001)
    assert continue_to(state, limits, model, 5000) == {"max_cost_usd": 0.001 * 11}
    state.raised = {"max_cost_usd": 0.001 * 11}
    assert call_cap(state, limits, model, {}, 5000)[0] == 99  # $0.00099 of output
    state.raised = {}
    both = Limits(max_tokens=100_000, max_cost_usd=0.001)
    to = continue_to(state, both, model, 5000)
    assert to == {"max_tokens": 200_000, "max_cost_usd": 0.001 * 11}
    assert raised_to(to) == "max_tokens raised to 200000 and max_cost_usd raised to 0.011"
    free = _Priced((1.0, 0.0))  # free output: what is left need only be more than nothing
    assert continue_to(state, limits, free, 5000) == {"max_cost_usd": 0.001 * 11}


def test_each_budget_is_raised_by_its_own_sizes() -> None:
    """One expensive call spent max_cost_usd=0.01 ($0.5 of 5,010 tokens) with max_tokens=100,000
    far from spent: the cost budget goes to 51 sizes, the tokens one size more (200,000), not
    51 sizes (5,100,000); and the other way round, a spent token budget leaves the cost one
    size more."""
    model = _Priced()
    both = Limits(max_tokens=100_000, max_cost_usd=0.01)
    costly = _state(usage=Usage(input_tokens=5000, output_tokens=10, cost_usd=0.5))
    assert continue_to(costly, both, model, 5000) == {
        "max_tokens": 200_000,
        "max_cost_usd": 0.01 * 51,
    }
    long = _state(usage=Usage(input_tokens=5000, output_tokens=10, cost_usd=0.01))
    limits = Limits(max_tokens=1000, max_cost_usd=1.0)
    assert continue_to(long, limits, model, 5000) == {"max_tokens": 11000, "max_cost_usd": 2.0}


def test_a_continue_after_a_cut_reply_leaves_the_next_the_room_asked() -> None:
    """A reply cut at the 70 output tokens left, 2,000 spent and 960 to read: a continue that
    left 40 would cut the next reply shorter still; asked for twice the 70, it leaves 1,040
    (4 sizes), in each budget."""
    state = _state(usage=Usage(input_tokens=1920, output_tokens=80))
    limits, model = Limits(max_tokens=1000), _Priced()
    assert continue_to(state, limits, model, 960) == {"max_tokens": 3000}  # one token
    assert continue_to(state, limits, model, 960, room=140) == {"max_tokens": 4000}
    priced = _state(usage=Usage(input_tokens=1920, output_tokens=80, cost_usd=0.0028))
    cost = Limits(max_cost_usd=0.001)  # $1 in, $10 out: 960 read is $0.00096, 140 out $0.0014
    assert continue_to(priced, cost, _Priced((1.0, 10.0)), 960) == {"max_cost_usd": 0.001 * 4}
    to = continue_to(priced, cost, _Priced((1.0, 10.0)), 960, room=140)
    assert to == {"max_cost_usd": 0.001 * 6}
    raised = _state(usage=priced.usage, raised=to)
    assert call_cap(raised, cost, _Priced((1.0, 10.0)), {}, 960)[0] == 224  # more than 140


def test_a_continue_raising_a_tiny_budget_stays_a_number() -> None:
    """A budget of a millionth of a cent that a dollar was spent past: the sizes the next call
    needs are counted in whole numbers, no further than 2**53, and what the budget becomes is
    finite (no OverflowError in the question, nor in the budgets after)."""
    state = _state(usage=Usage(cost_usd=1.0))
    limits = Limits(max_cost_usd=1e-300)
    to = continue_to(state, limits, _Priced((1.0, 10.0)), 10)
    assert to == {"max_cost_usd": 1e-300 * (2**53 + 1)}
    assert math.isfinite(float(raised_to(to).rpartition(" ")[2]))


def test_a_raised_budget_is_what_the_continue_said_whatever_size_a_redeploy_gives() -> None:
    """A `continue` said max_tokens goes to 11000 ($6 of max_cost_usd): the budget is that
    much under a redeploy that lowered its size, and the deploy's own where that is more
    (it raised the size past it), not as many of the new size as the old one made it; a
    session an older signoff raised by sizes (`limit_grants`) keeps them too."""
    state = _state(
        usage=Usage(input_tokens=5000, output_tokens=10, cost_usd=5.0),
        raised={"max_tokens": 11000, "max_cost_usd": 6.0},
    )
    assert budget_left(state, 500, 0.5) == {"max_tokens": 5990, "max_cost_usd": 1.0}
    assert budget_left(state, 100_000, 50.0) == {"max_tokens": 94990, "max_cost_usd": 45.0}
    assert budget_left(state, None, None) == {}  # a budget a redeploy removed: none
    assert own_left(state, Limits(max_tokens=500)) == {"max_tokens": 5990}
    assert over_budget(state, 500, None) is None
    assert over_budget(state, 500, None, Usage(output_tokens=5990)) == (
        "the session used 11000 of max_tokens=11000"
    )
    state.limit_grants = 29  # an older signoff's thirty sizes of 500: more than was promised
    assert budget_left(state, 500, None) == {"max_tokens": 9990}
    # Asked again under the lowered size: a size past what it was raised to, at least.
    assert continue_to(state, Limits(max_tokens=500), _Priced(), 0) == {"max_tokens": 15500}


def test_the_question_says_what_a_continue_raises_the_budgets_to() -> None:
    assert limit_question(
        "the session used 5010 of max_tokens=1000", "max_tokens raised to 11000"
    ) == (
        "the session used 5010 of max_tokens=1000. Continue with max_tokens raised to 11000, "
        "or stop?"
    )
    assert limit_question("spent", "") == "spent. Continue with a raised budget, or stop?"
