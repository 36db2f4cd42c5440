"""The HTTP endpoints a `SlackChannel` mounts on the signoff server: interactivity (button
presses, menus, modals) and, unless disabled, the Events API (replies typed in threads)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..._exceptions import SignoffError, StoreError, UsageError
from .._base import InvalidSignature
from ._payloads import SlackPayloadError

if TYPE_CHECKING:
    from ._channel import SlackChannel

__all__ = ["routes"]

Handler = Callable[[bytes, Mapping[str, str]], Awaitable[dict[str, Any] | None]]


def routes(channel: SlackChannel) -> Any:
    """A FastAPI router with the channel's endpoints, each a plain Starlette route: the raw body
    must reach the signature check untouched."""
    try:
        from fastapi import APIRouter, Request
        from starlette.responses import JSONResponse, Response
    except ImportError as exc:  # pragma: no cover - depends on the extras installed
        raise UsageError(
            "the Slack endpoint needs the server extra: pip install 'signoff[server,slack]'"
        ) from exc

    def endpoint(handle: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def serve(request: Request) -> Response:
            body = await request.body()
            try:
                answer = await handle(body, request.headers)
            except InvalidSignature as exc:
                return JSONResponse(_error(exc), status_code=401)
            except SlackPayloadError as exc:
                return JSONResponse(_error(exc), status_code=400)
            except StoreError as exc:  # nothing was taken: Slack retries the delivery
                return JSONResponse(_error(exc), status_code=503)
            if answer is None:
                return Response(status_code=200)
            return JSONResponse(answer)

        return serve

    router = APIRouter()
    router.add_route(
        channel.path, endpoint(channel.handle), methods=["POST"], include_in_schema=False
    )
    if channel.events_path is not None:
        router.add_route(
            channel.events_path,
            endpoint(channel.handle_event),
            methods=["POST"],
            include_in_schema=False,
        )
    return router


def _error(exc: SignoffError) -> dict[str, Any]:
    return {"error": {"code": exc.code, "message": str(exc)}}
