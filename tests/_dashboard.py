"""The dashboard tests' served app and browser-like client: a signed-in session, its cookie, the
CSRF token of a page, and a session started to look at.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from .test_server_common import PLAIN, auth, served

__all__ = ["PLAIN", "base", "cookie_of", "csrf_of", "signed_in", "start"]


@pytest.fixture
def base(tmp_path: Path) -> Iterator[str]:
    with served(f"sqlite:///{tmp_path}/state.db") as url:
        yield url


@contextmanager
def signed_in(base: str, token: str = "alice-token") -> Iterator[httpx.Client]:
    """A browser-like client: cookies, the login form, the CSRF token from the page. Its
    timeout is no claim about speed: a CI run beside other work once took over 10 s here."""
    with httpx.Client(base_url=base, timeout=30, verify=PLAIN) as c:
        page = c.get("/_signoff/login")
        r = c.post("/_signoff/login", data={"token": token, "csrf": csrf_of(page.text)})
        assert r.status_code == 303 and r.headers["location"] == "/_signoff"
        yield c


def cookie_of(base: str, token: str = "alice-token") -> dict[str, str]:
    """The sign-in cookie a browser gets for `token` from the login form (a new sign-in)."""
    with signed_in(base, token) as c:
        return {"signoff_token": c.cookies["signoff_token"]}


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf-token" content="([^"]+)"', html)
    assert match, "no CSRF token in the page"
    return match.group(1)


def start(base: str, agent: str = "support", message: str = "Refund 1042") -> dict[str, Any]:
    r = httpx.post(
        f"{base}/v1/sessions",
        json={"agent": agent, "message": message},
        headers=auth("alice-token"),
        timeout=10,
        verify=PLAIN,
    )
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body
