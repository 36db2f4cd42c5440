"""Block Kit for requests: approvals with Approve / Deny, questions with a select menu.

Action ids are signoff's own (`signoff.approve`, `signoff.deny`, `signoff.option`,
`signoff.text`); every interactive element carries the request id as its value.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..._text import BIDI, HIDDEN, escape_as_json, far_off, in_utc
from ..._types import InputRequest, Principal
from .._base import DELETED, Erased, Resolution

__all__ = [
    "APPROVE",
    "DENY",
    "DENY_VIEW",
    "OPTION",
    "TEXT",
    "TEXT_VIEW",
    "UNPARSED",
    "chosen_option",
    "closed_as",
    "deny_view",
    "erased_blocks",
    "erased_text",
    "fallback_text",
    "note_text",
    "refused_view",
    "TOO_LONG",
    "request_blocks",
    "short_blocks",
    "short_text",
    "slack_mention",
    "text_length",
    "text_view",
]

APPROVE = "signoff.approve"
DENY = "signoff.deny"
OPTION = "signoff.option"
TEXT = "signoff.text"
DENY_VIEW = "signoff.deny"
TEXT_VIEW = "signoff.text"
REASON_BLOCK = "signoff.reason"

# The top-level `text` (a notification's, a note's) has no `verbatim`: Slack is told not to
# process it, so no bare `@here`, `#channel` or name in a request's text becomes a mention or
# a link (chat.update's default, unlike chat.postMessage's, is `client`, which does).
UNPARSED: dict[str, Any] = {"parse": "none", "link_names": False}
ANSWER_BLOCK = "signoff.answer"

_MAX_TEXT = 3000  # Slack's limit for a section's (and a context element's) text
_MAX_SHOWN = 1000  # an answer or a reason in the closing line, so the line stays under it
_MAX_GROUP = 200  # a group's name in the facts line, which Slack limits as a whole
_MAX_VALUE = 150  # Slack's limit for a select option's value
_MAX_OPTIONS = 100  # Slack's limit for a select's options, and for its option groups
_MAX_PLAIN = 75  # Slack's limit for a button's or an option's text
# Slack refuses a message whose blocks hold more text than about 12,000 characters in all
# (`msg_blocks_too_long`, undocumented): a question's options share what is left of this.
_MOST_TEXT = 11_000
_OTHER_TEXT = 1500  # a question's facts line, its menu's placeholder, groups' and button's text
_LEAST_ROOM = 8  # an option's number and its label's start: fewer would say nothing
_BY_POSITION = "signoff.option#"
_MAX_NAME = 200  # an agent's or a tool's name in a short message
_CODE_SHOWN = 2700  # of a tool input cut to fit a section, beside its label and the cut's note
_SUMMARY_SHOWN = 2800  # of a question (and its options' descriptions) cut to fit a section

# Where a person reads whole what a message cuts: an open request's input or question, the
# edited input of one closed.
OPEN_WHOLE = "on the signoff dashboard or with `signoff pending --json`"
EDITED_WHOLE = "in the session's audit on the signoff dashboard"

# What Slack answers when it refuses a message's blocks: a limit signoff does not know of, or
# the undocumented one on all of a message's text together (about 12,000 characters). The
# request is then posted as `short_blocks`, which leaves the long parts out and says so.
TOO_LONG = frozenset({"invalid_blocks", "msg_blocks_too_long", "msg_too_long"})

# Lone surrogates (JSON carries them from a model, UTF-8 cannot hold them) and C0 controls but
# tab and newline: replaced in prose.
_UNSENDABLE = re.compile("[\x00-\x08\x0b-\x1f\x7f\ud800-\udfff]")
_FENCE = re.compile("`{3,}")


def sendable(text: str) -> str:
    """`text` as Slack can take and show it: what UTF-8 cannot hold and control characters
    become U+FFFD, bidirectional controls show as `\\u202e` and the like."""
    return BIDI.sub(escape_as_json, _UNSENDABLE.sub("\ufffd", text))


def _clip(text: str, limit: int) -> str:
    """Escaped text cut to `limit` characters (Slack refuses longer), never mid-entity."""
    if len(text) <= limit:
        return text
    return re.sub("&[a-z]*$", "", text[: limit - 1]) + "…"


def _plain(text: str, limit: int = 75) -> dict[str, Any]:
    text = sendable(text) if text.strip() else "(blank)"  # Slack refuses an empty text
    return {"type": "plain_text", "text": text if len(text) <= limit else text[: limit - 1] + "…"}


def _mrkdwn(text: str) -> dict[str, Any]:
    """A mrkdwn text object, `verbatim`: Slack would otherwise preprocess a request's text,
    linking bare URLs and `#channel` names and parsing some `@` mentions, which escaping does
    not stop; its markup and signoff's own `<!date…>` and `<@U…>` are still rendered."""
    return {"type": "mrkdwn", "text": _clip(text, _MAX_TEXT), "verbatim": True}


def escape(text: str) -> str:
    """`text` made sendable, with the three characters Slack's mrkdwn reserves escaped (so no
    text of a request can mention `<!channel>` or forge a link)."""
    return sendable(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _span(text: str) -> str:
    """`text` (an id) as an inline code span: escaped, and with no backtick that would end it."""
    return "`" + escape(text).replace("`", "\\u0060") + "`"


_SLACK_USER = re.compile(r"[A-Z0-9]+")


def _code(value: Any, where: str = OPEN_WHOLE) -> str:
    """`value` as indented JSON in a code block; one too long for a section is cut, and a line
    after the block says how much is shown and `where` to read it whole."""
    dumped = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    whole = len(dumped)
    dumped = escape(HIDDEN.sub(escape_as_json, dumped))
    # Backticks (only in JSON strings) that would end the code block are written as escapes.
    dumped = _FENCE.sub(lambda m: "\\u0060" * len(m.group()), dumped)
    if len(dumped) <= _MAX_TEXT - 40:
        return f"```{dumped}```"
    dumped = _clip(dumped, _CODE_SHOWN)
    return f"```{dumped}```\n_{cut_note(whole, where)}_"


def cut_note(whole: int | None, where: str) -> str:
    """What a text cut to fit Slack says after it: how long it is and where to read it all."""
    if whole is None:
        return f"Cut here: read the question and its choices whole {where}."
    return f"Cut here: it is {whole:,} characters long; read it whole {where}."


def _date(at: float) -> str:
    """A date Slack shows in each reader's time zone (UTC in the fallback text); one past the
    years a datetime holds is plain text, as no reader's time zone can show it."""
    fallback = in_utc(at, "%Y-%m-%d %H:%M UTC")
    if fallback is None:
        return far_off(at)
    return f"<!date^{int(at)}^{{date_short_pretty}} {{time}}|{fallback}>"


def slack_mention(principal: Principal | None) -> str:
    """`<@U…>` for a Slack principal (`slack:TEAM:USER`), else the principal's id."""
    if principal is None:
        return "the policy"
    parts = principal.principal_id.split(":")
    slack = principal.authenticator == "slack" and len(parts) == 3 and parts[0] == "slack"
    if slack and _SLACK_USER.fullmatch(parts[2]):  # only Slack's own user id is a mention
        return f"<@{parts[2]}>"
    # Cut, so the time and the reason after it in a closing line still show.
    return _span(_clip(principal.principal_id, _MAX_GROUP))


def fallback_text(request: InputRequest, resolution: Resolution | None = None) -> str:
    """The notification text (shown where blocks are not, and read by screen readers),
    escaped like the blocks: Slack reads mentions such as `<!channel>` in it too. A closed
    request's says how it closed, where an open one's asks for a decision."""
    if request.kind == "tool-approval":
        text = f"{request.agent} wants to run {request.tool_name}"
        if resolution is None:
            text += ": approve or deny"
    else:
        text = f"{request.agent} asks: {request.question or 'a question'}"
    if resolution is not None:
        text = f"{closed_as(resolution)}: {text}"
    return _clip(escape(text), _MAX_TEXT)


def note_text(text: str) -> str:
    """A note for the person who acted, escaped like the messages and clipped to what Slack
    takes: its text can hold a response policy's reason or an error of any length."""
    return _clip(escape(text), _MAX_TEXT)


def request_blocks(
    request: InputRequest, resolution: Resolution | None = None, *, edited_input: Any = None
) -> list[dict[str, Any]]:
    """The message for a request: open (with its controls) or closed (with who, when, how, and
    the `edited_input` an approver ran the call with instead of the proposed input); one whose
    deadline escalated it names the group it went to."""
    agent = escape(request.agent)
    blocks: list[dict[str, Any]] = []
    if request.kind == "tool-approval":
        blocks.append(
            {
                "type": "section",
                "block_id": "signoff.summary",
                "text": _mrkdwn(f"*{agent}* wants to run `{escape(request.tool_name or '')}`"),
            }
        )
        blocks.append(
            {"type": "section", "block_id": "signoff.input", "text": _mrkdwn(_code(request.input))}
        )
        if request.payload is not None:
            blocks.append(
                {
                    "type": "section",
                    "block_id": "signoff.payload",
                    "text": _mrkdwn("It asks for approval of:\n" + _code(request.payload)),
                }
            )
    else:
        question = escape(request.question or "a question")
        lines = [f"*{agent}* asks: {question}"]
        if _option_room(request) is None:
            lines += [
                f"• *{escape(o.label)}*: {escape(o.description)}"
                for o in request.options
                if o.description
            ]
        else:  # the menu shows them numbered and cut: here they are whole, as many as fit
            lines += [
                f"*{n}.* {escape(o.label)}"
                + (f": {escape(o.description)}" if o.description else "")
                for n, o in enumerate(request.options, 1)
            ]
        summary = "\n".join(lines)
        if len(summary) > _MAX_TEXT:
            shown = _clip(summary, _SUMMARY_SHOWN)
            summary = f"{shown}\n_{cut_note(None, OPEN_WHOLE)}_"
        blocks.append({"type": "section", "block_id": "signoff.summary", "text": _mrkdwn(summary)})
    facts = [f"request {_span(request.id)}", f"session {_span(request.session_id)}"]
    if request.approvers > 1:
        # Each name and the list cut, so the deadline and an escalation after them still show.
        so_far = ", ".join(_clip(escape(p), _MAX_GROUP) for p in request.approved_by)
        so_far = _clip(so_far, _MAX_SHOWN) or "none yet"
        facts.append(f"needs {request.approvers} approvals ({request.progress}: {so_far})")
    if request.expires_at is not None and resolution is None:
        facts.append(f"expires {_date(request.expires_at)}{_then(request)}")
    if request.escalated_to is not None:
        group = _clip(escape(request.escalated_to), _MAX_GROUP)
        facts.append(f":arrow_up: escalated to *{group}*: no one decided before the deadline")
    blocks.append(
        {"type": "context", "block_id": "signoff.facts", "elements": [_mrkdwn(" · ".join(facts))]}
    )
    if resolution is None:
        blocks.append(_controls(request))
    else:
        if edited_input is not None:
            text = "Approved with edited input:\n" + _code(edited_input, EDITED_WHOLE)
            blocks.append({"type": "section", "block_id": "signoff.edited", "text": _mrkdwn(text)})
        blocks.append(
            {
                "type": "context",
                "block_id": "signoff.resolution",
                "elements": [_mrkdwn(describe(request, resolution))],
            }
        )
    return blocks


def _then(request: InputRequest) -> str:
    """What its passed deadline does to a request, after the date it expires (as the terminal
    says it): nothing more for one denied then, which just expires."""
    if request.on_timeout == "approve":
        return ", then it is approved automatically"
    if request.on_timeout == "escalate" and request.escalate_to:
        return f", then it is escalated to *{_clip(escape(request.escalate_to), _MAX_GROUP)}*"
    return ""


def short_blocks(
    request: InputRequest, resolution: Resolution | None = None, *, refused: str
) -> list[dict[str, Any]]:
    """The message for a request whose full message Slack `refused` (one of `TOO_LONG`): who
    asks for what, a warning that the rest is too long for Slack and where to read it whole,
    its facts, and its controls (an approval's buttons; a question's free-text answer when it
    takes one: its choices, which may be what Slack refused, are left to the other surfaces)
    or how it closed."""
    agent = _clip(escape(request.agent), _MAX_NAME)
    if request.kind == "tool-approval":
        tool = _clip(escape(request.tool_name or ""), _MAX_NAME).replace("`", "\\u0060")
        summary = f"*{agent}* wants to run `{tool}`"
        asks = request.payload is not None
        what = "its input and what it asks approval of" if asks else "its input"
    else:
        summary = f"*{agent}* asks: {_clip(escape(request.question or 'a question'), _MAX_SHOWN)}"
        what = "its question and choices" if request.options else "its question"
    warning = (
        f":warning: This request is too long for a Slack message (Slack refused it: "
        f"`{escape(refused)}`), so {what} cannot be shown here. Read it whole before deciding: "
        f"on the signoff dashboard, or with `signoff pending --json`."
    )
    full = request_blocks(request, resolution)
    facts = [b for b in full if b.get("block_id") == "signoff.facts"]
    blocks: list[dict[str, Any]] = [
        {"type": "section", "block_id": "signoff.summary", "text": _mrkdwn(summary)},
        {"type": "section", "block_id": "signoff.short", "text": _mrkdwn(warning)},
        *facts,
    ]
    if resolution is not None:
        blocks.append(
            {
                "type": "context",
                "block_id": "signoff.resolution",
                "elements": [_mrkdwn(describe(request, resolution))],
            }
        )
        return blocks
    controls = _controls(request)
    controls["elements"] = [e for e in controls["elements"] if e["type"] == "button"]
    if controls["elements"]:
        blocks.append(controls)
    return blocks


def short_text(request: InputRequest, resolution: Resolution | None = None, *, refused: str) -> str:
    """The message of text alone for a request whose short message Slack `refused` too (a limit
    signoff does not know, met in what `short_blocks` keeps): what it is, and that it is to be
    read (and answered) elsewhere, as no buttons come with it."""
    where = "read it" if resolution is not None else "read and answer it"
    warning = (
        f"This request is too long for Slack (Slack refused it: {escape(refused)}): {where} "
        "on the signoff dashboard, or with `signoff pending --json`."
    )
    return _clip(f"{fallback_text(request, resolution)}\n{warning}", _MAX_TEXT)


def text_length(value: Any) -> int:
    """How many characters of text (each text object's and option's) `value`'s blocks hold."""
    if isinstance(value, dict):
        own = len(value["text"]) if isinstance(value.get("text"), str) else 0
        return own + sum(text_length(v) for k, v in value.items() if k != "text" or not own)
    if isinstance(value, list):
        return sum(text_length(v) for v in value)
    return 0


def _controls(request: InputRequest) -> dict[str, Any]:
    block_id = f"signoff:{request.id}"
    if request.kind == "tool-approval":
        return {
            "type": "actions",
            "block_id": block_id,
            "elements": [
                {
                    "type": "button",
                    "action_id": APPROVE,
                    "text": _plain("Approve"),
                    "style": "primary",
                    "value": request.id,
                },
                {
                    "type": "button",
                    "action_id": DENY,
                    "text": _plain("Deny"),
                    "style": "danger",
                    "value": request.id,
                },
            ],
        }
    elements: list[dict[str, Any]] = []
    if request.options:
        elements.append(
            {
                "type": "static_select",
                "action_id": OPTION,
                "placeholder": _plain("Choose an answer"),
                **_choices(request),
            }
        )
    if request.allow_text or not request.options:
        elements.append(
            {
                "type": "button",
                "action_id": TEXT,
                "text": _plain("Answer in your own words"),
                "value": request.id,
            }
        )
    return {"type": "actions", "block_id": block_id, "elements": elements}


def _choices(request: InputRequest) -> dict[str, Any]:
    """A select's `options`, or `option_groups` of 100 each when there are more than the 100
    options Slack allows in one list (it allows 100 groups)."""
    room = _option_room(request)
    options = [
        {
            "text": _plain(o.label) if room is None else _plain(f"{i + 1}. {o.label}", room),
            "value": _option_value(i, o.id),
        }
        for i, o in enumerate(request.options[: _MAX_OPTIONS * _MAX_OPTIONS])
    ]
    if len(options) <= _MAX_OPTIONS:
        return {"options": options}
    groups = []
    for start in range(0, len(options), _MAX_OPTIONS):
        part = options[start : start + _MAX_OPTIONS]
        label = f"Options {start + 1}–{start + len(part)}"
        groups.append({"label": _plain(label), "options": part})
    return {"option_groups": groups}


def _option_room(request: InputRequest) -> int | None:
    """How many characters each option of the menu may show, numbered, when their labels do
    not all fit whole (None: they do, unnumbered). Slack takes 75 for each, and refuses a
    message whose text passes `_MOST_TEXT` in all (`msg_blocks_too_long`): the options share
    what the question's section, at its longest, and the other text leave of it. Cut labels
    are numbered, as two may begin alike, and the question's section lists them whole."""
    labels = [_plain(o.label, _MAX_TEXT)["text"] for o in request.options]
    room = min(_MAX_PLAIN, (_MOST_TEXT - _MAX_TEXT - _OTHER_TEXT) // max(1, len(labels)))
    if all(len(label) <= room for label in labels):
        return None
    return max(room, _LEAST_ROOM)


def _option_value(position: int, option_id: str) -> str:
    """What a select option carries: its id, or its position (`signoff.option#0`) when the id
    is longer than the 150 characters Slack allows (Slack would refuse the whole message), is not
    text Slack can send back unchanged (a lone surrogate, a control character), or itself
    begins as a position does, so a value never means two options."""
    return f"{_BY_POSITION}{position}" if _by_position(option_id) else option_id


def _by_position(option_id: str) -> bool:
    """Whether an option with this id is sent as its position (see `_option_value`)."""
    return (
        len(option_id) > _MAX_VALUE
        or not option_id
        or sendable(option_id) != option_id
        or option_id.startswith(_BY_POSITION)
    )


def chosen_option(request: InputRequest, value: str) -> str:
    """The id of the option a select's `value` names (see `_option_value`): `signoff.option#N`
    names the option at N when that option is sent as its position; any other value is an id.

    Messages posted before ids beginning `signoff.option#` were sent as positions carried them
    as they are, and their values still read as then unless the option at N is sent as its
    position too; then they read as it, as in any message posted since. In such an older
    message either two options had that value (the option at N's id was too long or unsendable:
    the click could mean either, and was read as the id), or the option at N's id also began
    `signoff.option#` and the two were told apart (now the id is read as the position N).
    """
    number = value[len(_BY_POSITION) :]
    if value.startswith(_BY_POSITION) and number.isascii() and number.isdecimal():
        position = int(number)
        if value == f"{_BY_POSITION}{position}" and position < len(request.options):
            option = request.options[position]
            if _by_position(option.id):
                return option.id
    return value


def closed_as(resolution: Resolution) -> str:
    """How a request closed, in a word or two: Approved, Approved automatically (its deadline
    passed with `on_timeout="approve"`: no one decided), Denied, Answered, Expired, Deleted (with
    its session) or Withdrawn."""
    if resolution.outcome == "approved":
        return "Approved"
    if resolution.approved_on_timeout:
        return "Approved automatically"
    if resolution.outcome == DELETED:
        return "Deleted"
    if resolution.outcome == "cancelled" and resolution.status == "settled":
        return "Denied"
    if resolution.outcome in ("answered", "expired"):
        return resolution.outcome.capitalize()
    return "Withdrawn"


def describe(request: InputRequest, resolution: Resolution) -> str:
    """One line: how the request closed, by whom and when."""
    return _closing_line(resolution, request)


def _closing_line(resolution: Resolution, request: InputRequest | None = None) -> str:
    by = slack_mention(resolution.by)
    when = _date(resolution.closed_at(request))  # a lapse at its deadline, not when recorded
    reason = f": “{_clip(escape(resolution.reason), _MAX_SHOWN)}”" if resolution.reason else ""
    closed = closed_as(resolution)
    if closed == "Approved":
        return f":white_check_mark: *Approved* by {by} {when}{reason}"
    if closed == "Approved automatically":
        passed = f"when the deadline passed {when}"  # no one decided
        return f":white_check_mark: *Approved automatically* {passed}{reason}"
    if closed == "Denied":
        return f":x: *Denied* by {by} {when}{reason}"
    if closed == "Answered":
        value = escape(resolution.value or "")
        return f":speech_balloon: *Answered* “{_clip(value, _MAX_SHOWN)}” by {by} {when}"
    if closed == "Expired":
        return f":hourglass: *Expired* {when}{reason}"
    if closed == "Deleted":
        by = "" if resolution.by is None else f" by {by}"
        return f":wastebasket: *Deleted* with its session{by} {when}{reason}"
    return f":no_entry_sign: *Withdrawn* {when}{reason}"


def erased_blocks(erased: Erased) -> list[dict[str, Any]]:
    """The message of a request erased with its session: what it asked went with it, and is
    no longer shown (its controls neither); its ids and how it closed are."""
    gone = "_This request's session was deleted: what it asked is erased._"
    facts = f"request {_span(erased.request_id)} · session {_span(erased.session_id)}"
    return [
        {"type": "section", "block_id": "signoff.summary", "text": _mrkdwn(gone)},
        {"type": "context", "block_id": "signoff.facts", "elements": [_mrkdwn(facts)]},
        {
            "type": "context",
            "block_id": "signoff.resolution",
            "elements": [_mrkdwn(_closing_line(erased.resolution))],
        },
    ]


def erased_text(erased: Erased) -> str:
    """The notification text of an erased request's message (see `fallback_text`)."""
    text = f"{closed_as(erased.resolution)}: request {erased.request_id} (its session was deleted)"
    return _clip(escape(text), _MAX_TEXT)


def _modal(
    callback_id: str, title: str, submit: str, metadata: dict[str, Any], block: dict[str, Any]
) -> dict[str, Any]:
    return {
        "type": "modal",
        "callback_id": callback_id,
        "private_metadata": json.dumps(metadata, separators=(",", ":")),
        "title": _plain(title, 24),
        "submit": _plain(submit, 24),
        "close": _plain("Cancel", 24),
        "blocks": [block],
    }


def deny_view(request: InputRequest, metadata: dict[str, Any]) -> dict[str, Any]:
    """The modal that asks why, when someone presses Deny."""
    return _modal(
        DENY_VIEW,
        "Deny the call",
        "Deny",
        metadata,
        {
            "type": "input",
            "block_id": REASON_BLOCK,
            "optional": True,
            "label": _plain(f"Why deny {request.tool_name}?", 2000),
            "element": {"type": "plain_text_input", "action_id": "reason", "multiline": True},
        },
    )


def text_view(request: InputRequest, metadata: dict[str, Any]) -> dict[str, Any]:
    """The modal for a free-text answer to a question."""
    return _modal(
        TEXT_VIEW,
        "Your answer",
        "Answer",
        metadata,
        {
            "type": "input",
            "block_id": ANSWER_BLOCK,
            "label": _plain(request.question or "Your answer", 2000),
            "element": {"type": "plain_text_input", "action_id": "answer", "multiline": True},
        },
    )


def refused_view(text: str) -> dict[str, Any]:
    """What a form opened before its check becomes when the person may not answer: why, and
    no submit button (a submission could only be refused)."""
    return {
        "type": "modal",
        "title": _plain("Not taken", 24),
        "close": _plain("Close", 24),
        "blocks": [{"type": "section", "text": _mrkdwn(note_text(text))}],
    }
