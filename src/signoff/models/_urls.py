"""URLs as the models' reprs and errors show them."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["shown_url"]


def shown_url(url: object) -> str:
    """A URL as a repr or an error shows it, its password left out: an error is recorded in the
    session's log, which anyone who may read the session reads."""
    text = str(url)
    parts = urlsplit(text)
    if parts.password is None:
        return text
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
