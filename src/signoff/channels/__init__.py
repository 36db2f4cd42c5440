"""Channels: where people see requests and answer them. The terminal channel is built in."""

from __future__ import annotations

from .terminal import TerminalChannel, compact_json, duration

__all__ = ["TerminalChannel", "compact_json", "duration"]
