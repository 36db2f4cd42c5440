"""The table `bench.compare` prints: each backend's rows, signoff beside LangGraph with their
ratio, then how signoff stands against the targets of issue 8."""

from typing import Any

__all__ = ["table", "targets"]


def _ratio(a: float, b: float) -> str:
    return f"{b / a:8.1f}x" if a > 0 else "       -"


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def _cells(a: float, b: float, fmt: str) -> str:
    return f"{_human(a):>12}{_human(b):>12}" if fmt == "h" else fmt.format(a) + fmt.format(b)


def _conversation_table(backend: str, conv: dict[str, Any], points: list[int]) -> list[str]:
    lines = [f"== {backend}: one conversation, approve every turn ==", _HEAD]
    for p in points:
        s, g = conv["signoff"][str(p)], conv["langgraph"][str(p)]
        lines.append(f"turn {p}: raw message content {_human(s['content_bytes'])}")
        rows = [
            ("  time per turn (ms)", "turn_ms", 1.0, "{:12.2f}"),
            ("  resume -> tool body starts (ms)", "resume_ms", 1.0, "{:12.2f}"),
            ("  time per turn, CPU (ms)", "turn_cpu_ms", 1.0, "{:12.2f}"),
            ("  resume -> tool body, CPU (ms)", "resume_cpu_ms", 1.0, "{:12.2f}"),
            ("  bytes stored (files incl. WAL / relations)", "bytes", 1.0, "h"),
            ("  bytes in live pages (SQLite: without WAL)", "live_bytes", 1.0, "h"),
            ("  peak RSS (MB)", "peak_rss_kb", 1 / 1024, "{:12.1f}"),
        ]
        for label, key, scale, fmt in rows:
            if key in s and key in g:
                a, b = s[key] * scale, g[key] * scale
                lines.append(f"{label:44}{_cells(a, b, fmt)}{_ratio(a, b)}")
        a, b = s["bytes"] / s["content_bytes"], g["bytes"] / g["content_bytes"]
        lines.append(f"{'  bytes stored / raw content':44}{_cells(a, b, '{:12.2f}')}{_ratio(a, b)}")
        if "empty_bytes" in s and "empty_bytes" in g:
            a, b = _growth(s), _growth(g)
            label = "  live bytes over the empty store / raw"
            lines.append(f"{label:44}{_cells(a, b, '{:12.2f}')}{_ratio(a, b)}")
    lines.append("")
    return lines


def _growth(point: dict[str, Any]) -> float:
    """Live bytes the conversation added to the store (its empty tables and indexes left out),
    per raw byte."""
    return float(point["live_bytes"] - point["empty_bytes"]) / float(point["content_bytes"])


def _parked_table(backend: str, park: dict[str, Any]) -> list[str]:
    s, g = park["signoff"], park["langgraph"]
    lines = [f"== {backend}: {s['sessions']:,} sessions parked on an approval ==", _HEAD]
    lines.append(f"raw content per session {_human(s['content_bytes_per_session'])}")
    rows = [
        ("  bytes per parked session", s["bytes_per_session"], g["bytes_per_session"], "h"),
        ("  process RSS before (MB)", s["rss_before_kb"] / 1024, g["rss_before_kb"] / 1024,
         "{:12.1f}"),
        ("  process RSS after (MB)", s["rss_after_kb"] / 1024, g["rss_after_kb"] / 1024,
         "{:12.1f}"),
        ("  time to park one session (ms)", s["park_s"] * 1e3 / s["sessions"],
         g["park_s"] * 1e3 / g["sessions"], "{:12.2f}"),
        ("  time to list the pending queue (ms)", s["list_ms"], g["list_ms"], "{:12.1f}"),
    ]  # fmt: skip
    if "live_bytes_per_session" in s and "live_bytes_per_session" in g:
        # Without the WAL: signoff truncates its WAL when a turn parks, LangGraph's SQLite keeps
        # a WAL file of up to about 4 MB, which the row above counts.
        live = ("  live bytes per parked session", s["live_bytes_per_session"],
                g["live_bytes_per_session"], "h")  # fmt: skip
        rows.insert(1, live)
    for label, a, b, fmt in rows:
        lines.append(f"{label:44}{_cells(a, b, fmt)}{_ratio(a, b)}")
    lines.append("")
    return lines


_HEAD = f"{'':44}{'signoff':>12}{'LangGraph':>12}{'LG/signoff':>11}"


def table(results: dict[str, Any], points: list[int]) -> list[str]:
    lines: list[str] = []
    for backend, res in results.items():
        if "conversation" in res:
            lines += _conversation_table(backend, res["conversation"], points)
        if "parked" in res:
            lines += _parked_table(backend, res["parked"])
    return lines


def targets(results: dict[str, Any], points: list[int]) -> list[str]:
    lines = ["== signoff against the targets of issue 8 =="]
    first, last = str(points[0]), str(points[-1])
    for backend, res in results.items():
        behind = []
        if "conversation" in res:
            s, g = res["conversation"]["signoff"], res["conversation"]["langgraph"]
            for key, name in (
                ("turn_ms", "time per turn"),
                ("resume_ms", "resume latency"),
                ("turn_cpu_ms", "time per turn, CPU"),
                ("resume_cpu_ms", "resume latency, CPU"),
            ):
                if key not in s[first]:
                    continue
                r = s[last][key] / s[first][key]
                ok = "met" if r <= 1.5 else "MISSED"
                lines.append(
                    f"{backend}: {name} flat (turn {last} within 1.5x of turn {first}): "
                    f"{r:.2f}x  {ok}"
                )
            ratios = {p: s[p]["bytes"] / s[p]["content_bytes"] for p in map(str, points)}
            worst = max(ratios.values())
            ok = "met" if worst <= 2 else "MISSED"
            within = [p for p, r in ratios.items() if r <= 2]
            lines.append(
                f"{backend}: storage within 2x of raw content at every point: "
                f"worst {worst:.2f}x  {ok}"
                + (f" (met at turn {', '.join(within)})" if within and worst > 2 else "")
            )
            if all("empty_bytes" in s[p] for p in map(str, points)):
                lines.append(
                    f"{backend}:   (live bytes over the empty store's: "
                    + ", ".join(f"{_growth(s[p]):.2f}x" for p in map(str, points))
                    + ")"
                )
            live = [s[p]["live_bytes"] / s[p]["content_bytes"] for p in map(str, points)]
            lines.append(
                f"{backend}:   (live pages only, without WAL and free pages: "
                + ", ".join(f"{x:.2f}x" for x in live)
                + ")"
            )
            for p in map(str, points):
                for key in ("turn_ms", "resume_ms", "turn_cpu_ms", "resume_cpu_ms", "bytes"):
                    if key in s[p] and key in g[p] and s[p][key] >= g[p][key]:
                        behind.append(f"turn {p} {key}")
                if s[p]["peak_rss_kb"] >= g[p]["peak_rss_kb"]:
                    behind.append(f"turn {p} peak_rss_kb")
        if "parked" in res:
            ps, pg_ = res["parked"]["signoff"], res["parked"]["langgraph"]
            for key in ("bytes_per_session", "rss_after_kb", "list_ms", "park_s"):
                if ps[key] >= pg_[key]:
                    behind.append(f"parked {key}")
        lines.append(
            f"{backend}: ahead of LangGraph on every row: "
            + ("met" if not behind else "MISSED on " + ", ".join(behind))
        )
    return lines
