"""What the real model providers share: argument checks, prices, tool-result text, SDK loading."""

from __future__ import annotations

import asyncio
import importlib
import json
import math
import re
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import ModuleType
from typing import Any, Generic, Self, TypeVar

from .._exceptions import ModelError, UsageError
from .._tool_json import UNPARSED_ARGUMENTS, nests_deeper
from .._types import MODEL_NAME_MAX
from ._http_env import HttpEnv
from ._params import check_params
from ._provider_errors import (
    connection_problem,
    hidden,
    secret_forms,
    status_detail,
    status_hint,
)
from ._reply_cap import ReplyTooLarge, capped_http_client
from ._retry_after import long_wait_note
from ._urls import shown_url

__all__ = [
    "SdkModel",
    "ANTHROPIC_PRICES",
    "OPENAI_CACHED_PRICES",
    "OPENAI_MAX_OUTPUT",
    "OPENAI_PRICES",
    "UNPARSED_ARGUMENTS",
    "LoopClients",
    "check_price",
    "check_rate",
    "call_bound",
    "cap_output",
    "check_params",
    "check_positive",
    "encode_tool_result",
    "load_sdk",
    "lookup_price",
    "plain_input",
    "plain_int",
    "scrub",
    "served_model",
    "shown_url",
]


Price = tuple[float, float]

# USD per million (input, output) tokens of well-known models, list prices of late 2025 (and
# the newer Anthropic models below, with their source).
# Matched exactly or with a date / "-latest" suffix; pass `price_per_mtok=` to override. A
# dated snapshot listed at other prices than its base model is named exactly (it is found
# before the suffix match would give it its base's).
OPENAI_PRICES: dict[str, Price] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-2024-05-13": (5.00, 15.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "o3": (2.00, 8.00),
    "o3-mini": (1.10, 4.40),
    "o4-mini": (1.10, 4.40),
}
# USD per million cached input tokens (prompt_tokens_details.cached_tokens, part of the
# prompt's), the same list prices: a quarter or half of the input price.
OPENAI_CACHED_PRICES: dict[str, float] = {
    "gpt-4o": 1.25,
    "gpt-4o-2024-05-13": 5.00,  # no prompt caching: the input price, not gpt-4o's discount
    "gpt-4o-mini": 0.075,
    "gpt-4.1": 0.50,
    "gpt-4.1-mini": 0.10,
    "gpt-4.1-nano": 0.025,
    "o3": 0.50,
    "o3-mini": 0.55,
    "o4-mini": 0.275,
}
ANTHROPIC_PRICES: dict[str, Price] = {
    "claude-3-haiku": (0.25, 1.25),
    "claude-3-5-haiku": (0.80, 4.00),
    "claude-haiku-4-5": (1.00, 5.00),
    "claude-3-5-sonnet": (3.00, 15.00),
    "claude-3-7-sonnet": (3.00, 15.00),
    "claude-sonnet-4": (3.00, 15.00),
    "claude-sonnet-4-0": (3.00, 15.00),  # the alias of claude-sonnet-4-20250514
    "claude-sonnet-4-5": (3.00, 15.00),
    "claude-opus-4": (15.00, 75.00),
    "claude-opus-4-0": (15.00, 75.00),  # the alias of claude-opus-4-20250514
    "claude-opus-4-1": (15.00, 75.00),
    # From Anthropic's own model pages, platform.claude.com/docs/en/models/<model>/overview
    # ("Input pricing" / "Output pricing"), and the comparison tables on those pages (Sonnet
    # 5.5, Fable 5 and 5.1), as read in December 2026. Haiku 5.5 lists no single price.
    "claude-opus-4-5": (5.00, 25.00),
    "claude-opus-4-6": (5.00, 25.00),
    "claude-opus-4-8": (5.00, 25.00),
    "claude-sonnet-4-6": (3.00, 15.00),
    "claude-opus-5": (5.00, 25.00),
    "claude-opus-5-5": (4.00, 20.00),
    "claude-sonnet-5": (2.00, 10.00),
    "claude-sonnet-5-5": (2.00, 10.00),
    "claude-fable-5": (10.00, 50.00),
    "claude-fable-5-1": (10.00, 50.00),
}

# The most output tokens a reply of these models may have (OpenAI's model pages): what a cap
# the budgets set must stay under when the model is given no max_tokens of its own. Exact names
# only: an older snapshot may take fewer (gpt-4o-2024-05-13 takes 4,096).
OPENAI_MAX_OUTPUT: dict[str, int] = {
    "gpt-4o": 16_384,
    "gpt-4o-mini": 16_384,
    "gpt-4.1": 32_768,
    "gpt-4.1-mini": 32_768,
    "gpt-4.1-nano": 32_768,
    "o3": 100_000,
    "o3-mini": 100_000,
    "o4-mini": 100_000,
}

_SUFFIX = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8}|latest)")


P = TypeVar("P")


def lookup_price(model: str, table: Mapping[str, P]) -> P | None:
    """The price of `model` from `table`, or None for models it does not know (local ones)."""
    if model in table:
        return table[model]
    for name, price in table.items():
        if model.startswith(name) and _SUFFIX.fullmatch(model[len(name) :]):
            return price
    return None


# A dollar a token, far above any list price: a price past it (or infinite) priced a response
# as infinity or NaN, which the log refuses, so every turn failed.
_MAX_PRICE = 1_000_000.0


def check_price(owner: str, value: object) -> Price | None:
    """Validate a `price_per_mtok=(input, output)` argument."""
    if value is None:
        return None
    if (
        not isinstance(value, tuple | list)
        or len(value) != 2
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        or not all(0 <= v <= _MAX_PRICE for v in value)
    ):
        try:
            shown = repr(value)[:200]
        except ValueError:  # an int of more digits than Python writes out
            shown = "a number too long to show"
        raise UsageError(
            f"{owner}: price_per_mtok must be (input_usd, output_usd) per million tokens, "
            f"two numbers from 0 to {_MAX_PRICE:,.0f}; got {shown}"
        )
    return (float(value[0]), float(value[1]))


def check_rate(
    owner: str, name: str, value: object, *, per: str = "million tokens"
) -> float | None:
    """Validate one price in USD `per` million tokens (`cached_price_per_mtok=`,
    `cache_write_price_per_mtok=`) or another unit (`web_search_price_per_1k=`)."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= _MAX_PRICE
    ):
        raise UsageError(
            f"{owner}: {name} must be a number of USD per {per} from 0 to "
            f"{_MAX_PRICE:,.0f}, not {value!r}"[:400]
        )
    return float(value)


def check_positive(owner: str, name: str, value: object, *, integer: bool = False) -> None:
    """Raise `UsageError` unless `value` is None or a positive number (an int if `integer`)."""
    if value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (integer and not isinstance(value, int))
        or not 0 < value < math.inf  # NaN passed `<= 0`
    ):
        kind = "integer" if integer else "number"
        raise UsageError(f"{owner}: {name} must be a positive, finite {kind}, not {value!r}")


def cap_output(
    kwargs: dict[str, Any],
    keys: tuple[str, ...],
    key: str,
    cap: int | None,
    known: int | None = None,
) -> bool:
    """Lower the reply's token limit in a request's `kwargs` (each of `keys` given, in
    `extra_body` too, which the SDK sends over them) to `cap`, what the session's budgets leave,
    or set `key` to it when none is given and the model's own limit is `known` and above it (a
    server refuses a limit past its model's, or past its context with the prompt). True when
    the cap was set, so that a reply stopped at the limit was cut short by the budget."""
    if cap is None:
        return False
    extra = kwargs.get("extra_body")
    places = [kwargs]
    if isinstance(extra, Mapping):
        kwargs["extra_body"] = extra = dict(extra)  # the caller's params stay as they were
        places.append(extra)
    given = {k: where[k] for where in places for k in keys if k in where}  # extra_body's last
    own = [v for v in given.values() if isinstance(v, int) and not isinstance(v, bool)]
    if own and min(own) <= cap:
        return False
    if not given and (known is None or known <= cap):
        return False
    for where in places:
        for k in keys:
            if k in where:
                v = where[k]
                plain = isinstance(v, int) and not isinstance(v, bool)
                where[k] = min(v, cap) if plain else cap
    if not given:
        kwargs[key] = cap
    return True


def encode_tool_result(content: Any) -> str:
    """A tool result as the text a model reads: strings as they are, anything else as JSON."""
    if isinstance(content, str):
        return content
    return json.dumps(content, ensure_ascii=False, default=str)


_SURROGATE = re.compile("[\ud800-\udfff]")


def scrub(value: Any) -> Any:
    """`value` with lone surrogates in its text replaced by U+FFFD: JSON can carry one (from a
    model or a tool) into the conversation, but a request holding one cannot be sent as UTF-8."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    return value


def plain_input(value: Any) -> Any:
    """A tool input parsed by the SDK, if it is plain JSON nested at most `MAX_INPUT_DEPTH`
    levels; else its text under `UNPARSED_ARGUMENTS`, so validation fails and the model is told
    (a NaN would slip past checks like `amount > 100`; input nested deeper breaks what shows it
    to a reviewer and sends it back)."""
    try:
        json.dumps(value, allow_nan=False)
        if nests_deeper(value):
            raise ValueError("nested too deeply")
    except (TypeError, ValueError, RecursionError):
        try:
            text = json.dumps(value, default=str)
        except (ValueError, RecursionError):
            text = "(arguments nested too deeply to show)"
        return {UNPARSED_ARGUMENTS: text}
    return value


SERVED_NAME_MAX = MODEL_NAME_MAX
"""Characters of a model name a reply gives that are kept, as `ModelResponse.model` takes."""


def served_model(value: Any, asked: str) -> str | None:
    """The model a reply says made it (a gateway's router or fallback, a dated version), when
    that is a name other than the one `asked` for: None when it is the same or names none."""
    name = plain_str(value)
    if not name or name == asked:
        return None
    name = "".join(c for c in name if c.isprintable())[:SERVED_NAME_MAX]
    return name or None


def plain_str(value: Any) -> str | None:
    """A string field of a reply (a finish or stop reason, a block type), or None when the
    server sent something else: a list there is not even a key to look up."""
    return value if isinstance(value, str) else None


# More tokens than any model reads or writes in a call, and than JSON readers hold exactly.
_MAX_TOKENS = 2**53 - 1


def plain_int(value: Any) -> int:
    """A token count from a reply: a whole number from 0 to 2**53 - 1 (`120.0` from some
    gateways too), anything else counts as 0 (a count past a float's range cannot be priced)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_TOKENS
    return value if ok else 0


def load_sdk(module: str, extra: str, owner: str) -> ModuleType:
    """Import a provider SDK, or explain which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise UsageError(
            f"{owner} needs the {module!r} package: pip install 'signoff[{extra}]'"
        ) from exc


def call_bound(client: Any, params: Mapping[str, Any] | None = None) -> float | None:
    """How long one model call may take, retries and the waits between them included: twice
    the call's timeout per attempt and its timeout per wait, so a server that trickles its
    answer (each byte in time for the SDK's read timeout) or asks to wait an hour before a retry
    cannot hold a turn and its session. The call's timeout is `params`' `timeout` (the SDK
    call's own) where given, else the client's; None when it has none, or an httpx `Timeout`
    with any part None (a wait the SDK lets last as long as it takes)."""
    timeout = call_timeout(client, params)
    if timeout is not None and not isinstance(timeout, int | float):
        parts = [getattr(timeout, k, None) for k in ("connect", "read", "write", "pool")]
        if any(p is None for p in parts):
            return None
        timeout = max((p for p in parts if isinstance(p, int | float)), default=None)
    retries = getattr(client, "max_retries", 0)
    if timeout is None or isinstance(retries, bool) or not isinstance(retries, int):
        return None
    return (3 * max(retries, 0) + 2) * float(timeout)


def call_timeout(client: Any, params: Mapping[str, Any] | None) -> Any:
    """The timeout the SDK applies to one call: `params`' `timeout`, which the SDKs' calls take
    in place of the client's, or the client's."""
    if params is not None and "timeout" in params:
        return params["timeout"]
    return getattr(client, "timeout", None)


def _reading_reply(exc: BaseException) -> bool:
    """Whether `exc` was raised while the SDK read a reply (in its `_response` module), rather
    than while it checked and built the request."""
    tb = exc.__traceback__
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).endswith("._response"):
            return True
        tb = tb.tb_next
    return False


C = TypeVar("C")


class LoopClients(Generic[C]):
    """One SDK client per event loop: an HTTP connection pool cannot move between loops."""

    def __init__(
        self,
        factory: Callable[[], C],
        close: Callable[[C], Awaitable[Any]],
        *,
        shared: bool = False,
    ) -> None:
        """`shared`: the factory gives every loop the same client (one passed in), which
        `crossed` then tells about."""
        self._factory = factory
        self._close = close
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, C] = (
            weakref.WeakKeyDictionary()
        )
        self._shared = shared
        self._first: weakref.ReferenceType[asyncio.AbstractEventLoop] | None = None

    def get(self) -> C:
        loop = asyncio.get_running_loop()
        if self._first is None:
            self._first = weakref.ref(loop)
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = self._factory()
        return client

    def crossed(self) -> bool:
        """Whether the one client passed in is used on another loop than the first that used
        it: its HTTP connections (and their locks) belong to that one."""
        first = None if self._first is None else self._first()
        return self._shared and first is not asyncio.get_running_loop()

    async def aclose(self) -> None:
        """Close the client of the running loop (each loop closes its own)."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await self._close(client)


class SdkModel:
    """What the SDK-backed models share: one SDK client per event loop (a client passed in is
    used as is and never closed), `aclose`, `async with`, and a short repr."""

    model: str
    max_reply_bytes: int
    price_per_mtok: Price | None  # USD per million (input, output) tokens; None: not known
    params: dict[str, Any]  # passed to each SDK call as they are
    _base_url: str | None
    _clients: LoopClients[Any]
    _sdk: ModuleType
    _sdk_error: str  # the name of the SDK's base exception class
    _http_env: HttpEnv | None = None  # the proxies and CA bundle of a model made with env=

    def _http_client(self) -> Any:
        """The HTTP client of an SDK client made here: the SDK's defaults, replies capped at
        `max_reply_bytes`, and with `env=` its proxies and CA bundle in place of the process's
        (a client passed in is used as it is)."""
        error: type[Exception] = getattr(self._sdk, self._sdk_error)
        options = None if self._http_env is None else self._http_env.client_options()
        return capped_http_client(self._sdk, error, self.max_reply_bytes, options)

    def _use_clients(
        self, factory: Callable[[], Any], client: Any | None, secrets: Iterable[Any] = ()
    ) -> None:
        """Make an SDK client with `factory` on each loop (or use `client`); one the SDK will not
        make fails the call with a `ModelError` naming the model, `secrets` (its key) hidden."""

        def make() -> Any:
            if client is not None:
                return client
            try:
                return factory()
            except Exception as exc:
                shown = hidden(f"{type(exc).__name__}: {exc}", secret_forms(list(secrets)))
                raise ModelError(f"{self!r}: the SDK client could not be made: {shown}") from None

        async def close(c: Any) -> None:
            if c is not client:
                await c.close()

        self._clients = LoopClients(make, close, shared=client is not None)

    def __repr__(self) -> str:
        where = f", base_url={shown_url(self._base_url)!r}" if self._base_url else ""
        return f"{type(self).__name__}({self.model!r}{where})"

    async def _request(
        self,
        sdk: Any,
        base_error: type[Exception],
        call: Callable[[], Awaitable[Any]],
        what: str,
        where: str,
    ) -> Any:
        """Await one SDK call, within `call_bound` of its client, turning each SDK failure into
        a `ModelError` that says what failed and where (or a `UsageError` when the SDK refuses
        the arguments)."""
        client = self._clients.get()
        params = self.params
        bound = call_bound(client, params)
        deadline = asyncio.timeout(bound)
        try:
            async with deadline:
                return await call()
        except TimeoutError as exc:
            if not deadline.expired():
                raise ModelError(f"{what} for {where} timed out: {exc}") from exc
            raise ModelError(
                f"{what} for {where} gave up after {bound:g} s (timeout="
                f"{call_timeout(client, params)}, max_retries="
                f"{getattr(client, 'max_retries', None)}): the server answered too slowly or "
                "asked to wait longer before a retry"
            ) from exc
        except ReplyTooLarge as exc:
            raise ModelError(f"{what} for {where} failed: {exc}") from exc
        except TypeError as exc:
            raise UsageError(f"{self!r}: the SDK refused the request's arguments: {exc}") from exc
        except sdk.APIStatusError as exc:
            raise ModelError(
                f"{what} for {where} failed: HTTP {exc.status_code}: "
                f"{status_detail(exc)}{status_hint(exc.status_code)}"
                f"{long_wait_note(getattr(exc, 'response', None))}"
            ) from exc
        except sdk.APITimeoutError as exc:
            raise ModelError(f"{what} for {where} timed out") from exc
        except sdk.APIConnectionError as exc:
            raise ModelError(f"{what} for {where} failed: {connection_problem(exc)}") from exc
        except base_error as exc:
            raise ModelError(f"{what} for {where} failed: {type(exc).__name__}: {exc}") from exc
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            # The SDKs parse a 200's body unguarded: a proxy's truncated or garbled reply.
            raise ModelError(
                f"{what} for {where} returned a body that is not JSON: {type(exc).__name__}: {exc}"
            ) from exc
        except ValueError as exc:
            if not _reading_reply(exc):
                # The SDK's own check of the request, before sending it (a max_tokens it
                # expects to take longer than a non-streamed call may): no retry will pass it.
                raise UsageError(f"{self!r}: the SDK refused the request: {exc}") from exc
            # JSON the parser will not read, such as a number of more than 4,300 digits.
            raise ModelError(
                f"{what} for {where} returned a body that cannot be read: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        except RuntimeError as exc:
            if not self._clients.crossed() or "loop" not in str(exc):
                raise
            # A Runtime's *_sync twins run on a loop of their own: the pool cannot follow.
            raise ModelError(
                f"{what} for {where} failed: the client= passed to {type(self).__name__} was "
                "first used on another event loop, and its HTTP connections cannot be used on "
                "this one (a Runtime's *_sync calls run on a loop of their own): pass base_url="
                "/api_key= (or env=) instead, and a client is made for each loop; or use the "
                f"runtime from one loop ({type(exc).__name__}: {exc})"
            ) from exc

    async def aclose(self) -> None:
        """Close the HTTP client this model opened (a client passed in is left open)."""
        await self._clients.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
