"""The workload of `bench.compare`: deterministic messages of about 400 characters per turn."""

from __future__ import annotations

import json
import os
import random
import resource
from typing import Any

__all__ = [
    "WINDOW",
    "answer_text",
    "current_rss_kb",
    "json_bytes",
    "peak_rss_kb",
    "refund_input",
    "refund_result",
    "turn_content_bytes",
    "user_text",
]

WINDOW = 10
"""Time per turn and resume latency at turn N are medians over turns N-9..N."""

_WORDS = (
    "order refund customer parcel arrived damaged courier box screen cracked replacement "
    "warranty invoice payment card bank account support ticket delivery late missing item "
    "colour size return label shipping address tracking number please thanks kindly urgent "
    "again store credit manager policy receipt photo attached week month yesterday today"
).split()


def _text(kind: str, turn: int, size: int) -> str:
    """`size` characters of words, different for every kind and turn (no two messages alike)."""
    rnd = random.Random(f"{kind}-{turn}")
    out = f"[{kind} {turn}]"
    while len(out) < size:
        out += " " + rnd.choice(_WORDS)
    return out[:size]


def user_text(turn: int) -> str:
    return _text("user", turn, 400)


def answer_text(turn: int) -> str:
    return _text("answer", turn, 400)


def refund_input(turn: int) -> dict[str, Any]:
    """The tool call's input: about 400 characters of JSON."""
    return {"order_id": str(100_000 + turn), "amount": 180.0, "reason": _text("reason", turn, 350)}


def refund_result(turn: int) -> dict[str, Any]:
    """The tool's result: about 400 characters of JSON."""
    return {"refunded": 180.0, "order_id": str(100_000 + turn), "note": _text("note", turn, 350)}


def json_bytes(value: Any) -> int:
    """UTF-8 bytes of `value` as compact JSON: the separators' spaces are not content."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def turn_content_bytes(turn: int) -> int:
    """Raw message content of one turn: user text, tool input, tool result, answer (UTF-8)."""
    texts = len(user_text(turn).encode()) + len(answer_text(turn).encode())
    return texts + json_bytes(refund_input(turn)) + json_bytes(refund_result(turn))


def peak_rss_kb() -> int:
    """This process's own peak resident set size in KiB, from VmHWM: on Linux `ru_maxrss` keeps
    the spawning parent's peak across exec, so a small child would report its parent's."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def current_rss_kb() -> int:
    """This process's resident set size now, in KiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") // 1024
