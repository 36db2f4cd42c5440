"""The order of test files for the pytest-xdist workers (`tests/_order.py`) and the record it is
made from (`tests/_durations.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ._durations import file_seconds as recorded_seconds
from ._order import DURATIONS, file_seconds, longest_first

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_one" time="1.5"/>
<testcase classname="tests.test_a" name="test_two" time="2.25"/>
<testcase classname="tests.test_b.TestMachine" name="runTest" time="30.0"/>
<testcase classname="tests.test_c" name="test_skipped" time="0.01"><skipped/></testcase>
</testsuite></testsuites>
"""


def test_a_report_gives_each_files_total(tmp_path: Path) -> None:
    report = tmp_path / "run.xml"
    report.write_text(REPORT, encoding="utf-8")
    assert recorded_seconds(report) == {"test_a.py": 3.8, "test_b.py": 30.0, "test_c.py": 0.0}


def test_files_go_longest_first_each_kept_whole_and_in_order(
    pytestconfig: pytest.Config,
) -> None:
    class Item:
        def __init__(self, file: str, name: str) -> None:
            self.path = Path("tests") / file
            self.name = name

    items = [
        Item("test_a.py", "1"),
        Item("test_a.py", "2"),
        Item("test_new.py", "1"),  # not recorded yet: counts as quick
        Item("test_b.py", "1"),
        Item("test_b.py", "2"),
        Item("test_c.py", "1"),
    ]
    longest_first(items, {"test_a.py": 3.0, "test_b.py": 30.0, "test_c.py": 3.0})  # type: ignore[arg-type]
    assert [(i.path.name, i.name) for i in items] == [
        ("test_b.py", "1"),
        ("test_b.py", "2"),
        ("test_a.py", "1"),
        ("test_a.py", "2"),
        ("test_c.py", "1"),
        ("test_new.py", "1"),
    ]


def test_the_record_names_test_files_that_exist() -> None:
    recorded = file_seconds()
    assert recorded, f"{DURATIONS} is missing or empty"
    here = {p.name for p in DURATIONS.parent.glob("test_*.py")}
    assert set(recorded) <= here, sorted(set(recorded) - here)
    assert all(seconds >= 0 for seconds in recorded.values())


def test_a_missing_record_orders_nothing(tmp_path: Path) -> None:
    assert file_seconds(tmp_path / "durations.json") == {}
    (tmp_path / "durations.json").write_text(json.dumps({"test_a.py": 1}), encoding="utf-8")
    assert file_seconds(tmp_path / "durations.json") == {"test_a.py": 1.0}
