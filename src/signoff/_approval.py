"""Approval policies: whether a validated tool call runs, is denied, or waits for a person.

A policy is one of the helpers (`never()`, `once()`, `always()`), a predicate of the validated
input (`lambda input: input.amount > 100`), or a function of an `ApprovalContext` (recognised by
its first parameter being annotated `ApprovalContext` or named `ctx` / `context`). Either kind may
be sync or async and may return any `ApprovalStatus`.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeAlias, TypeVar

from ._error_text import error_text, readable
from ._exceptions import UsageError
from ._settings import flag, positive_seconds, shown_value
from ._sync import called_off_loop, thread_note
from ._text import is_blank, is_utf8
from ._types import Principal, Usage

__all__ = [
    "ApprovalArg",
    "ApprovalContext",
    "ApprovalPolicy",
    "ApprovalStatus",
    "Approved",
    "RequestRules",
    "Denied",
    "Guardrail",
    "SessionAuth",
    "SessionInfo",
    "Verdict",
    "always",
    "as_policy",
    "never",
    "once",
    "guardrail_setting",
    "own_decide",
    "policy",
    "predicate",
    "reason_text",
    "takes_one",
    "tool_policy",
]


@dataclass(frozen=True, slots=True)
class Approved:
    """Approve automatically; the reason reaches the model."""

    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Denied:
    """Deny automatically; the call never runs and the model receives the reason."""

    reason: str | None = None


ApprovalStatus: TypeAlias = (
    Literal["user-approval", "not-applicable", "approved", "denied"] | Approved | Denied | bool
)
"""What a policy function may return: ask a person, run, deny, or `True` / `False` (ask / run)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionAuth:
    """Who called this turn (`current`) and who created the session (`initiator`)."""

    current: Principal | None
    initiator: Principal | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionInfo:
    """Read-only identity of the session a tool or policy runs in."""

    id: str
    agent: str
    turn: str
    auth: SessionAuth
    parent: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalContext:
    """What a policy function receives. `budget_left` is what the session's budgets leave for
    model calls the policy makes (`max_tokens`, `max_cost_usd`: the least of the session's own
    and its share of its parent's, less what earlier reviews of the same reply spent); empty
    when none bounds them. `auto()` caps its review's output there, less its input. `edited`:
    the input is an approver's edit of a call a person was asked about, which only a denial
    refuses (a person has approved it). `approved`: the call was approved and is about to
    start, and only the guardrails are asked again (a deploy since may have changed them);
    false as the call is proposed and as an edit is checked."""

    session: SessionInfo
    tool_name: str
    tool_input: Any
    approved_tools: frozenset[str]  # a person approved a call of each (not a deadline, the app)
    call_id: str
    abort_signal: asyncio.Event  # set when the turn is cancelled or steered away
    pending_tools: frozenset[str] = field(default_factory=frozenset)
    budget_left: Mapping[str, float] = field(default_factory=dict)
    edited: bool = False
    approved: bool = False


@dataclass(frozen=True, slots=True)
class Verdict:
    """A policy's or guardrail's answer on one call: `Verdict("run")`, `Verdict("deny", reason)`
    (the model reads the reason) or `Verdict("ask")` (a person decides); `Guardrail.decide`
    returns one, or None to leave the call to the tool's policy."""

    action: Literal["run", "deny", "ask"]
    reason: str | None = None
    error: str | None = None
    auto: tuple[str, str] | None = None  # an auto() review: (verdict, reason)
    usage: Usage | None = None  # what the policy's own model calls cost (an auto() review)

    @staticmethod
    def spent(verdicts: Iterable[Verdict]) -> Usage | None:
        """What the policies behind `verdicts` spent on model calls, or None for nothing."""
        usages = [v.usage for v in verdicts if v.usage is not None]
        return sum(usages[1:], usages[0]) if usages else None


PolicyFn: TypeAlias = Callable[[ApprovalContext], "ApprovalStatus | Awaitable[ApprovalStatus]"]


OnTimeout = Literal["deny", "approve", "escalate"]

_MOST_APPROVERS = 2**63 - 1


def _seconds(value: float) -> str:
    """A deadline's seconds as the audit trail records them: short (`3600`, `1.5`) where that
    reads back as the same number, else whole (`1000004`, not `1e+06`): each change is one."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRules:
    """How a person's approval is gathered: quorum, eligibility and deadline."""

    approvers: int = 1
    distinct: bool = True
    exclude_requester: bool = False
    expires_in: float | None = None
    on_timeout: OnTimeout = "deny"
    escalate_to: str | None = None

    def described(self, *, quorum: bool = True) -> str:
        """The rules other than the defaults, in words ("" for none), the approver count only
        with `quorum` (a name that says it, `Always (2 approvers)`, does not): what the audit
        trail records of a tool's setting, so a change of any of them (a deadline that now
        approves, the requester no longer excluded) is one."""
        said = [f"{self.approvers} approvers"] if quorum and self.approvers > 1 else []
        if self.exclude_requester:
            said.append("not the requester")
        if not self.distinct:
            said.append("one person's approvals count each")
        if self.expires_in is not None:
            said.append(f"expires in {_seconds(self.expires_in)} s")
        if self.on_timeout != "deny":
            said.append(f"on timeout {self.on_timeout}")
        if self.escalate_to is not None:
            said.append(f"escalates to {self.escalate_to}")
        return "; ".join(said)

    def guarded(self) -> RequestRules:
        """These rules as a guardrail's request takes them: the tool's deadline may deny or
        escalate, but not approve the call unseen (the stricter of tool and guardrail wins)."""
        if self.on_timeout != "approve":
            return self
        return replace(self, on_timeout="deny")

    def __post_init__(self) -> None:
        approvers = self.approvers
        # One past what a store's integer holds (10**5000 failed every runtime's opening with a
        # bare ValueError, as Python writes out no int that long, nor could this error).
        if (
            isinstance(approvers, bool)
            or not isinstance(approvers, int)
            or not 1 <= approvers <= _MOST_APPROVERS
        ):
            raise UsageError(
                "approvers must be a positive integer (at most 2**63 - 1), "
                f"not {shown_value(approvers)}"
            )
        expires_in = self.expires_in
        # NaN fails this too, and an int no float holds (its deadline overflowed mid-turn).
        if expires_in is not None and not positive_seconds(expires_in):
            raise UsageError(f"expires_in must be positive seconds, not {shown_value(expires_in)}")
        flag("distinct", self.distinct)  # "no" was a true string
        flag("exclude_requester", self.exclude_requester)
        group = self.escalate_to
        # Spaces or invisible characters only name no group: the request would read escalated
        # to nothing; a lone surrogate is not text a channel can send.
        if group is not None and (
            not isinstance(group, str) or is_blank(group) or not is_utf8(group)
        ):
            raise UsageError(
                f"escalate_to must be a group's name (non-empty text), not {shown_value(group)}"
            )
        if self.on_timeout not in ("deny", "approve", "escalate"):
            raise UsageError(
                "on_timeout must be 'deny', 'approve' or 'escalate', "
                f"not {shown_value(self.on_timeout)}"
            )
        if self.on_timeout == "escalate" and not self.escalate_to:
            raise UsageError("on_timeout='escalate' needs escalate_to (a group name)")
        # Either alone was accepted and did nothing, while the audit trail and the request
        # (`escalate_to`) read as if the deadline would escalate or approve.
        if group is not None and self.on_timeout != "escalate":
            then = "approved" if self.on_timeout == "approve" else "denied"
            raise UsageError(
                f"escalate_to={group!r} needs on_timeout='escalate': without it the request is "
                f"{then} at its deadline and the group never hears of it"
            )
        if self.on_timeout != "deny" and expires_in is None:
            raise UsageError(
                f"on_timeout={self.on_timeout!r} needs expires_in (seconds): without a deadline "
                "the request never times out"
            )


class ApprovalPolicy:
    """Base of every approval policy; `label` is what the dashboard shows."""

    label = "Conditional"
    rules = RequestRules()

    async def decide(self, ctx: ApprovalContext) -> Verdict:
        """Whether this call runs, is denied, or waits for a person."""
        raise NotImplementedError

    def reviewer(self) -> object | None:
        """The model this policy reviews calls with, whose spend counts against the session's
        budgets (`auto()`'s); None for a policy that calls no model of signoff's."""
        return None

    def describe(self) -> str:
        """What the dashboard and the audit trail say this policy is."""
        return self.label


class _Never(ApprovalPolicy):
    label = "Never"

    async def decide(self, ctx: ApprovalContext) -> Verdict:
        return Verdict("run")


class _Always(ApprovalPolicy):
    label = "Always"

    def __init__(self, rules: RequestRules | None = None) -> None:
        self.rules = rules or RequestRules()

    def describe(self) -> str:
        if self.rules.approvers > 1:
            return f"Always ({self.rules.approvers} approvers)"
        return self.label

    async def decide(self, ctx: ApprovalContext) -> Verdict:
        return Verdict("ask")


class _Once(ApprovalPolicy):
    label = "Once"

    async def decide(self, ctx: ApprovalContext) -> Verdict:
        # A grant applies only once no request for this tool is still pending.
        if ctx.tool_name in ctx.approved_tools and ctx.tool_name not in ctx.pending_tools:
            return Verdict("run")
        return Verdict("ask")


class _Function(ApprovalPolicy):
    def __init__(self, fn: Callable[[Any], Any], *, takes_context: bool) -> None:
        self.fn = fn
        self.takes_context = takes_context

    async def decide(self, ctx: ApprovalContext) -> Verdict:
        try:
            # A sync one in a thread, as a sync tool: blocking, it would stop lease renewals.
            result = await called_off_loop(self.fn, ctx if self.takes_context else ctx.tool_input)
        except Exception as exc:  # fail closed: a broken policy asks a person
            error = f"approval policy raised {error_text(exc)}{thread_note(self.fn, exc)}"
            if not self.takes_context and isinstance(exc, TypeError) and "subscript" in str(exc):
                error += (
                    " (a predicate gets the validated input as an object: input.amount, "
                    "not input['amount'])"
                )
            return Verdict("ask", error=error)
        return normalize(result)

    def describe(self) -> str:
        name = getattr(self.fn, "__name__", "policy")
        return f"Conditional ({name})"


def normalize(result: object) -> Verdict:
    """Turn any `ApprovalStatus` into a `Verdict`; anything else asks a person (fail closed),
    saying why. Types are checked first: an object equal to everything (`mock.ANY`) is none."""
    word = result if isinstance(result, str) else None
    if result is True or word == "user-approval":
        return Verdict("ask")
    if result is False or word in ("not-applicable", "approved"):
        return Verdict("run")
    if word == "denied":
        return Verdict("deny")
    if isinstance(result, Approved):
        return Verdict("run", result.reason)
    if isinstance(result, Denied):
        return Verdict("deny", result.reason)
    kind = result.get("type") if isinstance(result, dict) else None
    if isinstance(kind, str) and kind in ("approved", "denied"):
        assert isinstance(result, dict)
        return Verdict("run" if kind == "approved" else "deny", result.get("reason"))
    return Verdict("ask", error=f"approval policy returned an invalid status: {result!r}")


def reason_text(reason: object) -> str | None:
    """A policy's reason as text the log can hold: any object is written out with `str()`, and
    what UTF-8 cannot encode (a lone surrogate) is replaced; one that shows nothing is none."""
    if reason is None:
        return None
    text = reason if isinstance(reason, str) else readable(reason)
    if is_blank(text):  # `Denied(" ")`: the model would be handed " " as the reason
        return None
    return text if text.isascii() else text.encode("utf-8", "replace").decode()


def never() -> ApprovalPolicy:
    """Never require approval (the default)."""
    return _Never()


def always(
    *,
    approvers: int = 1,
    distinct: bool = True,
    exclude_requester: bool = False,
    expires_in: float | None = None,
    on_timeout: OnTimeout = "deny",
    escalate_to: str | None = None,
) -> ApprovalPolicy:
    """Require approval before every call.

    `approvers=N` needs N eligible principals to approve (one cancel denies); `expires_in`
    seconds bounds the wait, after which `on_timeout` applies (`deny` unless you opt in).
    """
    return _Always(
        RequestRules(
            approvers=approvers,
            distinct=distinct,
            exclude_requester=exclude_requester,
            expires_in=expires_in,
            on_timeout=on_timeout,
            escalate_to=escalate_to,
        )
    )


def once() -> ApprovalPolicy:
    """Require approval the first time the tool runs in a session; allow it afterwards.

    Only a person's approval is the grant: one a deadline gave (`on_timeout="approve"`) is not.
    """
    return _Once()


def predicate(fn: Callable[[Any], Any]) -> ApprovalPolicy:
    """A function of the validated input; `True` asks a person."""
    return _Function(takes_one(_callable(fn, "predicate"), _PREDICATE), takes_context=False)


def policy(fn: PolicyFn) -> ApprovalPolicy:
    """A function of an `ApprovalContext` returning an `ApprovalStatus`."""
    return _Function(takes_one(_callable(fn, "policy"), _POLICY), takes_context=True)


_PREDICATE = (
    "approval predicate {} must take one argument, the call's validated input "
    "(lambda input: input.amount > 100)"
)
_POLICY = "approval policy {} must take one argument, an so.ApprovalContext (def check(ctx): ...)"


def takes_one(fn: Callable[..., Any], must: str) -> Callable[..., Any]:
    """`fn`, if it can be called with the one argument it is given: one that cannot (no
    parameter, two that need a value, a keyword-only one) raised a TypeError on every call, so
    each call of the tool asked a person (or each answer was refused) for a reason nobody could
    act on. `must` says what it takes, `{}` standing for its name. A class is refused: called,
    it makes one of itself (`so.Approved` as a predicate ran every call unasked)."""
    if isinstance(fn, type):
        what = must.split(" {}", 1)[0]
        raise UsageError(f"{what} must be a function, not the class {fn.__name__}")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (some builtins): left to the call
        return fn
    try:
        signature.bind(None)
    except TypeError:
        name = getattr(fn, "__name__", None)
        shown = repr(name) if isinstance(name, str) else type(fn).__name__
        bare = signature.replace(  # its parameters as the call sees them, without annotations
            parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
            return_annotation=signature.empty,
        )
        raise UsageError(f"{must.format(shown)}, not {bare}") from None
    return fn


def _callable(fn: Callable[..., Any], what: str) -> Callable[..., Any]:
    """`fn`, if it can be called: anything else made every call of the tool ask a person,
    with a TypeError for the reason."""
    if not callable(fn):
        raise UsageError(f"{what}() takes a function, not {fn!r}")
    return fn


def _takes_context(fn: Callable[..., Any]) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if not params:  # refused by `takes_one`
        return False
    first = params[0]
    annotation = first.annotation
    if annotation is ApprovalContext or (
        isinstance(annotation, str) and annotation.split(".")[-1] == "ApprovalContext"
    ):
        return True
    return first.name in ("ctx", "context")


# The policy helpers, by name, and the modules that define them.
_HELPERS = {
    "never": (__name__,),
    "once": (__name__,),
    "always": (__name__,),
    "auto": ("signoff._auto",),
    "policy": (__name__,),
    "predicate": (__name__,),
}


ApprovalArg: TypeAlias = "ApprovalPolicy | Callable[[Any], object] | bool | None"
"""What `approval=` takes: a policy (`never()`, `once()`, `always()`, `auto(...)`, `policy(fn)`),
a predicate of the validated input or a function of an `ApprovalContext` (sync or async), `True`
(always) or `False` / None (never). `as_policy` checks it, and refuses anything else."""


def as_policy(value: object) -> ApprovalPolicy:
    """Accept every form `approval=` takes and return a policy."""
    if value is None:
        return _Never()
    if value == "always":
        return _Always()
    if isinstance(value, ApprovalPolicy):
        return own_decide(value, ApprovalPolicy, "approval policy")
    if isinstance(value, type) and issubclass(value, ApprovalPolicy):  # else a predicate
        raise UsageError(
            f"approval={value.__name__} is a policy class: pass one of it, "
            f"approval={value.__name__}()"
        )
    if isinstance(value, type):
        # Called as a predicate, a class makes one of itself: `approval=so.Approved` ran every
        # call unasked (an `Approved` is a yes), `so.ApprovalSpec` asked for each one.
        raise UsageError(
            f"approval={value.__name__} is a class, not a policy: pass a policy "
            "(so.always(), so.policy(fn), ...), a predicate or a function of the context"
        )
    if value is True:
        return _Always()
    if value is False:
        return _Never()
    name = getattr(value, "__name__", None)
    if name in _HELPERS and getattr(value, "__module__", None) in _HELPERS[name]:
        # Else taken for a predicate: each call asked a person, a TypeError for the reason.
        called = f"so.{name}(fn)" if name in ("policy", "predicate") else f"so.{name}()"
        raise UsageError(f"approval=so.{name} is not called: write {called}")
    if callable(value):
        context = _takes_context(value)
        return _Function(
            takes_one(value, _POLICY if context else _PREDICATE), takes_context=context
        )
    raise UsageError(
        f"approval must be never(), once(), always(), a predicate or a policy function, "
        f"not {shown_value(value)}"
    )


_D = TypeVar("_D", ApprovalPolicy, "Guardrail")


def own_decide(value: _D, base: type[_D], what: str) -> _D:
    """`value`, if its class defines `decide`: the base's raised NotImplementedError on every
    call, so each call of the tool asked a person for a reason nobody could act on."""
    if type(value).decide is base.decide:
        raise UsageError(
            f"{what} {type(value).__name__} defines no decide(): write "
            "`async def decide(self, ctx)` returning an so.Verdict"
        )
    return value


class Guardrail:
    """Something an agent consults before each call, for tools it cannot modify."""

    async def decide(self, ctx: ApprovalContext) -> Verdict | None:
        """A verdict on this call, or None to leave it to the tool's own policy. Asked as the
        call is proposed, and again as an approved call would start (`ctx.approved`), where a
        denial wins over the approval: a costly review may decide cheaply then. An override is
        an `async def`; a plain one (which a type checker flags) runs in a thread, as a plain
        policy function does."""
        raise NotImplementedError

    def tool_names(self) -> Iterable[str]:
        """The tools this guardrail names, checked against the agent's tools when it is built."""
        return ()


class _ToolPolicy(Guardrail):
    def __init__(self, require_approval: Iterable[str], deny: Iterable[str]) -> None:
        self.require_approval = frozenset(require_approval)
        self.deny = frozenset(deny)

    async def decide(self, ctx: ApprovalContext) -> Verdict | None:
        if ctx.tool_name in self.deny:
            return Verdict("deny", f"{ctx.tool_name} is not allowed for this agent")
        if ctx.tool_name in self.require_approval:
            return Verdict("ask")
        return None

    def tool_names(self) -> Iterable[str]:
        return self.require_approval | self.deny


def tool_policy(*, require_approval: Iterable[str] = (), deny: Iterable[str] = ()) -> Guardrail:
    """Require approval for (or deny) tools by name without modifying them."""
    if isinstance(require_approval, str) or isinstance(deny, str):
        raise UsageError("tool_policy() takes lists of tool names, not a single string")
    lists = []
    for what, given in (("require_approval", require_approval), ("deny", deny)):
        # None was a bare TypeError; a name not text, one from the agent's check of its tools.
        if not isinstance(given, Iterable):
            raise UsageError(
                f"tool_policy({what}=...) takes a list of tool names, not {shown_value(given)}"
            )
        names = list(given)  # an iterator is read once
        for n in names:
            if not isinstance(n, str):
                raise UsageError(
                    f"tool_policy({what}=...): a tool name is text, not {shown_value(n)}"
                )
        lists.append(names)
    return _ToolPolicy(*lists)


DENIED_BY_GUARDRAIL = "Never (denied by guardrail)"
ASKED_BY_GUARDRAIL = "Always (guardrail)"


def guardrail_setting(guardrails: Iterable[Guardrail], name: str) -> str | None:
    """What the agent's guardrails make of tool `name`, the strictest of them all as its calls
    find (a deny of any wins over another's approval), or None when none names it: what both
    the audit trail and the dashboard say of it."""
    asked = False
    for g in guardrails:
        deny = getattr(g, "deny", ())
        if isinstance(deny, (set, frozenset, list, tuple)) and name in deny:
            return DENIED_BY_GUARDRAIL
        asked = asked or name in set(g.tool_names())
    return ASKED_BY_GUARDRAIL if asked else None
