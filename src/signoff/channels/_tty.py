"""Reading one typed line from a terminal so that Ctrl-C ends the wait at any moment.

`input()` misses a SIGINT that lands after its prompt is out but before its read begins: the
handler only runs once the read returns, at the next Enter. Here the wait is a `select` on the
terminal and on a signal wakeup pipe, which the interpreter writes to the moment any handled
signal arrives, so a signal from just before the wait wakes it too.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import contextvars
import io
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = [
    "discard_typed_ahead",
    "in_daemon_thread",
    "lenient_stdin",
    "read_terminal_line",
    "terminal_stdin",
]

_T = TypeVar("_T")


def terminal_stdin() -> int | None:
    """The file descriptor of standard input if it is a terminal this thread can wait on with
    signals in view (the main thread: only it runs handlers) with `select`, which on Windows
    takes sockets only; None otherwise."""
    if os.name != "posix" or threading.current_thread() is not threading.main_thread():
        return None
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, ValueError, OSError):  # closed, replaced, or no file underneath
        return None
    return fd if os.isatty(fd) else None


def lenient_stdin() -> None:
    """Have standard input read a byte its encoding does not take as a lone surrogate
    (`surrogateescape`, as Python's C.UTF-8 locale has it) rather than raise: decoding strictly
    (as under en_US.UTF-8), one such byte piped in failed the read, and what was read with it
    was lost. Left as it is once read from: Python allows no change then."""
    stdin = sys.stdin
    if isinstance(stdin, io.TextIOWrapper) and stdin.errors == "strict":
        with contextlib.suppress(io.UnsupportedOperation, ValueError):  # read from, or closed
            stdin.reconfigure(errors="surrogateescape")


def discard_typed_ahead() -> bool:
    """Discard what was typed at the terminal on standard input and not read yet (a stray `y`
    and Enter while tools ran), so that only a line typed once a request is shown answers it;
    whether a whole line was discarded. Input that is no terminal (a pipe) is left alone."""
    if os.name != "posix":
        return False
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, ValueError, OSError):  # closed, replaced, or no file underneath
        return False
    if not os.isatty(fd):
        return False
    import termios

    try:
        # Line editing on, a terminal is readable once a line is complete (Enter, or Ctrl-D).
        typed = bool(select.select([fd], [], [], 0)[0])
        termios.tcflush(fd, termios.TCIFLUSH)
    except (OSError, ValueError, termios.error):
        return False
    return typed


@contextlib.contextmanager
def _wakeup_pipe() -> Iterator[tuple[int, bytearray]]:
    """A pipe the interpreter writes a byte to when a signal arrives: its read end, and where
    to keep what is read from it. On the way out that goes to the wakeup fd this one replaced
    (asyncio's, which dispatches its own signal handlers by it)."""
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    caught = bytearray()
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    try:
        yield read_end, caught
    finally:
        signal.set_wakeup_fd(previous)
        caught += _drain(read_end)
        if caught and previous != -1:
            with contextlib.suppress(OSError):
                os.write(previous, caught)
        os.close(read_end)
        os.close(write_end)


def _drain(fd: int) -> bytes:
    got = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 512):
            got += chunk
    return got


def _wait(fd: int, wakeup: int) -> list[int]:
    """Block until `fd` or `wakeup` is readable. A plain function on purpose: entering it runs
    any signal handler still pending, so a signal caught just before the wakeup pipe took over
    raises here instead of being left for after the wait."""
    return select.select([fd, wakeup], [], [])[0]


def read_terminal_line(fd: int) -> str:
    """The next line typed at the terminal `fd`, without its newline; `EOFError` at Ctrl-D on
    an empty line, as `input()`. A signal handler's exception (Ctrl-C's KeyboardInterrupt)
    ends the wait whenever the signal came, and the bytes of a half-typed line go with it.
    A byte the encoding does not take reads as a lone surrogate, as `lenient_stdin` has piped
    input read it, so no prompt takes the line (a U+FFFD in its place was taken as text)."""
    encoding = getattr(sys.stdin, "encoding", None) or "utf-8"
    decoder = codecs.getincrementaldecoder(encoding)(errors="surrogateescape")
    line = ""
    with _wakeup_pipe() as (wakeup, caught):
        while True:
            ready = _wait(fd, wakeup)
            if wakeup in ready:
                caught += _drain(wakeup)
                continue  # the handler runs before the next wait, on entering _wait
            byte = os.read(fd, 1)  # one at a time: never read past the line into the next
            text = decoder.decode(byte, final=not byte)
            if text.endswith("\n"):
                return line + text[:-1]
            line += text
            if not byte:  # end of input: Ctrl-D, on an empty line or twice after some text
                if not line:
                    raise EOFError
                return line


async def in_daemon_thread(fn: Callable[[], _T], name: str) -> _T:
    """`fn()` run in a daemon thread of its own, awaited: as `asyncio.to_thread`, but a thread
    blocked reading the terminal holds up neither the event loop's shutdown nor the
    interpreter's exit, which wait for the default executor's threads (Ctrl-C at a prompt
    would end the program only once Enter was pressed)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_T] = loop.create_future()
    context = contextvars.copy_context()

    def deliver(setter: Callable[[Any], None], value: Any) -> None:
        def settle() -> None:
            if not future.done():  # the awaiting task was cancelled: nobody wants it
                setter(value)

        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for it
            loop.call_soon_threadsafe(settle)

    def run() -> None:
        try:
            result = context.run(fn)
        except BaseException as exc:  # handed to the awaiting task, as by to_thread
            deliver(future.set_exception, exc)
        else:
            deliver(future.set_result, result)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await future
