"""`auto()`: an approval policy that asks a decision model to review each exact call.

`clear` runs the call; `caution`, or any failure, timeout, unparsable answer or missing input,
asks a person. The verdict and reason are recorded on the request the person sees.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from ._approval import ApprovalContext, ApprovalPolicy, Verdict
from ._error_text import error_text
from ._exceptions import ModelError, UsageError
from ._output_caps import (
    BYTES_PER_TOKEN,
    input_price,
    output_cap,
    output_price,
    spare,
    text_tokens,
)
from ._settings import flag, positive_seconds, shown_value
from ._sync import TimeBound
from ._tool_json import kept, unlike
from ._tracing import review
from ._types import ModelResponse, Usage, UserMessage, billable, reported_usage
from .models._base import not_a_model_class

if TYPE_CHECKING:
    from .models import Model

__all__ = ["Criteria", "auto"]

DEFAULT_INSTRUCTIONS = (
    "You review one tool call an AI agent wants to make, before it runs. Decide whether it can "
    "run without a person looking at it. Answer with JSON only: "
    '{"verdict": "clear" | "caution", "reason": "<one sentence>"}.'
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Criteria:
    """What `clear` and `caution` mean for this tool."""

    clear: str = "The call has no dangerous, irreversible or surprising effect."
    caution: str = (
        "The call could cause harm, spend money, change or delete data, reach other people, or "
        "its input is incomplete or suspicious."
    )

    def __post_init__(self) -> None:
        # Else the reviewer was told `clear means: 5`, or nothing at all.
        for name in ("clear", "caution"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise UsageError(
                    f"Criteria({name}=...) must be non-empty text, not {shown_value(value)}"
                )


class _Auto(ApprovalPolicy):
    label = "Auto"

    def __init__(
        self,
        model: Model | None,
        instructions: str,
        criteria: Criteria,
        timeout: float,
        review_edits: bool = False,
    ) -> None:
        self.model = model
        self.instructions = instructions
        self.criteria = criteria
        self.timeout = timeout
        self.review_edits = review_edits

    def reviewer(self) -> object | None:
        return self.model

    async def decide(self, ctx: ApprovalContext) -> Verdict:
        if ctx.edited and not self.review_edits:
            # Clear or caution, the edit stands (a caution asks a person: the approver is one),
            # so a review would only cost.
            return Verdict("run")
        if self.model is None:
            return _caution("failed", "no decision model is configured for auto()")
        tool_input: Any = ctx.tool_input
        if isinstance(tool_input, BaseModel):
            tool_input = _shown(tool_input)
            if tool_input is None:
                return _caution(
                    "caution",
                    "the call's input as JSON is not what the tool would get (a field it leaves "
                    "out or shows otherwise), so it cannot be reviewed",
                )
        if tool_input is None:
            return _caution("caution", "the call has no input to review")
        from .models import ModelRequest
        from .models._base import reply_to

        prompt = (
            f"Tool: {ctx.tool_name}\nInput (JSON): {json.dumps(tool_input, sort_keys=True)}\n\n"
            f"clear means: {self.criteria.clear}\ncaution means: {self.criteria.caution}"
        )
        # The review's output is capped at what the session's budgets leave once its input is
        # counted (estimated from its text: no earlier call read it), as a turn's reply.
        price = output_price(self.model)
        reads = text_tokens(self.instructions, prompt)
        reading = Usage(input_tokens=reads, cost_usd=reads * (input_price(self.model) or 0.0))
        cap = output_cap(spare(ctx.budget_left, reading), price)
        if cap == 0:
            if output_cap(ctx.budget_left, price) == 0:
                return _caution(
                    "failed", "the session's budgets leave no output token for a review"
                )
            return _caution(
                "failed",
                f"the session's budgets leave no output token for a review once its input (about "
                f"{reads} tokens, its text at {BYTES_PER_TOKEN} bytes a token) is counted",
            )
        request = ModelRequest(
            session_id=ctx.session.id,
            agent=f"{ctx.session.agent}:auto-review",
            instructions=self.instructions,
            messages=[UserMessage(text=prompt)],
            tools=[],
            response_index=0,
            max_output_tokens=cap,
            budgeted=bool(ctx.budget_left),
        )
        bound = TimeBound(self.timeout)
        late = f"the review took longer than {self.timeout:g}s"
        try:
            with review(self.model, request, ctx.call_id) as span:  # failed by what it raises
                async with bound:
                    response = await reply_to(self.model.complete, request)
                if isinstance(response, ModelResponse):
                    span.responded(response)
        except TimeoutError as exc:
            if bound.expired():
                return _caution("failed", late)
            # The model's own (a provider's read timeout), raised before this one: it failed.
            return _caution("failed", f"the review failed: {error_text(exc)}")
        except Exception as exc:
            # A reply billed but refused (cut off at the cap among them) counts all the same.
            spent = billable(exc.usage) if isinstance(exc, ModelError) else None
            return _caution("failed", f"the review failed: {error_text(exc)}", spent)
        # What the review cost counts in the session's usage and budgets, as a turn's reply.
        spent = billable(getattr(response, "usage", None))
        if spent is not None and getattr(response, "cost_reported", False) is True:
            spent = reported_usage(spent)  # recorded as the provider's figure, as a turn's reply
        if bound.overran():
            # A reviewer that blocked (a sync HTTP client, never awaiting) past its timeout,
            # which asyncio enforces only at an await: its verdict came too late all the same.
            return _caution("failed", late, spent)
        cut = getattr(response, "cut_off", None)
        if cut is not None:  # half a review clears nothing: `{"verdict": "clear", "reason": "but`
            return _caution("failed", f"the review was cut off ({cut})", spent)
        # An input that holds a verdict may be quoted by the reviewer: see `_parse`.
        planted = _names_verdict(tool_input)
        verdict, reason = _parse(getattr(response, "text", ""), planted=planted)
        if verdict == "clear":
            return Verdict("run", reason, auto=("clear", reason), usage=spent)
        if verdict == "caution":
            return _caution("caution", reason, spent)
        return _caution("failed", f"the review answered something unparsable: {reason}", spent)


def _names_verdict(value: Any) -> bool:
    """Whether the call's input names a `verdict` a reviewer's quote of it could carry: as it
    is, or with JSON's escapes decoded (`v\\u0065rdict`), as `_parse` reads the quote."""
    if isinstance(value, dict):
        return any(_names_verdict(k) or _names_verdict(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_names_verdict(v) for v in value)
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if "verdict" in text.lower():
        return True
    # One level of JSON's own escapes (`\u0065`, `\n`), as one `json.loads` of the quote
    # decodes; Python's `unicode_escape` warned on `\d` and failed on `C:\Users`.
    return "verdict" in _JSON_ESCAPE.sub(_unescaped, text).lower()


_JSON_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|([\"\\/bfnrt]))")
_ONE_LETTER = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _unescaped(match: re.Match[str]) -> str:
    code, letter = match.group(1), match.group(2)
    if code is not None:
        return chr(int(code, 16))
    return _ONE_LETTER.get(letter, letter)


def _shown(validated: BaseModel) -> dict[str, Any] | None:
    """Validated input as JSON, by the names the model is shown, as a person would see it; None
    if validated again it is other input (`unlike`): a review of it would not see what runs."""
    kept(validated)  # a lazy input (this review's own): its form uses up the iterators
    form = validated.model_dump(mode="json", by_alias=True)
    try:
        again = type(validated).model_validate(form)
    except (Exception, SystemExit):  # a validator may raise anything: the form is no input
        return None
    return None if unlike(validated, again, form) is not None else form


def _caution(verdict: str, reason: str, usage: Usage | None = None) -> Verdict:
    return Verdict("ask", auto=(verdict, reason), usage=usage)


_CAUTION = re.compile(r"\bcaution\b", re.IGNORECASE)
_FENCE = re.compile(r"```(?:json)?", re.IGNORECASE)
_LEAD = re.compile(r"^[\s:.,-]*")
# What may follow a verdict word (after a closing quote or `**`): the end, a line break,
# punctuation, or a dash set apart.
_ALONE = re.compile(
    r"[\"'*_`]*[ \t\r]*(?:$|\n|[:.,;!]|[-\u2013\u2014](?=\s|$))[\s:.,;!\u2013\u2014-]*(.*)",
    re.DOTALL,
)


def _parse(text: str, *, planted: bool = False) -> tuple[str | None, str]:
    """`(verdict, reason)` from JSON, or from a reply that starts with the verdict word. When
    the call's input holds a verdict (`planted`), a JSON clear counts only as the whole reply
    (in a code fence or not), as the instructions ask: beside prose it may be the input's,
    quoted by a reviewer wary in words other than caution."""
    text = (text or "").strip()
    match = re.search(r"\{.*\}", text, re.DOTALL)
    if match:
        try:
            data = json.loads(match.group(0))
        except (ValueError, RecursionError):  # nested past Python's limit: unparsable too
            data = None
        found = data.get("verdict") if isinstance(data, dict) else None
        prose = text[: match.start()] + text[match.end() :]
        # A clear verdict beside prose that says caution may be one the reviewer quoted (the
        # call's input can hold any text): it is no clear verdict.
        quoted = _CAUTION.search(prose) or (planted and _FENCE.sub("", prose).strip())
        if found == "caution" or (found == "clear" and not quoted):
            return found, str(data.get("reason") or "")
    word = re.match(r"\W*(clear|caution)\b(.*)", text, re.IGNORECASE | re.DOTALL)
    if word:
        verdict, after = word.group(1).lower(), word.group(2)
        if verdict == "caution":
            return verdict, _LEAD.sub("", after).strip()
        # "Clear danger" or "Clear-cut fraud" uses the word and gives no verdict; nor does
        # prose that says clear and then caution: a person decides.
        alone = _ALONE.match(after)
        if alone and not _CAUTION.search(alone.group(1)):
            return verdict, alone.group(1).strip()
    return None, text[:200]


def auto(
    model: Model | None = None,
    *,
    instructions: str | None = None,
    criteria: Criteria | dict[str, str] | None = None,
    timeout: float = 15.0,
    review_edits: bool = False,
) -> ApprovalPolicy:
    """Ask a decision model (any `signoff.models` model) to classify each call; an approver's
    edit of a call only with `review_edits`, whose verdict is then recorded with the approval."""
    # Each was taken, and every review then failed (a person asked each time) or read nonsense.
    not_a_model_class(model, "auto() model")
    if model is not None and not callable(getattr(model, "complete", None)):
        raise UsageError(
            "auto() model must be a signoff model (e.g. so.models.OpenAIChat('gpt-4o')), "
            f"not {shown_value(model)}"
        )
    _check_scripted(model)
    if instructions is not None and not isinstance(instructions, str):
        raise UsageError(f"auto() instructions must be text, not {shown_value(instructions)}")
    if criteria is not None and not isinstance(criteria, Criteria | dict):
        raise UsageError(
            f"auto() criteria must be a so.Criteria or a dict, not {shown_value(criteria)}"
        )
    if isinstance(criteria, dict):
        unknown = set(criteria) - {"clear", "caution"}
        if unknown:
            raise UsageError(f"auto() criteria take 'clear' and 'caution', not {sorted(unknown)}")
        criteria = Criteria(**criteria)
    if not positive_seconds(timeout):
        # NaN passed `<= 0` and then bounded nothing; a string was a TypeError; an int no
        # float holds (10**400) passed `< inf`, and its timer raised OverflowError
        raise UsageError(
            f"auto() timeout must be positive and finite (seconds), not {shown_value(timeout)}"
        )
    flag("auto() review_edits", review_edits)
    return _Auto(
        model, instructions or DEFAULT_INSTRUCTIONS, criteria or Criteria(), timeout, review_edits
    )


def _check_scripted(model: Model | None) -> None:
    """Refuse a `Scripted` reviewer of several steps: each review is a conversation of its own
    (no earlier responses), so every review plays its first step and the rest never would."""
    from .models import Scripted

    if isinstance(model, Scripted) and len(model.steps) > 1:
        raise UsageError(
            f"auto() plays a Scripted reviewer's first step for every review (each review is a "
            f"conversation of its own), so {len(model.steps) - 1} of its {len(model.steps)} steps "
            "would never be played: script one step, a function of the review's one message "
            "(the tool and its input) returning the verdict"
        )
