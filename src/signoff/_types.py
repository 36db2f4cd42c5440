"""Plain, serializable data types shared by every layer: principals, messages, requests, answers.

All are pydantic models (keyword-only); the ones that are persisted carry a `kind` discriminator.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, field_validator

__all__ = [
    "APP_PRINCIPAL",
    "Action",
    "Answer",
    "AssistantMessage",
    "ChildRef",
    "CutOff",
    "Decision",
    "InputRequest",
    "InputResponse",
    "Message",
    "ModelResponse",
    "Option",
    "Principal",
    "ReportedUsage",
    "RequestKind",
    "RequestStatus",
    "SessionStatus",
    "ToolCall",
    "ToolResultMessage",
    "Usage",
    "UserMessage",
    "MAX_ANSWERS",
    "MAX_OPTIONS",
    "MAX_REPLY_COST_USD",
    "MAX_REPLY_TOKENS",
    "MODEL_NAME_MAX",
    "billable",
    "plain_usage",
    "reported_usage",
    "usage_fields",
    "usage_too_large",
    "input_hash",
    "same_json",
    "make_options",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Principal(_Model):
    """Who is acting: the caller of a turn, a requester or a responder."""

    authenticator: str
    principal_id: str
    principal_type: str = "user"
    issuer: str | None = None
    attributes: dict[str, Any] = Field(default_factory=dict)

    def same_as(self, other: Principal | None) -> bool:
        """Compare full identity (not attributes), as a response policy should."""
        return other is not None and (
            self.authenticator,
            self.issuer,
            self.principal_type,
            self.principal_id,
        ) == (other.authenticator, other.issuer, other.principal_type, other.principal_id)


APP_PRINCIPAL = Principal(authenticator="app", principal_id="signoff:app", principal_type="runtime")
"""The principal of the application itself, as opposed to a person who answers."""


class Usage(_Model):
    """Tokens and cost of one model response (or a sum of them)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
        )

    @property
    def total_tokens(self) -> int:
        """Input and output tokens together."""
        return self.input_tokens + self.output_tokens


class ReportedUsage(Usage):
    """`Usage` whose `cost_usd` is what the provider or gateway reported the call cost
    (OpenRouter's `usage.cost`), not a price computed from its tokens; the event that records
    it says `cost_reported`. A sum is one only when each of its parts is."""

    def __add__(self, other: Usage) -> Usage:
        total = super().__add__(other)
        return reported_usage(total) if isinstance(other, ReportedUsage) else total


def reported_usage(usage: Usage) -> ReportedUsage:
    """`usage`, its cost marked as the provider's own figure."""
    if isinstance(usage, ReportedUsage):
        return usage
    return ReportedUsage(
        input_tokens=usage.input_tokens, output_tokens=usage.output_tokens, cost_usd=usage.cost_usd
    )


def plain_usage(usage: Usage) -> Usage:
    """`usage` as a `Usage` (or `ReportedUsage`) itself, as the log records it and reads it back:
    a model's own subclass of it, with fields of its own, was recorded whole and could not be
    read again, which left its session running for good."""
    kind = ReportedUsage if isinstance(usage, ReportedUsage) else Usage
    if type(usage) is kind:
        return usage
    return kind(
        input_tokens=usage.input_tokens, output_tokens=usage.output_tokens, cost_usd=usage.cost_usd
    )


def usage_fields(usage: Usage) -> dict[str, Any]:
    """An event's `usage`, with `cost_reported` beside it when its cost is the provider's figure
    (as `model.completed` has it)."""
    reported = {"cost_reported": True} if isinstance(usage, ReportedUsage) else {}
    return {"usage": plain_usage(usage).model_dump(), **reported}


MAX_REPLY_TOKENS = 2**53 - 1
"""The most input or output tokens one reply may count: more than any model reads or writes in a
call, and than JSON readers hold exactly (the shipped models count a larger figure as 0)."""

MAX_REPLY_COST_USD = 1e18
"""The most one reply may cost: over what `MAX_REPLY_TOKENS` cost at any price a shipped model
takes, and far enough from a float's range that a session's sum stays finite (two replies of
1e308 added up to infinity, which no JSON reply can show)."""

MAX_ANSWERS = 1000
"""Requests one call may answer: a turn asks far fewer, and each answer costs checks and may
cost a store read, so a body of tens of thousands of made-up ids held the server for minutes."""

MODEL_NAME_MAX = 200
"""The most characters `ModelResponse.model` may have: longer is no model's name."""


def usage_too_large(usage: Usage) -> bool:
    """Whether `usage` counts more than one reply may (see `MAX_REPLY_TOKENS`)."""
    return (
        max(usage.input_tokens, usage.output_tokens) > MAX_REPLY_TOKENS
        or usage.cost_usd > MAX_REPLY_COST_USD
    )


def billable(usage: object) -> Usage | None:
    """`usage` when a reply reports it as a plain count (not negative, finite, not too large)
    that is not nothing, else None: anything else would give budget back or could not be added
    up."""
    if not isinstance(usage, Usage) or (
        usage.input_tokens,
        usage.output_tokens,
        usage.cost_usd,
    ) == (0, 0, 0):  # by value: a `ReportedUsage` of nothing is nothing too
        return None
    counts = (usage.input_tokens, usage.output_tokens)
    if not all(type(n) is int and n >= 0 for n in counts):
        return None
    cost = usage.cost_usd
    if type(cost) not in (int, float) or not (math.isfinite(cost) and cost >= 0):
        return None
    return None if usage_too_large(usage) else plain_usage(usage)


class ToolCall(_Model):
    """A call the model proposes; `id` is assigned by the engine when the model gives none."""

    name: str
    input: Any = Field(default_factory=dict)
    id: str | None = None


CutOff = Literal["max_tokens", "content_filter"]
"""Why a model stopped before its reply was done: its output limit or context window
(`max_tokens`), or the provider's content filter or a refusal (`content_filter`)."""


class ModelResponse(_Model):
    """What a model returns for one step: text and/or tool calls, with usage. `reasoning` holds
    provider blocks the provider wants back as they came with the calls (Anthropic's thinking).
    `cut_off` says why the provider stopped the reply short (None: it ended on its own): its text
    is then partial, and none of its tool calls is run. `context_tokens` is how many of the
    input tokens the session's next call reads again at least, when that is not all of
    `usage.input_tokens` (0: not known): input the provider billed but the conversation does not
    keep (tools it ran itself, a paused turn read again) is not read again. `cost_reported`:
    `usage.cost_usd` is what the provider or gateway reported the call cost (OpenRouter's
    `usage.cost`), not a price computed from its tokens. `model`: the model the provider says
    made the reply when it names another than the one asked for (a gateway's router or
    fallback, a dated version), printable (`str.isprintable`: no control, invisible or
    bidirectional character) and at most 200 characters; `model.completed` records it."""

    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    reasoning: list[dict[str, Any]] = Field(default_factory=list)
    cut_off: CutOff | None = None
    context_tokens: int | None = Field(default=None, ge=0)
    cost_reported: bool = False
    model: str | None = Field(default=None, min_length=1, max_length=MODEL_NAME_MAX)

    @field_validator("model")
    @classmethod
    def _printable(cls, name: str | None) -> str | None:
        """Refused, as a name too long is: the log, the dashboard and terminals show it, where
        an escape sequence or a bidirectional override would steer what they show. The
        OpenAI and Anthropic models keep only what is printable of the name a reply gives."""
        if name is not None and not name.isprintable():
            raise ValueError(
                "a model's name must be printable: no control, invisible or bidirectional "
                "characters"
            )
        return name


class UserMessage(_Model):
    """A message from the person: the prompt that starts a turn, or one sent into it."""

    kind: Literal["user"] = "user"
    text: str


class AssistantMessage(_Model):
    """What the model said in one step: its text and the tool calls it proposed."""

    kind: Literal["assistant"] = "assistant"
    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    reasoning: list[dict[str, Any]] = Field(default_factory=list)


class ToolResultMessage(_Model):
    """The result of one call as the model sees it; `is_error` for errors and denials."""

    kind: Literal["tool"] = "tool"
    call_id: str
    tool_name: str
    content: Any
    is_error: bool = False


Message = Annotated[UserMessage | AssistantMessage | ToolResultMessage, Field(discriminator="kind")]
"""One entry of the conversation a model reads, told apart by its `kind`."""

RequestKind = Literal["tool-approval", "question", "session-limit"]
RequestStatus = Literal["pending", "settled", "expired", "withdrawn"]
SessionStatus = Literal["idle", "running", "waiting", "failed", "cancelled"]
"""A session's status as every surface shows it (`SessionState.status`)."""


def input_hash(value: Any, *, tool_name: str = "", call_id: str = "") -> str:
    """Hash of the tool name, call id and canonical input: binds an approval to the exact call."""
    canonical = json.dumps(
        {"tool": tool_name, "call_id": call_id, "input": value},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def same_json(a: Any, b: Any) -> bool:
    """Whether two JSON values are the same JSON: `==` takes `true` for `1` and `false` for
    `0`, so an edit from one to the other read as no edit (and ran the call unedited). Numbers
    compare by value (`1` is `1.0`), as JSON has one kind of number. Walked without recursion:
    a reviewer's value may nest as deep as the JSON parser allows."""
    pairs = [(a, b)]
    while pairs:
        x, y = pairs.pop()
        if isinstance(x, bool) or isinstance(y, bool):
            if type(x) is not type(y) or x != y:
                return False
        elif isinstance(x, dict) and isinstance(y, dict):
            if x.keys() != y.keys():
                return False
            pairs.extend((v, y[k]) for k, v in x.items())
        elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            if len(x) != len(y):
                return False
            pairs.extend(zip(x, y, strict=True))
        elif isinstance(x, (dict, list, tuple)) or isinstance(y, (dict, list, tuple)):
            return False
        elif x != y:
            return False
    return True


class Option(_Model):
    """One choice a request offers: its `id` answers it, its `label` is what a person sees."""

    id: str
    label: str
    description: str | None = None


class Action(_Model):
    """The exact call an approval is bound to."""

    call_id: str
    tool_name: str
    input: Any
    input_hash: str

    @classmethod
    def of(cls, call_id: str, tool_name: str, input: Any) -> Action:
        """The action of call `call_id`, bound to exactly this input by its hash."""
        return cls(
            call_id=call_id,
            tool_name=tool_name,
            input=input,
            input_hash=input_hash(input, tool_name=tool_name, call_id=call_id),
        )


class ChildRef(_Model):
    """Where a mirrored request (`source="child"`) comes from: a subagent's session and request,
    asked during the parent's delegate call `call_id`."""

    session_id: str
    request_id: str
    agent: str
    call_id: str


class InputRequest(_Model):
    """A durable record of something a person must answer."""

    kind: RequestKind
    id: str
    session_id: str
    turn_id: str
    agent: str
    action: Action | None = None
    question: str | None = None
    options: list[Option] = Field(default_factory=list)
    allow_text: bool = False
    payload: Any = None
    source: Literal["policy", "tool", "guardrail", "ask", "child"] = "policy"
    index: int | None = None
    requested_by: Principal | None = None
    created_at: float
    expires_at: float | None = None
    status: RequestStatus = "pending"
    policy_error: str | None = None
    usage: Usage = Field(default_factory=Usage)
    approvers: int = 1
    distinct: bool = True
    exclude_requester: bool = False
    on_timeout: Literal["deny", "approve", "escalate"] = "deny"
    escalate_to: str | None = None
    escalated_to: str | None = None
    approved_by: list[str] = Field(default_factory=list)
    auto_verdict: str | None = None
    auto_reason: str | None = None
    child: ChildRef | None = None
    response_policy: bool = False
    """The tool's response policy decides who may answer: only a runtime that has it settles."""
    max_result_bytes: int | None = None
    """The asking call's bound on its result when it asked (a `ctx.ask()` question, or a tool's
    own approval): the answer it returns must fit, settled by a runtime with the tool or without.
    None on a request recorded before requests carried it, and on the others."""
    echoes_answer: bool = False
    """The question is `ask_question`'s, which returns the answer whole (`answered`): that form
    is what must fit `max_result_bytes`."""

    @property
    def progress(self) -> str:
        """Quorum progress such as "1 of 2" (empty for single-approver requests)."""
        return f"{len(self.approved_by)} of {self.approvers}" if self.approvers > 1 else ""

    @property
    def tool_name(self) -> str | None:
        """The gated call's tool (None for a question)."""
        return self.action.tool_name if self.action else None

    @property
    def call_id(self) -> str | None:
        """The gated call's id (None for a question)."""
        return self.action.call_id if self.action else None

    @property
    def input(self) -> Any:
        """The gated call's input as proposed (None for a question)."""
        return self.action.input if self.action else None


MAX_OPTIONS = 1000
"""The most options one question may offer (`ctx.ask()`): more than a person reads through,
and a tenth of what Slack can show in one select (the dashboard shows a button each)."""


APPROVAL_OPTIONS = [
    Option(id="approve", label="Approve", description="Run the call as proposed."),
    Option(id="cancel", label="Deny", description="Do not run the call."),
]


def make_options(
    options: Any, *, before_ids_checked: bool = False, asked: list[Option] | None = None
) -> list[Option]:
    """Options from strings, dicts (`label`, optional `id` and `description`) or `Option`s.

    Each needs a label and an id that are not blank: a blank one cannot be picked everywhere. A
    dict's id is text or a whole number (its decimal text); one it lacks comes from its label
    (`_derived_ids`), made unique, so only ids given twice are refused. `before_ids_checked`: as
    an older signoff made them (a falsy id came from the label, any other was `str()`-ed), for a
    question it asked that replays. `asked`: the options a replayed question was asked with,
    whose ids those without one take (`_ids_as_asked`).
    """
    listed = options is None or isinstance(options, Iterable)  # a number was a TypeError
    if not listed or isinstance(options, (str, bytes, Mapping)):
        raise ValueError(f"options must be a list, not {type(options).__name__}")
    out: list[Option] = []
    derived: list[int] = []  # the positions of options whose id comes from their label
    for i, raw in enumerate(options or ()):
        if isinstance(raw, Option):
            out.append(raw)
        elif isinstance(raw, str):
            out.append(Option(id=raw, label=raw))
        elif isinstance(raw, dict) and isinstance(raw.get("label"), str):
            given = raw.get("id")
            if before_ids_checked:  # as a question asked before 2026-12-05 (f79b4a61) was
                given = str(given) if given else None
            elif isinstance(given, int) and not isinstance(given, bool):
                given = str(given)  # `{"id": 0}` is the option "0", not one named for its label
            elif given is not None and not isinstance(given, str):
                raise ValueError(f"option #{i + 1}'s id must be text, not {type(given).__name__}")
            if given is None:
                derived.append(i)
            out.append(
                Option(
                    id=_slug(raw["label"]) or str(i + 1) if given is None else given,
                    label=raw["label"],
                    description=raw.get("description"),
                )
            )
        else:
            raise ValueError(f"option #{i + 1} must be a string, an Option or a dict with a label")
        if not out[-1].label.strip():
            raise ValueError(f"option #{i + 1} has a blank label")
        if not out[-1].id.strip():
            raise ValueError(f"option #{i + 1} has a blank id")
        for field in ("id", "label"):
            if not _is_text(getattr(out[-1], field)):
                # An answer naming it could never be recorded (it must be valid JSON text).
                raise ValueError(f"option #{i + 1}'s {field} is not valid Unicode text")
    out = _derived_ids(out, derived)
    if asked is not None:
        out = _ids_as_asked(out, derived, asked)
    ids = [o.id for o in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"option ids must be distinct: {ids}")
    return out


def _derived_ids(options: list[Option], derived: list[int]) -> list[Option]:
    """`options` with the ids derived from labels (at positions `derived`) made unique: `C++` and
    `C#` both slug to `c`. An id stays as derived unless an id given anywhere in the list, or
    derived earlier, is the same; then it takes the first free `-2`, `-3`... after it. Ids that
    did not clash before are unchanged, so questions recorded before replay as asked."""
    if not derived:
        return options
    out, mine = list(options), set(derived)
    taken = {o.id for i, o in enumerate(out) if i not in mine}
    clashing = []
    for i in derived:  # every derived id that is free keeps it, before any is suffixed
        if out[i].id in taken:
            clashing.append(i)
        taken.add(out[i].id)
    for i in clashing:
        n = 2
        while f"{out[i].id}-{n}" in taken:
            n += 1
        taken.add(f"{out[i].id}-{n}")
        out[i] = out[i].model_copy(update={"id": f"{out[i].id}-{n}"})
    return out


def _ids_as_asked(options: list[Option], derived: list[int], asked: list[Option]) -> list[Option]:
    """`options` with each id made from a label (at positions `derived`) replaced by the id of
    the option `asked` that shows the same (label and description), not given to another: made
    by position and clash suffixes, ids differ when the same options come in another order (a
    set's), and a question's answer names an option by its id as asked. All or none: where one
    shows as none asked does, `options` as made (a replay with other options)."""
    if not derived:
        return options
    mine = set(derived)
    given = {o.id for i, o in enumerate(options) if i not in mine}
    free: dict[tuple[str, str | None], list[str]] = {}
    for o in asked:  # two that show the same (recorded before they were refused) in their order
        if o.id not in given:
            free.setdefault((o.label, o.description), []).append(o.id)
    out = list(options)
    for i in derived:
        ids = free.get((out[i].label, out[i].description))
        if not ids:
            return options
        out[i] = out[i].model_copy(update={"id": ids.pop(0)})
    return out


def _is_text(value: str | None) -> bool:
    """Whether `value` can be written as UTF-8 (a lone surrogate cannot)."""
    try:
        (value or "").encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _slug(label: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in label.lower()).split())


class Answer(_Model):
    """What `ctx.ask()` returns: `value`, the chosen option's label or the typed text, and
    `option_id` (None for text) and `responder`, who answered."""

    value: str
    option_id: str | None = None
    text: str | None = None
    responder: Principal | None = None

    @property
    def authenticator(self) -> str | None:
        """The responder's authenticator, or None when nobody is recorded."""
        return self.responder.authenticator if self.responder else None

    @property
    def principal_id(self) -> str | None:
        """The responder's principal id, or None when nobody is recorded."""
        return self.responder.principal_id if self.responder else None

    @property
    def principal_type(self) -> str | None:
        """The responder's principal type, or None when nobody is recorded."""
        return self.responder.principal_type if self.responder else None


class Decision(_Model):
    """An answer to a pending approval: approve or deny, with an optional reason; decisions go
    to `Runtime.generate(approvals=...)`, which settles every open request at once."""

    id: StrictStr
    approved: StrictBool
    reason: StrictStr | None = None
    value: Any = None
    edited_input: dict[str, Any] | None = None
    input_hash: StrictStr | None = None


class InputResponse(_Model):
    """An answer to one request, for `Runtime.respond`: an option id (an approval's `approve`,
    or `cancel` to deny with `text` as the reason; a question's option) or free text."""

    request_id: StrictStr
    option_id: StrictStr | None = None
    text: StrictStr | None = None
    value: Any = None
    edited_input: dict[str, Any] | None = None
    input_hash: StrictStr | None = None
