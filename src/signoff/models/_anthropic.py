"""`Anthropic`: Claude models through the official SDK's messages API. What signoff sends is
`_anthropic_wire`'s; reading the blocks of a reply is `_anthropic_replies`'s."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._exceptions import BudgetSpent, ModelError, UsageError
from .._types import CutOff, ModelResponse, ToolCall, Usage
from ._anthropic_replies import Stored as _Stored
from ._anthropic_replies import check_counted as _check_counted
from ._anthropic_replies import paused as _paused
from ._anthropic_replies import read_blocks as _read_blocks
from ._anthropic_replies import sent_back as _sent_back
from ._anthropic_replies import total as _total
from ._anthropic_wire import (
    LEAST_THINKING,
    REASONING,
    check_thinking,
    last_turn_thinks,
    stand_in_tools,
    thinking_on,
    to_anthropic_messages,
    to_anthropic_tool,
)
from ._base import ModelRequest, PausedPart
from ._environment import ANTHROPIC_BASE_URL, anthropic_betas, anthropic_client
from ._http_env import HttpEnv, http_package
from ._provider import (
    ANTHROPIC_PRICES,
    SdkModel,
    cap_output,
    check_params,
    check_positive,
    check_price,
    check_rate,
    load_sdk,
    lookup_price,
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
    from anthropic import AsyncAnthropic

__all__ = ["Anthropic"]

# The blocks of a reply the conversation keeps; the others are the server tools' own.
_KEPT = ("text", "tool_use", *REASONING)

# The stop reasons that cut a reply short, and those that mean an empty one is no answer.
_CUT = ("max_tokens", "model_context_window_exceeded")
_EARLY = (*_CUT, "tool_use", "pause_turn")

# How many times a turn the API paused (`pause_turn`: a long server-tool loop) is continued;
# each continuation reads the whole conversation again.
MAX_CONTINUATIONS = 8

# Anthropic bills cache writes at 1.25x the input price (2x for the 1-hour cache) and cache
# reads at 0.1x.
_CACHE_WRITE = 1.25
_CACHE_WRITE_1H = 2.0
_CACHE_READ = 0.1

WEB_SEARCH_PRICE_PER_1K = 10.0
"""What Anthropic bills for 1,000 searches of its web search tool (`usage.server_tool_use.
web_search_requests`), in USD, beside the tokens the results take."""


class Anthropic(SdkModel):
    """A Claude model through the messages API, with tool use and usage accounting.

    Transient failures (connection errors, timeouts, 408/409/429/5xx, overloaded) are retried
    `max_retries` times with exponential backoff by the SDK; what still fails raises
    `ModelError`. `timeout` bounds each wait on the server, and a whole call gives up after
    `(3 * max_retries + 2) * timeout` (a `timeout` in `params` in its place; none with a wait
    left unbounded); a reply asking to wait over 120 s (Retry-After) is not
    retried, and the error says so. `params`
    are passed to `messages.create` as they are (`thinking`, `stop_sequences`, `extra_body`,
    ...), but neither they nor their `extra_body` may set the model, messages, tools, system
    or stream. A conversation that used tools, sent for an agent that now has none, declares
    stand-ins for them with `tool_choice` none: the API refuses tool calls and results without
    tools.
    Cost uses `price_per_mtok=(input, output)` in USD per million tokens, or a built-in
    list price for well-known models (the reply's `model`'s, when known), else 0, and each web
    search its server tool ran (`usage.server_tool_use.web_search_requests`)
    `web_search_price_per_1k` / 1000 (Anthropic's $10 per 1,000 searches by default). `env`
    replaces the process environment as the source of `ANTHROPIC_*` settings (key or token,
    base URL, custom headers) and of the HTTP client's proxies and CA bundle (`HTTPS_PROXY`,
    `NO_PROXY`, `SSL_CERT_FILE`, ...): none is then read from `os.environ`. A reply body past
    `max_reply_bytes` (as inflated) fails the call while it is read.
    A client signoff makes is one per event loop; a `client` passed in is used as it is on every
    loop, but its HTTP connections belong to the loop that first used it: a runtime used from two
    loops (its `*_sync` twins run on one of their own) fails there with a `ModelError` saying so.
    """

    _sdk_error = "AnthropicError"

    def __init__(
        self,
        model: str,
        *,
        client: AsyncAnthropic | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        max_tokens: int = 1024,
        price_per_mtok: tuple[float, float] | None = None,
        web_search_price_per_1k: float = WEB_SEARCH_PRICE_PER_1K,
        max_retries: int = 2,
        timeout: float = 120.0,
        params: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        owner = f"Anthropic({model!r})"
        if not isinstance(model, str) or not model:
            raise UsageError(f"Anthropic needs a model name, not {model!r}")
        if model != model.strip():  # every call would name a model the provider does not have
            raise UsageError(f"Anthropic: the model name {model!r} has blanks around it")
        if client is not None and (base_url, api_key, env) != (None, None, None):
            raise UsageError(f"{owner}: pass either client= or base_url=/api_key=/env=, not both")
        if max_tokens is None:
            raise UsageError(f"{owner}: max_tokens is required by the messages API")
        check_positive(owner, "max_tokens", max_tokens, integer=True)
        check_positive(owner, "timeout", timeout)
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise UsageError(f"{owner}: max_retries must be an integer >= 0, not {max_retries!r}")
        self.max_reply_bytes = check_reply_cap(owner, max_reply_bytes)
        self._sdk = load_sdk("anthropic", "anthropic", "Anthropic")
        self.model = model
        self.max_tokens = max_tokens
        sdk_create = self._sdk.resources.messages.AsyncMessages.create
        given = getattr(getattr(client, "messages", None), "create", None)
        self.params = check_params(
            owner, params, {"model", "messages", "tools", "system", "stream"}, sdk_create, given
        )
        given = check_price(owner, price_per_mtok)
        self._price_given = given is not None
        self.price_per_mtok = given or lookup_price(model, ANTHROPIC_PRICES)
        search_price = check_rate(
            owner, "web_search_price_per_1k", web_search_price_per_1k, per="1,000 searches"
        )
        if search_price is None:  # else no fee, where 0 says so
            raise UsageError(f"{owner}: web_search_price_per_1k must be a number, not None")
        self.web_search_price_per_1k = search_price
        if env is not None:
            self._http_env = HttpEnv(owner, self._sdk, env)
        source = os.environ if env is None else env
        if env is not None:
            base_url = base_url or env.get("ANTHROPIC_BASE_URL") or None
        # named in the model's label, as OpenAIChat names OPENAI_BASE_URL: the SDK reads it too
        self._base_url = base_url or (None if client else source.get("ANTHROPIC_BASE_URL")) or None
        check_endpoint(owner, self._base_url, api_key, http_package(self._sdk).URL)
        api_key = credential(owner, "api_key", api_key)
        auth_token = None
        if client is None and api_key is None:
            api_key = credential(owner, "ANTHROPIC_API_KEY", source.get("ANTHROPIC_API_KEY"))
            api_key = api_key or None
            token = None if api_key else source.get("ANTHROPIC_AUTH_TOKEN")
            auth_token = credential(owner, "ANTHROPIC_AUTH_TOKEN", token) or None
            if api_key is None and auth_token is None:
                if base_url is None and not source.get("ANTHROPIC_BASE_URL"):
                    # Said now: the SDK would only refuse each request, as bad arguments.
                    raise UsageError(
                        f"{owner}: no API key; set ANTHROPIC_API_KEY or pass api_key= "
                        "(or base_url= for a gateway that needs none)"
                    )
                api_key = "unused"  # a gateway that checks none; the SDK wants one

        betas = anthropic_betas(client, env, self.params)
        check_thinking(owner, self.params, max_tokens, interleaved="interleaved-thinking" in betas)

        def make() -> Any:
            if env is None:
                return self._sdk.AsyncAnthropic(
                    api_key=api_key,
                    auth_token=auth_token,
                    # The SDK reads ANTHROPIC_BASE_URL again, and took an empty one for a URL.
                    base_url=self._base_url or ANTHROPIC_BASE_URL,
                    max_retries=max_retries,
                    timeout=timeout,
                    http_client=self._http_client(),
                )
            return anthropic_client(
                self._sdk,
                env,
                api_key=api_key,
                auth_token=auth_token,
                base_url=base_url,
                max_retries=max_retries,
                timeout=timeout,
                http_client=self._http_client(),
            )

        self._use_clients(make, client, (api_key, auth_token))

    @property
    def least_input_price_per_mtok(self) -> float | None:
        """What an input token costs at least (a cache read), in USD per million: what a
        session's budgets hold back for a call's input before making it."""
        return None if self.price_per_mtok is None else self.price_per_mtok[0] * _CACHE_READ

    # -- the call -----------------------------------------------------------------------------

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """The next response from the Anthropic Messages API. Its errors never show
        the credentials the client sends (a server may echo the key it was sent)."""
        client = self._clients.get()
        with hide_secrets(client, self.params):
            return await self._complete(client, request)

    async def _complete(self, client: Any, request: ModelRequest) -> ModelResponse:
        thinking = thinking_on(self.params)
        messages = to_anthropic_messages(request.messages, thinking=thinking)
        if thinking and not last_turn_thinks(messages):
            # The last turn's tool calls came without thinking (another model made them): the
            # API keeps one thinking mode per turn, so this request goes without thinking.
            thinking = False
            messages = to_anthropic_messages(request.messages, thinking=False)
        kwargs: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": scrub(messages),
        }
        if request.instructions:
            kwargs["system"] = scrub(request.instructions)
        stand_ins: list[dict[str, Any]] = []
        if request.tools:
            kwargs["tools"] = scrub([to_anthropic_tool(t) for t in request.tools])
        else:  # the API refuses earlier tool calls and results in a request without tools
            stand_ins = stand_in_tools(messages)
            if stand_ins:
                kwargs["tools"] = scrub(stand_ins)
        kwargs.update(self.params)
        if stand_ins:  # tools the agent no longer has: whatever `params` chose, none is called
            kwargs["tool_choice"] = {"type": "none"}
            extra = kwargs.get("extra_body")
            if isinstance(extra, Mapping) and "tool_choice" in extra:
                kwargs["extra_body"] = {k: v for k, v in extra.items() if k != "tool_choice"}
        if not thinking and thinking_on(self.params):
            kwargs.pop("thinking", None)
            extra = kwargs.get("extra_body")
            if isinstance(extra, Mapping) and "thinking" in extra:
                kwargs["extra_body"] = {k: v for k, v in extra.items() if k != "thinking"}
        # What the budgets leave the whole reply, kept for its continuations whether or not it
        # binds now (and lowered by what `on_pause` says of each part); `binds`: it set the next
        # call's limit (else the model's own limit binds, and a reply that limit cut is no
        # budget's doing).
        cap = request.max_output_tokens
        binds = cap_output(kwargs, ("max_tokens",), "max_tokens", cap)
        if binds and thinking and cap is not None:
            self._think_within(kwargs, cap)
        sdk = self._sdk
        where = f"{self.model!r} at {shown_url(client.base_url)}"
        # The paused parts of this reply, in order: those journaled before (`request.paused`),
        # then those this call receives. What each cost counts once: a journaled part's when
        # journaled, the others' (`unjournaled`) in the response or the error.
        parts = self._resumed(request.paused)
        unjournaled: list[Usage] = []
        here = Usage()  # what the parts this call received cost: its cap was set before them
        if parts:
            binds = self._continue(kwargs, parts, parts, here, unjournaled, where, cap, binds)
        while True:
            try:
                message = await self._request(
                    sdk,
                    sdk.AnthropicError,
                    lambda: client.messages.create(**kwargs),
                    "Anthropic messages call",
                    where,
                )
            except ModelError as exc:
                if unjournaled:  # the paused parts were billed: the failed turn counts them
                    exc.usage = _total([*unjournaled, exc.usage])
                    exc.context_tokens = 0  # read again each call, not kept: how much, unknown
                raise
            budgeted = request.budgeted or cap is not None
            if not _paused(message):
                bound = cap if binds else None
                return self._parse(
                    message, where, bound, parts, here, unjournaled, budgeted=budgeted
                )
            try:
                _check_counted(message, where, budgeted, unjournaled)
                billed = self._usage(message)
                # Blocks of the wrong shape fail the call here, before they are journaled.
                _read_blocks(message.content, where, _total([*unjournaled, billed]), [], [], [])
            except ModelError as exc:
                exc.context_tokens = 0  # a paused turn's input is not kept (as below)
                raise
            data: dict[str, Any] = {"content": scrub([_sent_back(b) for b in message.content])}
            container = getattr(getattr(message, "container", None), "id", None)
            if isinstance(container, str) and container:
                data["container"] = container
            part = PausedPart(model=self._maker, data=data, usage=billed)
            here = here + billed
            if request.on_pause is None:
                unjournaled.append(billed)
            else:
                # The engine's cap for the next part holds back its input too: the reply may
                # write no more in all than the parts so far and that.
                given = await request.on_pause(part)
                if isinstance(given, int) and not isinstance(given, bool) and given > 0:
                    more = here.output_tokens + given
                    cap = more if cap is None else min(cap, more)
            parts.append(part)
            binds = self._continue(kwargs, parts, parts[-1:], here, unjournaled, where, cap, binds)

    @property
    def _maker(self) -> str:
        """Who makes this model's paused parts: another model starts over instead of going on
        from them."""
        return f"anthropic:{self.model}"

    def _resumed(self, paused: Sequence[PausedPart]) -> list[PausedPart]:
        """The parts journaled of this reply before, to continue from; none (start over) unless
        every one is this model's and of the form it journals."""
        if not paused:
            return []
        for p in paused:
            data = p.data if isinstance(p, PausedPart) and p.model == self._maker else {}
            content = data.get("content") if isinstance(data, dict) else None
            if not (
                isinstance(content, list)
                and content
                and all(isinstance(b, dict) and isinstance(b.get("type"), str) for b in content)
                and isinstance(data.get("container", ""), str)
            ):
                return []
        return list(paused)

    def _continue(
        self,
        kwargs: dict[str, Any],
        parts: list[PausedPart],
        new: list[PausedPart],
        here: Usage,
        unjournaled: list[Usage],
        where: str,
        cap: int | None,
        binds: bool,
    ) -> bool:
        """Make `kwargs` the request that continues the turn the API paused, as Anthropic says to:
        the paused content (of the `new` parts of `parts`) sent back as the assistant's (and its
        code-execution container named), its output capped at what `cap` leaves of it after the
        parts this call received (`here`) when that is below the model's own limit. True when
        the budgets set its limit (`binds`: they set the last one's). Past `MAX_CONTINUATIONS`
        parts the reply fails, to be asked afresh (`start_over`): no retry could go on from them."""
        spent = _total(unjournaled)
        if len(parts) > MAX_CONTINUATIONS:
            raise ModelError(
                f"Anthropic messages call for {where} paused its turn {len(parts)} times "
                f"(stop_reason pause_turn): signoff continues one at most {MAX_CONTINUATIONS} "
                "times",
                usage=spent if unjournaled else None,
                start_over=True,
            )
        messages = list(kwargs["messages"])
        for part in new:
            blocks = list(part.data["content"])
            if messages and messages[-1]["role"] == "assistant":  # one paused already: it goes on
                messages[-1] = {**messages[-1], "content": [*messages[-1]["content"], *blocks]}
            else:
                messages.append({"role": "assistant", "content": blocks})
        kwargs["messages"] = messages
        container = parts[-1].data.get("container")
        if container:
            kwargs["container"] = container
        if cap is None:
            return False
        left = cap - here.output_tokens
        if left <= 0:
            raise BudgetSpent(
                f"Anthropic messages call for {where} paused its turn after the {cap} output "
                "tokens the session's budgets had left (stop_reason pause_turn)",
                usage=spent,
            )
        # What is left only shrinks: once it binds, it binds on (a part of no output leaves it).
        binds = cap_output(kwargs, ("max_tokens",), "max_tokens", left) or binds
        if binds and thinking_on(kwargs):
            try:
                self._think_within(kwargs, left)
            except BudgetSpent as exc:
                exc.usage = spent
                raise
        return binds

    def _think_within(self, kwargs: dict[str, Any], cap: int) -> None:
        """Lower thinking's `budget_tokens` below `cap`, as the API wants it below `max_tokens`;
        a cap that leaves no room for its least (1,024) leaves no reply worth asking for
        (`BudgetSpent`, saying the 1,025 output tokens a call needs, for `continue` to leave)."""
        extra = kwargs.get("extra_body")
        for where in (kwargs, extra if isinstance(extra, dict) else {}):
            thinking = where.get("thinking")
            if not isinstance(thinking, Mapping):
                continue
            budget = thinking.get("budget_tokens")
            if not isinstance(budget, int) or isinstance(budget, bool) or budget < cap:
                continue
            if cap - 1 < LEAST_THINKING:
                raise BudgetSpent(
                    f"{self!r}: the {cap} output tokens the session's budgets leave cannot hold "
                    f"thinking (budget_tokens of at least {LEAST_THINKING:,}, below max_tokens)",
                    needed=LEAST_THINKING + 1,
                )
            where["thinking"] = {**thinking, "budget_tokens": cap - 1}

    def _parse(
        self,
        message: Any,
        where: str,
        cap: int | None = None,
        paused: Sequence[PausedPart] = (),
        here: Usage | None = None,
        unjournaled: Sequence[Usage] = (),
        *,
        budgeted: bool = False,
    ) -> ModelResponse:
        """The response in `message`, which ends the turn the API paused in `paused` (whose
        text and reasoning come first, and the cost of those not journaled, `unjournaled`);
        `here` is what the paused parts this call received cost, within its `cap`; `budgeted`:
        the session's budgets bound the call, so a reply whose usage they cannot count fails."""
        if isinstance(message, str):  # the SDK's answer to a Content-Type other than JSON
            raise ModelError(
                f"Anthropic messages call for {where} returned a body that is not JSON: "
                f"{head(message, 200)!r}"
            )
        content = getattr(message, "content", None)
        if not isinstance(content, list):
            error = body_error(message)
            if error is not None:
                raise ModelError(
                    f"Anthropic messages call for {where} returned an error instead of a "
                    f"message: {error}"
                )
            raise ModelError(f"Anthropic messages call for {where} returned no content list")
        _check_counted(message, where, budgeted, unjournaled)
        # A message came: what it cost is counted even when it cannot be used.
        billed = self._usage(message)
        usage = _total([*unjournaled, billed])
        written = billed.output_tokens + (0 if here is None else here.output_tokens)
        stop = plain_str(getattr(message, "stop_reason", None))
        parts = [*([_Stored(b) for b in p.data["content"]] for p in paused), content]
        # Input billed that the conversation does not keep (what a server tool read, a paused
        # turn read again) is not read by the next call: how much of it there was is not known.
        unkept = bool(paused) or any(
            plain_str(getattr(b, "type", None)) not in _KEPT for blocks in parts for b in blocks
        )
        kept = 0 if unkept else None  # a reply refused below says so too (`context_tokens`)
        if cap is not None and stop == "max_tokens" and not 0 < written < cap:
            # Cut at what the budgets had left: half an answer or call must not pass for one.
            raise BudgetSpent(
                f"Anthropic messages call for {where} was cut off at the {cap} output tokens the "
                "session's budgets had left (stop_reason max_tokens)",
                usage=usage,
                context_tokens=kept,
            )
        if stop == "refusal" and (
            not any(getattr(b, "type", None) == "text" and _said(b) for b in content)
            or any(getattr(b, "type", None) == "tool_use" for b in content)
        ):
            # Declined for safety, perhaps mid-call: an empty (or blank) answer or half a tool
            # call would pass for a real one, so the turn fails and says why.
            raise ModelError(
                f"Anthropic messages call for {where} was refused (stop_reason refusal)",
                usage=usage,
                context_tokens=kept,
            )
        if stop in _CUT and content and getattr(content[-1], "type", None) == "tool_use":
            # The limit cut the block's input short: running it would act on half a call.
            limit = f"at max_tokens={self.max_tokens}" if stop == "max_tokens" else f"({stop})"
            raise ModelError(
                f"Anthropic messages call for {where} was cut off {limit} in a tool call"
                + ("; raise max_tokens" if stop == "max_tokens" else ""),
                usage=usage,
                context_tokens=kept,
            )
        texts: list[str] = []
        calls: list[ToolCall] = []
        reasoning: list[dict[str, Any]] = []
        try:
            for blocks in parts:
                _read_blocks(blocks, where, usage, texts, calls, reasoning)
        except ModelError as exc:
            exc.context_tokens = kept
            raise
        if not "".join(texts).strip() and not calls and stop in _EARLY:
            # Thinking that spent max_tokens, a paused server tool: the empty text would pass
            # for the model's answer.
            raise ModelError(
                f"Anthropic messages call for {where} stopped before any answer "
                f"(stop_reason {stop})" + ("; raise max_tokens" if stop == "max_tokens" else ""),
                usage=usage,
                context_tokens=kept,
            )
        cut: CutOff | None = None  # half an answer must not pass for a whole one
        if stop in _CUT:
            cut = "max_tokens"
        elif stop == "refusal":
            cut = "content_filter"
        return ModelResponse(
            text="".join(texts),
            tool_calls=calls,
            usage=usage,
            reasoning=reasoning,
            cut_off=cut,
            context_tokens=kept,
            model=served_model(getattr(message, "model", None), self.model),
        )

    def _usage(self, message: Any) -> Usage:
        """The tokens a message reports (cache writes and reads among its input), priced at the
        list price of the model it names when no price was given and that one is known; the
        writes to the 1-hour cache (`cache_creation.ephemeral_1h_input_tokens`) at its price, and
        the web searches its server tool ran (`server_tool_use.web_search_requests`) at theirs,
        whatever the tokens cost."""
        usage = getattr(message, "usage", None)
        plain = plain_int(getattr(usage, "input_tokens", 0))
        written = plain_int(getattr(usage, "cache_creation_input_tokens", 0))
        hour = plain_int(
            getattr(getattr(usage, "cache_creation", None), "ephemeral_1h_input_tokens", 0)
        )
        hour = min(hour, written)
        read = plain_int(getattr(usage, "cache_read_input_tokens", 0))
        output = plain_int(getattr(usage, "output_tokens", 0))
        searches = plain_int(
            getattr(getattr(usage, "server_tool_use", None), "web_search_requests", 0)
        )
        cost = searches * self.web_search_price_per_1k / 1000
        # With no price given, a reply another model made (a gateway's router or fallback) costs
        # that model's list price, when known: what it was billed at.
        served = plain_str(getattr(message, "model", None)) or ""
        listed = None if self._price_given else lookup_price(served, ANTHROPIC_PRICES)
        price = listed or self.price_per_mtok
        if price is not None:
            price_in, price_out = price
            cost += (
                plain * price_in
                + (written - hour) * price_in * _CACHE_WRITE
                + hour * price_in * _CACHE_WRITE_1H
                + read * price_in * _CACHE_READ
                + output * price_out
            ) / 1_000_000
        return Usage(input_tokens=plain + written + read, output_tokens=output, cost_usd=cost)


def _said(block: Any) -> bool:
    """Whether a text block says anything: more than whitespace."""
    text = getattr(block, "text", "")
    return bool(text.strip() if isinstance(text, str) else text)
