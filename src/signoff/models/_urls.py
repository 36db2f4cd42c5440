"""URLs as the models' reprs and errors show them."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from .._exceptions import UsageError

__all__ = ["SECRET_PARAM", "check_endpoint", "shown_url"]


# Query parameters that carry a credential (`?key=`, `?api_key=`, `?token=`, an Azure `sig=`);
# others (`api-version`) stay, to tell endpoints apart.
SECRET_PARAM = re.compile(r"key|token|secret|sig|auth|pass|credential", re.IGNORECASE)


def shown_url(url: object) -> str:
    """A URL as a repr or an error shows it, its password (or a user name with none, often a
    token: `https://TOKEN@host`) and the values of query parameters named as credentials
    (`?key=...`) left out: an error is recorded in the session's log, which anyone who may read
    the session reads."""
    text = str(url)
    parts = urlsplit(text)
    host = parts.netloc.rpartition("@")[2]
    if parts.username and not parts.password:  # `TOKEN@host`, `TOKEN:@host`
        parts = parts._replace(netloc=f"***@{host}")
    elif parts.password is not None:
        user = parts.username or ""
        parts = parts._replace(netloc=f"{user}:***@{host}")
    if parts.query:
        params = parts.query.split("&")
        for i, param in enumerate(params):
            name, eq, value = param.partition("=")
            if eq and value and SECRET_PARAM.search(name):
                params[i] = f"{name}=***"
        parts = parts._replace(query="&".join(params))
    shown = urlunsplit(parts)
    return text if shown == urlunsplit(urlsplit(text)) else shown


def check_endpoint(owner: str, base_url: object, api_key: object) -> None:
    """Raise `UsageError` for a base URL that no request could reach (not text, or not an
    `http://` or `https://` URL with a host: `localhost:8000/v1`, a number) or an API key that
    is not text: the model was made, and each turn then failed with a model error."""
    if base_url is not None:
        try:
            parts = urlsplit(base_url) if isinstance(base_url, str) else None
            reachable = parts is not None and parts.scheme in ("http", "https") and parts.hostname
        except ValueError:  # a malformed host (`http://[::1`)
            reachable = False
        if not reachable:
            if not isinstance(base_url, str):
                shown = f"a value of type {type(base_url).__name__}"
            else:
                try:
                    shown = repr(shown_url(base_url))
                except ValueError:  # unsplittable: what precedes an `@` may be a password
                    shown = repr(base_url.rpartition("@")[2])
            raise UsageError(
                f"{owner}: base_url must be an http:// or https:// URL with a host "
                f"(http://localhost:11434/v1), not {shown}"
            )
    if api_key is not None and not isinstance(api_key, str):
        raise UsageError(f"{owner}: api_key must be text, not {type(api_key).__name__}")
