"""What the chaos test's `signoff worker` and `signoff serve` processes logged, by pid: which
session leases each lost while it was never killed (it stalled past the lease, or could not
renew it), and the lines that tell the story of a session when a check fails."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

__all__ = ["lines_by_pid", "lost_leases", "story", "timed_records"]

_LOST = re.compile(r"session (\S+): lease \d+ (?:lost|was taken over|about to lapse)")
"""A lease its drive gave up or found taken over (a renewal that failed once is not: the lease
may still be live, and no other process may run the call meanwhile)."""


def lines_by_pid(logs: list[tuple[Path, list[tuple[int, int]]]]) -> dict[int, list[str]]:
    """The lines each process wrote, from each log and where in it each process began (a
    process starts only once the one before it in the same log is dead)."""
    out: dict[int, list[str]] = {}
    for path, spans in logs:
        data = path.read_bytes()
        for i, (pid, at) in enumerate(spans):
            end = spans[i + 1][1] if i + 1 < len(spans) else len(data)
            out[pid] = data[at:end].decode(errors="replace").splitlines()
    return out


def _when(line: str) -> float | None:
    """The time a logged line was written (the logging format's local time), if it has one."""
    try:
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    except ValueError:
        return None


def lost_leases(logs: dict[int, list[str]]) -> dict[int, list[tuple[str, float]]]:
    """(session, when) of each lease each process logged losing (`_LOST`)."""
    out: dict[int, list[tuple[str, float]]] = {}
    for pid, lines in logs.items():
        for line in lines:
            m = _LOST.search(line)
            at = _when(line)
            if m is not None and at is not None:
                out.setdefault(pid, []).append((m.group(1), at))
    return out


def timed_records(path: Path) -> list[tuple[str, str, int, float]]:
    """(`start` or `done`, idempotency key, pid, time) for every record a tool body wrote."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            what, _, key = str(rec["key"]).partition(" ")
            out.append((what, key, int(rec["pid"]), float(rec["at"])))
    return out


def story(
    key: str,
    records: list[tuple[str, str, int, float]],
    logs: dict[int, list[str]],
    sessions: set[str],
) -> str:
    """The records of `key` with their times, and what each process involved logged about
    `sessions` (claims, leases lost, outcomes): enough to tell a stall from a double drive."""
    mine = [(what, pid, at) for what, k, pid, at in records if k == key]
    out = [f"records of {key}:"]
    out += [
        f"  {datetime.fromtimestamp(at).isoformat()} pid {pid} {what}" for what, pid, at in mine
    ]
    for pid in sorted({pid for _, pid, _ in mine}):
        said = [x for x in logs.get(pid, []) if any(s in x for s in sessions)]
        out.append(f"pid {pid} logged about {sorted(sessions)}:")
        out += [f"  {x}" for x in said[-30:]]
    return "\n".join(out)
