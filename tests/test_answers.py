"""Answers on their way in (`_answers`): how a reply is checked against its request before
anything is recorded, and how a second answer to a settled request is told apart from the
first."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff._answers import (
    MAX_DEPTH,
    MAX_TEXT_BYTES,
    Reply,
    input_responses,
    repeat,
    resolution,
)
from signoff.testing import call, call_tools, reply, scripted_agent, store_contents


def question(**fields: Any) -> so.InputRequest:
    return so.InputRequest(
        id="req_1",
        kind="question",
        session_id="ses_1",
        turn_id="trn_1",
        agent="ops",
        question="Which plan?",
        created_at=1.0,
        **fields,
    )


def nested(levels: int) -> Any:
    """A value of `levels` lists, one inside the other."""
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


def test_a_hash_on_the_answer_to_a_question_bound_to_no_call_is_invalid_not_stale() -> None:
    """A question asked outside any call has no input hash to compare: an answer naming one is
    malformed (`InvalidAnswer`), not an answer to another version of the call (`StaleAnswer`)."""
    with pytest.raises(so.InvalidAnswer, match="bound to no call: it takes no input_hash"):
        resolution(question(allow_text=True), Reply("req_1", None, "pro", input_hash="sha256:x"))


def test_an_answers_value_may_nest_up_to_the_limit_and_no_deeper() -> None:
    request = question(allow_text=True)
    done = resolution(request, Reply("req_1", None, "pro", value=nested(MAX_DEPTH)))
    assert done["outcome"] == "answered"
    with pytest.raises(so.InvalidAnswer, match=f"nests deeper than {MAX_DEPTH} levels"):
        resolution(request, Reply("req_1", None, "pro", value=nested(MAX_DEPTH + 1)))


def test_an_answer_over_the_text_limit_is_refused() -> None:
    """What an answer records is bounded like any text a person sends (`MAX_TEXT_BYTES`), its
    value included; an answer just inside the bound is taken."""
    request = question(allow_text=True)
    small = resolution(request, Reply("req_1", None, "pro", value="x" * (MAX_TEXT_BYTES - 200)))
    assert small["outcome"] == "answered"
    with pytest.raises(so.InvalidAnswer, match=f"over the limit of {MAX_TEXT_BYTES}"):
        resolution(request, Reply("req_1", None, "pro", value="x" * (MAX_TEXT_BYTES + 1)))


def test_free_text_counts_once_against_the_text_limit() -> None:
    """A free-text answer is recorded as the answer's value and as its text, and was measured
    so: a 3 MiB reply, under the 4 MiB a person's text may take (a message of it is taken),
    was refused as "the answer is 6291535 bytes". It counts once now, as the person gave it."""
    request = question(allow_text=True)
    text = "x" * (MAX_TEXT_BYTES - 200)
    done = resolution(request, Reply("req_1", None, text))
    assert done["answer"] == {"value": text, "option_id": None, "text": text}
    with pytest.raises(so.InvalidAnswer, match=f"over the limit of {MAX_TEXT_BYTES}"):
        resolution(request, Reply("req_1", None, "x" * (MAX_TEXT_BYTES + 1)))


def test_text_counts_as_its_utf8_bytes_however_json_escapes_it() -> None:
    """A person's text is bounded as a message's is, by its UTF-8 bytes: the answer's text and
    an approval's reason were measured as escaped JSON with their wrapping, so 4 MiB of letters,
    or 3 MiB of quotes (taken as a prompt), were refused ("the answer is 6291537 bytes")."""
    request = question(allow_text=True)
    for text in ("x" * MAX_TEXT_BYTES, '"' * (3 << 20), 'x"\\\n' * (MAX_TEXT_BYTES // 4)):
        assert resolution(request, Reply("req_1", None, text))["answer"]["text"] == text
    with pytest.raises(so.InvalidAnswer, match=f"{MAX_TEXT_BYTES + 1} bytes, over the limit"):
        resolution(request, Reply("req_1", None, "\u00e9" * (MAX_TEXT_BYTES // 2) + "x"))
    approval = _request("tool-approval")
    reason = '"' * MAX_TEXT_BYTES
    assert resolution(approval, Reply("req_1", "cancel", reason))["reason"] == reason
    with pytest.raises(so.InvalidAnswer, match=f"{MAX_TEXT_BYTES + 1} bytes, over the limit"):
        resolution(approval, Reply("req_1", "cancel", reason + "x"))
    # A reason and a value are what the person gave, in all: bounded together.
    with pytest.raises(so.InvalidAnswer, match="over the limit"):
        resolution(approval, Reply("req_1", "approve", reason[:-2], value="xy"))
    assert resolution(approval, Reply("req_1", "approve", reason[:-4], value="x"))["value"] == "x"


def _request(kind: str) -> so.InputRequest:
    return so.InputRequest(
        kind=kind, id="req_1", session_id="ses_1", turn_id="trn_1", agent="a", created_at=0.0
    )


def test_a_conflicting_answer_says_a_cancelled_approval_was_denied() -> None:
    """A deny's outcome is `cancelled`: a person who typed `deny` reads that it was denied."""
    approval = _request("tool-approval")
    with pytest.raises(so.ConflictingAnswer) as denied_first:
        repeat(approval, "settled", {"outcome": "cancelled"}, {"outcome": "approved"})
    assert str(denied_first.value) == (
        "request req_1 was already settled as 'cancelled' (denied); this answer says 'approved'"
    )
    with pytest.raises(so.ConflictingAnswer) as approved_first:
        repeat(approval, "settled", {"outcome": "approved"}, {"outcome": "cancelled"})
    assert str(approved_first.value).endswith("this answer says 'cancelled' (denied)")
    question = _request("question")  # a question's `cancel` option is no deny
    with pytest.raises(so.ConflictingAnswer) as other:
        repeat(question, "settled", {"outcome": "answered"}, {"outcome": "cancelled"})
    assert str(other.value).endswith("already settled as 'answered'; this answer says 'cancelled'")
    same = repeat(approval, "settled", {"outcome": "cancelled"}, {"outcome": "cancelled"})
    assert (same.outcome, same.applied) == ("cancelled", False)


def test_deny_is_the_cancel_option_and_a_refusal_says_so() -> None:
    """Approvals are `approve` / `cancel` (labelled Deny): `deny`, the word `signoff deny` and
    the dashboard use, is refused naming the option that denies."""
    approval = so.InputRequest(
        id="req_1",
        kind="tool-approval",
        session_id="ses_1",
        turn_id="trn_1",
        agent="ops",
        created_at=1.0,
    )
    with pytest.raises(so.InvalidAnswer) as refused:
        resolution(approval, Reply("req_1", "deny", None))
    assert str(refused.value) == (
        "request req_1 is an approval: option_id must be 'approve' or 'cancel' (to deny), "
        "not 'deny'"
    )


@pytest.mark.parametrize(
    "given",
    [
        so.Decision(id="req_1", approved=False),
        {"id": "req_1", "approved": False, "reason": "no"},
        {"request_id": "req_1", "approved": True},
    ],
)
def test_a_decision_given_as_a_response_says_where_decisions_go(given: Any) -> None:
    """`respond` takes `InputResponse`s: a `Decision` (or its dict) is refused naming both the
    shape `respond` takes and `generate(approvals=...)`, not with pydantic's report."""
    with pytest.raises(so.InvalidAnswer) as refused:
        input_responses([given])
    assert str(refused.value) == (
        "response #1 is a decision (id, approved): respond takes InputResponse(request_id=..., "
        "option_id='approve' or 'cancel', text=reason); pass decisions to "
        "generate(approvals=...) instead"
    )
    assert refused.value.request_ids == ["req_1"]


def test_a_malformed_response_names_its_problems_in_one_line() -> None:
    with pytest.raises(so.InvalidAnswer) as refused:
        input_responses([{"request_id": "req_1", "option": "approve"}])
    assert str(refused.value) == (
        "response #1 is malformed: option: Extra inputs are not permitted"
    )
    assert refused.value.request_ids == ["req_1"]
    with pytest.raises(so.InvalidAnswer, match="^no responses given$"):
        input_responses([])


async def test_a_principal_whose_attributes_are_not_plain_json_is_refused(store_url: str) -> None:
    """Who acts is recorded with each turn and answer: attributes JSON cannot hold (an object,
    an integer of more than 4,300 digits, NaN, which strict readers refuse) were a bare
    TypeError or ValueError (NaN was stored); each is a UsageError and nothing is recorded."""
    from signoff.testing import call, call_tools, reply, scripted_agent, store_contents

    @so.tool(approval=so.always())
    async def pay(amount: int) -> str:
        """Pay an amount."""
        return "paid"

    agent = scripted_agent("ops", [call_tools(call("pay", amount=5)), reply("ok")], tools=[pay])
    bad = [{"o": object()}, {"n": [10**5000]}, {"f": float("nan")}, {"f": float("-inf")}]
    async with so.Runtime([agent], store=store_url) as rt:
        for attributes in bad:
            who = so.Principal(authenticator="sso", principal_id="mallory", attributes=attributes)
            with pytest.raises(so.UsageError, match="auth's attributes are not plain JSON"):
                await rt.generate("ops", prompt="pay", auth=who)
        assert await rt.sessions() == []
        r = await rt.generate("ops", prompt="pay")
        (req,) = r.pending
        before = await store_contents(rt.store, r.session_id)
        approve = so.InputResponse(request_id=req.id, option_id="approve")
        for attributes in bad:
            who = so.Principal(authenticator="sso", principal_id="mallory", attributes=attributes)
            with pytest.raises(so.UsageError, match="principal's attributes are not plain JSON"):
                await rt.respond(r.session_id, [approve], principal=who)
            assert await store_contents(rt.store, r.session_id) == before
        r = await rt.respond(r.session_id, [approve])
        assert r.status == "completed"


@pytest.mark.parametrize("text", ["\ud800", "a\ud800b", "ok \udcff"])
async def test_typed_text_with_a_lone_surrogate_is_said_to_be_no_unicode_text(
    store_url: str, text: str
) -> None:
    """A free-text answer of one lone surrogate was refused as "the answer text is empty" (it
    draws nothing) and one holding it amid text with a codec's words; `send` said the first
    "says nothing" and the other "holds a lone surrogate". Each is now told it is not Unicode
    text, by its usual error, before it is judged blank; nothing is recorded."""

    @so.tool
    async def ask(ctx: so.ToolContext) -> str:
        """Ask anything."""
        return str((await ctx.ask("Say?", options=["yes", "no"])).text)

    agent = scripted_agent("a", [call_tools(call("ask")), reply("done")], tools=[ask])
    said = "is not valid Unicode text: it holds a lone surrogate"
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go")
        sid, (asked,) = r.session_id, r.pending
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.InvalidAnswer) as refused:
            await rt.respond(sid, [so.InputResponse(request_id=asked.id, text=text)])
        assert str(refused.value) == f"request {asked.id}: the answer text {said}"
        with pytest.raises(so.UsageError) as told:
            await rt.send(sid, text)
        assert str(told.value) == f"the message {said}"
        with pytest.raises(so.UsageError, match=f"^the prompt {said}$"):
            await rt.generate(session_id=sid, prompt=text)
        assert await store_contents(rt.store, sid) == before


def test_a_reason_with_a_lone_surrogate_is_said_to_be_no_unicode_text() -> None:
    """An approval's reason is held to the same words as a typed answer, not a codec's."""
    approval = _request("tool-approval")
    for text in ("\ud800", "fine \udfff"):
        with pytest.raises(so.InvalidAnswer) as refused:
            resolution(approval, Reply("req_1", "cancel", text))
        said = "the reason is not valid Unicode text: it holds a lone surrogate"
        assert str(refused.value) == f"request req_1: {said}"
