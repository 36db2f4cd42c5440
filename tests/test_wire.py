"""How the client reads a refusal's timing (`_wire.backoff`): it doubles up to 2 s, and follows a
server's `Retry-After` when it asks for longer, up to 30 s, so a proxy's absurd hint cannot
park a stream for hours; a hint that is no plain number is ignored."""

from __future__ import annotations

import pickle

import httpx
import pytest

import signoff as so
from signoff import _wire


def _refused(retry_after: str | None) -> httpx.Response:
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    return httpx.Response(503, headers=headers, request=httpx.Request("GET", "http://t/v1/x"))


@pytest.mark.parametrize(
    ("failures", "hint", "pause"),
    [
        (1, None, 0.2),
        (2, None, 0.4),
        (10, None, 2.0),
        (1, "5", 5.0),
        (1, "0", 0.2),
        (1, "3600", 30.0),
        (1, "99999999999", 0.2),  # more digits than any wait: no hint
        (1, "-5", 0.2),
        (1, "Wed, 21 Oct 2015 07:28:00 GMT", 0.2),
    ],
)
def test_the_pause_before_asking_again(failures: int, hint: str | None, pause: float) -> None:
    assert _wire.backoff(failures, _refused(hint)) == pytest.approx(pause)
    if hint is None:
        assert _wire.backoff(failures) == pytest.approx(pause)


def test_a_session_waiting_the_client_builds_says_the_store_did_not_name_unfinished() -> None:
    """`unfinished` was set only by `__init__`: the client's copy of a `session_waiting` error
    (and one pickled by an older signoff) had no such attribute, an AttributeError where the
    docs say None."""
    body = {"code": "session_waiting", "message": "waits", "request_ids": ["r"], "held_by": ["s"]}
    exc = _wire.error(body, 409)
    assert isinstance(exc, so.SessionWaiting)
    assert (exc.held_by, exc.unfinished) == (["s"], None)
    old = so.SessionWaiting("s", ["r"])
    del old.__dict__["unfinished"]  # as a signoff before `unfinished` pickled it
    again = pickle.loads(pickle.dumps(old))
    assert again.unfinished is None
