"""Whether a store call is made for someone waiting on its answer (an HTTP request): such a
call waits only briefly for a busy store and then fails with `StoreBusy`, so the client hears at
once that the server is overloaded instead of after the store's whole timeout, and requests do
not pile up waiting. Workers, sweeps and background work keep the store's longer wait."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["REQUEST_WAIT", "is_prompt", "promptly", "wrote"]

REQUEST_WAIT = 3.0
"""Seconds a call made for an HTTP request waits for a busy store (PostgreSQL's default
`?request_pool_timeout=`, SQLite's wait for its file's lock): a store busy for longer than that
is overloaded, and the client is better told so (`StoreBusy`) than kept waiting."""

_PROMPT: ContextVar[bool] = ContextVar("signoff_store_prompt", default=False)


@contextmanager
def promptly(prompt: bool = True) -> Iterator[None]:
    """Store calls made inside (and in tasks started inside) wait for a busy store only briefly
    (PostgreSQL's `?request_pool_timeout=`, `REQUEST_WAIT` for SQLite); with `prompt=False`, as
    long as the store allows. The server wraps every HTTP request in it."""
    token = _PROMPT.set(prompt)
    try:
        yield
    finally:
        _PROMPT.reset(token)


def is_prompt() -> bool:
    """Whether store calls made here are to wait only briefly for a busy store."""
    return _PROMPT.get()


def wrote() -> None:
    """A store call has written: what its request does next waits as long as workers do, so a
    request that recorded something (an answer) is not failed half done (its turn not driven)
    behind a 503 that says to try again."""
    if _PROMPT.get():
        _PROMPT.set(False)
