"""`WebhookChannel`: a signed JSON POST to your URLs when a request opens, is escalated, closes
or nears expiry.

Each delivery carries `Signoff-Timestamp` (Unix seconds) and `Signoff-Signature`
(`v1=` + hex HMAC-SHA256 of `{timestamp}.{body}` with the shared secret); receivers check both
with `verify_webhook`. To rotate the secret, give the channel the new and the old one: it signs
with each (comma-separated), so receivers still on the old secret accept every delivery.
Failed deliveries (network errors, 408, 429 and 5xx) are retried with exponential backoff, or
after the receiver's `Retry-After` when it asks for longer (both at most `max_backoff`);
`Signoff-Delivery` (and the payload's `id`) stays the same across retries and restarts so receivers
can dedupe: a delivery can arrive twice, and `verify_webhook` accepts a replay within its window.
Deliveries wait in a queue per URL (so a slow receiver holds up no other channel) and are kept in
the hub's state until sent: one given up on after `max_attempts` (logged as an error), or still
unsent when the process stops, is sent again when the hub next starts on the same state (with an
in-memory state, it is lost). A 4xx refusal is final.

Each attempt is bounded by `timeout` as a whole and only the response's status is read, never
its body. Redirects are not followed (a 3xx is a refusal: the signed body goes only where it was
configured to). URLs are the operator's own configuration, so loopback and private addresses are
allowed (e.g. a receiver on the same host); never build them from untrusted input. A password
in one (Basic auth) is masked in logs and errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import hashlib
import hmac
import json
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import __version__
from .._exceptions import UsageError
from .._settings import seconds, whole
from .._types import InputRequest
from ._base import Channel, Escalation, InvalidSignature, Resolution, logger, off_loop

if TYPE_CHECKING:
    import httpx

__all__ = ["WebhookChannel", "sign_webhook", "verify_webhook"]

TIMESTAMP_HEADER = "Signoff-Timestamp"
SIGNATURE_HEADER = "Signoff-Signature"
EVENT_HEADER = "Signoff-Event"
DELIVERY_HEADER = "Signoff-Delivery"

_RETRY_STATUSES = frozenset({408, 425, 429})
_OUTBOX = "outbox:"  # memo key prefix of a delivery not yet sent: "outbox:{url} {delivery}"
_BACKFILLED = "backfilled"  # memo: the open requests were announced on a first start


def sign_webhook(secret: str, timestamp: int, body: bytes) -> str:
    """The `Signoff-Signature` value for `body` sent at `timestamp`."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def verify_webhook(
    secret: str | Sequence[str],
    headers: Mapping[str, str],
    body: bytes | str,
    *,
    tolerance: float = 300,
    now: float | None = None,
) -> dict[str, Any]:
    """Check a delivery's signature and age; returns the parsed JSON payload.

    `secret` may be several (while rotating): a signature by any of them is accepted.
    Raises `InvalidSignature` when a header is missing, the timestamp is more than `tolerance`
    seconds away from `now`, no `v1=` signature (comma-separated, for secret rotation)
    matches (the comparison is constant-time), or the unsigned `Signoff-Delivery` or
    `Signoff-Event` header, when present, differs from the signed body's `id` or `type`.

        payload = verify_webhook(SECRET, request.headers, await request.body())
    """
    secrets = _secrets(secret, "verify_webhook()")
    if not tolerance >= 0:  # NaN compares false with every age: it would let any replay in
        raise UsageError(f"tolerance must be a number of seconds >= 0, not {tolerance!r}")
    if now is not None and not math.isfinite(now):
        raise UsageError(f"now must be a finite Unix time, not {now!r}")
    try:
        raw = body.encode() if isinstance(body, str) else bytes(body)
    except UnicodeEncodeError:  # text decoded from invalid UTF-8: the bytes signed are gone
        raise InvalidSignature("the body is not valid UTF-8 text: pass the raw bytes") from None
    lowered = {k.lower(): v for k, v in headers.items()}
    stamp = lowered.get(TIMESTAMP_HEADER.lower())
    given = lowered.get(SIGNATURE_HEADER.lower())
    if not stamp or not given:
        raise InvalidSignature(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER} header")
    try:
        if not (stamp.isascii() and stamp.isdigit()):  # int() also reads "1_7", other digits
            raise ValueError(stamp)
        timestamp = int(stamp)  # a ValueError past 4300 digits too
    except ValueError:
        shown = stamp[:40]
        raise InvalidSignature(f"{TIMESTAMP_HEADER} is not a Unix timestamp: {shown!r}") from None
    current = time.time() if now is None else now
    try:
        age = current - timestamp
    except OverflowError:  # an integer too large for a float: no real clock is there
        raise InvalidSignature(f"{TIMESTAMP_HEADER} is more than {tolerance:g}s off") from None
    if abs(age) > tolerance:
        raise InvalidSignature(f"the delivery is {int(age)}s old; more than {tolerance:g}s off")
    expected = [sign_webhook(s, timestamp, raw).encode() for s in secrets]
    candidates = [s.strip() for s in given.split(",") if s.strip().startswith("v1=")]
    # As bytes: compare_digest refuses str with non-ASCII characters (a TypeError, not a no).
    if not any(hmac.compare_digest(e, _utf8(c)) for e in expected for c in candidates):
        raise InvalidSignature("the signature does not match the body and timestamp")
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json can read
        raise InvalidSignature("the signed body is not JSON") from None
    if not isinstance(payload, dict):
        raise InvalidSignature("the signed body is not a JSON object")
    # Headers are not signed: a receiver deduping on Signoff-Delivery must not be told a replay
    # is another delivery.
    for header, key in ((DELIVERY_HEADER, "id"), (EVENT_HEADER, "type")):
        claimed = lowered.get(header.lower())
        if claimed is not None and claimed != payload.get(key):
            raise InvalidSignature(f"the {header} header does not match the signed body's {key}")
    return payload


def _secrets(secret: str | Sequence[str], who: str) -> list[str]:
    """The signing secrets as a list: one, or several while rotating, none of them empty."""
    if isinstance(secret, str):
        secrets = [secret]
    elif isinstance(secret, Iterable) and not isinstance(secret, bytes | bytearray | Mapping):
        secrets = list(secret)
    else:  # named by its type only: the value is a secret
        raise UsageError(
            f"{who}: secret must be a non-empty string, or a list of them while rotating, "
            f"not {type(secret).__name__}"
        )
    if not secrets or not all(isinstance(s, str) and s for s in secrets):
        raise UsageError(f"{who} needs the shared secret: a non-empty string, or several")
    for s in secrets:
        try:
            s.encode()
        except UnicodeEncodeError:  # e.g. from an environment holding invalid UTF-8
            raise UsageError(f"{who}: a secret is not valid Unicode (a lone surrogate)") from None
    return secrets


def _utf8(text: str) -> bytes:
    """`text` as UTF-8, unpaired surrogates kept as they are (they then match nothing)."""
    return text.encode("utf-8", "surrogatepass")


def _json_bytes(body: Mapping[str, Any]) -> bytes:
    """The delivery body as UTF-8 JSON; text with unpaired surrogates (which UTF-8 cannot hold)
    is written with `\\u` escapes instead, so such a request is delivered rather than failing."""
    try:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(body, separators=(",", ":")).encode()


class WebhookChannel(Channel):
    """Posts `request.opened`, `request.escalated`, `request.resolved` and `request.expiring` to
    every URL.

    `secret` signs each delivery; several (the new one and the old, while rotating) each sign.

    `expiring_within`: warn this many seconds before a request's `expires_at`. Retries:
    `max_attempts` in all, waiting `backoff * 2**n` seconds, or the receiver's `Retry-After` if
    longer, between them (at most `max_backoff`).

    A new channel starts from now, as the hub does: requests opened before it first started
    are not announced. `backfill=True` sends `request.opened` for each of those still open (as
    stored then, oldest first) on the first start with it on the hub's state, once.
    """

    name = "webhooks"
    live_only = False  # receivers hear of every request, also ones that closed at once

    def __init__(
        self,
        urls: str | Sequence[str],
        secret: str | Sequence[str],
        *,
        name: str | None = None,
        accepts: Callable[[InputRequest], bool] | None = None,
        expiring_within: float = 300.0,
        max_attempts: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 60.0,
        timeout: float = 10.0,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        backfill: bool = False,
    ) -> None:
        super().__init__(name=name, accepts=accepts)
        if not isinstance(backfill, bool):
            raise UsageError(f"backfill must be True or False, not {backfill!r}")
        httpx = _httpx()  # fail at configuration time, with the install hint
        url_list = [urls] if isinstance(urls, str) else list(urls)
        if not url_list:
            raise UsageError("WebhookChannel needs at least one URL")
        for url in url_list:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise UsageError(f"a webhook URL must be http(s)://..., not {_masked(url)!r}")
            try:
                parsed = httpx.URL(url)
                host, port = parsed.host, parsed.port  # .host decodes IDNA
            except (httpx.InvalidURL, UnicodeError) as exc:  # UnicodeError: a bad IDNA host
                raise UsageError(f"not a usable webhook URL: {_unusable(url, exc)}") from None
            if not host:
                raise UsageError(f"the webhook URL {_masked(url)!r} names no host")
            if port is not None and not 0 < port < 65536:  # else each send raises
                raise UsageError(f"the webhook URL {_masked(url)!r} names no usable port")
            if url_list.count(url) > 1:  # one queue per URL: twice would deliver twice
                raise UsageError(f"the webhook URL {_masked(url)!r} is given twice")
        secrets = _secrets(secret, "WebhookChannel")
        whole("max_attempts", max_attempts, least=1)  # 2.5 would fail each delivery
        seconds("timeout", timeout)  # 0 would fail every attempt at once
        # A NaN or infinite max_backoff would sleep forever between attempts.
        seconds("backoff", backoff, zero=True)
        seconds("max_backoff", max_backoff, zero=True)
        seconds("expiring_within", expiring_within, zero=True)
        self.urls = url_list
        self.secrets = secrets
        self.secret = secrets[0]
        self.expiring_within = expiring_within
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.timeout = timeout
        self.clock = clock
        self._sleep = sleep
        self._client = client
        self._own_client = client is None
        self._queues: dict[str, asyncio.Queue[tuple[str, str, bytes]]] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._deadlines: dict[str, InputRequest] = {}
        self._sending: set[str] = set()  # deliveries being sent now
        self._queued: set[str] = set()  # "url delivery" queued or being sent: never twice at once
        # "url delivery" kept by an earlier run and queued again by `start`: the hub, reading
        # the entry again (its position was not saved past it), must not send it once more.
        self._restored: set[str] = set()
        self.backfill = backfill
        self._backfilled: set[str] = set()  # request ids whose opening `start` sent
        self.delivered = 0
        self.failed = 0

    # -- what the hub tells it ----------------------------------------------------------------

    async def start(self, open_requests: Sequence[InputRequest]) -> None:
        self._ensure_workers()
        for url, delivery, kept in await off_loop(self._unsent):
            self._restored.add(f"{url} {delivery}")
            if f"{url} {delivery}" not in self._queued:
                self._queued.add(f"{url} {delivery}")
                self._queues[url].put_nowait((delivery, kept["event"], kept["body"].encode()))
        for r in open_requests:
            if r.expires_at is not None:
                self._deadlines[r.id] = r
        if self.backfill and not await off_loop(self.recall, _BACKFILLED):
            for r in sorted(open_requests, key=lambda r: (r.created_at, r.index or 0)):
                await self.enqueue("request.opened", r)  # kept before the memo says it was
                self._backfilled.add(r.id)
            await off_loop(self.remember, _BACKFILLED, True)

    def _unsent(self) -> list[tuple[str, str, dict[str, Any]]]:
        """The deliveries an earlier run kept and did not send (`url`, `delivery`, the memo);
        those of a URL no longer configured are dropped."""
        unsent = []
        for key, kept in self.memos(_OUTBOX):
            url, _, delivery = key.removeprefix(_OUTBOX).rpartition(" ")  # a URL may hold " "
            if url not in self.urls:
                logger.warning(
                    "webhook %s is no longer configured; dropping %s", _masked(url), delivery
                )
                self.forget(key)
            else:
                unsent.append((url, delivery, kept))
        return unsent

    async def on_requested(self, request: InputRequest) -> None:
        if request.expires_at is not None:
            self._deadlines[request.id] = request
        if request.id in self._backfilled:  # opened as the hub began: `start` sent it
            self._backfilled.discard(request.id)
            return
        await self.enqueue("request.opened", request)

    async def on_escalated(self, request: InputRequest, escalation: Escalation) -> None:
        self._deadlines.pop(request.id, None)  # the deadline is lifted: nothing to warn of
        await self.enqueue("request.escalated", request, escalation=escalation)

    async def on_resolved(self, request: InputRequest, resolution: Resolution) -> None:
        self._deadlines.pop(request.id, None)
        self._backfilled.discard(request.id)
        # a closed request is never warned about again
        await off_loop(self.forget, f"warned:{request.id}")
        await self.enqueue("request.resolved", request, resolution)

    async def tick(self, now: float) -> None:
        for rid, r in list(self._deadlines.items()):
            assert r.expires_at is not None
            if now < r.expires_at - self.expiring_within:
                continue
            if (
                now < r.expires_at
                and await self._still_expiring(r)
                and not await off_loop(self.recall, f"warned:{rid}")
            ):
                # Queued (and kept) before it counts as warned: a state that fails in between
                # leaves it for the next tick instead of losing it.
                await self.enqueue("request.expiring", r)
                await off_loop(self.remember, f"warned:{rid}", True)
            self._deadlines.pop(rid, None)

    async def _still_expiring(self, request: InputRequest) -> bool:
        """Whether `request` is open with the deadline it was shown with, as stored now. An
        opening delivered late (one the hub gave up on, delivered again at its next start) can
        come after the request's close: it is not warned about, and no memo is left behind
        that its close (already delivered) would have dropped."""
        if self._runtime is None:
            return True
        stored = await self._runtime.store.get_request(request.id)
        return (
            stored is not None
            and stored.status == "pending"
            and stored.request.expires_at == request.expires_at
        )

    # -- delivery -----------------------------------------------------------------------------

    def payload(
        self,
        event: str,
        request: InputRequest,
        resolution: Resolution | None = None,
        *,
        escalation: Escalation | None = None,
    ) -> dict[str, Any]:
        """The JSON body of a delivery; `id` is stable for the same event of the same request
        (a request is escalated at most once, so that event has one id too)."""
        digest = hashlib.sha256(f"{event}:{request.id}".encode()).hexdigest()[:24]
        return {
            "id": f"whd_{digest}",
            "type": event,
            "at": self.clock(),
            "request": request.model_dump(mode="json"),
            "resolution": None if resolution is None else resolution.to_dict(),
            "escalation": None if escalation is None else escalation.to_dict(),
        }

    async def enqueue(
        self,
        event: str,
        request: InputRequest,
        resolution: Resolution | None = None,
        *,
        escalation: Escalation | None = None,
    ) -> None:
        """Queue one event for every URL (each URL gets them in order), kept in the hub's state
        first: a failure to keep it queues it nowhere."""
        body = self.payload(event, request, resolution, escalation=escalation)
        raw = _json_bytes(body)
        self._ensure_workers()
        urls = [
            url
            for url in self.urls
            if f"{url} {body['id']}" not in self._queued
            and f"{url} {body['id']}" not in self._restored
        ]
        if not urls:
            return  # an entry the hub read again while its delivery waits or was restored
        if self._state is not None:
            kept = {"event": event, "body": raw.decode()}
            await off_loop(self._keep, [f"{_OUTBOX}{url} {body['id']}" for url in urls], kept)
        for url in urls:
            if f"{url} {body['id']}" not in self._queued:  # not queued while it was kept
                self._queued.add(f"{url} {body['id']}")
                self._queues[url].put_nowait((body["id"], event, raw))

    def _keep(self, keys: list[str], kept: dict[str, Any]) -> None:
        for key in keys:
            self.remember(key, kept)

    def _ensure_workers(self) -> None:
        if self._workers:
            return
        for url in self.urls:
            self._queues[url] = asyncio.Queue()
            self._workers.append(
                asyncio.create_task(self._work(url), name=f"signoff-webhook-{_masked(url)}")
            )

    async def _work(self, url: str) -> None:
        queue = self._queues[url]
        while True:
            delivery, event, raw = await queue.get()
            self._sending.add(f"{url} {delivery}")
            try:
                if await self._send(url, delivery, event, raw) != "gave up":
                    if self._state is not None:
                        await off_loop(self.forget, f"{_OUTBOX}{url} {delivery}")
                elif self._state is not None:
                    logger.error(
                        "webhook %s: %s is sent again when the hub next starts",
                        _masked(url),
                        delivery,
                    )
            except Exception:
                logger.exception("webhook %s: delivering %s failed", _masked(url), delivery)
            finally:
                self._sending.discard(f"{url} {delivery}")
                self._queued.discard(f"{url} {delivery}")
                queue.task_done()

    async def deliver(self, url: str, delivery: str, event: str, raw: bytes) -> bool:
        """POST one delivery, retrying with backoff; True once a 2xx answered."""
        return await self._send(url, delivery, event, raw) == "delivered"

    async def _send(self, url: str, delivery: str, event: str, raw: bytes) -> str:
        """`deliver`'s attempts; `delivered`, `refused` (a final 4xx) or `gave up`."""
        import httpx

        client = self._http()
        for attempt in range(1, self.max_attempts + 1):
            stamp = int(self.clock())  # signed afresh: a late retry is not a stale delivery
            headers = {
                "Content-Type": "application/json",
                "User-Agent": f"signoff/{__version__}",
                TIMESTAMP_HEADER: str(stamp),
                SIGNATURE_HEADER: ", ".join(sign_webhook(s, stamp, raw) for s in self.secrets),
                EVENT_HEADER: event,
                DELIVERY_HEADER: delivery,
            }
            asked: float | None = None
            try:
                status, asked = await self._post(client, url, raw, headers)
            except (httpx.HTTPError, TimeoutError) as exc:
                problem = repr(exc)
            else:
                if 200 <= status < 300:
                    self.delivered += 1
                    return "delivered"
                problem = f"HTTP {status}"
                if status < 500 and status not in _RETRY_STATUSES:
                    logger.error(
                        "webhook %s refused %s (%s); not retried", _masked(url), delivery, problem
                    )
                    self.failed += 1
                    return "refused"
            if attempt < self.max_attempts:
                delay = min(self.max_backoff, max(self.backoff * 2 ** (attempt - 1), asked or 0))
                logger.warning(
                    "webhook %s: %s on attempt %s for %s; retrying in %.2fs",
                    _masked(url),
                    problem,
                    attempt,
                    delivery,
                    delay,
                )
                await self._sleep(delay)
        logger.error("webhook %s: gave up on %s after %s attempts", _masked(url), delivery, attempt)
        self.failed += 1
        return "gave up"

    async def _post(
        self, client: httpx.AsyncClient, url: str, raw: bytes, headers: dict[str, str]
    ) -> tuple[int, float | None]:
        """One POST's status, and the seconds its `Retry-After` asks to wait. The whole attempt
        is bounded by `timeout` (httpx bounds each read only) and the receiver's body is never
        read, so a trickling or endless answer costs neither time nor memory."""
        async with (
            asyncio.timeout(self.timeout),
            # Never followed, also by a client the caller made to: the body goes only to `url`.
            client.stream(
                "POST", url, content=raw, headers=headers, follow_redirects=False
            ) as response,
        ):
            return response.status_code, _retry_after(response.headers, self.clock())

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = _httpx().AsyncClient(timeout=self.timeout)
        return self._client

    async def drain(self) -> None:
        """Wait until every queued delivery was sent or given up."""
        for queue in self._queues.values():
            await queue.join()

    async def close(self) -> None:
        """Send what is queued (for up to `timeout` seconds), then stop. Deliveries still unsent
        are counted in `failed` and logged as an error: the hub's state keeps them for its next
        start (an in-memory state, or no hub, loses them)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.timeout):
                await self.drain()
        lost = len(self._sending) + sum(q.qsize() for q in self._queues.values())
        if lost:
            self.failed += lost
            kept = self._state is not None and self._state.path != ":memory:"
            logger.error(
                "webhooks: %s deliveries were not sent within %ss of closing and %s",
                lost,
                self.timeout,
                "are sent when the hub next starts" if kept else "are lost",
            )
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._workers.clear()
        self._queues.clear()
        self._queued.clear()
        self._sending.clear()
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None


def _masked(url: object) -> object:
    """`url` as logs and errors show it, with what may be a password masked: the userinfo httpx
    reads (the last `@` before the first `/`, `?` or `#`), which it sends as Basic auth, and a
    password holding one of those unencoded, which httpx reads as a port and path (`u:123/pw@h`
    is host `u`): from the first `:` to the last `@`. What is not a string is shown as it is
    (the error naming it says it is no URL)."""
    if not isinstance(url, str):
        return url
    scheme, sep, rest = url.partition("://")
    last = rest.rfind("@")
    if not sep or last < 0:
        return url
    ends = [i for i in (rest.find(c) for c in "/?#") if i >= 0]
    authority = rest[: min(ends, default=len(rest))]
    at = authority.rfind("@")  # where httpx's userinfo ends, if it reads one
    colon = authority.partition("[")[0].find(":")  # not one of an IPv6 host's
    if 0 <= colon < at or (at < 0 and colon >= 0):
        shown = f"{scheme}://{rest[:colon]}:***@{rest[last + 1 :]}"
    elif at >= 0:  # a user name alone (a token, often) is sent as Basic auth too
        shown = f"{scheme}://***@{rest[at + 1 :]}"
    else:
        return url
    return shown if _sends_nothing_shown(url, shown) else f"{scheme}://***@{rest[last + 1 :]}"


def _sends_nothing_shown(url: str, shown: str) -> bool:
    """Whether the Basic auth httpx would send for `url` is out of `shown`: a check on the mask
    by httpx's own reading."""
    httpx = _httpx()
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, UnicodeError):
        return True  # it sends nothing at all
    # The user name is shown beside a password, and is the secret without one; only the shown
    # userinfo can hold it (the host on follows the last `@`).
    secret = parsed.password if b":" in parsed.userinfo else parsed.username
    return not secret or secret not in shown.partition("://")[2].rpartition("@")[0]


def _unusable(url: str, exc: Exception) -> str:
    """What the error about a URL httpx cannot read shows. The parser's message may quote part
    of a password holding `/`, `?` or `#` unencoded (`Invalid port: ...`): it is left out when
    something masked lies past where httpx's userinfo ends."""
    masked = _masked(url)
    rest = url.partition("://")[2]
    if masked != url and any(0 <= rest.find(c) < rest.rfind("@") for c in "/?#"):
        return f"{masked!r} (is a password in it not percent-encoded?)"
    return f"{masked!r} ({exc})"


def _httpx() -> Any:
    try:
        import httpx
    except ImportError as exc:  # pragma: no cover - depends on the extras installed
        raise UsageError("webhooks need httpx: pip install 'signoff[webhooks]'") from exc
    return httpx


def _retry_after(headers: httpx.Headers, now: float) -> float | None:
    """The seconds a `Retry-After` header asks to wait (a number of seconds or an HTTP date);
    None without one or with one that is neither."""
    value = headers.get("retry-after", "").strip()
    if value.isascii() and value.isdigit() and len(value) <= 9:
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT
        return None
    return max(0.0, when.timestamp() - now)
