"""Guessing tokens is bounded: failed sign-ins and unrecognised bearer tokens are counted per
client address and over all of them, and an address past the bound is refused (429
`too_many_failures`, `Retry-After`) whatever token it sends, while others are served."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.testclient import TestClient

from signoff.server._auth import TOKEN_COOKIE
from signoff.server._pages import csrf_key
from signoff.server._sign_ins import issue
from signoff.server._throttle import PER_CLIENT, WINDOW, Failures, client_of

from .test_server_common import auth
from .test_sign_ins import HTTP, JSON, _csrf, dashboard


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_client_is_held_after_its_failures_until_its_window_ends() -> None:
    clock = Clock()
    failures = Failures(clock, per_client=3, overall=1000, window=60)
    for _ in range(3):
        assert failures.retry_after("a") is None
        failures.failed("a")
        clock.now += 10
    assert failures.retry_after("a") == 30  # the window began at the first failure
    assert failures.retry_after("b") is None  # another address is served
    clock.now += 29.5
    assert failures.retry_after("a") == 1
    clock.now += 0.5
    assert failures.retry_after("a") is None  # a new window: three guesses again
    failures.failed("a")
    assert failures.retry_after("a") is None


def test_past_the_overall_bound_every_client_that_failed_is_held() -> None:
    """A guesser spread over many addresses gets one guess each once all of them together
    failed `overall` times; an address that never failed is still served."""
    clock = Clock()
    failures = Failures(clock, per_client=10, overall=5, window=60)
    for n in range(4):
        failures.failed(f"10.0.0.{n}")
    assert failures.retry_after("10.0.0.0") is None
    clock.now += 20
    failures.failed("10.0.0.9")
    for n in (0, 1, 2, 3, 9):
        assert failures.retry_after(f"10.0.0.{n}") == 40, n  # until the overall window ends
    assert failures.retry_after("10.0.0.7") is None
    clock.now += 40
    assert failures.retry_after("10.0.0.9") is None


def test_a_clock_set_back_holds_no_one_past_a_window() -> None:
    """The runtime's clock is a wall clock: stepped back an hour, it held a client that failed
    (and kept the overall count growing) for that hour plus the window. Set back by less than
    a window it keeps the window; by more, the window is over."""
    clock = Clock()
    failures = Failures(clock, per_client=2, overall=3, window=60)
    failures.failed("a")
    failures.failed("a")
    clock.now -= 30
    assert failures.retry_after("a") == 60  # a small step back keeps the hold (capped hint)
    clock.now -= 3600
    assert failures.retry_after("a") is None
    failures.failed("a")
    failures.failed("b")
    assert failures.retry_after("a") is None  # a fresh window: one failure so far
    assert failures.retry_after("b") is None  # the overall count restarted with it
    failures.failed("a")
    assert failures.retry_after("a") == 60


def test_the_clients_remembered_are_bounded() -> None:
    clock = Clock()
    failures = Failures(clock, per_client=1, overall=10**9, window=60, max_clients=100)
    for n in range(1000):
        failures.failed(f"c{n}")
        clock.now += 0.01
    assert len(failures._clients) == 100
    assert failures.retry_after("c999") is not None and failures.retry_after("c0") is None
    clock.now += 61  # every window lapsed: they make room first, the newest client is kept
    failures.failed("new")
    assert len(failures._clients) == 1 and failures.retry_after("new") is not None


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("203.0.113.9", "203.0.113.9"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::7", "2001:db8:1:2::/64"),  # one host's /64 is one client
        ("::ffff:203.0.113.9", "203.0.113.9"),
        ("testclient", "testclient"),
        # as a proxy may forward it (uvicorn before 0.30 hands it on as is): the port is no
        # part of the client, else each connection would be a client of its own
        ("203.0.113.9:51234", "203.0.113.9"),
        ("[2001:db8:1:2:aaaa::1]:443", "2001:db8:1:2::/64"),
        ("[2001:db8:1:2:bbbb::7]", "2001:db8:1:2::/64"),
        ("[::ffff:203.0.113.9]:80", "203.0.113.9"),
        ("host.example:80", "host.example:80"),  # no address: counted as it is
        ("[2001:db8::1]:x", "[2001:db8::1]:x"),
    ],
)
def test_clients_are_counted_by_address(host: str, key: str) -> None:
    assert client_of(SimpleNamespace(client=SimpleNamespace(host=host))) == key  # type: ignore[arg-type]
    assert client_of(SimpleNamespace(client=None)) == ""  # type: ignore[arg-type]


def _form_sign_in(c: TestClient, token: str) -> Any:
    page = c.get("/_signoff/login")
    return c.post(
        "/_signoff/login", data={"token": token, "csrf": _csrf(page.text)}, follow_redirects=False
    )


def test_guessing_by_form_and_by_bearer_token_is_bounded_per_address(tmp_path: Path) -> None:
    """Nothing bounded the guesses: the sign-in form and a bearer token answered every wrong
    token at once. Now both count for the address, and past the bound it is refused (429,
    `Retry-After`), the right token too; other addresses, and a browser already signed in from
    the held address, are served as ever, and the bound lapses with its window."""
    clock = Clock()
    with (
        dashboard(f"sqlite:///{tmp_path}/s.db", clock=clock) as app,
        TestClient(app, base_url=HTTP, client=("198.51.100.7", 4000)) as c,
        TestClient(app, base_url=HTTP, client=("198.51.100.8", 4000)) as other,
    ):
        signed_in = _form_sign_in(c, "alice-token")
        assert signed_in.status_code == 303
        for n in range(PER_CLIENT):
            if n % 2:
                r = _form_sign_in(c, f"guess-{n}")
                assert r.status_code == 401 and "not recognised" in r.text
            else:
                r = c.get("/v1/requests", headers=auth(f"guess-{n}"))
                assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"
        clock.now += 5
        for token in ("guess-x", "alice-token"):  # refused before it is compared
            r = c.get("/v1/requests", headers=auth(token))
            assert r.status_code == 429, r.text
            assert r.json()["error"]["code"] == "too_many_failures"
            assert r.headers["retry-after"] == str(int(WINDOW) - 5)
            r = _form_sign_in(c, token)
            assert r.status_code == 429 and "Too many failed sign-ins" in r.text
            assert r.headers["retry-after"] == str(int(WINDOW) - 5)
            assert "set-cookie" not in r.headers or "signoff_token=" not in r.headers["set-cookie"]
        page = c.post(
            "/_signoff/login",
            data={"token": "alice-token", "csrf": _csrf(c.get("/_signoff/login").text)},
            headers=JSON,
        )
        assert page.status_code == 429 and page.json()["error"]["code"] == "too_many_failures"
        r = c.get("/_signoff/", headers={"Authorization": "Bearer guess-y"})
        assert r.status_code == 429 and r.headers["retry-after"]  # the dashboard's page says so
        # the browser signed in before still works: a cookie is no guess
        assert c.get("/v1/requests").status_code == 200
        assert other.get("/v1/requests", headers=auth("alice-token")).status_code == 200
        assert _form_sign_in(other, "alice-token").status_code == 303
        clock.now += WINDOW
        assert c.get("/v1/requests", headers=auth("alice-token")).status_code == 200
        assert _form_sign_in(c, "alice-token").status_code == 303


def test_failures_after_a_window_lapsed_count_in_a_new_one() -> None:
    """A failure counted after the client's window lapsed (the check before it came just in
    time) starts a new window: the client is held once it fails `per_client` times in it."""
    clock = Clock()
    failures = Failures(clock, per_client=3, overall=1000, window=60)
    failures.failed("a")
    failures.failed("a")
    clock.now += 60
    for _ in range(3):
        failures.failed("a")
    assert failures.retry_after("a") == 60


def test_guessing_by_forged_sign_in_cookies_is_bounded_without_a_secret(tmp_path: Path) -> None:
    """Without a secret the cookie's key is public: anyone could make a sign-in cookie for a
    token they guess, and the server answered each at once, unbounded (the bound counted only
    forms and bearer tokens). Now a refused cookie counts as a guess, and past the bound a
    cookie this process never honoured is refused (429) whether its guess is right or wrong;
    the browser signed in before from that address is served as ever."""
    clock = Clock()
    key = csrf_key(None)
    with (
        dashboard(f"sqlite:///{tmp_path}/s.db", clock=clock) as app,
        TestClient(app, base_url=HTTP, client=("198.51.100.7", 4000)) as c,
        TestClient(app, base_url=HTTP, client=("198.51.100.7", 4001)) as guesser,
    ):
        assert _form_sign_in(c, "alice-token").status_code == 303
        assert c.get("/v1/requests").status_code == 200
        for n in range(PER_CLIENT):
            guesser.cookies.set(TOKEN_COOKIE, issue(key, f"guess-{n}", clock()))
            assert guesser.get("/v1/requests").status_code == 401
        for token in ("guess-x", "bob-token"):  # refused before it is compared
            guesser.cookies.set(TOKEN_COOKIE, issue(key, token, clock()))
            r = guesser.get("/v1/requests")
            assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_failures"
            assert guesser.get("/_signoff/", follow_redirects=False).status_code == 429
        assert c.get("/v1/requests").status_code == 200  # honoured before: no guess
        clock.now += WINDOW
        assert guesser.get("/v1/requests").status_code == 200  # the bound lapsed


def test_a_refused_sign_in_cookie_is_no_guess_with_a_secret(tmp_path: Path) -> None:
    """With a secret no one can make a cookie without it: one refused (e.g. made before the
    secret changed) counts for nothing, so a browser holding it is never held."""
    with (
        dashboard(f"sqlite:///{tmp_path}/s.db", secret="s3cret") as app,
        TestClient(app, base_url=HTTP) as c,
    ):
        c.cookies.set(TOKEN_COOKIE, issue(csrf_key("another"), "alice-token", time.time()))
        for _ in range(3 * PER_CLIENT):
            assert c.get("/v1/requests").status_code == 401
        assert c.get("/v1/requests", headers=auth("alice-token")).status_code == 200


def test_addresses_forgotten_in_a_flood_are_held_not_new_again() -> None:
    """More addresses failing in one window than are remembered made each forgotten one new
    again: cycling through three times as many addresses, every attempt was a guess, so the
    bound held nothing. Now an address forgotten while its window ran is held as failed in it
    until the overall window ends: each address guesses once, and one that never failed is
    served as ever."""
    clock = Clock()
    failures = Failures(
        clock, per_client=10, overall=50, window=60, max_clients=100, salt=b"fixed: repeatable"
    )
    guesses = 0
    for _ in range(5):
        for n in range(300):
            if failures.retry_after(f"a{n}") is None:
                guesses += 1
                failures.failed(f"a{n}")
            clock.now += 0.01
    assert guesses == 300
    assert failures.retry_after("a0") == 45 and failures.retry_after("someone-new") is None
    clock.now += 45  # the overall window ended: the forgotten may try again
    assert failures.retry_after("a0") is None


def test_the_forgotten_address_filter_holds_few_that_never_failed() -> None:
    """The filter of forgotten addresses set three bits from `hash((n, address))`, and those
    three all followed one 20-bit value: at 65,536 forgotten, 1 address in 25 that never failed
    was held (and 1 in 5,000 at 200, which made the flood test above flaky). Three independent
    positions hold 1 in 176, as the filter's comment says."""
    clock = Clock()
    failures = Failures(
        clock, per_client=10, overall=50, window=60, max_clients=100, salt=b"fixed: repeatable"
    )
    for n in range(65_536 + 100):
        failures.failed(f"forgotten-{n}")
    held = sum(failures.retry_after(f"never-failed-{n}") is not None for n in range(20_000))
    assert held < 20_000 / 150, held
    assert failures.retry_after("forgotten-0") is not None  # no false negatives


def test_each_server_keys_its_forgotten_address_filter_at_random() -> None:
    """No one can pick addresses that collide in the filter: its key is random per server."""
    clock = Clock()
    assert Failures(clock).salt != Failures(clock).salt
    assert len(Failures(clock).salt) == 16


@pytest.mark.parametrize("secret", [None, "s3cret"], ids=["keyless", "with a secret"])
def test_a_browser_signed_in_through_another_process_and_a_held_address(
    tmp_path: Path, secret: str | None
) -> None:
    """Without a secret, a process cannot tell a cookie another process made from one forged
    for a guessed token, so an address held for its guesses in this process is refused (429)
    a sign-in it has not seen yet, until the window ends (as documented); with a secret (the
    same in every process) no cookie is a guess, and the browser is served as ever."""
    clock = Clock()
    store = f"sqlite:///{tmp_path}/s.db"
    address = ("198.51.100.7", 4000)
    with (
        dashboard(store, clock=clock, secret=secret) as one,
        dashboard(store, clock=clock, secret=secret) as two,
        TestClient(one, base_url=HTTP, client=address) as a,
        TestClient(two, base_url=HTTP, client=address) as b,
    ):
        assert _form_sign_in(a, "alice-token").status_code == 303
        cookie = a.cookies.get(TOKEN_COOKIE)
        assert cookie is not None
        for n in range(PER_CLIENT):  # someone behind the same address guesses at the other
            assert b.get("/v1/requests", headers=auth(f"guess-{n}")).status_code == 401
        assert a.get("/v1/requests").status_code == 200  # where it signed in: served
        b.cookies.set(TOKEN_COOKIE, cookie)
        r = b.get("/v1/requests")
        if secret is None:
            assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_failures"
            assert 0 < int(r.headers["retry-after"]) <= WINDOW
            clock.now += WINDOW
            assert b.get("/v1/requests").status_code == 200
        else:
            assert r.status_code == 200
