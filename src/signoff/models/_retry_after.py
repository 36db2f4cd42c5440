"""How long a failed reply asks to wait before a retry (`Retry-After`, `retry-after-ms`), and
the longest wait a call makes for one: past it the call fails at once, saying so, instead of
holding its turn and session until the call's bound gives up."""

from __future__ import annotations

import email.utils
import math
import time
from typing import Any

__all__ = ["MAX_RETRY_WAIT", "asked_wait", "long_wait_note", "refuse_long_waits"]

MAX_RETRY_WAIT = 120.0
"""The longest `Retry-After` a call waits for before a retry, in seconds: the openai SDK's own
limit, which the anthropic SDK does not have (it waits up to 49 days)."""


def asked_wait(headers: Any) -> float | None:
    """The seconds a reply's headers ask to wait before a retry, as the SDKs read them
    (`retry-after-ms`, then `retry-after` in seconds or as a date), or None for none."""
    for name, divisor in (("retry-after-ms", 1000), ("retry-after", 1)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            wait = float(value) / divisor
        except ValueError:
            continue
        return None if math.isnan(wait) else wait
    try:
        date = email.utils.parsedate_tz(headers.get("retry-after") or "")
        return None if date is None else float(email.utils.mktime_tz(date) - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


async def refuse_long_waits(response: Any) -> None:
    """Mark a failed reply that asks to wait longer than `MAX_RETRY_WAIT` as not to be retried
    (`x-should-retry: false`, which both SDKs obey)."""
    if response.status_code >= 400:
        wait = asked_wait(response.headers)
        if wait is not None and wait > MAX_RETRY_WAIT:
            response.headers["x-should-retry"] = "false"


def long_wait_note(response: Any) -> str:
    """What a failed reply's message adds when it asked to wait longer than a call waits."""
    wait = asked_wait(getattr(response, "headers", None) or {})
    if wait is None or wait <= MAX_RETRY_WAIT:
        return ""
    shown = "for ever" if math.isinf(wait) else f"{wait:,.0f} s"
    return (
        f" (the server asks to wait {shown} before a retry, over the {MAX_RETRY_WAIT:.0f} s a "
        "call waits: not retried)"
    )
