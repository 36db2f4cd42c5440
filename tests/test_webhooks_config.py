"""A webhook channel's settings: what is refused when it is configured, named, with any password
in its URL masked."""

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


def test_a_url_no_connection_can_use_is_refused_when_configured() -> None:
    """A port past 65535 made every send raise (an ExceptionGroup, not a failed attempt) and
    a malformed IDNA host raised a UnicodeError: both are configuration errors, by name."""
    for bad in ("http://127.0.0.1:99999/hook", "http://127.0.0.1:0/hook", "http://xn--/hook"):
        with pytest.raises(so.UsageError, match="URL"):
            WebhookChannel(bad, SECRET)


def test_a_secret_that_is_not_valid_unicode_is_refused_when_configured() -> None:
    """A secret read from an environment holding invalid UTF-8 has lone surrogates: signing
    raised UnicodeEncodeError on every send (never a failed attempt, kept forever)."""
    for bad in ("whsec_\udcff", ["whsec_new", "\ud800"]):
        with pytest.raises(so.UsageError, match="secret"):
            WebhookChannel("https://example.com/hook", bad)
        with pytest.raises(so.UsageError, match="secret"):
            verify_webhook(bad, {}, b"{}")


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


@pytest.mark.parametrize("url", [123, None, b"http://example.com/hook"])
def test_a_url_that_is_not_text_is_a_usage_error(url: object) -> None:
    """Masking a password in the URL an error names must not fail on what is no text at all:
    it raised AttributeError ('int' object has no attribute 'partition') instead."""
    with pytest.raises(so.UsageError, match=r"must be http\(s\)://\.\.\., not"):
        WebhookChannel([url], SECRET)  # type: ignore[list-item]


@pytest.mark.parametrize(
    "url",
    [
        "http://hook:s3cr3t#pw@example.com/x",
        "http://hook:s3cr3t/pw@example.com/x",
        "http://hook:s3cr3t?pw@example.com/x",
    ],
)
def test_a_password_that_breaks_the_url_is_not_shown_in_the_error(url: str) -> None:
    """A password with `#`, `/` or `?` not percent-encoded ends the host part where the mask
    looked for it: the error showed the URL whole, and httpx's message ('Invalid port: ...')
    quoted the password's start."""
    with pytest.raises(so.UsageError, match="not a usable webhook URL") as refused:
        WebhookChannel(url, SECRET)
    assert "s3cr3t" not in str(refused.value) and "pw" not in str(refused.value)
    assert "hook:***@example.com/x" in str(refused.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # httpx reads `hook:123` as a host and port: no Basic auth, the rest a path, query or
        # fragment; a person meant the password `123/s3cr3t` (it was shown whole)
        ("http://hook:123/s3cr3t@example.com/x", "http://hook:***@example.com/x"),
        ("http://hook:12?s3cr3t@example.com/x", "http://hook:***@example.com/x"),
        ("http://hook:12#s3cr3t@example.com/x", "http://hook:***@example.com/x"),
        # httpx sends the password `p` to host `ss`; a person meant `p@ss/s3cr3t`
        ("http://hook:p@ss/s3cr3t@example.com/x", "http://hook:***@example.com/x"),
        # httpx reads the last `@` before the path: the password is `s3cr3t@example.com\`
        ("http://hook:s3cr3t@example.com\\@evil.example/x", "http://hook:***@evil.example/x"),
        ("HTTP://hook:s3cr3t@example.com/x", "HTTP://hook:***@example.com/x"),
        ("http://hook:s3%2Fcr3t@example.com/x", "http://hook:***@example.com/x"),
        ("http://:s3cr3t@example.com/x", "http://:***@example.com/x"),
        ("http://hook:s3cr3t@[::1]:8080/x", "http://hook:***@[::1]:8080/x"),
        # a password the user name holds: the user name is masked too
        ("http://hook:ook@example.com/x", "http://***@example.com/x"),
        # a token as the user name is sent as Basic auth too
        ("http://s3cr3t-token@example.com/x", "http://***@example.com/x"),
        # nothing secret: shown as given
        ("http://[::1]:8080/x@y", "http://[::1]:8080/x@y"),
        (
            "https://example.com/hook?to=ops@example.com",
            "https://example.com/hook?to=ops@example.com",
        ),
        ("http://example.com:8080/x", "http://example.com:8080/x"),
    ],
)
def test_a_password_is_masked_however_the_url_reads(url: str, shown: str) -> None:
    """A URL httpx takes but reads differently from its writer (`http://u:123/pw@host` is host
    `u`, port 123) was logged whole: all that httpx sends as Basic auth, and all before the
    last `@` a password may reach, is masked."""
    import httpx

    from signoff.channels.webhooks import _masked

    masked = _masked(url)
    assert masked == shown
    assert "s3cr3t" not in str(masked) and "s3%2F" not in str(masked) and ":ook" not in str(masked)
    parsed = httpx.URL(url)
    if parsed.password:  # what httpx sends is not in the userinfo shown
        assert parsed.password not in str(masked).partition("://")[2].rpartition("@")[0]
    if (
        url != shown
        and url.startswith("http://")
        and parsed.host
        and (parsed.port is None or 0 < parsed.port < 65536)
    ):
        with pytest.raises(so.UsageError, match="is given twice") as given_twice:
            WebhookChannel([url, url], SECRET)
        assert f"{shown!r} is given twice" in str(given_twice.value)


def test_an_unusable_url_with_a_password_still_says_what_is_wrong() -> None:
    """A password httpx reads as one is masked, and the parser's message about the rest (a bad
    port) is kept: it quotes nothing of the password."""
    with pytest.raises(so.UsageError, match="not a usable webhook URL") as refused:
        WebhookChannel("http://hook:s3cr3t@example.com:abc/x", SECRET)
    assert "'http://hook:***@example.com:abc/x' (Invalid port: 'abc')" in str(refused.value)
    assert "s3cr3t" not in str(refused.value)
