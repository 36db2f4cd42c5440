"""The example support agent: order lookup, refunds over 100 need approval, account deletion too.

Run it with `signoff chat examples.support:runtime`. With `SIGNOFF_MODEL`, `ANTHROPIC_API_KEY`,
`OPENAI_API_KEY` or `OPENAI_BASE_URL` set it talks to that provider (`so.models.from_env`);
otherwise, or with `SIGNOFF_MODEL=demo`, it uses an offline demo model: `so.models.Scripted`
driven by a small rule-based function (`demo_model`) that reads the customer's message and the
tool results the way a real model would.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from typing import Any

import signoff as so
from signoff import (
    Message,
    ModelResponse,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

__all__ = ["ORDERS", "REFUNDS", "agent", "choose_model", "demo_model", "runtime"]

ORDERS: dict[str, dict[str, Any]] = {
    "1042": {"item": "Espresso machine", "total": 180.0, "status": "delivered"},
    "1043": {"item": "Milk frother", "total": 45.0, "status": "delivered"},
    "1044": {"item": "Coffee grinder", "total": 120.0, "status": "shipped"},
}
"""The demo shop's orders (in memory)."""

REFUNDS: list[dict[str, Any]] = []
"""Refunds issued by this process, in order: the tool's side effect."""


@so.tool
async def lookup_order(order_id: str) -> dict[str, Any]:
    """Look up an order by its number: item, total and delivery status."""
    order = ORDERS.get(order_id)
    if order is None:
        raise LookupError(f"no order {order_id}")
    return {"order_id": order_id, **order}


@so.tool(approval=lambda input: input.amount > 100)
async def issue_refund(order_id: str, amount: float, reason: str) -> dict[str, Any]:
    """Refund an order in full or in part to the original payment method."""
    order = ORDERS.get(order_id)
    if order is None:
        raise LookupError(f"no order {order_id}")
    done = sum(r["amount"] for r in REFUNDS if r["order_id"] == order_id)
    left = round(order["total"] - done, 2)  # in cents: 45.00 - 30.10 leaves 14.90, not 14.8999
    if not 0 < amount <= left:
        already = f" ({done:.2f} refunded already)" if done else ""
        raise ValueError(
            f"amount must be between 0 and what is left of the order total "
            f"{order['total']:.2f}: {left:.2f}{already}"
        )
    REFUNDS.append({"order_id": order_id, "amount": amount, "reason": reason})
    return {"order_id": order_id, "refunded": amount}


@so.tool
async def delete_account(email: str) -> dict[str, Any]:
    """Delete a customer's account and personal data."""
    return {"deleted": email}


# An order is the number after "order" ("order 42", "order #1042", "order no. 1042"), else the
# first of four digits or more; text is folded first (NFKC), so full-width digits read as digits.
_ORDER_NAMED = re.compile(r"\border\s*(?:#|no\.?|number)?\s*(\d+)\b", re.I)
_ORDER = re.compile(r"\b(\d{4,})\b")
# An amount is a number with a currency before or after it: $40, €40, 40 usd, USD 40, 40 euros,
# 40 dollars, 40.50, 40,50 (a decimal comma), 1,250.00 (thousands); read whole, its sign and
# every decimal with it (100.005 is not 100.00, nor $-5 five), for the tool to refuse or ask.
_NUMBER = r"(-?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:[.,]\d+)?))(?!\d)"
_CURRENCY = r"(?:usd|eur|gbp|dollars?|euros?|pounds?)"
# A symbol before the number first: in "order 1043 $0" the 1043 is not an amount in dollars,
# nor is 1042 in "order 1042 $-5".
_AMOUNTS = [
    re.compile(rf"[$€£]\s*{_NUMBER}"),
    re.compile(rf"\b{_CURRENCY}\s*{_NUMBER}", re.I),
    re.compile(rf"{_NUMBER}\s*(?:{_CURRENCY}\b|[$€£](?!\s*-?\d))", re.I),
]
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")

HELP = (
    "I can look up an order, refund it, or delete an account. Tell me the order number, "
    "for example: refund order 1042, it arrived broken."
)


def demo_model(conversation: list[Message]) -> ModelResponse:
    """Decide the next step from the conversation: call a tool, or answer in a sentence."""
    if not conversation:
        return ModelResponse(text=HELP)
    last = conversation[-1]
    if isinstance(last, ToolResultMessage):
        return _after_tools(conversation)
    if isinstance(last, UserMessage):
        return _on_message(last.text)
    return ModelResponse(text=HELP)


def _on_message(text: str) -> ModelResponse:
    lowered = text.lower()
    if "delete" in lowered and "account" in lowered:
        email = _EMAIL.search(text)
        if email is None:  # ask, and wait for the answer, as for a refund naming no order
            return _call("ask_question", {"question": "Which account? Give its email address."})
        return _call("delete_account", {"email": email.group(0)})
    order = _order_number(text)
    if order is None:
        if "refund" in lowered:  # rather than guess, ask which order (and wait for the answer)
            return _call("ask_question", {"question": "Which order should I refund?"})
        return ModelResponse(text=HELP)
    return _call("lookup_order", {"order_id": order})


def _after_tools(conversation: list[Message]) -> ModelResponse:
    results: list[ToolResultMessage] = []
    for message in reversed(conversation):
        if not isinstance(message, ToolResultMessage):
            break
        results.insert(0, message)
    request = _last_user_text(conversation)
    sentences = []
    for result in results:
        content, approval = _unwrap(result.content)
        if result.tool_name == "ask_question":
            answer = str(content.get("answer", "")) if content.get("status") == "answered" else ""
            email = _EMAIL.search(answer)
            if email is not None and "delete" in request.lower():
                return _call("delete_account", {"email": email.group(0)})
            folded = unicodedata.normalize("NFKC", answer).strip()  # "42" alone names it too
            answered = _order_number(folded) or (folded if folded.isdigit() else None)
            if answered:
                return _call("lookup_order", {"order_id": answered})
            sentences.append(HELP)
        elif result.tool_name == "lookup_order":
            if result.is_error:
                sentences.append(f"I couldn't find that order: {_error(content)}.")
                continue
            if "refund" in request.lower():
                amount = _requested_amount(request)  # "$0" is an amount too: not the total
                return _call(
                    "issue_refund",
                    {
                        "order_id": content["order_id"],
                        "amount": content["total"] if amount is None else amount,
                        "reason": _reason(request),
                    },
                )
            sentences.append(
                f"Order {content['order_id']} ({content['item']}, {content['total']:.2f}) "
                f"is {content['status']}."
            )
        elif result.tool_name == "issue_refund":
            if content.get("denied"):
                why = content.get("reason") or "no reason was given"
                sentences.append(f"I couldn't issue the refund: it was declined ({why}).")
            elif result.is_error:
                sentences.append(f"The refund failed: {_error(content)}.")
            else:
                note = f" (approved: {approval['reason']})" if approval.get("reason") else ""
                sentences.append(
                    f"Done. I've refunded {content['refunded']:.2f} for order "
                    f"{content['order_id']} to the original payment method{note}."
                )
        elif result.tool_name == "delete_account":
            if content.get("denied"):
                why = content.get("reason") or "no reason was given"
                sentences.append(f"I did not delete the account: it was declined ({why}).")
            elif result.is_error:
                sentences.append(f"Deleting the account failed: {_error(content)}.")
            else:
                sentences.append(f"The account {content['deleted']} has been deleted.")
    return ModelResponse(text=" ".join(sentences) or HELP)


def _unwrap(content: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tool's own result, and the approval (reason, who) signoff puts beside it, if any."""
    if not isinstance(content, dict):
        return {}, {}
    if "result" in content and ("approval" in content or "edited_input" in content):
        inner = content["result"]
        approval = content.get("approval")
        return (
            inner if isinstance(inner, dict) else {},
            approval if isinstance(approval, dict) else {},
        )
    return content, {}


def _call(name: str, input: dict[str, Any]) -> ModelResponse:
    return ModelResponse(tool_calls=[ToolCall(name=name, input=input)])


def _last_user_text(conversation: list[Message]) -> str:
    for message in reversed(conversation):
        if isinstance(message, UserMessage):
            return message.text
    return ""


def _requested_amount(text: str) -> float | None:
    folded = unicodedata.normalize("NFKC", text)
    match = next((m for m in (a.search(folded) for a in _AMOUNTS) if m is not None), None)
    if match is None:
        return None
    number = match.group(1)
    if re.fullmatch(r"-?\d+,\d{1,2}", number):  # a decimal comma: 50,00
        return float(number.replace(",", "."))
    return float(number.replace(",", ""))


def _order_number(text: str) -> str | None:
    """The order a message names: the number after "order", else its first of 4+ digits."""
    folded = unicodedata.normalize("NFKC", text)
    found = _ORDER_NAMED.search(folded) or _ORDER.search(folded)
    return None if found is None else found.group(1)


def _reason(text: str) -> str:
    _, comma, rest = text.partition(",")
    rest = rest.strip().rstrip(".!")
    if comma and rest:
        return rest[0].upper() + rest[1:]
    return "Customer requested a refund"


def _error(content: dict[str, Any]) -> str:
    error = content.get("error", "unknown error")
    if not isinstance(error, str):
        return json.dumps(error)
    return re.sub(r"^[A-Za-z]+Error: ", "", error)  # "LookupError: no order 7" -> "no order 7"


def choose_model() -> so.models.Model:
    """A real provider when the environment configures one, else the offline demo model."""
    demo = so.models.Scripted([demo_model], repeat_last=True)
    if os.environ.get("SIGNOFF_MODEL", "").strip().lower() == "demo":
        return demo
    return so.models.from_env(fallback=demo)


agent = so.Agent(
    name="support",
    model=choose_model(),
    instructions=(
        "You help customers of a small coffee-equipment shop with their orders. Look an order "
        "up before refunding it, refund at most its total, and give the customer's reason. "
        "Some actions need a person's approval: if one is denied, say so and give the reason."
    ),
    tools=[lookup_order, issue_refund, delete_account, so.ask_question()],
    guardrails=[so.tool_policy(require_approval=["delete_account"])],
)

runtime = so.Runtime([agent], store="sqlite:///.signoff/state.db")
