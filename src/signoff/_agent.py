"""`Agent` and its `Limits`: a model, instructions, tools and guardrails under one name."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from ._approval import Guardrail, own_decide
from ._exceptions import UsageError
from ._settings import positive_seconds
from ._text import is_blank, is_utf8
from ._tool_json import MAX_RESULT_BYTES
from ._tools import Tool
from ._types import MAX_ANSWERS, MAX_REPLY_COST_USD, MAX_REPLY_TOKENS
from .models._base import not_a_model_class
from .models._provider import SdkModel

if TYPE_CHECKING:
    from .models import Model

__all__ = ["MAX_CALLS_PER_RESPONSE", "Agent", "Limits", "StandIn", "by_name", "unpriced"]

MAX_CALLS_PER_RESPONSE = 128
"""The default bound on the tool calls in one model response (`Limits.max_calls_per_response`):
far over what a model proposes at once, far under the 1,000 requests one answer call settles."""


class StandIn:
    """The model of an agent a process only records events for, standing in for one it lacks
    (the command line's, a mirror's close): never called. Its agent has none of the real one's
    tools, so an answer is not refused for a delegate tool it seems to lack."""

    def __init__(self, agent: str) -> None:
        self.agent = agent


_MAY_BE_NONE = ("max_tokens", "max_cost_usd", "max_messages", "max_calls_per_response")


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Bounds on a session: tokens, cost, model steps per turn, messages sent, TTL and sizes.

    `max_tokens` and `max_cost_usd` bound what its model calls spend: a call that would start
    over one asks a person to raise it, and each call's output is capped at what they leave
    (`ModelRequest.max_output_tokens`; a reply cut there asks the same way).
    `max_messages` is the message window; the turn holding an open request is always sent whole.
    `ttl` (seconds or a timedelta) expires a session that has been idle that long.
    `max_result_bytes` (1 MiB) bounds a tool's result, a step's result, an approval payload and
    a `ctx.ask()` question with its options, as JSON: one over it is a tool error the model
    reads (a step or `ctx.ask()` raises `TooLarge`), not stored.
    `max_response_bytes` (1 MiB) bounds a model response as JSON: one over it fails the turn,
    retryably, before anything of it is stored.
    `max_calls_per_response` (128; None for the most, 1,000) bounds the tool calls in one
    model response: more fail the turn as a response over `max_response_bytes` does, as each
    gated call would open an approval request (a notification) of its own. A larger value
    counts as 1,000, the requests one `generate(approvals=)` settles.
    """

    max_tokens: int | None = None
    max_cost_usd: float | None = None
    max_steps: int = 50
    max_messages: int | None = None
    ttl: float | timedelta | None = None
    max_result_bytes: int = MAX_RESULT_BYTES
    max_response_bytes: int = MAX_RESULT_BYTES
    max_calls_per_response: int | None = MAX_CALLS_PER_RESPONSE

    @property
    def tokens_bound(self) -> int | None:
        """`max_tokens` as the budgets take it: None at the most (`sys.maxsize` counts as it),
        which bounds nothing, so a session under it is unbudgeted, as under None."""
        return None if self.max_tokens == MAX_REPLY_TOKENS else self.max_tokens

    @property
    def cost_bound(self) -> float | None:
        """`max_cost_usd` as the budgets take it: None at the most, as `tokens_bound`."""
        return None if self.max_cost_usd == MAX_REPLY_COST_USD else self.max_cost_usd

    def __post_init__(self) -> None:
        # A bound that cannot work is refused here, before a session is made under it.
        for name, value, whole in (
            ("max_tokens", self.max_tokens, True),
            ("max_cost_usd", self.max_cost_usd, False),
            ("max_steps", self.max_steps, True),
            ("max_messages", self.max_messages, True),
            ("max_result_bytes", self.max_result_bytes, True),
            ("max_response_bytes", self.max_response_bytes, True),
            ("max_calls_per_response", self.max_calls_per_response, True),
        ):
            if value is None and name in _MAY_BE_NONE:
                continue
            if not _positive(value, whole=whole):
                kind = "whole number" if whole else "number"
                raise UsageError(f"Limits({name}=...) must be a positive {kind}, not {value!r}")
            most = _MOST.get(name)
            if most is not None and value > most:  # type: ignore[operator]
                # Counted as the most: past it the budgets' sums lose precision or reach
                # infinity (a cost of 1e308 at any price), and every model step raised, the
                # session left running. `sys.maxsize`, as "no bound", still bounds nothing.
                object.__setattr__(self, name, most)
        calls = self.max_calls_per_response
        if calls is None or calls > MAX_ANSWERS:
            # More gated calls would open more requests than one `generate(approvals=)` settles.
            object.__setattr__(self, "max_calls_per_response", MAX_ANSWERS)
        ttl = self.ttl.total_seconds() if isinstance(self.ttl, timedelta) else self.ttl
        if ttl is not None and not _positive(ttl, whole=False):
            raise UsageError(f"Limits(ttl=...) must be positive seconds or a timedelta: {ttl!r}")

    @property
    def ttl_seconds(self) -> float | None:
        """`ttl` in seconds, or None for sessions that never expire."""
        if isinstance(self.ttl, timedelta):
            return self.ttl.total_seconds()
        return None if self.ttl is None else float(self.ttl)


_MOST = {"max_tokens": MAX_REPLY_TOKENS, "max_cost_usd": MAX_REPLY_COST_USD}
"""The largest budgets: what one reply may count at most (`usage_too_large`)."""


def _positive(value: object, *, whole: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
        return False
    return value > 0 if whole else positive_seconds(value)  # a float must hold it


class Agent:
    """A named agent: model, instructions, tools, guardrails and limits."""

    def __init__(
        self,
        *,
        name: str,
        model: Model,
        instructions: str = "",
        tools: Sequence[Tool] = (),
        guardrails: Sequence[Guardrail] = (),
        limits: Limits | None = None,
    ) -> None:
        if not isinstance(name, str) or is_blank(name):  # " ": no one could read or type it
            raise UsageError(f"an agent needs a name, not {name!r}")
        if not is_utf8(name):  # no store could hold it: its sessions' agent, its tools' streams
            raise UsageError(f"agent {name!r}: its name holds a lone surrogate (not Unicode text)")
        if "\x00" in name:  # PostgreSQL holds no NUL in text: its sessions could not be made
            raise UsageError(
                f"agent {name!r}: its name holds a NUL character (\\x00), which a PostgreSQL "
                "store cannot hold; name the agent without it"
            )
        not_a_model_class(model, f"agent {name!r}: model")
        # Else every turn failed with an AttributeError, or `generate` raised one.
        if not callable(getattr(model, "complete", None)):
            raise UsageError(
                f"agent {name!r}: model must be a signoff model (e.g. "
                f"so.models.OpenAIChat('gpt-4o') or so.models.from_env()), not {model!r}"
            )
        if not isinstance(instructions, str):
            raise UsageError(f"agent {name!r}: instructions must be text, not {instructions!r}")
        if limits is not None and not isinstance(limits, Limits):
            raise UsageError(f"agent {name!r}: limits must be a so.Limits, not {limits!r}")
        if limits is not None and limits.cost_bound is not None and unpriced(model):
            # Its responses would all cost 0: the budget could never be spent.
            raise UsageError(
                f"agent {name!r}: max_cost_usd cannot bound {model!r}, whose price signoff does "
                "not know (it would count every response as free); pass "
                "price_per_mtok=(input_usd, output_usd) per million tokens ((0, 0) if it is free)"
            )
        for what, given in (("tools", tools), ("guardrails", guardrails)):
            if not isinstance(given, Iterable):  # one tool or guardrail given alone
                raise UsageError(
                    f"agent {name!r}: {what} must be a list of {what}, not {type(given).__name__}"
                )
        self.name = name
        self.model = model
        self.instructions = instructions
        self.tools: dict[str, Tool] = {}
        for t in tools:
            if not isinstance(t, Tool):
                raise UsageError(f"agent {name!r}: {t!r} is not a Tool; decorate it with @tool")
            if t.name in self.tools:
                raise UsageError(f"agent {name!r}: two tools are named {t.name!r}")
            self.tools[t.name] = t
        if limits is not None and limits.cost_bound is not None:
            for t in self.tools.values():
                review = t.approval.reviewer()
                if review is not None and unpriced(review):
                    # What each review cost counts against the budget too: as nothing.
                    raise UsageError(
                        f"agent {name!r}: max_cost_usd cannot bound the auto() review of tool "
                        f"{t.name!r}, whose model {review!r} has no price signoff "
                        "knows (it would count every review as free); pass price_per_mtok="
                        "(input_usd, output_usd) per million tokens ((0, 0) if it is free)"
                    )
        self.guardrails = list(guardrails)
        for g in self.guardrails:
            if isinstance(g, type) and issubclass(g, Guardrail):
                raise UsageError(
                    f"agent {name!r}: {g.__name__} is a guardrail class: pass one of it, "
                    f"{g.__name__}()"
                )
            if not isinstance(g, Guardrail):
                raise UsageError(f"agent {name!r}: {g!r} is not a guardrail")
            own_decide(g, Guardrail, f"agent {name!r}: guardrail")
            names = g.tool_names()
            if isinstance(names, str):  # its letters were read as the names of tools
                raise UsageError(
                    f"agent {name!r}: guardrail {type(g).__name__}'s tool_names() must return "
                    f"a list of tool names, not the string {names!r}"
                )
            unknown = sorted(set(names) - set(self.tools))
            if unknown:
                raise UsageError(
                    f"agent {name!r}: guardrail names unknown tool(s): {', '.join(unknown)}"
                )
        self.limits = limits or Limits()

    def __repr__(self) -> str:
        return f"Agent({self.name!r}, tools={list(self.tools)})"


def unpriced(model: object) -> bool:
    """Whether `model` counts every response as free: a provider model whose price signoff
    does not know (no `price_per_mtok=` nor a list price), which no cost budget can bound."""
    return isinstance(model, SdkModel) and model.price_per_mtok is None


def by_name(agents: object) -> dict[str, Agent]:
    """A runtime's agents by name: a list of `Agent` objects, no two of one name (a name, one
    agent alone or no list at all was a bare TypeError or AttributeError)."""
    if isinstance(agents, (str, Agent)) or not isinstance(agents, Iterable):
        raise UsageError(f"agents must be a list of Agent objects, not {agents!r}")
    named: dict[str, Agent] = {}
    for agent in agents:
        if not isinstance(agent, Agent):
            raise UsageError(f"agents must be a list of Agent objects, not one of {agent!r}")
        if agent.name in named:
            raise UsageError(f"two agents are named {agent.name!r}")
        named[agent.name] = agent
    return named
