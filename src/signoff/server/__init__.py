"""The signoff server: REST API under `/v1`, Server-Sent Events, and the reviewer dashboard.

    from signoff.server import create_app, TokenAuth
    app = create_app(runtime, auth=TokenAuth({"s3cret": so.Principal(...)}))

Needs the `server` extra: `pip install 'signoff[server]'`.
"""

from . import _extra  # noqa: F401  (first: a UsageError naming what the extra lacks)

# isort: split
from .._client import AsyncClient, Client, LiveSession, RemoteError, RemoteResult, RequestView
from ._app import create_app
from ._auth import AccessRule, Authenticator, DevAuth, TokenAuth, default_access
from ._errors import ErrorBody
from ._serve import DEFAULT_STORE, load_runtime, serve

__all__ = [
    "DEFAULT_STORE",
    "AccessRule",
    "AsyncClient",
    "Authenticator",
    "Client",
    "DevAuth",
    "ErrorBody",
    "LiveSession",
    "RemoteError",
    "RemoteResult",
    "RequestView",
    "TokenAuth",
    "create_app",
    "default_access",
    "load_runtime",
    "serve",
]
