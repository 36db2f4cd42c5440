"""The refusals a `WebhookChannel` records: deliveries a receiver answered with a redirect or
a 4xx other than 408, 425 and 429, which are never sent again, so the operator must hear of
them (`WebhookChannel.refusals()`). They are kept in the hub's state, the latest
`REFUSALS_KEPT` of each URL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._base import off_loop
from ._webhook_urls import endpoint, masked

if TYPE_CHECKING:
    from .webhooks import WebhookChannel

__all__ = [
    "REDIRECTED",
    "REFUSALS_KEPT",
    "REFUSED",
    "TOO_LARGE",
    "note_refusal",
    "refused",
    "refusals",
]

REFUSALS_KEPT = 100  # refusals kept per URL, the oldest dropped first
_KEY = "refused:"  # memo key prefix of the refusals of a URL: "refused:{url}"
REDIRECTED = "a redirect is not followed (the signed body goes only to the URL configured): "
REDIRECTED += "configure the channel with the URL it points to"
REFUSED = "the receiver's final answer: check its URL and secret"
TOO_LARGE = "the receiver's final answer: the body is too large for it, even with nothing to clip"


def note_refusal(
    ch: WebhookChannel,
    url: str,
    delivery: str,
    event: str,
    answer: tuple[int | None, str, float | None],
) -> None:
    """Record why `url` refused a delivery (`answer`: its status and what it said), among its
    latest `REFUSALS_KEPT`."""
    status, problem, _ = answer
    key = f"{_KEY}{url}"
    kept = ch.recall(key)
    seen = [r for r in kept if isinstance(r, dict)] if isinstance(kept, list) else []
    entry = {"delivery": delivery, "event": event, "status": status, "reason": problem}
    ch.remember(key, [*seen, {**entry, "at": ch.clock()}][-REFUSALS_KEPT:])


def refused(ch: WebhookChannel) -> set[str]:
    """The deliveries `ch`'s state records as refused, each as `"{url} {delivery}"`: what a
    crash or a store outage left kept after the refusal was recorded is not sent again. One
    an earlier signoff recorded under another spelling of the URL is under its `endpoint`."""
    found: set[str] = set()
    for key, kept in ch.memos(_KEY):
        url = endpoint(key.removeprefix(_KEY))
        if isinstance(kept, list):
            found.update(f"{url} {r.get('delivery')}" for r in kept if isinstance(r, dict))
    return found


async def refusals(ch: WebhookChannel) -> list[dict[str, Any]]:
    """The refusals `ch` recorded, oldest first, each with its `url` (masked)."""
    found: list[dict[str, Any]] = []
    for key, kept in await off_loop(ch.memos, _KEY):
        url = str(masked(key.removeprefix(_KEY)))
        if isinstance(kept, list):
            found.extend({"url": url, **r} for r in kept if isinstance(r, dict))
    return sorted(found, key=lambda r: _when(r.get("at")))


def _when(value: object) -> float:
    """A recorded time, or 0 for one that is not a number."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
