"""`./scripts/test-durations REPORT.xml`: write tests/durations.json, the seconds each test
file took in the JUnit XML report of a whole run (what `_order` sorts the files by)."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from xml.etree import ElementTree

from ._order import DURATIONS


def file_seconds(report: Path) -> dict[str, float]:
    """Seconds per test file name in a JUnit XML report (setup, call and teardown together)."""
    seconds: dict[str, float] = defaultdict(float)
    for case in ElementTree.parse(report).iter("testcase"):
        module = case.get("classname", "").split(".")
        name = next((f"{part}.py" for part in module if part.startswith("test_")), None)
        if name is not None:
            seconds[name] += float(case.get("time", "0"))
    return {name: round(total, 1) for name, total in sorted(seconds.items())}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: scripts/test-durations REPORT.xml", file=sys.stderr)
        return 2
    recorded = file_seconds(Path(argv[0]))
    if not recorded:
        print(f"no test cases in {argv[0]}", file=sys.stderr)
        return 1
    DURATIONS.write_text(json.dumps(recorded, indent=0) + "\n", encoding="utf-8")
    print(f"{len(recorded)} files, {sum(recorded.values()):.0f} s, written to {DURATIONS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
