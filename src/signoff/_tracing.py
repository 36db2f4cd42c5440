"""OpenTelemetry traces of drives, model calls and tool bodies (the `signoff[otel]` extra).

The engine starts and ends spans through a `Tracing`; without `opentelemetry` installed it gets
`OFF`, whose spans do nothing, and `opentelemetry` is never imported. Attributes follow the
OpenTelemetry GenAI semantic conventions where they apply, `signoff.*` for the rest.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, Self, TypeVar, cast

from ._error_text import error_message, error_text
from ._exceptions import UsageError
from ._refused_replies import refused_cost
from ._span_errors import error_type, exception_type, named
from ._text import cut, storable
from ._trace_content import (
    MESSAGES_MAX,
    ShownInputs,
    json_text,
    messages_json,
    shown_input,
    span_attributes,
    span_value,
)
from ._trace_resumes import goes_on_with, ran_before
from ._types import Usage

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from ._state import SessionState

__all__ = [
    "MESSAGES_MAX",
    "OFF",
    "DriveSpan",
    "ModelSpan",
    "ToolSpan",
    "Tracing",
    "review",
    "tracing_for",
]

# Set on model spans for the providers signoff knows; other models get none.
_PROVIDERS = {"OpenAIChat": "openai", "Anthropic": "anthropic"}

_P = ParamSpec("_P")
_R = TypeVar("_R")

log = logging.getLogger("signoff.runtime")

# A W3C `traceparent` of version 00: trace id, span id, trace flags, in lower-case hex.
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")

_TEXT_MAX = 16_384
"""With content on, an error's message, stack trace and status description are cut past this
many characters: the log cuts what it stores too, and a span of megabytes is one an exporter
sends slowly or drops with its whole batch."""

_NO_TOOLS: Mapping[str, Any] = MappingProxyType({})

_REVIEWS: ContextVar[tuple[Tracing, SessionState] | None] = ContextVar(
    "signoff_tracing_reviews", default=None
)
"""While a call's policy and guardrails decide it (`Tracing.reviews`): the tracing and state its
review calls (`review`) are traced with."""

# `opentelemetry.trace` and `opentelemetry.context`, once a runtime found them installed.
_trace: Any = None
_context: Any = None


def tracing_for(provider: Any, content: object) -> Tracing:
    """The `Tracing` of a runtime: to `provider` (a `TracerProvider`), else to the global one
    once a drive finds one set; OpenTelemetry is imported then, if it is installed at all."""
    if type(content) is not bool:
        raise UsageError(f"trace_content must be True or False, not {content!r}")
    if provider is None:
        return Tracing(None, content, lazy=True)
    if not _load():
        raise UsageError("tracer_provider needs OpenTelemetry: pip install 'signoff[otel]'")
    if not isinstance(provider, _trace.TracerProvider):
        raise UsageError(
            "tracer_provider must be an opentelemetry TracerProvider, "
            f"not {type(provider).__name__}"
        )
    return Tracing(_tracer(provider), content)


def _load() -> bool:
    """Import OpenTelemetry's API; False if it is not installed."""
    global _trace, _context
    if _trace is None:
        try:
            from opentelemetry import context, trace
        except ImportError:
            return False
        _trace, _context = trace, context
    return True


def _settable() -> bool:
    """Whether a global tracer provider may be set: OpenTelemetry's API was imported (setting
    one imports it) or OTEL_PYTHON_TRACER_PROVIDER names one (the API loads it when asked). If
    not, a drive need not import it to find none set: some milliseconds of a process's first."""
    return "opentelemetry.trace" in sys.modules or "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def _tracer(provider: Any) -> Tracer:
    version = getattr(sys.modules.get("signoff"), "__version__", None)
    return cast("Tracer", _trace.get_tracer("signoff", version, tracer_provider=provider))


def _guarded(method: Callable[_P, _R | None]) -> Callable[_P, _R | None]:
    """`method`, an exception of the tracer provider's (a span processor's `on_start` or
    `on_end`, an exporter called from them, a span of a third-party SDK) logged, not raised: a
    trace is an observer of the turn, and a failing one must not fail the turn, nor leave a tool
    body that ran unrecorded (it would run again on a retry)."""

    @functools.wraps(method)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> _R | None:
        try:
            return method(*args, **kwargs)
        except Exception:
            name = method.__qualname__
            log.warning("tracing failed in %s; the turn goes on", name, exc_info=True)
            return None

    return guarded


class _Span:
    """One span, current (its children's parent) from creation until `end`; as a context
    manager it ends on any exit, failed by any exception that leaves it."""

    __slots__ = ("_token", "content", "span")

    def __init__(
        self, tracer: Tracer, name: str, kind: Any, attributes: dict[str, Any], content: bool
    ) -> None:
        self.span: Span = _trace.INVALID_SPAN  # records nothing, if the provider fails to start
        self.content = content
        self._token: object | None = None
        self._start(tracer, name, kind, attributes)

    @_guarded
    def _start(self, tracer: Tracer, name: str, kind: Any, attributes: dict[str, Any]) -> None:
        shown = span_attributes(attributes)
        span = tracer.start_span(span_value(name), kind=kind, attributes=shown)
        self.span = span
        # The no-op tracer hands back the current span: nothing to make current then.
        if span.is_recording() or span.get_span_context().is_valid:
            self._token = _context.attach(_trace.set_span_in_context(span))

    # Every text signoff puts on a span goes through these: `span_value` escapes the lone
    # surrogates the OTLP exporter cannot encode.
    def _set(self, key: str, value: Any) -> None:
        self.span.set_attribute(key, span_value(value))

    def _event(self, name: str, attributes: Mapping[str, Any]) -> None:
        self.span.add_event(name, span_attributes(attributes))

    def _error(self, why: str) -> None:
        self.span.set_status(_trace.Status(_trace.StatusCode.ERROR, span_value(why)))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            if exc is not None:
                self.fail(exc)
        finally:
            self.end()

    @_guarded
    def fail(self, exc: BaseException) -> None:
        """Set the span's status to error. Its message and stack trace are recorded only with
        content on: they may quote tool input or message text."""
        span = self.span
        if not span.is_recording():
            return
        self._set("error.type", error_type(exc))
        if self.content:
            why = cut(storable(error_text(exc)), _TEXT_MAX)
            # The event `record_exception` adds, but with the texts cut; and that reads the
            # message again, which may raise.
            stack = cut(storable("".join(traceback.format_exception(exc))), _TEXT_MAX)
            attributes = {"exception.type": exception_type(exc), "exception.stacktrace": stack}
            message = cut(storable(error_message(exc)), _TEXT_MAX)
            self._event("exception", {**attributes, "exception.message": message})
        else:
            self._event("exception", {"exception.type": exception_type(exc)})
            why = named(exc)
        self._error(why)

    def end(self) -> None:
        try:
            if self._token is not None:
                _context.detach(self._token)
                self._token = None
        finally:
            self._end()

    @_guarded
    def _end(self) -> None:
        self.span.end()


class DriveSpan(_Span):
    """`invoke_agent {agent}`: one process driving one turn until it completes, fails or parks."""

    __slots__ = ("began",)  # the turn `begin` named

    @_guarded
    def begin(self, state: SessionState, now: float) -> None:
        """Name the turn; a resumed one also names the answers it goes on with and how long
        the first of them waited for its person."""
        span = self.span
        if not span.is_recording():
            return
        turn = state.turn
        span.update_name(span_value(f"invoke_agent {state.agent}"))
        self._set("gen_ai.agent.name", state.agent)
        if turn is None:
            return
        self._set("signoff.turn_id", turn.id)
        self.began = turn.id
        self._set("signoff.drive.resumed", ran_before(turn))
        if turn.traceparent is not None and turn.status not in ("completed", "cancelled"):
            self._link(turn.traceparent)
        answered = [r for r in goes_on_with(state) if r.request.created_at]
        if answered:
            asked = min(r.request.created_at for r in answered)
            self._set("signoff.waited_seconds", max(0.0, now - asked))
            self._event(
                "signoff.turn.resumed",
                {
                    "signoff.request_ids": [r.request.id for r in answered],
                    "signoff.request_kinds": [r.request.kind for r in answered],
                    "signoff.request_outcomes": [r.outcome or "" for r in answered],
                },
            )

    def _link(self, traceparent: str) -> None:
        """Link to the drive that last parked the turn, from its stored `traceparent`; one
        that does not parse (edited by hand, say) is passed over."""
        parent = _span_context(traceparent)
        # Before 1.23 neither adds links to a started span: the API has no `add_link`, or its
        # default (which an older SDK's spans inherit) only warns.
        default = getattr(_trace.Span, "add_link", None)
        if parent is None or default is None or type(self.span).add_link is default:
            return
        self.span.add_link(parent, {"signoff.link": "resumed_from"})

    @_guarded
    def traceparent(self) -> str | None:
        """This drive's W3C trace context, for the turn it parks: the next drive links to it."""
        context = self.span.get_span_context()
        if not context.is_valid:
            return None
        return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"

    @_guarded
    def finish(self, state: SessionState | None) -> None:
        """Say how the drive left the turn: parked on which requests, ended, or failed."""
        span = self.span
        turn = None if state is None else state.turn
        if state is None or turn is None or not span.is_recording():
            return
        self._set("signoff.turn.status", turn.status)
        if turn.id != getattr(self, "began", None):  # a queued message's, begun in this drive
            self._set("signoff.turn_id", turn.id)
            self._set("signoff.drive.resumed", False)
        if turn.status == "waiting":
            pending = state.pending_requests()
            self._event(
                "signoff.turn.parked",
                {
                    "signoff.request_ids": [r.id for r in pending],
                    "signoff.request_kinds": [r.kind for r in pending],
                },
            )
        elif turn.status == "failed":
            error = turn.error or {}
            code = str(error.get("code") or "turn_failed")
            self._set("error.type", code)
            self._set("signoff.turn.retryable", turn.retryable)
            # The turn's error message may quote the model's or a tool's text: content only.
            said = storable(str(error.get("message") or code))
            why = cut(said, _TEXT_MAX) if self.content else code
            self._error(why)


def _span_context(traceparent: object) -> Any:
    """The remote `SpanContext` a stored `traceparent` names, or None if it is not one."""
    found = _TRACEPARENT.fullmatch(traceparent) if isinstance(traceparent, str) else None
    if found is None:
        return None
    trace_id, span_id, flags = (int(part, 16) for part in found.groups())
    context = _trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=_trace.TraceFlags(flags)
    )
    return context if context.is_valid else None


class ModelSpan(_Span):
    """`chat {model}`: one call of the agent's model, whose `tools` show its calls' input, and
    whose reply's `parts` the provider paused are journaled as they come (billed, each)."""

    __slots__ = ("parts", "tools")

    def __init__(
        self,
        tracer: Tracer,
        kind: Any,
        attributes: dict[str, Any],
        content: bool,
        tools: Mapping[str, Any],
        parts: Sequence[Usage] = (),
    ) -> None:
        self.tools = tools
        self.parts = parts
        model = attributes.get("gen_ai.request.model")
        super().__init__(tracer, f"chat {model}" if model else "chat", kind, attributes, content)

    def _usage(self, usage: Usage | None) -> None:
        """Record what the call billed: `usage`, and its paused parts journaled before."""
        if self.parts:
            usage = sum(self.parts, Usage()) + (usage or Usage())
        if usage is None:
            return
        self._set("gen_ai.usage.input_tokens", usage.input_tokens)
        self._set("gen_ai.usage.output_tokens", usage.output_tokens)
        self._set("signoff.usage.cost_usd", usage.cost_usd)

    @_guarded
    def fail(self, exc: BaseException) -> None:
        """Fail the span, with what the call billed all the same: a reply refused though the
        provider billed it (`refused_cost`, which the failed turn counts) and the parts of it
        journaled before."""
        super().fail(exc)
        if self.span.is_recording():
            self._usage(refused_cost(exc))

    @_guarded
    def responded(self, response: Any) -> None:
        """Record the response's usage (and, with content on, its text and calls)."""
        span = self.span
        if not span.is_recording():
            return
        self._usage(response.usage)
        self._set("signoff.tool_calls", len(response.tool_calls))
        if self.content:
            parts: list[dict[str, Any]] = []
            if response.text:
                parts.append({"type": "text", "content": response.text})
            parts += [
                {
                    "type": "tool_call",
                    "id": c.id,
                    "name": c.name,
                    "arguments": shown_input(self.tools.get(c.name), c.input),
                }
                for c in response.tool_calls
            ]
            output = [{"role": "assistant", "parts": parts}]
            self._set("gen_ai.output.messages", json_text(output))


class ToolSpan(_Span):
    """`execute_tool {tool}`: one run of a tool's body (a replay of its journal included)."""

    __slots__ = ()

    def __init__(
        self, tracer: Tracer, name: str, kind: Any, attributes: dict[str, Any], content: bool
    ) -> None:
        super().__init__(tracer, f"execute_tool {name}", kind, attributes, content)

    @_guarded
    def outcome(self, outcome: str, result: Any = None) -> None:
        """How the body ended without an error: `ok` (with its result, content on), `asking`
        (parked on a question), `approval_required`, `withdrawn`, `stopped` (turn cancelled),
        `held` (a subagent driven elsewhere)."""
        if self.span.is_recording():
            self._set("signoff.tool.outcome", outcome)
            if self.content and outcome == "ok":
                self._set("gen_ai.tool.call.result", json_text(result))


class _Off:
    """A span that records nothing, for `OFF`."""

    __slots__ = ()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass

    def begin(self, state: SessionState, now: float) -> None:
        pass

    def finish(self, state: SessionState | None) -> None:
        pass

    def traceparent(self) -> str | None:
        return None

    def responded(self, response: Any) -> None:
        pass

    def outcome(self, outcome: str, result: Any = None) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        pass

    def end(self) -> None:
        pass


_OFF_SPAN = _Off()


_NOT_INSTALLED = (
    "tracing is off: OTEL_PYTHON_TRACER_PROVIDER=%r names a tracer provider, but OpenTelemetry "
    "is not installed: pip install 'signoff[otel]'"
)


class Tracing:
    """Starts the spans of a runtime's drives; `content` puts messages, tool input and tool
    results on them (off by default: they may hold personal data)."""

    def __init__(self, tracer: Tracer | None, content: bool = False, *, lazy: bool = False) -> None:
        self.tracer = tracer
        self.content = content
        # The global provider's tracer records nothing until a provider is set, and a no-op
        # provider's never does: no span is started then, which saves most of the cost. Once
        # set, a global provider stays; each drive looks whether it is set yet (`drive`).
        self._unset = lazy
        self.on = tracer is not None and not isinstance(tracer, _trace.NoOpTracer)
        self._inputs = ShownInputs()

    def _look(self) -> None:
        """Whether the global provider is set now (OpenTelemetry imported the first time one
        may be: `_settable`)."""
        if self.tracer is None:
            if not _settable():
                return  # looked at again by the next drive, as cheaply
            if not _load():
                self._unset = False  # not installed: off for good
                if "OTEL_PYTHON_TRACER_PROVIDER" in os.environ:  # a provider asked for
                    log.warning(_NOT_INSTALLED, os.environ["OTEL_PYTHON_TRACER_PROVIDER"])
                return
        try:
            provider = _trace.get_tracer_provider()
            if self.tracer is None:
                self.tracer = _tracer(provider)
        except Exception:
            # OTEL_PYTHON_TRACER_PROVIDER names no provider that loads (its StopIteration would
            # end the drive's coroutine); it raises on every look, so one warning and off.
            self._unset = False
            log.warning(
                "tracing is off: the tracer provider OTEL_PYTHON_TRACER_PROVIDER=%r names could "
                "not be loaded",
                os.environ.get("OTEL_PYTHON_TRACER_PROVIDER"),
                exc_info=True,
            )
            return
        if not isinstance(provider, _trace.ProxyTracerProvider):
            self._unset = False
            self.on = True

    def drive(self, session_id: str) -> DriveSpan:
        """Start a drive of `session_id`'s turn: a child of the caller's current span."""
        if self._unset:
            self._look()
        if not self.on:
            return cast(DriveSpan, _OFF_SPAN)
        assert self.tracer is not None
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.conversation.id": session_id,
            "signoff.session_id": session_id,
        }
        kind = _trace.SpanKind.INTERNAL
        return DriveSpan(self.tracer, "invoke_agent", kind, attributes, self.content)

    def model(
        self,
        state: SessionState,
        model: object,
        request: Any,
        tools: Mapping[str, Any] = _NO_TOOLS,
        *,
        reviewed: str | None = None,
        parts: Sequence[Usage] = (),
    ) -> ModelSpan:
        """Start a call of `model` with `request`, for an agent with `tools` (by name): with
        content on, its calls' input is shown as they validate it, secrets masked. `reviewed`:
        the id of the tool call the model reviews (an `auto()` policy's); `parts`: what the
        parts of the reply its provider paused cost, added to as they are journaled."""
        if not self.on:
            return cast(ModelSpan, _OFF_SPAN)
        assert self.tracer is not None
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.agent.name": state.agent,
            "gen_ai.conversation.id": state.id,
            "signoff.session_id": state.id,
            "signoff.turn_id": "" if state.turn is None else state.turn.id,
        }
        if reviewed is not None:
            attributes["signoff.review.call_id"] = reviewed
        name = getattr(model, "model", None)
        if isinstance(name, str):
            attributes["gen_ai.request.model"] = name
        provider = _PROVIDERS.get(type(model).__name__)
        if provider is not None:
            attributes["gen_ai.provider.name"] = provider
        if self.content:
            if request.instructions:
                instructions = [{"type": "text", "content": request.instructions}]
                attributes["gen_ai.system_instructions"] = json_text(instructions)
            shown = functools.partial(self._inputs.of, tools=tools)
            try:  # it validates the calls with the app's tools: a trace must not fail the turn
                attributes["gen_ai.input.messages"] = messages_json(request.messages, shown)
            except Exception:
                log.warning("tracing failed to show a model call's messages", exc_info=True)
        kind = _trace.SpanKind.CLIENT
        return ModelSpan(self.tracer, kind, attributes, self.content, tools, parts)

    @contextlib.contextmanager
    def reviews(self, state: SessionState) -> Iterator[None]:
        """While a call of `state`'s turn is decided: a review its policy makes (`review`) is
        traced as a call of the agent's model, a child of the span current then."""
        token = _REVIEWS.set((self, state))
        try:
            yield
        finally:
            _REVIEWS.reset(token)

    def tool(self, state: SessionState, call_id: str, name: str, arguments: Any) -> ToolSpan:
        """Start a run of tool `name`'s body for call `call_id`."""
        if not self.on:
            return cast(ToolSpan, _OFF_SPAN)
        assert self.tracer is not None
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.type": "function",
            "gen_ai.conversation.id": state.id,
            "signoff.session_id": state.id,
            "signoff.turn_id": "" if state.turn is None else state.turn.id,
        }
        if self.content:
            # `tool.started` is recorded: raising here would leave the turn running, to fail
            # the same at every retry.
            try:
                attributes["gen_ai.tool.call.arguments"] = json_text(arguments)
            except Exception:
                log.warning("tracing failed to show a tool's input", exc_info=True)
        return ToolSpan(self.tracer, name, _trace.SpanKind.INTERNAL, attributes, self.content)


OFF = Tracing(None)
"""No tracing: OpenTelemetry is not installed."""


def review(model: object, request: Any, call_id: str) -> ModelSpan:
    """Start `auto()`'s call of `model` reviewing call `call_id`: traced with the runtime's
    tracing while `Tracing.reviews` decides the call, else recording nothing."""
    found = _REVIEWS.get()
    if found is None:
        return cast(ModelSpan, _OFF_SPAN)
    tracing, state = found
    if tracing._unset:  # an edit's review, in a process that has driven no turn yet
        tracing._look()
    return tracing.model(state, model, request, reviewed=call_id)
