"""`WebhookChannel`: a signed JSON POST to your URLs when a request opens, is escalated, closes
or nears expiry.

Each delivery carries `Signoff-Timestamp` (Unix seconds) and `Signoff-Signature`
(`v1=` + hex HMAC-SHA256 of `{timestamp}.{body}` with the shared secret); receivers check both
with `verify_webhook`. To rotate the secret, give the channel the new and the old one: it signs
with each (comma-separated), so receivers still on the old secret accept every delivery.
Failed deliveries (network errors, 408, 425, 429 and 5xx) are retried with exponential backoff, or
after the receiver's `Retry-After` when it asks for longer (both at most `max_backoff`; the
next delivery to that receiver waits out all it asked, up to an hour, also after a restart
or on another machine: `_webhook_waits`);
`Signoff-Delivery` (and the payload's `id`) stays the same across retries and restarts so receivers
can dedupe: a delivery can arrive twice, and `verify_webhook` accepts a replay within its window.
Deliveries wait in a queue per URL, each with its own worker (so a slow or hanging receiver
holds up no other URL or channel, their redeliveries included, nor does a host name that does
not resolve in time: `_webhook_lookups`) and are kept in
the hub's state until sent: one given up on after `max_attempts` (logged as an error) is sent
again every minute while the hub runs (the oldest of its URL first, the others once it got
through, up to one that fails again, from which the next round goes on), and one given up
on or still unsent when the process stops is sent again when the hub next starts on the
same state (by a later poll if reading the state fails then), or by a
hub on another state taking over: a copy of each is kept in the runtime's store
(`_webhook_outbox`), so neither an in-memory state nor a lost machine loses it. A 3xx or a
4xx other than 408, 425 and 429 is final: it is logged as an error saying what to do and
recorded in the hub's state (`refusals()`), never sent again on that state, nor on another
once the store dropped its copy (a later poll does where the store failed to). A
`Retry-After` longer than a minute also delays the next try of one given up on.

Each attempt is bounded by `timeout` as a whole and only the response's status is read, never
its body. Redirects are not followed (a 3xx is a refusal, logged with where it points: the
signed body goes only where it was configured to). URLs are the operator's own configuration,
so loopback and private addresses are allowed (e.g. a receiver on the same host); never build
them from untrusted input. A password
in one (Basic auth) is masked in logs and errors, and sent only in the `Authorization` header,
never in the request's URL (which httpx logs at INFO). Query values and a fragment are masked
too, also in httpx's INFO line on the channel's own client (`_webhook_posts.shown_masked`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._exceptions import StoreError, UsageError
from .._settings import seconds, whole
from .._sync import checked_clock, checked_sleep
from .._types import InputRequest
from . import _given_up as given_up
from ._base import Channel, Erased, Escalation, Resolution, logger, off_loop
from ._retries import Outage, doubled
from ._webhook_bodies import MAX_BODY_BYTES, delivery_body, json_bytes, smallest, within
from ._webhook_erased import erased_among, forget_erased, stripped
from ._webhook_lookups import own_client
from ._webhook_outbox import OUTBOX as _OUTBOX
from ._webhook_outbox import (
    drop_copy,
    drop_pending,
    keep_copies,
    take_copies,
    unsent,
)
from ._webhook_posts import post_once
from ._webhook_refusals import REDIRECTED, REFUSED, TOO_LARGE, note_refusal, refusals
from ._webhook_rounds import Rounds
from ._webhook_signatures import secret_list, sign_webhook, signed_headers, verify_webhook
from ._webhook_stop import Stop
from ._webhook_urls import checked_urls, masked
from ._webhook_waits import Waits
from ._webhook_warned import drop_warned, drop_warned_erased, still_due, warn

if TYPE_CHECKING:
    import httpx

__all__ = ["WebhookChannel", "sign_webhook", "verify_webhook"]

_RETRY_STATUSES = frozenset({408, 425, 429})
_DONE = {
    "delivered": "delivered",
    "refused": "refused",
    "gave up": "given up on",
    "stale": "dropped (its request closed)",
}
_ERASED = "erased"  # `_send`'s outcome for a delivery of a request erased since it was queued
_STALE = "stale"  # not sent: a warning kept past its request's close (`still_due`)
_BACKFILLED = "backfilled"  # memo: the open requests were announced on a first start


class WebhookChannel(Channel):
    """Posts `request.opened`, `request.escalated`, `request.resolved` and `request.expiring` to
    every URL.

    `secret` signs each delivery; several (the new one and the old, while rotating) each sign.

    `clock` (this machine's wall clock) stamps each delivery's signature, as the receiver's
    clock checks it; a body's `at` is on the runtime's clock, as the request's own times are.

    `sleep` (an async function of the seconds, `asyncio.sleep` by default) waits between
    attempts; a plain one (`time.sleep`) is refused, as it would block the event loop.

    `expiring_within`: warn this many seconds before a request's `expires_at`, once per request
    (also across hubs: the memo that it warned is kept in the store, `_webhook_warned`). Retries:
    `max_attempts` in all, waiting `backoff * 2**n` seconds, or the receiver's `Retry-After` if
    longer, between them (at most `max_backoff`).

    A new channel starts from now, as the hub does: requests opened before it first started
    are not announced. `backfill=True` sends `request.opened` for each of those still open (as
    stored then, oldest first) on the first start with it on the hub's state, once.

    `max_body_bytes` (256 KiB) bounds a body: one over it is clipped (`_CLIPPABLE`: inputs,
    payload and answer as null, long text cut), the largest part first, naming each in
    `clipped`. One still over it (a low bound: ids, names and parts of 500 bytes or fewer are
    never clipped) is sent as it is, the first logged as a warning.
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
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        super().__init__(name=name, accepts=accepts)
        checked_clock(clock, "WebhookChannel: clock")  # else every delivery failed to be signed
        checked_sleep(sleep, "WebhookChannel: sleep")  # time.sleep would block the event loop
        if not isinstance(backfill, bool):
            raise UsageError(f"backfill must be True or False, not {backfill!r}")
        url_list = checked_urls(urls)
        secrets = secret_list(secret, "WebhookChannel")
        whole("max_attempts", max_attempts, least=1)  # 2.5 would fail each delivery
        whole("max_body_bytes", max_body_bytes, least=1024)
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
        self.max_body_bytes = max_body_bytes
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
        self._unkept: set[str] = set()  # requests warned of whose memo is still to be kept
        self._sending: set[str] = set()  # deliveries being sent now
        self._queued: set[str] = set()  # "url delivery" queued or being sent: never twice at once
        # "url delivery" kept by an earlier run and queued again by `start`: the hub, reading
        # the entry again (its position was not saved past it), must not send it once more.
        self._restored: set[str] = set()
        # Delivery -> what is sent of it now that its request is erased (None: nothing), for
        # the workers that have it queued or queue it again (`_webhook_erased`).
        self._replaced: dict[str, bytes | None] = {}
        self.backfill = backfill
        self._backfilled: set[str] = set()  # request ids whose opening `start` sent
        self._unrestored = False  # the deliveries kept by an earlier run are still to be queued
        self._undropped = False  # the store failed to drop the copy of one sent or refused
        self._rounds = Rounds(self)  # the deliveries given up on, sent again in rounds
        self._stop = Stop(self)  # how `close` waits for the queues to drain
        # URL -> its last failed answer: status (None: no answer), what failed, Retry-After.
        self._answers: dict[str, tuple[int | None, str, float | None]] = {}
        # What each URL's last answer asked with Retry-After, kept for other hubs too.
        self._waits = Waits(self)
        # What the state or the store fails (damaged, locked, down) is tried again at each
        # tick, logged once.
        self._failing = Outage(f"channel {self.name}: what it keeps in its state and the store")
        self._overlong = False  # a body over max_body_bytes once clipped was logged
        self.delivered = 0
        self.failed = 0

    # -- what the hub tells it ----------------------------------------------------------------

    async def start(self, open_requests: Sequence[InputRequest]) -> None:
        self._stop = Stop(self)  # not cut short (a forced stop's `cut_short`) any more
        self._ensure_workers()
        for r in open_requests:
            if r.expires_at is not None:
                self._deadlines[r.id] = r
        self._unrestored = True
        try:
            await self._restore()
        except StoreError as exc:  # `tick` reads them later; the backfill waits for the next start
            self._failing.failed(exc)
            return
        if self.backfill and not await off_loop(self.recall, _BACKFILLED):
            for r in sorted(open_requests, key=lambda r: (r.created_at, r.index or 0)):
                await self.enqueue("request.opened", r)  # kept before the memo says it was
                self._backfilled.add(r.id)
            await off_loop(self.remember, _BACKFILLED, True)

    async def _restore(self) -> None:
        """Queue the deliveries an earlier run kept and did not send. When reading them fails
        (the state locked too long, or damaged), `tick` tries again: no other start is left to
        send them. Those a hub on another state kept in the store come too (`take_copies`),
        after what receivers asked an earlier run or another hub to wait (`Waits`); those the
        state records as refused do not (`unsent`), their copies dropped, nor those of a
        request the store no longer has (erased while no hub ran here: a close goes stripped)."""
        await self._waits.load()
        await drop_pending(self)
        await take_copies(self)
        found = await off_loop(unsent, self)
        if await forget_erased(self, await erased_among(self, found)):
            found = await off_loop(unsent, self)
        for url, delivery, kept in found:
            self._restored.add(f"{url} {delivery}")
            if f"{url} {delivery}" not in self._queued:
                self._queued.add(f"{url} {delivery}")
                self._queues[url].put_nowait((delivery, kept["event"], kept["body"].encode()))
        self._unrestored = False

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
        self._unkept.discard(request.id)
        await drop_warned(self, request)  # a closed request is never warned about again
        body = self.payload("request.resolved", request, resolution)
        if resolution.outcome == "approved" and self._runtime is not None:
            # The audit entry does not carry an edit: the approved input is the stored one.
            stored = await self._runtime.store.get_request(request.id)
            edited = ((stored.resolution if stored else None) or {}).get("edited_input")
            if edited is not None:
                body["resolution"]["edited_input"] = edited
                body = within(body, self.max_body_bytes)
        await self._enqueue(body)

    async def on_erased(self, erased: Sequence[Erased]) -> None:
        """`request.resolved` for each request erased with its session before its close was
        delivered, whatever `accepts` says (the request is gone: it cannot be asked); its
        `request` holds only its `id` and `session_id`, its resolution no answer. What was kept
        unsent of it goes, or is sent so stripped (`forget_erased`)."""
        await forget_erased(self, [gone.request_id for gone in erased])
        for gone in erased:
            rid = gone.request_id
            self._deadlines.pop(rid, None)
            self._backfilled.discard(rid)
            self._unkept.discard(rid)
            await drop_warned_erased(self, rid)
            left = {"id": rid, "session_id": gone.session_id}
            body = self._payload("request.resolved", rid, left, gone.resolution)
            await self._enqueue(stripped(body) or body)

    async def on_erased_closed(self, erased: Sequence[Erased]) -> None:
        """Requests erased whose close was delivered to the channel: what is kept unsent of
        them goes (an opening, escalation or warning), or is sent stripped (the close)."""
        await forget_erased(self, [gone.request_id for gone in erased])

    async def tick(self, now: float) -> None:
        """Queue the kept deliveries a start could not read, and the warnings now due. What the
        state fails is tried again at the next tick, logged when it starts failing, when its
        error changes and once it works, not at every poll."""
        failure: StoreError | None = None
        try:
            if self._unrestored:
                await self._restore()
            elif self._undropped:  # store copies of deliveries done that the store kept
                await drop_pending(self)
        except StoreError as exc:
            failure = exc
        try:  # kept deliveries that cannot be read (a damaged row) hold back no warning
            await warn(self, now)
        except StoreError as exc:
            failure = failure or exc
        try:  # a warning that fails holds back no redelivery
            await self._rounds.redo()
        except StoreError as exc:
            failure = failure or exc
        if failure is not None:
            self._failing.failed(failure)
        else:
            self._failing.worked()

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
        shown = request.model_dump(mode="json")
        return self._payload(event, request.id, shown, resolution, escalation)

    def _payload(
        self,
        event: str,
        request_id: str,
        request: dict[str, Any],
        resolution: Resolution | None,
        escalation: Escalation | None = None,
    ) -> dict[str, Any]:
        """`payload`'s body for the request `request_id` as `request` shows it."""
        body = delivery_body(event, request_id, request, resolution, escalation, self._now())
        return within(body, self.max_body_bytes)

    def _now(self) -> float:
        """When an event is queued, on the runtime's clock (on PostgreSQL the database's): the
        one the request's own times are on and its warning is timed by. `clock`, this machine's,
        signs deliveries, as the receiver's clock checks them; it stands in until a hub binds a
        runtime."""
        return self.clock() if self._runtime is None else self._runtime.now()

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
        await self._enqueue(self.payload(event, request, resolution, escalation=escalation))

    async def _enqueue(self, body: dict[str, Any]) -> None:
        """`enqueue` the delivery of `body`."""
        event = body["type"]
        raw = json_bytes(body)
        self._ensure_workers()
        urls = [
            url
            for url in self.urls
            if f"{url} {body['id']}" not in self._queued
            and f"{url} {body['id']}" not in self._restored
        ]
        if not urls:
            return  # an entry the hub read again while its delivery waits or was restored
        if len(raw) > self.max_body_bytes and not self._overlong:  # logged once: the bound
            self._overlong = True  # is too low for the parts never clipped (ids, names, ...)
            logger.warning(
                "channel %s: %s (%s) is %s bytes with all it can clip clipped, over "
                "max_body_bytes=%s; sent as it is, as are later ones (not logged): raise "
                "max_body_bytes if a receiver caps there",
                self.name,
                body["id"],
                event,
                len(raw),
                self.max_body_bytes,
            )
        if self._state is not None:
            kept = {"event": event, "body": raw.decode()}
            await keep_copies(self, urls, body["id"], kept)  # for a hub on another state
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
                asyncio.create_task(self._work(url), name=f"signoff-webhook-{masked(url)}")
            )

    async def _work(self, url: str) -> None:
        queue = self._queues[url]
        while True:
            delivery, event, raw = await queue.get()
            if f"{url} {delivery}" in self._rounds.held_back:  # kept: the next round sends it
                self._rounds.held_back.discard(f"{url} {delivery}")
                self._queued.discard(f"{url} {delivery}")
                queue.task_done()
                continue
            self._sending.add(f"{url} {delivery}")
            probe = self._rounds.probing.get(url) == delivery
            outcome: str | None = None
            recorded = False  # what the receiver answered is kept in the state and store
            try:
                outcome = await self._send(url, delivery, event, raw)
                if outcome == _STALE and probe:  # none sent: the next tick's round goes on
                    self._rounds.skipped(url)
                if outcome == _ERASED:  # its copies went with the erasure (`forget_erased`)
                    recorded = True
                elif outcome != "gave up":
                    if self._state is not None:
                        if outcome == "refused":  # recorded before its copy to send goes
                            answer = self._answers.get(url, (None, "refused", None))
                            await off_loop(note_refusal, self, url, delivery, event, answer)
                        await off_loop(self.forget, f"{_OUTBOX}{url} {delivery}")
                        await drop_copy(self, url, delivery, outcome)
                    recorded = True
                    if probe and outcome != _STALE:  # the receiver answered: the rest follow
                        await self._rounds.got_through(url)
                elif self._state is not None:
                    later = self._rounds.gave_up(url, delivery)
                    logger.error(
                        "webhook %s: %s is sent again in %gs and when the hub next starts",
                        masked(url),
                        delivery,
                        given_up.REDO_EVERY + later,
                    )
            except Exception:
                _log_unfinished(url, delivery, outcome, recorded)
            finally:
                self._rounds.done(url, delivery, probe)
                self._sending.discard(f"{url} {delivery}")
                self._queued.discard(f"{url} {delivery}")
                queue.task_done()

    async def deliver(self, url: str, delivery: str, event: str, raw: bytes) -> bool:
        """POST one delivery, retrying with backoff; True once a 2xx answered."""
        return await self._send(url, delivery, event, raw) == "delivered"

    async def _send(self, url: str, delivery: str, event: str, raw: bytes) -> str:
        """`deliver`'s attempts; `delivered`, `refused` (a final 4xx) or `gave up`; `erased`
        (nothing sent) for one of a request erased since, whose close is sent stripped; `stale`
        (nothing sent) for a warning whose request closed since, or lost that deadline."""
        import httpx

        client = self._http()
        await self._waits.wait_out(url, delivery, self._sleep)
        if event == "request.expiring" and not await still_due(self, raw):
            return _STALE  # dropped as if it was sent: it warns of nothing now
        attempt = 0
        swapped = False
        while attempt < self.max_attempts:
            if not swapped and delivery in self._replaced:  # erased while it waited
                swapped, swap = True, self._replaced[delivery]
                if swap is None:
                    return _ERASED
                raw = swap
            attempt += 1
            stamp = int(self.clock())  # signed afresh: a late retry is not a stale delivery
            headers = signed_headers(self.secrets, stamp, raw, event, delivery)
            asked: float | None = None
            status = None
            try:
                status, asked, moved = await post_once(
                    client, url, raw, headers, self.timeout, self.clock(), own=self._own_client
                )
            except (httpx.HTTPError, TimeoutError) as exc:
                problem = repr(exc)
            else:
                await self._waits.note(url, asked)
                if 200 <= status < 300:
                    self.delivered += 1
                    return "delivered"
                problem = f"HTTP {status}"
                if moved is not None:  # where to point the channel, if the receiver moved
                    problem += f" to {str(masked(moved))[:200]!r}"  # masked whole, then cut
            if status == 413 and (smaller := smallest(raw)) is not None:
                # Under max_body_bytes and still too large for this receiver: at once, as small
                # as it goes (not an attempt: the receiver answered, and will take it).
                logger.warning(
                    "webhook %s: HTTP 413 (body too large) for %s of %s bytes; sending it "
                    "again at once clipped as far as it goes (%s bytes): set "
                    "WebhookChannel(max_body_bytes=) below the receiver's limit",
                    masked(url),
                    delivery,
                    len(raw),
                    len(smaller),
                )
                raw = smaller
                attempt -= 1
                continue
            self._answers[url] = (status, problem, asked)
            if status is not None and status < 500 and status not in _RETRY_STATUSES:
                logger.error(
                    "webhook %s refused %s (%s): %s; not retried (%s)",
                    masked(url),
                    delivery,
                    problem,
                    REDIRECTED if status < 400 else TOO_LARGE if status == 413 else REFUSED,
                    "see WebhookChannel.refusals()" if self._state is not None else "not kept",
                )
                self.failed += 1
                return "refused"
            if attempt < self.max_attempts:
                delay = min(self.max_backoff, max(doubled(self.backoff, attempt - 1), asked or 0))
                logger.warning(
                    "webhook %s: %s on attempt %s for %s; retrying in %.2fs",
                    masked(url),
                    problem,
                    attempt,
                    delivery,
                    delay,
                )
                await self._sleep(delay)
        logger.error("webhook %s: gave up on %s after %s attempts", masked(url), delivery, attempt)
        self.failed += 1
        return "gave up"

    async def refusals(self) -> list[dict[str, Any]]:
        """The deliveries receivers refused (a 3xx, or a 4xx other than 408, 425 and 429),
        oldest first, each with its `url` (masked), `delivery` id, `event`, `status`, `reason`
        (the redirect's target included) and `at` (Unix time); kept in the hub's state, the
        latest `REFUSALS_KEPT` per URL. They are never sent again."""
        return await refusals(self)

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = own_client(self.timeout)
        return self._client

    async def drain(self) -> None:
        """Wait until every queued delivery was sent or given up."""
        for queue in self._queues.values():
            await queue.join()

    def cut_short(self) -> list[asyncio.Task[Any]]:
        """A forced stop (`serve`'s second signal): `close` waits for no delivery, also if it is
        waiting already; those left unsent are kept for the next start, as at any close."""
        return self._stop.cut_short()

    async def close(self) -> None:
        """Send what is queued (for up to `timeout` seconds, none once cut short), then stop.
        Deliveries still unsent are counted in `failed` and logged as an error: the hub's state
        keeps them for its next start, and the store for a hub's on any state (no hub, or an
        in-memory state on a store without channel memos, loses them)."""
        await self._stop.drain()
        self._stop.count_unsent()
        for task in self._workers:
            task.cancel()
        for task in self._workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._workers.clear()
        self._queues.clear()
        self._queued.clear()
        self._sending.clear()
        self._replaced.clear()
        self._rounds = Rounds(self)  # what was given up on is kept: the next start sends it
        if self._own_client and self._client is not None:
            await self._client.aclose()
            self._client = None


def _log_unfinished(url: str, delivery: str, outcome: str | None, recorded: bool) -> None:
    """Log what failed while a worker sent `delivery` to `url` (called in its `except`): the
    sending, the queuing of what was given up on behind it, or the keeping of the answer."""
    if outcome is None:
        logger.exception("webhook %s: delivering %s failed", masked(url), delivery)
    elif recorded:  # reading the deliveries given up on failed: the next round tries again
        logger.exception(
            "webhook %s: %s was %s; queuing the deliveries given up on behind it failed, "
            "tried again in %gs",
            masked(url),
            delivery,
            _DONE.get(outcome, outcome),
            given_up.REDO_EVERY,
        )
    else:  # the receiver answered: only keeping that in the state or store failed
        logger.exception(
            "webhook %s: %s was %s, but the hub's state or the store could not record it; it "
            "is sent again when the hub next starts",
            masked(url),
            delivery,
            _DONE.get(outcome, outcome),
        )
