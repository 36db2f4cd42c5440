"""Many short child processes without a Python start each: a server process imports signoff
once, then forks one child per command, which the crash tests SIGKILL (from inside, by the
store's fault hook or a wrapped write) at a chosen point.

The server reads one JSON list of arguments a line on stdin and answers each with the child's
exit code (-9 when it was SIGKILLed); a child that ends writes its JSON result to the file
named by its first argument. As a fresh process would, each child starts from the server's
untouched imports (the server runs nothing else and has no thread to fork with), reads an empty
stdin, and a child still running after `TIMEOUT` seconds is ended (SIGALRM), so that a hung one
neither holds its test past that nor outlives the server.

`Scripts` does the same for `python -c SCRIPT ARGS...` children (`python -m tests._forks`
serves them): each script runs in a forked child as `__main__`, with its own environment,
its stdout and stderr captured, and its exit code or killing signal returned.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

__all__ = ["Forks", "Scripts", "python_env", "serve", "serve_scripts"]

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 60
"""Seconds a child may run before SIGALRM ends it (what `subprocess.run(timeout=60)` gave)."""
PYCACHE = Path(tempfile.gettempdir()) / f"signoff-tests-pycache-{os.getuid()}"
"""Where child Pythons keep their bytecode when this environment says to write none."""


def python_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (else this process's) for a child `python`: under `PYTHONDONTWRITEBYTECODE` each
    child compiled signoff's modules from source again (0.3 s of CPU each, 0.5 s with the CLI);
    instead they share compiled files in `PYCACHE`, outside the tree (`PYTHONPYCACHEPREFIX`,
    checked against each source's mtime and size, written atomically)."""
    out = dict(os.environ if env is None else env)
    if out.pop("PYTHONDONTWRITEBYTECODE", None):
        out["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    return out


def serve(run: Callable[[list[str]], Coroutine[Any, Any, dict[str, Any]]]) -> None:
    """Run `run(args)` for each command read, in a forked child, until stdin ends."""
    for line in sys.stdin:
        out, *args = json.loads(line)

        def child(out: str = out, args: list[str] = args) -> None:
            os.dup2(2, 1)  # stdout is the answers' pipe: what the child prints goes to stderr
            result = asyncio.run(run(args))
            Path(out).write_text(json.dumps(result))

        _answer(_forked(child, TIMEOUT))


def _forked(body: Callable[[], None], timeout: int) -> int:
    """Run `body` in a child forked from this (single-threaded) process, as a process of its
    own would: stdin empty, SIGALRM after `timeout` seconds (so a hung child does not outlive
    its test), `SystemExit` as its exit status. Its exit code, negative if a signal killed it."""
    assert threading.active_count() == 1, f"forking with threads: {threading.enumerate()}"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(timeout)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            body()
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _answer(code: int) -> None:
    sys.stdout.write(json.dumps(code) + "\n")
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
            env=python_env(),
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


def serve_scripts() -> None:
    """Run each script read (`{"code", "argv", "env", "out", "err", "timeout"}`, a JSON line) in
    a forked child as `python -c` would, answering with its exit code, until stdin ends."""
    # What the scripts import, imported once here.
    import signoff.cli
    import signoff.stores.postgres

    del signoff

    for line in sys.stdin:
        job = json.loads(line)

        def child(job: dict[str, Any] = job) -> None:
            os.environ.clear()
            os.environ.update(job["env"])
            for fd, name in ((1, "out"), (2, "err")):
                target = os.open(job[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(target, fd)
                os.close(target)
            sys.argv = ["-c", *job["argv"]]
            exec(compile(job["code"], "<string>", "exec"), {"__name__": "__main__"})

        _answer(_forked(child, job["timeout"]))


class Scripts:
    """The parent's side of `serve_scripts`: `run()` as `subprocess.run([python, "-c", ...])`
    with `capture_output=True`, without a Python start (nor signoff's imports) each time."""

    def __init__(self, tmp: Path) -> None:
        self.forks = Forks("tests._forks", tmp)

    def run(
        self, code: str, *argv: str, env: dict[str, str] | None = None, timeout: int = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run `code` with `argv` in a child of its own; its exit code (negative: the signal
        that killed it) and what it wrote, as text."""
        forks = self.forks
        forks.runs += 1
        out, err = forks.tmp / f"script-{forks.runs}.out", forks.tmp / f"script-{forks.runs}.err"
        job: dict[str, Any] = {"code": code, "argv": list(argv), "timeout": timeout}
        job.update(env=dict(os.environ if env is None else env), out=str(out), err=str(err))
        assert forks.proc.stdin is not None and forks.proc.stdout is not None
        forks.proc.stdin.write(json.dumps(job) + "\n")
        forks.proc.stdin.flush()
        line = forks.proc.stdout.readline()
        assert line, forks.stderr()
        stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
        out.unlink()
        err.unlink()
        return subprocess.CompletedProcess(["-c", code, *argv], int(line), stdout, stderr)

    def close(self) -> None:
        self.forks.close()


if __name__ == "__main__":
    serve_scripts()
