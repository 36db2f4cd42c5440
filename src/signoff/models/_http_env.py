"""The HTTP settings httpx takes from the environment (proxies, CA bundle), read from a given
mapping instead.

A model made with `env=` builds its HTTP client with `trust_env=False`, so the process's
`HTTPS_PROXY` or `SSL_CERT_FILE` cannot redirect it or change whom it trusts; the ones the
mapping names apply, read as httpx reads them: `<scheme>_proxy` for http, https and all in
either case (the lower-case name wins, as in `urllib`), `NO_PROXY`, `SSL_CERT_FILE` and
`SSL_CERT_DIR` (and `SSLKEYLOGFILE`, which Python's `ssl` reads when a CA bundle is named).
"""

from __future__ import annotations

import importlib
import ipaddress
import ssl
from collections.abc import Mapping
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from .._exceptions import UsageError
from ._urls import shown_url

__all__ = ["HttpEnv", "http_package", "proxy_routes"]


def _proxies(env: Mapping[str, str]) -> dict[str, str]:
    """`<scheme>_proxy` settings by scheme (`no` for `NO_PROXY`), as `urllib.request`'s
    `getproxies_environment` reads them: any case first, then lower case over it."""
    proxies: dict[str, str] = {}
    for name, value in env.items():
        name = name.lower()
        if value and name.endswith("_proxy"):
            proxies[name[:-6]] = value
    if "REQUEST_METHOD" in env:  # a CGI request's `Proxy:` header arrives as HTTP_PROXY
        proxies.pop("http", None)
    for name, value in env.items():
        if name.endswith("_proxy"):
            if value:
                proxies[name[:-6]] = value
            else:
                proxies.pop(name[:-6], None)
    return proxies


def _is_ip(hostname: str, kind: type[ipaddress.IPv4Address | ipaddress.IPv6Address]) -> bool:
    try:
        kind(hostname.split("/")[0])
    except ValueError:
        return False
    return True


def _direct(hostname: str) -> str | None:
    """The httpx URL pattern a `NO_PROXY` entry sends directly, or None for one it ignores."""
    if "://" in hostname:
        return hostname
    if _is_ip(hostname, ipaddress.IPv6Address):
        addr, slash, subnet = hostname.partition("/")
        return f"all://[{addr}]/{subnet}" if slash else f"all://[{hostname}]"
    if (
        _is_ip(hostname, ipaddress.IPv4Address)
        or hostname.lower() == "localhost"
        or hostname.startswith("[")
        or (hostname.startswith("*.") and "/" not in hostname)
    ):
        return f"all://{hostname}"
    if "/" not in hostname:
        return f"all://*{hostname}"  # a domain and its subdomains
    return None


def proxy_routes(env: Mapping[str, str]) -> dict[str, str | None]:
    """URL pattern -> proxy URL (None: go directly), as httpx's `get_environment_proxies`
    makes them from the process environment, here from `env`."""
    proxies = _proxies(env)
    routes: dict[str, str | None] = {}
    for scheme in ("http", "https", "all"):
        if proxies.get(scheme):
            url = proxies[scheme]
            routes[f"{scheme}://"] = url if "://" in url else f"http://{url}"
    for hostname in (h.strip() for h in proxies.get("no", "").split(",")):
        if hostname == "*":
            return {}
        pattern = _direct(hostname) if hostname else None
        if pattern is not None:
            routes[pattern] = None
    return routes


def http_package(sdk: ModuleType) -> ModuleType:
    """The HTTP package (`httpx`, or the `httpx2` of newer SDKs) the SDK's clients are made of."""
    for cls in sdk.DefaultAsyncHttpxClient.__mro__:
        if cls.__name__ == "AsyncClient" and not cls.__module__.startswith(sdk.__name__):
            return importlib.import_module(cls.__module__.partition(".")[0])
    raise TypeError(f"{sdk.__name__}.DefaultAsyncHttpxClient is not an httpx AsyncClient")


def _ca_context(owner: str, env: Mapping[str, str]) -> ssl.SSLContext | None:
    """The context verifying servers with the CA bundle `env` names, as httpx would make it
    from the process environment; None for the default one."""
    for name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
        path = env.get(name)
        if not path:
            continue
        try:
            if name == "SSL_CERT_FILE":
                context = ssl.create_default_context(cafile=path)
            else:
                context = ssl.create_default_context(capath=path)
            # create_default_context took SSLKEYLOGFILE from the process: the mapping's instead
            context.keylog_filename = env.get("SSLKEYLOGFILE") or None  # type: ignore[assignment]
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"{owner}: {name}={path!r} cannot be loaded: {exc}") from None
        return context
    return None


class _NoTransport:
    """Stands in for the default transport while mount patterns are checked, so the check
    makes no connection pool or SSL context."""


class HttpEnv:
    """The proxies and CA bundle `env` names, checked when the model is made; each SDK client
    made later gets an HTTP client following them and nothing of the process's."""

    def __init__(self, owner: str, sdk: ModuleType, env: Mapping[str, str]) -> None:
        self._http = http = http_package(sdk)
        self._limits = getattr(sdk, "DEFAULT_CONNECTION_LIMITS", None) or http.Limits()
        self.verify: ssl.SSLContext | None = _ca_context(owner, env)
        self.routes: dict[str, str | None] = {}
        for pattern, url in proxy_routes(env).items():
            try:
                http.AsyncClient(transport=_NoTransport(), trust_env=False, mounts={pattern: None})
            except (ValueError, http.InvalidURL):
                continue  # httpx, too, ignores a NO_PROXY entry it cannot parse
            if url is not None:
                try:
                    http.Proxy(url)
                except (ValueError, http.InvalidURL) as exc:
                    name = pattern.removesuffix("://").upper() + "_PROXY"
                    raise UsageError(  # its login left out, here and in httpx's own words
                        f"{owner}: the proxy URL {name} names ({_shown(url)}) is not usable: "
                        f"{_without_login(str(exc), url)}"
                    ) from None
            self.routes[pattern] = url

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for the SDK's `DefaultAsyncHttpxClient`: no settings from the
        process environment, a transport through each proxy, and the CA bundle given."""
        http = self._http
        verify: ssl.SSLContext | bool = True if self.verify is None else self.verify
        mounts = {
            pattern: None
            if url is None
            else http.AsyncHTTPTransport(
                proxy=url, verify=verify, trust_env=False, limits=self._limits
            )
            for pattern, url in self.routes.items()
        }
        return {"trust_env": False, "verify": verify, "mounts": mounts}


def _shown(url: str) -> str:
    """A proxy URL as an error shows it: its login's password (or token) left out."""
    try:
        return shown_url(url)
    except ValueError:  # too malformed to split: nothing of it is shown
        return "a URL that cannot be read"


def _without_login(text: str, url: str) -> str:
    """`text` (the HTTP library's error) without the user name or password of `url`'s login,
    which it shows but for a password (`ftp://TOKEN@proxy`: a token as the user name)."""
    try:
        parts = urlsplit(url)
        login = [parts.username, parts.password]
    except ValueError:
        return "the HTTP library refused it"
    for value in sorted((v for v in login if v), key=len, reverse=True):
        text = text.replace(value, "***")
    return text
