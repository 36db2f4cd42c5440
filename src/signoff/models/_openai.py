"""`OpenAIChat`: any OpenAI-compatible chat-completions endpoint, through the official SDK."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._exceptions import BudgetSpent, ModelError, UsageError
from .._tool_json import nests_deeper
from .._types import (
    MAX_REPLY_COST_USD,
    AssistantMessage,
    CutOff,
    ModelResponse,
    ToolCall,
    ToolResultMessage,
    Usage,
    reported_usage,
)
from ._base import ModelRequest, ToolSpec
from ._counts import uncounted, unread_usage
from ._environment import OPENAI_BASE_URL, openai_client
from ._http_env import HttpEnv, http_package
from ._ids import openai_id_fits, wire_ids, wire_name
from ._provider import (
    OPENAI_CACHED_PRICES,
    OPENAI_MAX_OUTPUT,
    OPENAI_PRICES,
    UNPARSED_ARGUMENTS,
    SdkModel,
    cap_output,
    check_params,
    check_positive,
    check_price,
    check_rate,
    encode_tool_result,
    load_sdk,
    lookup_price,
    plain_input,
    plain_int,
    plain_str,
    scrub,
    served_model,
    shown_url,
)
from ._provider_errors import body_error, head, hide_secrets
from ._reply_cap import DEFAULT_MAX_REPLY_BYTES, check_reply_cap
from ._urls import check_endpoint, credential

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["OpenAIChat"]


# Why a reply that stopped this way with no text and no call is no answer.
_EARLY = {
    "length": "was cut off at the token limit before any answer (finish_reason length); "
    "raise max_tokens",
    "model_length": "was cut off at the model's context length before any answer "
    "(finish_reason model_length)",
    "tool_calls": "ended for tool calls (finish_reason tool_calls) but sent none",
    "function_call": "ended for a function call (finish_reason function_call) but sent none",
}

# The token counts of a reply's usage the session's budgets need.
_COUNTS = ("prompt_tokens", "completion_tokens")

# The finish reasons of a reply stopped short, as `ModelResponse.cut_off` names them.
# Mistral's API says `model_length` for a reply cut at the model's context length.
_CUT_OFF: dict[str, CutOff] = {
    "length": "max_tokens",
    "model_length": "max_tokens",
    "content_filter": "content_filter",
}


class OpenAIChat(SdkModel):
    """A model behind the chat-completions API of OpenAI or a compatible server.

    Ollama, vLLM and llama.cpp servers work through `base_url`. Transient failures (connection
    errors, timeouts, 408/409/429/5xx) are retried `max_retries` times with exponential backoff
    by the SDK; what still fails raises `ModelError`. `timeout` bounds each wait on the server,
    and a whole call gives up after `(3 * max_retries + 2) * timeout` (a `timeout` in `params` in
    its place; none with a wait left unbounded); a reply asking to wait
    over 120 s (Retry-After) is not retried, and the error says so. `params` are passed to
    `chat.completions.create` as they are (`seed`, `reasoning_effort`, `extra_body`, ...), but
    neither they nor their `extra_body` may set the model, messages, tools or stream.
    Cost uses `price_per_mtok=(input, output)` in USD per million tokens, or a built-in list
    price for well-known models (the reply's `model`'s, when known), else 0; the prompt's
    cached tokens (`prompt_tokens_details.cached_tokens`) cost `cached_price_per_mtok`, by
    default a known model's list price for them, else the input price; those it wrote to a
    cache (`prompt_tokens_details.cache_write_tokens`, which gateways such as OpenRouter report
    for models that bill cache writes) cost `cache_write_price_per_mtok`, by default the input
    price. Where the gateway reports the call's cost (OpenRouter's `usage.cost`), that is its
    cost instead, and the response says so (`cost_reported`). `env` replaces the process
    environment as the source of `OPENAI_*` settings (key, base URL, organization,
    project, custom headers) and of the HTTP client's proxies and CA bundle (`HTTPS_PROXY`,
    `NO_PROXY`, `SSL_CERT_FILE`, ...): none is then read from `os.environ`. A reply body past
    `max_reply_bytes` (as inflated) fails the call while it is read.
    A client signoff makes is one per event loop; a `client` passed in is used as it is on every
    loop, but its HTTP connections belong to the loop that first used it: a runtime used from two
    loops (its `*_sync` twins run on one of their own) fails there with a `ModelError` saying so.
    """

    _sdk_error = "OpenAIError"

    def __init__(
        self,
        model: str,
        *,
        client: AsyncOpenAI | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        price_per_mtok: tuple[float, float] | None = None,
        cached_price_per_mtok: float | None = None,
        cache_write_price_per_mtok: float | None = None,
        max_retries: int = 2,
        timeout: float = 120.0,
        params: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        owner = f"OpenAIChat({model!r})"
        if not isinstance(model, str) or not model:
            raise UsageError(f"OpenAIChat needs a model name, not {model!r}")
        if model != model.strip():  # every call would name a model the provider does not have
            raise UsageError(f"OpenAIChat: the model name {model!r} has blanks around it")
        if client is not None and (base_url, api_key, env) != (None, None, None):
            raise UsageError(f"{owner}: pass either client= or base_url=/api_key=/env=, not both")
        if temperature is not None and (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or not 0 <= temperature < math.inf  # also NaN
        ):
            raise UsageError(f"{owner}: temperature must be a number >= 0, not {temperature!r}")
        check_positive(owner, "max_tokens", max_tokens, integer=True)
        check_positive(owner, "timeout", timeout)
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise UsageError(f"{owner}: max_retries must be an integer >= 0, not {max_retries!r}")
        self.max_reply_bytes = check_reply_cap(owner, max_reply_bytes)
        self._sdk = load_sdk("openai", "openai", "OpenAIChat")
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        sdk_create = self._sdk.resources.chat.completions.AsyncCompletions.create
        given = getattr(getattr(getattr(client, "chat", None), "completions", None), "create", None)
        self.params = check_params(
            owner, params, {"model", "messages", "tools", "stream"}, sdk_create, given
        )
        given = check_price(owner, price_per_mtok)
        self._price_given = given is not None
        self.price_per_mtok = given or lookup_price(model, OPENAI_PRICES)
        cached = check_rate(owner, "cached_price_per_mtok", cached_price_per_mtok)
        self._cached_given = cached
        if cached is None and given is None:
            cached = lookup_price(model, OPENAI_CACHED_PRICES)
        if cached is None and self.price_per_mtok is not None:
            cached = self.price_per_mtok[0]  # no discount known: counted at the input price
        self.cached_price_per_mtok = cached
        self.cache_write_price_per_mtok = check_rate(
            owner, "cache_write_price_per_mtok", cache_write_price_per_mtok
        )
        if env is not None:
            self._http_env = HttpEnv(owner, self._sdk, env)
        source = os.environ if env is None else env
        # named in the model's label; a client given is not ours to point anywhere
        self._base_url = base_url or (None if client else source.get("OPENAI_BASE_URL")) or None
        check_endpoint(owner, self._base_url, api_key, http_package(self._sdk).URL)
        api_key = credential(owner, "api_key", api_key)
        if client is None and api_key is None:
            api_key = credential(owner, "OPENAI_API_KEY", source.get("OPENAI_API_KEY")) or None
            if api_key is None:
                if self._base_url is None:
                    raise UsageError(
                        f"{owner}: no API key; set OPENAI_API_KEY or pass api_key= "
                        "(or base_url= for a local OpenAI-compatible server)"
                    )
                api_key = "unused"  # local compatible servers rarely check it; the SDK wants one

        def make() -> Any:
            if env is None:
                return self._sdk.AsyncOpenAI(
                    api_key=api_key,
                    # The SDK reads OPENAI_BASE_URL again, and took an empty one for a URL.
                    base_url=self._base_url or OPENAI_BASE_URL,
                    max_retries=max_retries,
                    timeout=timeout,
                    http_client=self._http_client(),
                )
            assert api_key is not None
            return openai_client(
                self._sdk,
                env,
                api_key=api_key,
                base_url=self._base_url,
                max_retries=max_retries,
                timeout=timeout,
                http_client=self._http_client(),
            )

        self._use_clients(make, client, (api_key,))

    @property
    def least_input_price_per_mtok(self) -> float | None:
        """What an input token costs at least (a cached one), in USD per million: what a
        session's budgets hold back for a call's input before making it."""
        if self.price_per_mtok is None:
            return None
        rates = (self.cached_price_per_mtok, self.cache_write_price_per_mtok)
        return min([self.price_per_mtok[0], *(r for r in rates if r is not None)])

    # -- the call -----------------------------------------------------------------------------

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """The next response from the OpenAI-compatible Chat Completions API. Its errors never show
        the credentials the client sends (a server may echo the key it was sent)."""
        client = self._clients.get()
        with hide_secrets(client, self.params):
            return await self._complete(client, request)

    async def _complete(self, client: Any, request: ModelRequest) -> ModelResponse:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": scrub(to_openai_messages(request.instructions, request.messages)),
        }
        if request.tools:
            kwargs["tools"] = scrub([to_openai_tool(t) for t in request.tools])
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        key = max_tokens_key(client.base_url.host)
        if self.max_tokens is not None:
            kwargs[key] = self.max_tokens
        kwargs.update(self.params)
        cap = request.max_output_tokens
        known = OPENAI_MAX_OUTPUT.get(self.model) if is_openai_host(client.base_url.host) else None
        if not cap_output(kwargs, ("max_completion_tokens", "max_tokens"), key, cap, known):
            cap = None  # the model's own limit binds: a reply it cut is no budget's doing
        sdk = self._sdk
        where = f"{self.model!r} at {shown_url(client.base_url)}"
        completion = await self._request(
            sdk,
            sdk.OpenAIError,
            lambda: client.chat.completions.create(**kwargs),
            "OpenAI chat completion",
            where,
        )
        budgeted = request.budgeted or request.max_output_tokens is not None
        return self._parse(completion, where, cap, budgeted=budgeted)

    def _parse(
        self, completion: Any, where: str, cap: int | None = None, *, budgeted: bool = False
    ) -> ModelResponse:
        """The response in `completion`; `budgeted`: the session's budgets bound the call, so a
        reply whose usage they cannot count fails it."""
        if isinstance(completion, str):  # the SDK's answer to a Content-Type other than JSON
            raise ModelError(
                f"OpenAI chat completion for {where} returned a body that is not JSON: "
                f"{head(completion, 200)!r}"
            )
        choices = getattr(completion, "choices", None)
        if not isinstance(choices, list) or not choices:
            error = body_error(completion)
            if error is not None:
                raise ModelError(
                    f"OpenAI chat completion for {where} returned an error instead of a "
                    f"completion: {error}"
                )
            raise ModelError(f"OpenAI chat completion for {where} returned no choices")
        unread = unread_usage(getattr(completion, "usage", None), _COUNTS)
        if budgeted and unread is not None:
            raise ModelError(uncounted("OpenAI chat completion", where, unread))
        # A completion came: what it cost is counted even when it cannot be used.
        usage = self._usage(completion)
        reported = reported_cost(getattr(completion, "usage", None)) is not None
        billed = reported_usage(usage) if reported else usage  # as a refused reply records it
        finish = plain_str(getattr(choices[0], "finish_reason", None))
        if cap is not None and finish == "length" and not 0 < usage.output_tokens < cap:
            # Cut at what the budgets had left (not short of it, as by a server's full context):
            # half an answer or call must not pass for one.
            raise BudgetSpent(
                f"OpenAI chat completion for {where} was cut off at the {cap} output tokens the "
                "session's budgets had left (finish_reason length)",
                usage=billed,
            )
        message = getattr(choices[0], "message", None)
        if message is None or isinstance(message, str | int | float | list):
            # Not an object: read as one it would pass for an empty answer.
            raise ModelError(
                f"OpenAI chat completion for {where} returned no message", usage=billed
            )
        content = getattr(message, "content", None)
        text = _text(content)
        if text is None:
            # Read as no text, it passed for an empty answer that ended the turn.
            raise ModelError(
                f"OpenAI chat completion for {where} has {_misshapen(content)}", usage=billed
            )
        refusal = getattr(message, "refusal", None)
        if not text.strip() and isinstance(refusal, str):
            text = refusal  # blank content beside a refusal says nothing the refusal does not
        raw_calls = getattr(message, "tool_calls", None) or []
        if not isinstance(raw_calls, list):
            raise ModelError(
                f"OpenAI chat completion for {where} has tool_calls that are not a list: "
                f"{type(raw_calls).__name__}",
                usage=billed,
            )
        if finish == "error":
            # A gateway's word that the generation failed midway (OpenRouter puts the error on
            # the choice): its partial text or calls would pass for the model's answer.
            error = body_error(choices[0])
            raise ModelError(
                f"OpenAI chat completion for {where} ended in an error (finish_reason error)"
                + (f": {error}" if error else ""),
                usage=billed,
            )
        if finish == "content_filter" and (not text.strip() or raw_calls):
            # Filtered, perhaps mid-call: an empty (or blank) answer or half a tool call would
            # pass for a real one, so the turn fails and says why.
            raise ModelError(
                f"OpenAI chat completion for {where} was filtered (finish_reason content_filter)",
                usage=billed,
            )
        if finish in ("length", "model_length") and raw_calls:
            # The limit cut the last call's arguments short: running any would act on half a reply.
            limit = (
                "the token limit in a tool call (finish_reason length); raise max_tokens"
                if finish == "length"
                else "the model's context length in a tool call (finish_reason model_length)"
            )
            raise ModelError(
                f"OpenAI chat completion for {where} was cut off at {limit}", usage=billed
            )
        if not text.strip() and not raw_calls and finish in _EARLY:
            # A reasoning model that spent max_tokens thinking, or a compatible server whose
            # tool-call parser failed: the empty text would pass for the model's answer.
            raise ModelError(f"OpenAI chat completion for {where} {_EARLY[finish]}", usage=billed)
        calls = []
        for raw in raw_calls:
            function = getattr(raw, "function", None)
            name = getattr(function, "name", None)
            if not isinstance(name, str) or not name:
                raise ModelError(
                    f"OpenAI chat completion for {where} has a tool call with no name", usage=billed
                )
            call_id = getattr(raw, "id", None)
            calls.append(
                ToolCall(
                    name=name,
                    input=parse_arguments(getattr(function, "arguments", None)),
                    id=call_id if isinstance(call_id, str) and call_id else None,
                )
            )
        # Half an answer must not pass for a whole one, nor a refusal (as Anthropic's reads).
        refused = isinstance(refusal, str) and bool(refusal.strip())
        cut: CutOff | None = "content_filter" if refused else _CUT_OFF.get(finish or "")
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=usage,
            cut_off=cut,
            cost_reported=reported,
            model=served_model(getattr(completion, "model", None), self.model),
        )

    def _prices(self, served: Any) -> tuple[tuple[float, float], float] | None:
        """The (input, output) and cached input prices of a reply by the model `served` names:
        with no `price_per_mtok` given, its list prices when known (a gateway's router or
        fallback answered with another model, and billed at its price), else this model's."""
        listed = None if self._price_given else lookup_price(plain_str(served) or "", OPENAI_PRICES)
        if listed is not None:
            cached = self._cached_given
            if cached is None:
                cached = lookup_price(plain_str(served) or "", OPENAI_CACHED_PRICES)
            return listed, listed[0] if cached is None else cached
        if self.price_per_mtok is None:
            return None
        cached = self.cached_price_per_mtok
        return self.price_per_mtok, self.price_per_mtok[0] if cached is None else cached

    def _usage(self, completion: Any) -> Usage:
        """The tokens a completion reports, priced: the prompt's cached tokens and those written
        to a cache (both among its `prompt_tokens`) at their prices."""
        usage = getattr(completion, "usage", None)
        input_tokens = plain_int(getattr(usage, "prompt_tokens", 0))
        output_tokens = plain_int(getattr(usage, "completion_tokens", 0))
        details = getattr(usage, "prompt_tokens_details", None)
        cached = min(plain_int(getattr(details, "cached_tokens", 0)), input_tokens)
        written = min(plain_int(getattr(details, "cache_write_tokens", 0)), input_tokens - cached)
        cost = reported_cost(usage)
        prices = self._prices(getattr(completion, "model", None))
        if cost is None and prices is not None:
            (price_in, price_out), price_cached = prices
            price_written = (
                price_in
                if self.cache_write_price_per_mtok is None
                else self.cache_write_price_per_mtok
            )
            cost = (
                (input_tokens - cached - written) * price_in
                + cached * price_cached
                + written * price_written
                + output_tokens * price_out
            ) / 1_000_000
        return Usage(input_tokens=input_tokens, output_tokens=output_tokens, cost_usd=cost or 0.0)


def reported_cost(usage: Any) -> float | None:
    """What a gateway reports a completion cost in USD: OpenRouter's `usage.cost` (its credits,
    a dollar each), and on a call made with the user's own provider key (`is_byok`) also
    `cost_details.upstream_inference_cost`, the provider's bill, which `cost` leaves out. None
    when it reports none, or something that is no plain amount (a price is then computed)."""
    cost = _amount(getattr(usage, "cost", None))
    if cost is None:
        return None
    if getattr(usage, "is_byok", None) is True:
        details = getattr(usage, "cost_details", None)
        upstream = (
            details.get("upstream_inference_cost")
            if isinstance(details, dict)
            else getattr(details, "upstream_inference_cost", None)
        )
        cost += _amount(upstream) or 0.0
    return cost


def _amount(value: Any) -> float | None:
    """`value` as a reported amount of USD: a finite number from 0 to `MAX_REPLY_COST_USD`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 <= value <= MAX_REPLY_COST_USD else None  # NaN fails both


# -- the wire format ------------------------------------------------------------------------


def to_openai_tool(spec: ToolSpec) -> dict[str, Any]:
    """A tool as a chat-completions function tool."""
    function: dict[str, Any] = {"name": spec.name, "parameters": spec.input_schema}
    if spec.description:
        function["description"] = spec.description
    return {"type": "function", "function": function}


def to_openai_messages(instructions: str, messages: Any) -> list[dict[str, Any]]:
    """The conversation as chat-completions messages, instructions first as the system message;
    tool-call ids the API refuses (too long, or repeated) are mapped to ones it takes."""
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    for m in wire_ids(messages, openai_id_fits):
        if isinstance(m, AssistantMessage):
            item: dict[str, Any] = {"role": "assistant", "content": m.text or None}
            if m.tool_calls:
                item["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": format_arguments(c.input)},
                    }
                    for c in m.tool_calls
                ]
            elif not m.text:
                item["content"] = ""
            out.append(item)
        elif isinstance(m, ToolResultMessage):
            out.append({"role": "tool", "tool_call_id": m.call_id, "content": tool_text(m)})
        else:
            out.append({"role": "user", "content": m.text})
    return out


OPENAI_HOST = "api.openai.com"


def is_openai_host(host: str) -> bool:
    """Whether `host` is OpenAI's own API: `api.openai.com` or a regional host under it (the EU
    data-residency `eu.api.openai.com`), which takes the same parameters and models."""
    host = host.lower().removesuffix(".")
    return host == OPENAI_HOST or host.endswith("." + OPENAI_HOST)


def max_tokens_key(host: str) -> str:
    """OpenAI itself wants the newer name (reasoning models refuse the old); others the classic."""
    return "max_completion_tokens" if is_openai_host(host) else "max_tokens"


def tool_text(m: ToolResultMessage) -> str:
    """A tool result as text; errors and denials say so up front, since the wire has no flag."""
    body = encode_tool_result(m.content)
    if not m.is_error:
        return body
    name = wire_name(m.tool_name)  # as its call shows it: a name the model made up may be long
    if isinstance(m.content, dict) and m.content.get("denied"):
        return f"DENIED: the call to {name} was not run. {body}"
    if isinstance(m.content, dict) and m.content.get("timed_out"):
        return f"EXPIRED: no one decided on the call to {name} in time; it was not run. {body}"
    if isinstance(m.content, dict) and m.content.get("cancelled"):
        return f"CANCELLED: the call to {name} has no result. {body}"
    return f"ERROR: the call to {name} failed. {body}"


def parse_arguments(arguments: Any) -> Any:
    """Tool-call arguments as data; text that is not plain JSON (NaN and Infinity are not, and
    would slip past checks like `amount > 100`; nor is 1e400, read as infinity) or nests deeper
    than `MAX_INPUT_DEPTH` levels is passed on to fail validation."""
    if arguments is None or arguments == "":
        return {}
    if not isinstance(arguments, str):
        return plain_input(arguments)  # some compatible servers send an object, not a string
    try:
        value = json.loads(arguments, parse_constant=_not_json, parse_float=_finite)
    except (ValueError, RecursionError):
        return {UNPARSED_ARGUMENTS: arguments}
    return {UNPARSED_ARGUMENTS: arguments} if nests_deeper(value) else value


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _finite(number: str) -> float:
    value = float(number)
    if math.isinf(value):
        raise ValueError(f"{number} is too large for a float")
    return value


def format_arguments(value: Any) -> str:
    """Tool-call arguments as sent back: always a JSON object, as compatible servers read them
    again (Ollama and vLLM parse each earlier call's, and refused every later request of the
    session over one the model wrote unparsable). Unparsable text goes back under
    `UNPARSED_ARGUMENTS`, as signoff holds it, and input that is no object under `input`, as
    `Anthropic` sends it."""
    if not isinstance(value, dict):
        value = {"input": value}
    return json.dumps(value, ensure_ascii=False)


def _text(content: Any) -> str | None:
    """A message's text: its content, or the text of its content parts (from some compatible
    servers); None when the content has the wrong shape (see `_misshapen`)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        return None
    parts = []
    for part in content:
        if not isinstance(part, dict) or _bad_text_part(part):
            return None
        if isinstance(part.get("text"), str):
            parts.append(part["text"])
    return "".join(parts)


def _bad_text_part(part: dict[str, Any]) -> bool:
    """Whether `part` is a text part without text (other parts may carry none)."""
    return part.get("type") == "text" and not isinstance(part.get("text"), str)


def _misshapen(content: Any) -> str:
    """What is wrong with content `_text` cannot read."""
    if not isinstance(content, list):
        return f"content that is neither text nor a list of parts: {type(content).__name__}"
    for part in content:
        if not isinstance(part, dict):
            return f"a content part that is not an object: {type(part).__name__}"
    bad = next(p.get("text") for p in content if _bad_text_part(p))
    return f"a text part whose text is not text: {type(bad).__name__}"
