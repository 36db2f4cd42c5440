"""The order in which pytest-xdist hands test files to its workers: the longest first.

`./scripts/test` runs the suite with `--dist loadfile --no-loadscope-reorder`, so the workers
take files in collection order. Sorted longest first (by `durations.json`, the seconds each
file took in a recent run) no worker is left running one long file at the end while the
others wait. A file missing from it counts as quick; `./scripts/test-durations` rewrites it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")


def file_seconds(path: Path = DURATIONS) -> dict[str, float]:
    """Seconds per test file name, as last recorded (empty if there is no record)."""
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    return {str(name): float(seconds) for name, seconds in recorded.items()}


def longest_first(items: list[pytest.Item], seconds: dict[str, float]) -> None:
    """Sort `items` by their file's recorded seconds, longest first; a file's own tests keep
    their order and stay together (the sort is stable, and keyed by file)."""
    items.sort(key=lambda item: (-seconds.get(item.path.name, 0.0), str(item.path)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("dist", "no") != "no" or hasattr(config, "workerinput"):
        longest_first(items, file_seconds())
