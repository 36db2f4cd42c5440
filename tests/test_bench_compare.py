"""The measuring helpers behind bench.compare's figures (the figures themselves are not tested)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from bench.compare_workload import (
    answer_text,
    json_bytes,
    refund_input,
    refund_result,
    turn_content_bytes,
    user_text,
)

ROOT = Path(__file__).resolve().parent.parent


def test_raw_content_counts_compact_json_not_separator_spaces() -> None:
    data = refund_input(3)
    compact = json.dumps(data, separators=(",", ":"))
    assert json_bytes(data) == len(compact.encode()) < len(json.dumps(data).encode())
    assert turn_content_bytes(3) == (
        len(user_text(3)) + len(answer_text(3)) + json_bytes(refund_input(3))
    ) + json_bytes(refund_result(3))


def test_json_bytes_counts_utf8_bytes_not_escapes() -> None:
    assert json_bytes({"a": "é"}) == len('{"a":"é"}'.encode())


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_peak_rss_of_a_side_is_its_own_not_its_parents() -> None:
    # Each side runs in a child of the bench parent; a parent bigger than the child must not
    # lend the child its peak (Linux's ru_maxrss does, across exec).
    big = bytearray(160 * 1024 * 1024)
    for i in range(0, len(big), 4096):
        big[i] = 1
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >= 160 * 1024
    code = "from bench.compare_workload import peak_rss_kb; print(peak_rss_kb())"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    del big
    assert int(out.stdout) < 100 * 1024
