"""Ctrl-C while the `signoff` command is still starting: importing signoff and its command line
takes most of a second, and a person who changes their mind then gets one line, not a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._cli import ROOT, ctrl_c_after

# Imported by the test's interpreter only: it says so on stderr, then sleeps in that import, so
# that the SIGINT lands while the command is importing, every run.
_SLOW_IMPORT = """
import importlib.abc, importlib.machinery, os, sys, time

class _Slow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["SLOW_IMPORT"]:
            sys.meta_path.remove(self)
            sys.stderr.write("importing " + name + "\\n")
            sys.stderr.flush()
            time.sleep(60)
        return None

sys.meta_path.insert(0, _Slow())
"""


@pytest.mark.parametrize(
    "command",
    [
        ["-c", "import sys\nfrom signoff.cli import main\nsys.exit(main())"],  # the console script
        ["-m", "signoff"],
    ],
    ids=["signoff", "python-m-signoff"],
)
@pytest.mark.parametrize("slow", ["signoff._runtime", "rich.console", "typer"])
def test_ctrl_c_while_the_command_imports_is_one_line_and_130(
    tmp_path: Path, command: list[str], slow: str
) -> None:
    """`signoff sessions` interrupted while it imports the runtime, Rich or Typer exits 130 with
    the one line Ctrl-C prints elsewhere: a KeyboardInterrupt out of the import was Python's
    traceback, as the command had not yet started to catch it."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_SLOW_IMPORT)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hook), str(ROOT / "src"), str(ROOT)]),
        "SLOW_IMPORT": slow,
    }
    argv = [*command, "sessions", "--store", f"sqlite:///{tmp_path}/none.db"]
    status, out, rest = ctrl_c_after(
        [sys.executable, *argv], f"importing {slow}\n", cwd=tmp_path, env=env
    )
    assert (status, out, rest) == (130, "", "interrupted\n")


def test_the_console_script_imports_nothing_heavy_before_main() -> None:
    """`from signoff.cli import main`, all the console script runs before `main`, loads neither
    the runtime nor Typer nor Rich: whatever it loads cannot be interrupted cleanly."""
    code = (
        "import sys\nfrom signoff.cli import main\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('typer', 'rich', 'pydantic')"
        " or m in ('signoff._runtime', 'signoff._exports', 'signoff.cli._main')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == "[]\n", done.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["sessions", "slow_runtime:rt"],
        ["pending", "slow_runtime:rt"],
        ["events", "ses_x", "slow_runtime:rt"],
        ["approve", "req_x", "slow_runtime:rt"],
        ["db", "upgrade", "slow_runtime:rt"],
        ["worker", "slow_runtime:rt"],
        ["chat", "slow_runtime:rt"],
        ["serve", "slow_runtime:rt"],
    ],
    ids=lambda argv: argv[0] if argv[0] != "db" else "db-upgrade",
)
def test_one_ctrl_c_while_the_runtime_module_imports_ends_the_command(
    tmp_path: Path, argv: list[str]
) -> None:
    """`MODULE:RUNTIME` is imported inside the command's event loop, whose SIGINT handler only
    cancels its task: a module slow to import (a model library, say) held the first Ctrl-C
    until it was done (the command went on, 20 s and more here), and `serve`, which imports it
    before its loop, ended 130 without a word. One Ctrl-C now ends each, 130, "interrupted"."""
    (tmp_path / "slow_runtime.py").write_text(
        "import sys, time\nprint('importing', file=sys.stderr, flush=True)\ntime.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    status, out, rest = ctrl_c_after(
        [sys.executable, "-m", "signoff", *argv, "--store", f"sqlite:///{tmp_path}/s.db"],
        "importing\n",
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=20,
    )
    assert (status, rest) == (130, "interrupted\n"), out
