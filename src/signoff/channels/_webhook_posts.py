"""One attempt of a `WebhookChannel` delivery: a POST bounded as a whole by the channel's
`timeout`, of which only the status (and a `Retry-After`, a redirect's `Location`) is read."""

from __future__ import annotations

import asyncio
import email.utils
from typing import TYPE_CHECKING

from ._webhook_urls import httpx_module, without_login

if TYPE_CHECKING:
    import httpx

__all__ = ["post_once", "retry_after"]


async def post_once(
    client: httpx.AsyncClient,
    url: str,
    raw: bytes,
    headers: dict[str, str],
    timeout: float,
    now: float,
) -> tuple[int, float | None, str | None]:
    """One POST's status, the seconds its `Retry-After` asks to wait (as of `now`) and a
    redirect's `Location` (never followed). The whole attempt is bounded by `timeout` (httpx
    bounds each read only) and the receiver's body is never read, so a trickling or endless
    answer costs neither time nor memory."""
    target, login = without_login(url)
    # Sent as Basic auth, as httpx does with a URL's own (a client's auth comes first), but
    # never in the URL: httpx logs that at INFO, password and all.
    auth = login if login is not None and client.auth is None else httpx_module().USE_CLIENT_DEFAULT
    async with (
        asyncio.timeout(timeout),
        # Never followed, also by a client the caller made to: the body goes only to `url`.
        client.stream(
            "POST", target, content=raw, headers=headers, auth=auth, follow_redirects=False
        ) as response,
    ):
        status = response.status_code
        if 200 <= status < 300:  # a wait asked for by a delivered answer is nothing to read
            return status, None, None
        moved = response.headers.get("location") if 300 <= status < 400 else None
        return status, retry_after(response.headers, now), moved


def retry_after(headers: httpx.Headers, now: float) -> float | None:
    """The seconds a `Retry-After` header asks to wait (a number of seconds or an HTTP date);
    None without one or with one that is neither."""
    value = headers.get("retry-after", "").strip()
    if value.isascii() and value.isdigit() and len(value) <= 9:
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):  # Overflow: a year or offset
        return None  # past a C integer, e.g. a receiver's "+99999999999999999999"
    if when.tzinfo is None:  # an HTTP date is GMT
        return None
    return max(0.0, when.timestamp() - now)
