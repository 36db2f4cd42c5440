"""The output cap of a model call: how many output tokens what the session's budgets leave pays
for, at the model's output price. Shared by a turn's model step and `auto()`'s reviews."""

from __future__ import annotations

import math
from collections.abc import Mapping

from ._types import Usage

__all__ = [
    "BYTES_PER_TOKEN",
    "input_price",
    "input_price_floor",
    "output_cap",
    "output_price",
    "spare",
    "text_tokens",
]

BYTES_PER_TOKEN = 4
"""The bytes of UTF-8 text one input token is taken to hold where none was counted (an `auto()`
review's prompt): the usual rule of about four characters of English a token."""


def output_price(model: object) -> float | None:
    """What one output token of `model` costs in USD, from its `price_per_mtok` (the shipped
    models'); None when it has none, or when output is free."""
    price = getattr(model, "price_per_mtok", None)
    if not isinstance(price, tuple | list) or len(price) != 2:
        return None
    out = price[1]
    if isinstance(out, bool) or not isinstance(out, int | float) or not 0 < out < math.inf:
        return None
    return out / 1_000_000


def input_price(model: object) -> float | None:
    """What one uncached input token of `model` costs in USD, from its `price_per_mtok`; None
    when it has none."""
    price = getattr(model, "price_per_mtok", None)
    if not isinstance(price, tuple | list) or len(price) != 2:
        return None
    given = price[0]
    if isinstance(given, bool) or not isinstance(given, int | float) or not 0 <= given < math.inf:
        return None
    return given / 1_000_000


def text_tokens(*texts: str) -> int:
    """About how many input tokens `texts` take, at `BYTES_PER_TOKEN` bytes of UTF-8 a token
    (rounded up): an estimate where no tokenizer or earlier count says."""
    size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    return -(-size // BYTES_PER_TOKEN)


def input_price_floor(model: object) -> float | None:
    """The least one input token of `model` may cost in USD: its price for a cached one where it
    has one (`least_input_price_per_mtok`, the shipped models'), else its `price_per_mtok`'s
    input price; None when it has none."""
    least = getattr(model, "least_input_price_per_mtok", None)
    if least is None:
        price = getattr(model, "price_per_mtok", None)
        least = price[0] if isinstance(price, tuple | list) and len(price) == 2 else None
    if isinstance(least, bool) or not isinstance(least, int | float) or not 0 <= least < math.inf:
        return None
    return least / 1_000_000


def output_cap(left: Mapping[str, float], price: float | None) -> int | None:
    """The most output tokens a reply may take within what the budgets leave (`left`): their
    tokens, and their cost at the output `price`; None when nothing bounds it. A cost budget
    with nothing left bounds it at 0 whatever the price (free output, or none known): the input
    held back spent it."""
    counts = [left["max_tokens"]] if "max_tokens" in left else []
    if "max_cost_usd" in left and left["max_cost_usd"] <= 0:
        counts.append(0)
    elif "max_cost_usd" in left and price is not None:
        counts.append(left["max_cost_usd"] / price)
    # Rounded first: 0.001 / 0.00001 is 99.99999999999999 in floats.
    return max(0, math.floor(round(min(counts), 6))) if counts else None


def spare(bound: Mapping[str, float], spent: Usage) -> dict[str, float]:
    """What `bound` (by budget: `max_tokens`, `max_cost_usd`) leaves once `spent` is counted."""
    used = {"max_tokens": spent.total_tokens, "max_cost_usd": spent.cost_usd}
    return {k: bound[k] - used[k] for k in ("max_tokens", "max_cost_usd") if k in bound}
