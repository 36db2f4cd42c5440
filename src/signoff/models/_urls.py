"""URLs as the models' reprs and errors show them, and the checks of a model's base URL and keys."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from urllib.parse import urlsplit, urlunsplit

from .._exceptions import UsageError

__all__ = ["SECRET_PARAM", "check_endpoint", "credential", "shown_url"]


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


def check_endpoint(
    owner: str, base_url: object, api_key: object, parse: Callable[[str], object] | None = None
) -> None:
    """Raise `UsageError` for a base URL that no request could reach (not text, not an
    `http://` or `https://` URL with a host: `localhost:8000/v1`, a number; holding a control
    or invisible character, which `urlsplit` drops, spaces around it or in its host (one in its
    path is sent percent-encoded), a port
    that is no number from 0 to 65535, or anything `parse`, its URL parser, refuses) or an API
    key that is not text: the model was made, and each turn then failed with a model error."""
    if base_url is not None:
        why = _unreachable(base_url, parse)
        if why is not None:
            if not isinstance(base_url, str):
                shown = f"a value of type {type(base_url).__name__}"
            else:
                try:
                    shown = repr(shown_url(base_url))
                except ValueError:  # unsplittable: what precedes an `@` may be a password
                    shown = repr(base_url.rpartition("@")[2])
            raise UsageError(
                f"{owner}: base_url must be an http:// or https:// URL with a host "
                f"(http://localhost:11434/v1), not {shown}{why}"
            )
    if api_key is not None and not isinstance(api_key, str):
        raise UsageError(f"{owner}: api_key must be text, not {type(api_key).__name__}")


_UNSEEN = frozenset({"Cc", "Cf", "Zl", "Zp"})
"""Unicode categories of characters no URL holds: controls (a line break, a tab), invisible
format characters (a zero-width space) and line separators. A space inside a path is sent
percent-encoded, as the HTTP library encodes it."""


def _unreachable(base_url: object, parse: Callable[[str], object] | None) -> str | None:
    """Why no request could reach `base_url` (after the URL shown: "" when that says it),
    or None when one could."""
    if not isinstance(base_url, str):
        return ""
    control = next((c for c in base_url if unicodedata.category(c) in _UNSEEN), None)
    if control is not None:  # a line break an env file left, which `urlsplit` drops unsaid
        return f": it holds {control!r}, and a URL holds no control or invisible characters"
    if base_url != base_url.strip():  # sent as %20 on every path: each call a wrong one
        return ": it has spaces around it"
    try:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return ""
    except ValueError:  # a malformed host (`http://[::1`)
        return ""
    if any(c.isspace() for c in parts.netloc):  # no host holds one
        return ": its host holds a space"
    try:
        parts.port  # noqa: B018 - read to check it
    except ValueError:  # `:114340`, `:11434abc`
        return ": its port is not a number from 0 to 65535"
    if parse is not None:
        try:
            parse(base_url)
        except Exception as exc:  # the HTTP client's `InvalidURL` (an invalid IDNA host name)
            return f": {type(exc).__name__}: {exc}"
    return None


def credential(owner: str, name: str, value: object) -> str | None:
    """The key or token `value` (the setting `name`) as a request header sends it: without the
    whitespace around it (a secret file's last line break, which the HTTP client refused in
    every call, its error showing the whole key); a `UsageError` naming the setting, never the
    value, for one holding a control or non-ASCII character, which no header carries."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise UsageError(f"{owner}: {name} must be text, not {type(value).__name__}")
    value = value.strip()
    if not all(" " <= c <= "~" for c in value):
        raise UsageError(
            f"{owner}: {name} holds a control or non-ASCII character; a key or token is one "
            "line of printable ASCII (its value is not shown)"
        )
    return value
