"""Channels: where people see requests and answer them. The terminal channel is built in.

A `ChannelHub` follows the audit trail and tells each `Channel` when requests open, are
escalated and close; Slack (`signoff.channels.slack`, the `slack` extra), webhooks and text
channels build on it.
"""

from __future__ import annotations

from ._base import (
    Channel,
    ChannelState,
    ChannelUnreachable,
    Erased,
    Escalation,
    InvalidSignature,
    RateLimited,
    Resolution,
)
from ._hub import ChannelHub
from ._terminal_text import TerminalTextChannel
from .terminal import TerminalChannel, compact_json, duration
from .text import TextChannel, parse_reply
from .webhooks import WebhookChannel, sign_webhook, verify_webhook

__all__ = [
    "Channel",
    "ChannelHub",
    "ChannelState",
    "ChannelUnreachable",
    "Erased",
    "Escalation",
    "InvalidSignature",
    "RateLimited",
    "Resolution",
    "TerminalChannel",
    "TerminalTextChannel",
    "TextChannel",
    "WebhookChannel",
    "compact_json",
    "duration",
    "parse_reply",
    "sign_webhook",
    "verify_webhook",
]
