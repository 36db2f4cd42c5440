"""Many short child processes without a Python start each: a server process imports signoff
once, then forks one child per command, which the crash tests SIGKILL (from inside, by the
store's fault hook or a wrapped write) at a chosen point.

The server reads one JSON list of arguments a line on stdin and answers each with the child's
exit code (-9 when it was SIGKILLed); a child that ends writes its JSON result to the file
named by its first argument.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

__all__ = ["Forks", "serve"]

ROOT = Path(__file__).resolve().parent.parent


def serve(run: Callable[[list[str]], Coroutine[Any, Any, dict[str, Any]]]) -> None:
    """Run `run(args)` for each command read, in a forked child, until stdin ends."""
    for line in sys.stdin:
        out, *args = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                result = asyncio.run(run(args))
                Path(out).write_text(json.dumps(result))
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        sys.stdout.write(json.dumps(os.waitstatus_to_exitcode(status)) + "\n")
        sys.stdout.flush()


class Forks:
    """The parent's side: `python -m MODULE` serving commands, one forked child each."""

    def __init__(self, module: str, tmp: Path) -> None:
        self.tmp = tmp
        self.err_path = tmp / f"{module}.err"
        self.err = self.err_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
        )
        self.runs = 0

    def run(self, *args: str) -> tuple[int, dict[str, Any] | None]:
        """One child's exit code, and its result if it ended."""
        self.runs += 1
        out = self.tmp / f"result-{self.runs}.json"
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([str(out), *args]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, self.stderr()
        return int(line), json.loads(out.read_text()) if out.exists() else None

    def stderr(self) -> str:
        self.err.flush()
        return self.err_path.read_text()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.err.close()
