"""Webhook URLs: the ones a `WebhookChannel` is given, checked when it is configured, and how
logs and errors show them (a password, query values and a fragment masked)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .._exceptions import UsageError

__all__ = ["checked_urls", "endpoint", "httpx_module", "masked", "spellings", "without_login"]

_HOST = re.compile(rb"[A-Za-z0-9._-]+")
"""A host as httpx sends it (IDNA-encoded): a name, or an IPv4 address."""


def checked_urls(urls: str | Sequence[str]) -> list[str]:
    """`urls` as a list, each an http(s) URL httpx can send to, naming a host and a usable port,
    none twice (one queue per URL: twice would deliver twice). Each is its `endpoint`: a scheme
    and a host are case-insensitive (RFC 3986 3.1, 3.2.2) and a scheme's own port is no other,
    so `HTTPS://Example.com:443/x` and `https://example.com/x` are one URL, as are
    `http://host` and `http://host/`."""
    httpx = httpx_module()  # fail at configuration time, with the install hint
    if not isinstance(urls, str | Sequence):
        raise UsageError(f"WebhookChannel takes a URL or a list of URLs, not {urls!r}")
    given = [_lowercase_scheme(url) for url in ([urls] if isinstance(urls, str) else urls)]
    if not given:
        raise UsageError("WebhookChannel needs at least one URL")
    url_list: list[str] = []
    for url in given:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise UsageError(f"a webhook URL must be http(s)://..., not {masked(url)!r}")
        try:
            parsed = httpx.URL(url)
            host, port = parsed.host, parsed.port  # .host decodes IDNA
        except (httpx.InvalidURL, UnicodeError) as exc:  # UnicodeError: a bad IDNA host
            raise UsageError(f"not a usable webhook URL: {_unusable(url, exc)}") from None
        if not host:
            raise UsageError(f"the webhook URL {masked(url)!r} names no host")
        if not _HOST.fullmatch(parsed.raw_host) and b":" not in parsed.raw_host:
            # httpx takes `exa mple.com` as `exa%20mple.com`, which no lookup finds: every
            # delivery would fail, retried for good. (An IPv6 address holds `:`.)
            raise UsageError(
                f"the webhook URL {masked(url)!r} names no usable host: a host name or address "
                "holds only letters, digits, `.`, `-` and `_`"
            )
        if port is not None and not 0 < port < 65536:  # else each send raises
            raise UsageError(f"the webhook URL {masked(url)!r} names no usable port")
        url = endpoint(url)
        if url in url_list:  # one queue per URL: twice would deliver twice
            raise UsageError(f"the webhook URL {masked(url)!r} is given twice")
        url_list.append(url)
    return url_list


_OWN_PORTS = {"http": "80", "https": "443"}


def endpoint(url: str) -> str:
    """`url` as one endpoint is written however it was spelled: its scheme and host in
    lowercase, its scheme's own port (`:443` of https) left out, no path as `/` (what httpx
    sends to), the rest (path, query, any login) as it is. Deliveries are queued and kept
    under it. A URL httpx cannot read, or one whose rewriting httpx would read otherwise, is
    returned as it is."""
    httpx = httpx_module()
    scheme, sep, rest = str(_lowercase_scheme(url)).partition("://")
    # The authority as httpx reads it: up to the first `/`, `?` or `#`; its host after the
    # last `@`, then an optional `:port` (an IPv6 host is in brackets).
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    login, at, hostport = rest[:end].rpartition("@")
    if hostport.startswith("["):
        host, bracket, port = hostport.partition("]")
        host += bracket
        port = port.removeprefix(":")
    else:
        host, _, port = hostport.partition(":")
    if port.lstrip("0") == _OWN_PORTS.get(scheme):  # no int(): a stored key may be anything
        port = ""
    path = rest[end:] if rest[end:].startswith("/") else f"/{rest[end:]}"  # as httpx sends it
    shown = f"{scheme}{sep}{login}{at}{host.lower()}{':' if port else ''}{port}{path}"
    try:
        same = _read(httpx.URL(shown)) == _read(httpx.URL(url))
    except (httpx.InvalidURL, UnicodeError):
        return url
    return shown if same else url


def spellings(url: str) -> list[str]:
    """`url` (an `endpoint`) and the spelling an earlier signoff kept its deliveries and waits
    under in the store, by digest, when it was given without a path (`http://host`, now
    `http://host/`). Other spellings were written as the operator gave them, and are not known."""
    scheme, sep, rest = url.partition("://")
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    if not sep or rest[end : end + 1] != "/" or rest[end + 1 : end + 2] not in ("", "?", "#"):
        return [url]
    return [url, f"{scheme}{sep}{rest[:end]}{rest[end + 1 :]}"]


def _read(url: Any) -> tuple[Any, ...]:
    """What httpx sends to for an `httpx.URL`, a host in any case the same."""
    return (url.scheme, url.userinfo, url.host.lower(), url.port, url.raw_path, url.fragment)


def without_login(url: str) -> tuple[Any, Any]:
    """`url` as an `httpx.URL` without its user name and password, and the Basic auth httpx
    would have sent for them (None without any), so that no request carries them in its URL."""
    httpx = httpx_module()
    parsed = httpx.URL(url)
    bare = parsed.copy_with(userinfo=b"") if parsed.userinfo else parsed
    if not (parsed.username or parsed.password):  # as httpx: `http://:@host/` sends none
        return bare, None
    return bare, httpx.BasicAuth(parsed.username, parsed.password)


def _lowercase_scheme(url: object) -> object:
    """`url` with its http(s) scheme, in whatever case it came, in lowercase; anything else as
    it is (`checked_urls` names what it refuses)."""
    if not isinstance(url, str):
        return url
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in ("http", "https"):
        return f"{scheme.lower()}://{rest}"
    return url


def masked(url: object) -> object:
    """`url` as logs and errors show it, with what may be a secret masked: its login (see
    `_login_masked`) and the value of each query parameter (`?token=***&to=***`; the names
    stay, to tell URLs apart), and a fragment. What is not a string is shown as it is (the
    error naming it says it is no URL)."""
    if not isinstance(url, str):
        return url
    return _query_masked(_login_masked(url))


def _query_masked(url: str) -> str:
    """`url` with each query parameter's value, and any fragment, as `***`: a token the
    receiver checks (`?token=...`) is often there. The query starts at the first `?` past the
    `://` (a login `_login_masked` left holds none), the fragment at the first `#`."""
    head, sep, rest = url.partition("://")
    if not sep:
        head, rest = "", url
    before, hash_, fragment = rest.partition("#")
    path, question, query = before.partition("?")
    if question:
        params = re.split(r"([&;])", query)
        for i, param in enumerate(params):
            if param in ("&", ";") or not param:
                continue
            name, eq, value = param.partition("=")
            params[i] = (f"{name}=***" if value else param) if eq else "***"
        query = "".join(params)
    return f"{head}{sep}{path}{question}{query}{hash_}{'***' if fragment else ''}"


def _login_masked(url: str) -> str:
    """`url` with what may be a password masked: the userinfo httpx reads (the last `@` before
    the first `/`, `?` or `#`), which it sends as Basic auth, and a password holding one of
    those unencoded, which httpx reads as a port and path (`u:123/pw@h` is host `u`): from
    the first `:` to the last `@`."""
    scheme, sep, rest = url.partition("://")
    last = rest.rfind("@")
    if not sep or last < 0:
        return url
    ends = [i for i in (rest.find(c) for c in "/?#") if i >= 0]
    authority = rest[: min(ends, default=len(rest))]
    at = authority.rfind("@")  # where httpx's userinfo ends, if it reads one
    colon = authority.partition("[")[0].find(":")  # not one of an IPv6 host's
    if 0 <= colon < at or (at < 0 and colon >= 0):
        shown = f"{scheme}://{rest[:colon]}:***@{rest[last + 1 :]}"
    elif at >= 0:  # a user name alone (a token, often) is sent as Basic auth too
        shown = f"{scheme}://***@{rest[at + 1 :]}"
    else:
        return url
    return shown if _sends_nothing_shown(url, shown) else f"{scheme}://***@{rest[last + 1 :]}"


def _sends_nothing_shown(url: str, shown: str) -> bool:
    """Whether the Basic auth httpx would send for `url` is out of `shown`: a check on the mask
    by httpx's own reading."""
    httpx = httpx_module()
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, UnicodeError):
        return True  # it sends nothing at all
    # The user name is shown beside a password, and is the secret without one; only the shown
    # userinfo can hold it (the host on follows the last `@`).
    secret = parsed.password if b":" in parsed.userinfo else parsed.username
    return not secret or secret not in shown.partition("://")[2].rpartition("@")[0]


def _unusable(url: str, exc: Exception) -> str:
    """What the error about a URL httpx cannot read shows. The parser's message may quote part
    of a password holding `/`, `?` or `#` unencoded (`Invalid port: ...`): it is left out when
    something masked lies past where httpx's userinfo ends."""
    shown = masked(url)
    rest = url.partition("://")[2]
    if _login_masked(url) != url and any(0 <= rest.find(c) < rest.rfind("@") for c in "/?#"):
        return f"{shown!r} (is a password in it not percent-encoded?)"
    return f"{shown!r} ({exc})"


def httpx_module() -> Any:
    """The `httpx` module, or a `UsageError` with the install hint when it is not installed."""
    try:
        import httpx
    except ImportError as exc:  # pragma: no cover - depends on the extras installed
        raise UsageError("webhooks need httpx: pip install 'signoff[webhooks]'") from exc
    return httpx
