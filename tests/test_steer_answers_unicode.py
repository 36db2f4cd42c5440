"""Typed replies name an option however the keyboard wrote it: full-width letters (an input
method left in its wide mode) and decomposed accents name the option they read as."""

from __future__ import annotations

from pathlib import Path

import pytest

import signoff as so
from signoff._types import APPROVAL_OPTIONS, make_options, match_option
from signoff.channels import parse_reply
from signoff.testing import Capture, ExecutionLog, reply, sqlite_runtime, tool_results

from ._steer import ALICE, refund_agent


@pytest.mark.parametrize(
    ("text", "chosen"),
    [
        ("ａｐｐｒｏｖｅ", "approve"),  # full-width, as an input method in its wide mode types it
        ("Ａｐｐｒｏｖｅ", "approve"),
        ("ＤＥＮＹ", "cancel"),
        ("\u3000approve\u3000", "approve"),  # ideographic spaces around it
        ("１", "approve"),  # a full-width digit was taken already
        ("²", None),  # a superscript is still no index
        ("approve!", None),
    ],
)
def test_an_approval_option_is_named_in_any_width(text: str, chosen: str | None) -> None:
    option = match_option(APPROVAL_OPTIONS, text)
    assert (None if option is None else option.id) == chosen


def test_a_label_is_named_composed_or_decomposed() -> None:
    options = make_options([{"id": "cafe", "label": "Caf\u00e9"}, {"id": "tea", "label": "Tea"}])
    for typed in ("Cafe\u0301", "CAFE\u0301", "caf\u00e9"):
        assert match_option(options, typed) == options[0], typed
    ids = make_options([{"id": "r\u00e9sum\u00e9", "label": "CV"}, {"id": "x", "label": "Other"}])
    assert match_option(ids, "re\u0301sume\u0301") == ids[0]


async def test_a_full_width_approve_approves_and_is_not_a_steer(tmp_path: Path) -> None:
    """Typed in an input method's wide mode, "approve" withdrew the approval as a new message
    ('ignored'), and the model read it, instead of approving the call."""
    log = ExecutionLog()
    seen = Capture(reply("Done."))
    async with sqlite_runtime(tmp_path, refund_agent(log, seen)) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        [req] = r.pending
        r = await rt.send(r.session_id, "ａｐｐｒｏｖｅ", principal=ALICE)
        assert r.status == "completed"
        assert r.outcomes == [so.Outcome(request_id=req.id, outcome="approved", applied=True)]
        assert log.count("issue_refund") == 1
        [result] = tool_results(seen.last)
        assert result.content == {"refunded": 180, "order_id": "1042"}


def test_a_text_channel_reads_a_yes_or_no_in_any_width() -> None:
    """The text channels' yes and no (the terminal's prompts, SMS-like channels) are read as
    typed replies name options: full-width, as an input method's wide mode types them."""
    approval = so.InputRequest(
        kind="tool-approval", id="req_1", session_id="s", turn_id="t", agent="a", created_at=0.0
    )
    approve = so.InputResponse(request_id="req_1", option_id="approve")
    assert parse_reply(approval, "ｙｅｓ") == approve
    assert parse_reply(approval, "１") == approve
    assert parse_reply(approval, "ＮＯ - too big") == so.InputResponse(
        request_id="req_1", option_id="cancel", text="too big"
    )
    assert parse_reply(approval, "ｍａｙｂｅ") is None
