"""The checks of user settings shared by the runtime, the stores, the server and the channels:
a duration or a count that makes no sense is refused with its name and its allowed range."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

import signoff as so
from signoff._settings import flag, positive_seconds, seconds, whole

NOT_NUMBERS: list[Any] = [True, False, "5", None, [1], 1j]


@pytest.mark.parametrize("value", [0, -1, -0.5, math.nan, math.inf, -math.inf, *NOT_NUMBERS])
def test_seconds_refuses_what_is_not_a_positive_finite_number(value: Any) -> None:
    assert not positive_seconds(value)
    with pytest.raises(so.UsageError, match=r"^wait must be a positive, finite number of seconds"):
        seconds("wait", value)


@pytest.mark.parametrize("value", [1e-9, 0.5, 2, 1e12])
def test_seconds_takes_a_positive_finite_number_as_it_is(value: float) -> None:
    assert positive_seconds(value)
    assert seconds("wait", value) is value


def test_seconds_from_zero_takes_zero_and_refuses_what_is_below_it() -> None:
    assert seconds("wait", 0, zero=True) == 0
    assert seconds("wait", 0.0, zero=True) == 0.0
    for value in (-0.1, math.nan, math.inf, False, "0"):
        with pytest.raises(so.UsageError, match="wait must be a finite number of seconds from 0"):
            seconds("wait", value, zero=True)


def test_seconds_within_bounds_names_them_and_takes_the_bounds_themselves() -> None:
    assert seconds("ttl", 0.1, least=0.1, most=86_400) == 0.1
    assert seconds("ttl", 86_400, least=0.1, most=86_400) == 86_400
    for value in (0.001, 0.0999, 86_400.5, 0, math.inf):
        with pytest.raises(so.UsageError) as info:
            seconds("ttl", value, least=0.1, most=86_400)
        assert (
            str(info.value) == f"ttl must be a number of seconds, from 0.1 to 86400, not {value!r}"
        )
    with pytest.raises(so.UsageError, match=r"0 or from 1 to 5, not 0\.5"):
        seconds("ttl", 0.5, least=1, most=5, zero=True)
    assert seconds("ttl", 0, least=1, most=5, zero=True) == 0
    with pytest.raises(
        so.UsageError, match=r"wait must be a number of seconds, from 0 to 60, not -1"
    ):
        seconds("wait", -1, most=60, zero=True)
    with pytest.raises(so.UsageError, match=r"wait must be a number of seconds, above 0, up to 60"):
        seconds("wait", 0, most=60)
    with pytest.raises(so.UsageError, match=r"wait must be a number of seconds, from 2 up, not 1"):
        seconds("wait", 1, least=2)


@pytest.mark.parametrize("value", [0, -3, 2.5, math.nan, *NOT_NUMBERS])
def test_whole_refuses_what_is_not_a_whole_number_in_range(value: Any) -> None:
    with pytest.raises(so.UsageError, match=r"^size must be a whole number from 1, not "):
        whole("size", value, least=1)


def test_whole_takes_a_whole_number_in_range_and_names_the_range() -> None:
    assert whole("port", 0, least=0, most=65_535) == 0
    assert whole("port", 65_535, least=0, most=65_535) == 65_535
    with pytest.raises(
        so.UsageError, match=r"port must be a whole number from 0 to 65535, not 65536"
    ):
        whole("port", 65_536, least=0, most=65_535)


def test_the_error_class_and_the_value_shown_can_be_the_callers() -> None:
    """A store URL's option is a `StoreError`, and shows the text the URL holds."""
    with pytest.raises(
        so.StoreError, match=r"^URL option pool_max must be a whole number from 1, not '0'$"
    ):
        whole("URL option pool_max", 0, least=1, shown="'0'", error=so.StoreError)
    with pytest.raises(so.StoreError, match=r"not 'nan'$"):
        seconds("URL option pool_timeout", math.nan, shown="'nan'", error=so.StoreError)


@pytest.mark.parametrize("value", [10**400, -(10**400)], ids=["huge", "-huge"])
def test_seconds_refuses_an_integer_no_float_holds(value: int) -> None:
    """`math.isfinite` raised `OverflowError` on it, and a sleep or deadline would have too."""
    assert not positive_seconds(value)
    with pytest.raises(so.UsageError, match=r"^wait must be a positive, finite number"):
        seconds("wait", value)
    with pytest.raises(so.UsageError, match=r"^wait must be a finite number of seconds from 0"):
        seconds("wait", value, zero=True)
    with pytest.raises(so.UsageError, match=r"^lease_ttl must be a number of seconds"):
        so.Runtime([], store="sqlite:///:memory:", lease_ttl=value)


def test_an_integer_too_long_to_print_is_named_by_its_size() -> None:
    """Python refuses to print an int of over 4300 digits: the error said that instead."""
    with pytest.raises(so.UsageError, match=r"^size must be a whole number from 0, not a "):
        whole("size", -(10**5000), least=0)
    with pytest.raises(so.UsageError, match=r"^wait must be a positive, finite number"):
        seconds("wait", 10**5000)


def test_a_flag_is_true_or_false_and_nothing_else() -> None:
    """`"no"` and `0` were taken for their truth: `"no"` as true."""
    assert flag("migrate", True) is True and flag("migrate", False) is False
    for value in ("no", "false", 0, 1, None, [True]):
        with pytest.raises(
            so.UsageError, match=f"^migrate must be True or False, not {re.escape(repr(value))}$"
        ):
            flag("migrate", value)
