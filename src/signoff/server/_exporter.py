"""`Exporter`: one app's Prometheus metrics, in a registry of its own (`prometheus_client`).

Imported only when `create_app(metrics=True)` asks for it (`_metrics`), so the `metrics` extra
is needed only then. Labels are bounded: a route's template, never its path (no session or
request id), a method from a fixed list, a status class, an error code; nothing names a
principal, a tenant or what was asked.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from .._counts import Counts
from ._stream_slots import StreamSlots

__all__ = ["Exporter"]

log = logging.getLogger("signoff.server")

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""The methods a label names; any other is `other` (a client may send any token)."""

# A format version `prometheus_client` can compare: it reads each part as a number if it can,
# and comparing a part it cannot (`version=x`, or digits past Python's limit) raised a TypeError.
_VERSION = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,6}){0,3}")


class _Activity:
    """What the runtime and the server did, read from their own counts when scraped: nothing
    is done for it while they work."""

    def __init__(self, counts: Counts, streams: StreamSlots) -> None:
        self.counts = counts
        self.streams = streams
        # Set by each scrape just before the registry is read (`Exporter.render`).
        self.store_up = True
        self.open_requests: int | None = None

    def collect(self) -> Iterator[Metric]:
        counts = self.counts
        yield CounterMetricFamily(
            "signoff_turns_driven",
            "Drives of a turn this process ran (taking it forward until it completed, waited "
            "for a person, or failed).",
            value=counts.drives,
        )
        yield CounterMetricFamily(
            "signoff_turns_failed",
            "Drives of a turn this process ran that raised or left the turn failed.",
            value=counts.failed_drives,
        )
        yield CounterMetricFamily(
            "signoff_answers_accepted",
            "Answers to input requests this process settled (a repeated answer is not one).",
            value=counts.accepted,
        )
        refused = CounterMetricFamily(
            "signoff_answers_refused",
            "Answers to input requests this process refused, by error code.",
            labels=["code"],
        )
        for code, n in sorted(counts.refused.items()):
            refused.add_metric([code], n)
        yield refused
        yield GaugeMetricFamily(
            "signoff_event_streams_open",
            "Event streams (the API's and the dashboard's) this process holds open.",
            value=self.streams.total(),
        )
        yield GaugeMetricFamily(
            "signoff_store_up",
            "1 if the store answered this scrape's count of open requests in time, else 0.",
            value=1 if self.store_up else 0,
        )
        if self.open_requests is not None:
            yield GaugeMetricFamily(
                "signoff_open_requests",
                "Input requests pending in the store, of every session whose TTL has not passed.",
                value=self.open_requests,
            )


class Exporter:
    """One app's registry: HTTP requests and their latency by route template, the runtime's
    activity, the store's open requests, and the process collectors `prometheus_client` gives."""

    def __init__(self, counts: Counts, streams: StreamSlots) -> None:
        registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        self.registry = registry
        self.requests = Counter(
            "signoff_http_requests",
            "HTTP requests answered, by method, route template and status class.",
            ["method", "route", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "signoff_http_request_duration_seconds",
            "Seconds until the response began (an event stream: until it opened; a request that "
            "failed: until it raised), by method and route template.",
            ["method", "route"],
            registry=registry,
        )
        self.activity = _Activity(counts, streams)
        registry.register(self.activity)

    def answered(self, method: str, route: str, status: int | None, seconds: float) -> None:
        """Count and time one request; `status` None when the app raised (the server answers
        500), `seconds` then the time until it raised."""
        method = method if method in METHODS else "other"
        status_class = "5xx" if status is None else f"{status // 100}xx"
        self.requests.labels(method, route, status_class).inc()
        self.latency.labels(method, route).observe(seconds)

    def render(self, accept: str, open_requests: int | None) -> tuple[bytes, str]:
        """The registry in the format `accept` asks for (Prometheus text by default, or
        OpenMetrics), and its content type; `open_requests` None when the store did not answer."""
        up = open_requests is not None
        if up != self.activity.store_up:
            if up:
                log.info("metrics: the store answers again")
            else:
                log.warning("metrics: the store did not answer the count of open requests")
        self.activity.store_up = up
        self.activity.open_requests = open_requests
        encode, content_type = choose_encoder(_versioned(accept))
        return encode(self.registry), content_type


def _versioned(accept: str) -> str:
    """`accept` without its `version` parameters that are not dotted numbers: a client's
    malformed header gets the format's default version, not a 500."""
    kept = []
    for item in accept.split(","):
        media, *params = item.split(";")
        for param in params:
            key, _, value = param.strip().partition("=")
            if key != "version" or _VERSION.fullmatch(value):
                media += ";" + param
        kept.append(media)
    return ",".join(kept)
