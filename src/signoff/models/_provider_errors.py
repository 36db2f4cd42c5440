"""What a provider's failure says: its error text cut short, a proxy's page read as words, the
credentials its client sends hidden, and what a connection error means."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from html.parser import HTMLParser
from typing import Any
from urllib.parse import quote, quote_plus, unquote, urlsplit

from .._exceptions import SignoffError
from ._urls import SECRET_PARAM

__all__ = [
    "body_error",
    "cause_of",
    "client_secrets",
    "connection_problem",
    "cut",
    "head",
    "hidden",
    "hide_secrets",
    "page_text",
    "secret_forms",
    "status_detail",
    "status_hint",
]


# How much of a server's own error text a message keeps: a page of megabytes helps nobody, and
# would be stored whole in the turn's failure on every retry.
_DETAIL_CHARS = 2000

# The credentials of the call `hide_secrets` holds, which each cut hides before it cuts: hidden
# after, a key the cut split (`sk-fake-t [cut]`) was recorded in part.
_SECRETS: ContextVar[tuple[str, ...]] = ContextVar("signoff_model_secrets", default=())


def cut(text: str) -> str:
    """`text` as an error message shows it: at most `_DETAIL_CHARS` characters, then `[cut]`."""
    text = hidden(text, _SECRETS.get())
    return text if len(text) <= _DETAIL_CHARS else text[:_DETAIL_CHARS] + " [cut]"


def head(text: str, chars: int) -> str:
    """The first `chars` characters of `text`, the credentials of the call hidden first."""
    return hidden(text, _SECRETS.get())[:chars]


def status_detail(exc: BaseException) -> str:
    """The error an API returned, from the body of an SDK status error: `type: message`."""
    return cut(_status_detail(exc))


def _status_detail(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            kind = error.get("type")
            prefix = f"{kind}: " if isinstance(kind, str) and kind else ""
            return prefix + str(error["message"])
        if isinstance(error, str):
            return error
        detail = body.get("detail")  # a FastAPI-based server's (vLLM's, a proxy's)
        if isinstance(detail, str) and detail:
            return detail
        if body:
            # The openai SDK's message says only "Error code: 422": what the server said is
            # in the body, whatever its shape.
            try:
                return json.dumps(body, ensure_ascii=False, default=str)
            except (ValueError, RecursionError):
                pass
    if isinstance(body, str):
        # A proxy's page (nginx's 413, a load balancer's 502) or plain text: its words.
        text = page_text(body)
        if text:
            return text
    return str(getattr(exc, "message", exc))


class _PageText(HTMLParser):
    """The text of a page outside its scripts and styles (linear in the page, where a pattern
    for tags backtracks over a hostile `<<<<...`)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.words: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag in ("script", "style"):
            self._skipping += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._skipping:
            self._skipping -= 1

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.words.extend(data.split())


def page_text(body: str) -> str:
    """The words of an error page or text (its first 32 KB read): tags, scripts and styles
    left out, entities read, runs of whitespace made one space."""
    read = head(body, 16 * _DETAIL_CHARS)
    reader = _PageText()
    try:
        reader.feed(read)
        reader.close()
    except Exception:  # the parser's own trouble with a malformed page: its text as it is
        return " ".join(read.split())
    return " ".join(reader.words)


def body_error(body: Any) -> str | None:
    """The error a 200 reply carries in place of a result (a gateway passing on an upstream
    failure, or a compatible server's `{"object": "error", ...}`), as `type: message`; else None."""

    def field(value: Any, key: str) -> Any:
        return value.get(key) if isinstance(value, dict) else getattr(value, key, None)

    error = field(body, "error")
    if error is None and "error" in (field(body, "object"), field(body, "type")):
        error = body
    if error is None:
        # A FastAPI-based server's or proxy's error (vLLM's) is `{"detail": ...}`.
        error = field(body, "detail")
    if isinstance(error, str) and error:
        return cut(error)
    message = field(error, "message")
    if not isinstance(message, str):
        return None
    kind = field(error, "type")
    prefix = f"{kind}: " if isinstance(kind, str) and kind and kind != "error" else ""
    return cut(prefix + message)


def status_hint(status: int) -> str:
    """What to check for a status that retrying will not fix."""
    if status in (401, 403):
        return " (check the API key)"
    if status == 404:
        return " (check the model name and base_url)"
    return ""


# Header names whose values are credentials (`Authorization`, `api-key`, `x-portkey-api-key`,
# `cf-aig-authorization`): a gateway that echoes one in an error must not have it recorded.
_SECRET_HEADER = re.compile(r"auth|key|token|secret|cookie", re.IGNORECASE)
# Shorter values are no credential worth hiding (`unused`, a local server's `x`), and hiding
# them would garble the message around every word that holds them.
_LEAST_SECRET = 8


def client_secrets(client: Any, params: Mapping[str, Any] | None = None) -> list[str]:
    """The credentials an SDK client sends, with a model's `params` on each call: its API key,
    auth token, the login in its base URL (`_userinfo`), the values of its custom headers and
    `params`' `extra_headers` named like credentials (a `Bearer` value's token alone too), and
    of its default query and `params`' `extra_query` parameters named as credentials (`?key=`,
    as given and URL-encoded), longest first."""
    found: list[Any] = [getattr(client, "api_key", None), getattr(client, "auth_token", None)]
    found += _userinfo(getattr(client, "base_url", None))
    extra = params if isinstance(params, Mapping) else {}
    for headers in (getattr(client, "_custom_headers", None), extra.get("extra_headers")):
        for name, value in _named(headers):
            if _SECRET_HEADER.search(name):
                found += [value, value.rpartition(" ")[2]]
    for query in (getattr(client, "_custom_query", None), extra.get("extra_query")):
        for name, value in _named(query):
            if SECRET_PARAM.search(name):  # and as a URL echoed carries it, encoded
                found += [value, quote(value, safe=""), quote_plus(value)]
    found += _body_secrets(extra.get("extra_body"))  # a gateway's key sent in the body
    return secret_forms(found)


def _body_secrets(body: Any) -> list[str]:
    """The text in `extra_body` under a key named as a credential (`gateway_key`, an
    `authorization` object, a list of `api_keys`), at any depth below it: a provider's 400 may
    quote the body back."""
    found: list[str] = []
    stack: list[tuple[Any, bool]] = [(body, False)]
    seen: set[int] = set()
    while stack:
        item, under = stack.pop()
        if isinstance(item, str):
            if under:
                found.append(item)
            continue
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, Mapping):
            stack.extend(
                (value, under or (isinstance(key, str) and _secret_key(key)))
                for key, value in item.items()
            )
        elif isinstance(item, list | tuple):
            stack.extend((value, under) for value in item)
    return found


def _secret_key(name: str) -> bool:
    """Whether a body key names a credential, as a header or query parameter would."""
    return bool(_SECRET_HEADER.search(name) or SECRET_PARAM.search(name))


def secret_forms(values: Sequence[Any]) -> list[str]:
    """The text `values` (the credentials a call sends) and the forms an error may show them in,
    longest first: as escaped in a repr of their bytes (httpx's `Illegal header value
    b'Bearer sk-...\\n'` showed a key read from a file with its line break whole) or of
    themselves, in `unicode_escape` or JSON, and without the whitespace around them."""
    kept: set[str] = set()
    for value in values:
        if not isinstance(value, str):
            continue
        encoded = value.encode("utf-8", "surrogatepass")
        forms = {
            value,
            value.strip(),
            repr(encoded)[2:-1],
            repr(value)[1:-1],
            value.encode("unicode_escape").decode("ascii"),
            json.dumps(value)[1:-1],
            json.dumps(value, ensure_ascii=False)[1:-1],
        }
        kept |= {f for f in forms if len(f.strip()) >= _LEAST_SECRET}
    return sorted(kept, key=len, reverse=True)


def _userinfo(url: Any) -> list[str]:
    """The password in a client's base URL (or a user name with none, often a token:
    `https://TOKEN@gateway`), as written there and decoded, and the basic-auth token the HTTP
    client makes of them for each request, which a server may echo. A user name beside a
    password is shown, as `shown_url` shows it (`svc-gateway` blanked the host too)."""
    if url is None:
        return []
    try:
        parts = urlsplit(str(url))
        user, password = parts.username, parts.password
    except ValueError:  # a malformed URL: no request went anywhere with it
        return []
    if not user and not password:
        return []
    found = [password or user or ""]  # one of them is there
    found += [unquote(s) for s in found]
    pair = f"{unquote(user or '')}:{unquote(password or '')}".encode("utf-8", "surrogatepass")
    return [*found, base64.b64encode(pair).decode("ascii")]


def _named(values: Any) -> Iterator[tuple[str, str]]:
    """The text values of a mapping of headers or query parameters, by name."""
    if isinstance(values, Mapping):
        for name, value in values.items():
            if isinstance(name, str) and isinstance(value, str):
                yield name, value


@contextmanager
def hide_secrets(client: Any, params: Mapping[str, Any] | None = None) -> Iterator[None]:
    """Within it, a signoff error raised has the credentials `client` sends (with `params` on
    each call) replaced by `[redacted]` in its message, and an error text cut is hidden before
    the cut: a server or gateway that echoes the key it was sent in its error (`invalid x-api-key
    sk-...`) had it recorded in the turn's failure, which anyone who may read the session reads,
    and shown by the dashboard and the CLI. So do the messages of the errors it was raised from
    (the SDK's)."""
    secrets = client_secrets(client, params)
    token = _SECRETS.set(tuple(secrets))
    try:
        yield
    except SignoffError as exc:
        seen: set[int] = set()
        error: BaseException | None = exc
        # The SDK's errors it was raised from too: a trace's stack (with content on) and a
        # logged traceback show their messages.
        while secrets and error is not None and id(error) not in seen:
            seen.add(id(error))
            error.args = tuple(hidden(a, secrets) if isinstance(a, str) else a for a in error.args)
            if isinstance(getattr(error, "message", None), str):
                error.message = hidden(error.message, secrets)  # type: ignore[attr-defined]
            error = error.__cause__ or error.__context__
        raise
    finally:
        with suppress(ValueError):  # a call closed unfinished from another context restores none
            _SECRETS.reset(token)


def hidden(text: str, secrets: Sequence[str]) -> str:
    """`text` with each of `secrets` (`secret_forms`, longest first) replaced by `[redacted]`."""
    for secret in secrets:
        text = text.replace(secret, "[redacted]")
    return text


def cause_of(exc: BaseException) -> str:
    """What lies under an SDK connection error, for a message that says what failed."""
    cause = exc.__cause__ or exc.__context__
    return f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)


def connection_problem(exc: BaseException) -> str:
    """Whether a connection error happened before the server was reached, in the middle of its
    answer (a body cut short), or after it (a body labelled with an encoding it does not have),
    so the message does not send anyone to check the address."""
    cause = exc.__cause__ or exc.__context__
    kind = type(cause).__name__
    if kind == "DecodingError":
        return f"the body could not be decoded ({cause_of(exc)})"
    if kind == "LocalProtocolError":  # refused by the HTTP client itself (a header value)
        return f"the request could not be sent ({cause_of(exc)})"
    broke = kind in ("RemoteProtocolError", "ReadError", "WriteError")
    return f"{'the connection broke' if broke else 'cannot connect'} ({cause_of(exc)})"
