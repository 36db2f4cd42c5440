"""One attempt of a `WebhookChannel` delivery: a POST bounded as a whole by the channel's
`timeout`, of which only the status (and a `Retry-After`, a redirect's `Location`) is read."""

from __future__ import annotations

import asyncio
import email.utils
import functools
from typing import TYPE_CHECKING

from ._webhook_urls import httpx_module, masked, without_login

if TYPE_CHECKING:
    import httpx

__all__ = ["post_once", "retry_after", "shown_masked"]


async def post_once(
    client: httpx.AsyncClient,
    url: str,
    raw: bytes,
    headers: dict[str, str],
    timeout: float,
    now: float,
    *,
    own: bool = False,
) -> tuple[int, float | None, str | None]:
    """One POST's status, the seconds its `Retry-After` asks to wait (as of `now`) and a
    redirect's `Location` (never followed). The whole attempt is bounded by `timeout` (httpx
    bounds each read only) and the receiver's body is never read, so a trickling or endless
    answer costs neither time nor memory. On the channel's `own` client, httpx's INFO line of
    the request shows the URL masked (`shown_masked`)."""
    httpx = httpx_module()
    target, login = without_login(url)
    # Sent as Basic auth, as httpx does with a URL's own (a client's auth comes first), but
    # never in the URL: httpx logs that at INFO, password and all.
    auth = login if login is not None and client.auth is None else httpx.USE_CLIENT_DEFAULT
    request = client.build_request("POST", target, content=raw, headers=headers)
    if own and masked(str(request.url)) != str(request.url):
        request.url = shown_masked(request.url)
    async with asyncio.timeout(timeout):
        # Never followed, also by a client the caller made to: the body goes only to `url`.
        response = await client.send(request, stream=True, auth=auth, follow_redirects=False)
        try:
            status = response.status_code
            if 200 <= status < 300:  # a wait asked for by a delivered answer is nothing to read
                return status, None, None
            moved = response.headers.get("location") if 300 <= status < 400 else None
            return status, retry_after(response.headers, now), moved
        finally:
            await response.aclose()


def shown_masked(url: httpx.URL) -> httpx.URL:
    """`url` as an `httpx.URL` that is sent as it is (httpx's transport reads its raw parts)
    but shows masked (`str`, `repr`), as httpx's INFO line of each request prints it: a token
    in the query stays out of the application's logs. Only for the channel's own client: one
    of the caller's may sign or log the URL in hooks of its own."""
    return _masked_url_class()(url)


@functools.cache
def _masked_url_class() -> type[httpx.URL]:
    import httpx  # present: the channel checked it when it was made

    class MaskedURL(httpx.URL):
        def __str__(self) -> str:
            return str(masked(super().__str__()))

        def __repr__(self) -> str:
            return f"URL({str(self)!r})"

    return MaskedURL


def retry_after(headers: httpx.Headers, now: float) -> float | None:
    """The seconds a `Retry-After` header asks to wait (a number of seconds or an HTTP date);
    None without one or with one that is neither."""
    value = headers.get("retry-after", "").strip()
    if value.isascii() and value.isdigit():
        # Seconds (leading zeros and all), at most 31 years: every wait is capped below that.
        return min(float(value), 1e9)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):  # Overflow: a year or offset
        return None  # past a C integer, e.g. a receiver's "+99999999999999999999"
    if when.tzinfo is None:  # an HTTP date is GMT
        return None
    return max(0.0, when.timestamp() - now)
