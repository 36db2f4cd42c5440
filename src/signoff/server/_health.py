"""`/healthz` and `/readyz`: what a load balancer or an orchestrator probes, without credentials.

Liveness says the process answers HTTP and its store is not gone for good (its SQLite file
deleted or replaced, or its PostgreSQL schema dropped, under it: only a restart mends that);
readiness also says its store answers a read and the server is not stopping, so a proxy sends
requests elsewhere while the database is down or the process drains. Neither tells anything
about sessions, so neither asks who is calling.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from .._exceptions import StoreError, StoreGone, StoreUnavailable
from ._context import get_context
from ._errors import ApiError, public_message
from ._json_response import JSONText
from ._waits import within

__all__ = ["READY_TIMEOUT", "router"]

READY_TIMEOUT = 2.0
"""Seconds `/readyz` waits for the store before it answers 503: a probe times out soon (a
second by default in Kubernetes), and a database in its outage grace would hold a call 10 s."""

PROBE_SESSION = "ses_readiness_probe"
"""The session `/readyz` reads the head of: one indexed read that finds nothing and writes
nothing, on either store."""

router = APIRouter(default_response_class=JSONText, include_in_schema=False)


@router.get("/healthz")
async def healthz(request: Request) -> dict[str, str]:
    """The process is up and serving HTTP (it does not touch the store), and its store was not
    found gone for good: a database that is down fails readiness only, as waiting mends it."""
    if get_context(request).gone is not None:
        raise ApiError(
            503,
            StoreGone.code,
            "the store was deleted or replaced under this process (its SQLite file, or its "
            "PostgreSQL schema); only a restart mends that",
        )
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> dict[str, str]:
    """Ready to take requests: the store answered a read in time and the server is not stopping."""
    ctx = get_context(request)
    if ctx.closing:
        raise ApiError(503, "shutting_down", "the server is stopping", headers={"Retry-After": "1"})
    try:
        await within(ctx.runtime.store.head(PROBE_SESSION), READY_TIMEOUT)
    except StoreGone as gone:  # for good: `/healthz` fails too from now on
        ctx.met(gone)
        raise
    except TimeoutError:
        exc: StoreError = StoreUnavailable(f"the store did not answer within {READY_TIMEOUT:g} s")
        raise ApiError(
            503,
            exc.code,
            public_message(exc),
            headers={"Retry-After": str(StoreUnavailable.retry_after)},
        ) from None
    return {"status": "ready"}
