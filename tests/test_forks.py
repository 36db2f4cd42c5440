"""The forked children of tests/_forks.py stand in for fresh processes in the crash tests: each
is a process of its own, killed for real, sharing nothing with the one before, reading an empty
stdin and ended if it hangs."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import signoff

from ._forks import Forks, Scripts

_PROBE = """
import json, os, sys
import signoff
fds = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
    except FileNotFoundError:  # the listing's own descriptor, closed since
        pass
print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "seen": hasattr(signoff, "_probe"),
                  "fds": fds, "argv": sys.argv, "env": os.environ.get("PROBE"),
                  "signoff": signoff.__file__}))
signoff._probe = True
"""


def test_each_script_is_a_process_of_its_own_with_nothing_inherited(scripts: Scripts) -> None:
    first = scripts.run(_PROBE, "a", env={"PROBE": "1"})
    second = scripts.run(_PROBE, "b", env={"PROBE": "2"})
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    one, two = json.loads(first.stdout), json.loads(second.stdout)
    server = scripts.forks.proc.pid
    assert one["pid"] != two["pid"] and server not in (one["pid"], two["pid"])
    assert one["ppid"] == two["ppid"] == server
    assert one["seen"] is two["seen"] is False  # the first child's module state died with it
    assert (one["argv"], one["env"]) == (["-c", "a"], "1")
    assert (two["argv"], two["env"]) == (["-c", "b"], "2")
    for seen in (one, two):
        assert seen["signoff"] == signoff.__file__  # the code under test, not another checkout
        fds = seen["fds"]
        assert fds.pop("0") == "/dev/null"
        # stdout and stderr to their files: no socket, database file or pipe inherited
        assert set(fds) == {"1", "2"}, fds


def test_a_script_reading_stdin_reads_nothing(scripts: Scripts) -> None:
    """The server's stdin is the pipe its jobs come on: a child must not read (or wait on) it."""
    done = scripts.run("import sys; print(repr(sys.stdin.read()))", timeout=10)
    assert (done.returncode, done.stdout) == (0, "''\n"), done.stderr


def test_a_killed_script_is_reported_and_the_next_one_runs(scripts: Scripts) -> None:
    killed = scripts.run("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.returncode == -signal.SIGKILL
    assert scripts.run("raise SystemExit(3)").returncode == 3
    assert scripts.run("print('ok')").stdout == "ok\n"


def test_a_script_that_hangs_is_ended_at_its_timeout(scripts: Scripts) -> None:
    done = scripts.run("import time; time.sleep(60)", timeout=1)
    assert done.returncode == -signal.SIGALRM


def test_a_scenario_child_that_fails_answers_without_a_result(tmp_path: Path) -> None:
    """`serve` (the fault-injection children): a failing run exits 1 with its traceback on
    stderr, and what it prints does not reach the answers' pipe."""
    forks = Forks("tests._fault_child", tmp_path)
    try:
        code, result = forks.run("nope://x", str(tmp_path / "runs"), "s", "0", "before")
        assert (code, result) == (1, None)
        assert "Traceback" in forks.stderr()
        assert not (tmp_path / "runs").exists()
    finally:
        forks.close()
