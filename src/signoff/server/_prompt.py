"""`PromptStore`: the store calls made for an HTTP request wait for a busy store only briefly."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from ..stores import promptly

__all__ = ["PromptStore"]


class PromptStore:
    """ASGI middleware: every HTTP request runs inside `promptly()`, so a busy store (PostgreSQL's
    pool all in use) answers it with a 503 `store_busy` within `?request_pool_timeout=` seconds
    instead of holding it for the pool's whole timeout while more requests pile up behind."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the lifespan, which starts workers and sweeps: patient
            await self.app(scope, receive, send)
            return
        with promptly():
            await self.app(scope, receive, send)
