"""A webhook channel's settings: what is refused when it is configured, named (its URLs:
test_webhook_urls.py)."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff.channels import (
    WebhookChannel,
    verify_webhook,
)

from .test_webhooks import SECRET


def test_configuration_errors_are_named() -> None:
    with pytest.raises(so.UsageError, match="at least one URL"):
        WebhookChannel([], SECRET)
    with pytest.raises(so.UsageError, match="http"):
        WebhookChannel("ftp://example.com", SECRET)
    with pytest.raises(so.UsageError, match="secret"):
        WebhookChannel("https://example.com/hook", "")
    with pytest.raises(so.UsageError, match="max_attempts"):
        WebhookChannel("https://example.com/hook", SECRET, max_attempts=0)
    for timeout in (0, -1, float("nan")):
        with pytest.raises(so.UsageError, match="timeout"):
            WebhookChannel("https://example.com/hook", SECRET, timeout=timeout)
    # each URL once (twice would deliver every event twice), and one httpx can send to
    with pytest.raises(so.UsageError, match="twice"):
        WebhookChannel(["https://example.com/a", "https://example.com/a"], SECRET)
    for bad in ("https://[::1", "http://", "https:///path"):
        with pytest.raises(so.UsageError, match="URL"):
            WebhookChannel(bad, SECRET)


def test_a_nan_backoff_or_warning_window_and_a_fractional_max_attempts_are_refused() -> None:
    """NaN passes a `< 0` check: a NaN `max_backoff` would have a retry sleep forever and a NaN
    `expiring_within` would warn at once; `max_attempts=2.5` would fail each delivery later."""
    nan = float("nan")
    with pytest.raises(so.UsageError, match="backoff"):
        WebhookChannel("https://example.com/hook", SECRET, backoff=nan)
    with pytest.raises(so.UsageError, match="max_backoff"):
        WebhookChannel("https://example.com/hook", SECRET, max_backoff=nan)
    with pytest.raises(so.UsageError, match="expiring_within"):
        WebhookChannel("https://example.com/hook", SECRET, expiring_within=nan)
    for attempts in (2.5, "3", True):
        with pytest.raises(so.UsageError, match="max_attempts"):
            WebhookChannel("https://example.com/hook", SECRET, max_attempts=attempts)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"timeout": float("inf")}, "timeout must be a positive, finite number of seconds"),
        ({"timeout": "10"}, "timeout must be a positive, finite number of seconds"),
        ({"timeout": True}, "timeout must be a positive, finite number of seconds"),
        ({"backoff": float("inf")}, "backoff must be a finite number of seconds from 0"),
        ({"max_backoff": -1}, "max_backoff must be a finite number of seconds from 0"),
        ({"expiring_within": "300"}, "expiring_within must be a finite number of seconds"),
        ({"max_attempts": 0}, "max_attempts must be a whole number from 1, not 0"),
    ],
)
def test_webhook_settings_out_of_their_range_are_refused_naming_it(
    setting: dict[str, Any], message: str
) -> None:
    """An infinite timeout or backoff hung a delivery for ever, and a string where the seconds
    go was a bare TypeError; each is a `UsageError` naming the setting and its range."""
    with pytest.raises(so.UsageError, match=f"^{message}"):
        WebhookChannel("https://example.com/hook", SECRET, **setting)
    assert WebhookChannel("https://example.com/hook", SECRET, backoff=0, max_backoff=0).backoff == 0


def test_a_secret_that_is_not_valid_unicode_is_refused_when_configured() -> None:
    """A secret read from an environment holding invalid UTF-8 has lone surrogates: signing
    raised UnicodeEncodeError on every send (never a failed attempt, kept forever)."""
    for bad in ("whsec_\udcff", ["whsec_new", "\ud800"]):
        with pytest.raises(so.UsageError, match="secret"):
            WebhookChannel("https://example.com/hook", bad)
        with pytest.raises(so.UsageError, match="secret"):
            verify_webhook(bad, {}, b"{}")


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ("whsec_abc\n", "the secret has spaces or a newline around it"),
        (" whsec_abc", "the secret has spaces or a newline around it"),
        ("\n", "the secret is blank"),
        (" ", "the secret is blank"),
        (["whsec_new", "whsec_abc\r\n"], "secret #2 has spaces or a newline around it"),
    ],
)
def test_a_blank_secret_or_one_with_blanks_around_it_is_refused_unshown(
    bad: str | list[str], problem: str
) -> None:
    """A secret read from a file written by `echo` ends in a newline: it was taken as given,
    so every delivery was signed with the newline, and a receiver holding the secret without
    it answered 401, a final refusal never sent again. Refused when configured, as API tokens
    are, without showing it; `verify_webhook` refuses it too."""
    for make in (
        lambda: WebhookChannel("https://example.com/hook", bad),
        lambda: verify_webhook(bad, {}, b"{}"),
    ):
        with pytest.raises(so.UsageError, match=problem) as caught:
            make()
        assert "whsec_" not in str(caught.value)


@pytest.mark.parametrize("bad", [5, None, 1.5, b"whsec_bytes", {"whsec_a": 1}, object()])
def test_a_secret_of_the_wrong_type_is_a_usage_error_naming_it(bad: object) -> None:
    """`WebhookChannel(url, secret=5)` failed with a bare TypeError (`list(5)`); bytes were
    refused as "not a string" without saying which argument. Neither error echoes the value."""
    for make in (
        lambda: WebhookChannel("https://example.com/hook", bad),  # type: ignore[arg-type]
        lambda: verify_webhook(bad, {}, b"{}"),  # type: ignore[arg-type]
    ):
        with pytest.raises(so.UsageError, match=r"secret") as caught:
            make()
        assert type(bad).__name__ in str(caught.value), caught.value
        assert "whsec_" not in str(caught.value)


class _AsyncSleep:
    async def __call__(self, seconds: float) -> None:
        return None


def test_a_sleep_that_would_block_the_event_loop_is_refused_when_the_channel_is_made() -> None:
    """`sleep` is awaited between attempts: `time.sleep` was taken, blocked the event loop (every
    channel, the server) for each backoff, then failed on awaiting its None."""
    import asyncio
    import functools
    import time

    blocking: list[Any] = [time.sleep, lambda seconds: None, 0.5, asyncio.Event]
    for sleep in blocking:
        with pytest.raises(
            so.UsageError,
            match=r"^WebhookChannel: sleep must be an async function of the seconds to wait, "
            r"such as asyncio.sleep",
        ):
            WebhookChannel("https://example.com/hook", SECRET, sleep=sleep)
    with pytest.raises(so.UsageError, match="a plain one: it would block the event loop"):
        WebhookChannel("https://example.com/hook", SECRET, sleep=time.sleep)  # type: ignore[arg-type]
    waiting: list[Any] = [asyncio.sleep, functools.partial(asyncio.sleep), _AsyncSleep()]
    for wait in waiting:
        WebhookChannel("https://example.com/hook", SECRET, sleep=wait)  # async: taken
