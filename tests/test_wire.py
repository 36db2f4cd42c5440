"""How the client reads a refusal's timing (`_wire.backoff`): it doubles up to 2 s, and follows a
server's `Retry-After` when it asks for longer, up to 30 s, so a proxy's absurd hint cannot
park a stream for hours; a hint that is no plain number is ignored."""

from __future__ import annotations

import httpx
import pytest

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
