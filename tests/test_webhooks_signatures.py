"""verify_webhook compares the whole signature: one that differs only in its last digits, is
cut short or runs on is refused, and so is the right digest under another scheme's prefix."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff.channels import InvalidSignature, verify_webhook
from signoff.channels.webhooks import sign_webhook

from .test_webhooks import SECRET

BODY = b'{"id":"whd_1","type":"request.opened"}'
STAMP = 1_700_000_000


def _flip(digit: str) -> str:
    return "0" if digit != "0" else "1"


def _near_misses(good: str) -> list[str]:
    return [
        good[:-1] + _flip(good[-1]),  # the last hex digit
        good[:40] + "".join(_flip(d) for d in good[40:]),  # all but the first 37 digits
        good[:-8],  # cut short
        good + "00",  # runs on
        "v0=" + good.removeprefix("v1="),  # Slack's scheme, this digest
    ]


@pytest.mark.parametrize("index", range(5))
def test_a_signature_almost_right_is_refused(index: int) -> None:
    good = sign_webhook(SECRET, STAMP, BODY)
    headers = {"Signoff-Timestamp": str(STAMP), "Signoff-Signature": good}
    assert verify_webhook(SECRET, headers, BODY, now=STAMP)["id"] == "whd_1"
    forged = _near_misses(good)[index]
    with pytest.raises(InvalidSignature, match="does not match"):
        verify_webhook(SECRET, {**headers, "Signoff-Signature": forged}, BODY, now=STAMP)


@pytest.mark.parametrize("now", [10**400, "1800000000", float("nan"), True])
def test_a_now_that_is_no_unix_time_is_a_usage_error(now: Any) -> None:
    """`now=` a string or an int no float holds raised a bare TypeError or OverflowError from
    the check meant to refuse it."""
    headers = {
        "Signoff-Timestamp": str(STAMP),
        "Signoff-Signature": sign_webhook(SECRET, STAMP, BODY),
    }
    with pytest.raises(so.UsageError, match="^now must be a finite Unix time, not "):
        verify_webhook(SECRET, headers, BODY, now=now)
