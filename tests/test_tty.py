"""Reading a typed line at a terminal (a pseudo-terminal here): whole lines, Ctrl-D, bytes that
are no UTF-8, and signals that come while it waits; what was typed before a prompt is shown, and
standard input decoded strictly."""

from __future__ import annotations

import io
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time
import tty
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest
from rich.console import Console

import signoff as so
from signoff.channels import TerminalChannel
from signoff.channels._tty import discard_typed_ahead, read_terminal_line, terminal_stdin
from tests._cli import ROOT, TARGET, url

__all__ = ["url"]  # the fixture, used by name


@pytest.fixture
def terminal() -> Iterator[tuple[int, int]]:
    """A pseudo-terminal: (what the person types into, what the program reads)."""
    keyboard, screen = pty.openpty()
    yield keyboard, screen
    os.close(keyboard)
    os.close(screen)


def test_it_reads_one_line_at_a_time_and_leaves_the_next(terminal: tuple[int, int]) -> None:
    keyboard, screen = terminal
    os.write(keyboard, "refund order 1042 ✓\nand then\n".encode())
    assert read_terminal_line(screen) == "refund order 1042 ✓"
    assert read_terminal_line(screen) == "and then"


def test_ctrl_d_on_an_empty_line_is_end_of_input(terminal: tuple[int, int]) -> None:
    keyboard, screen = terminal
    os.write(keyboard, b"\x04")
    with pytest.raises(EOFError):
        read_terminal_line(screen)


def test_ctrl_d_after_some_text_hands_it_over_as_input_does(terminal: tuple[int, int]) -> None:
    keyboard, screen = terminal
    os.write(keyboard, b"half\x04\x04")
    assert read_terminal_line(screen) == "half"


def test_bytes_that_are_no_utf8_read_as_lone_surrogates(terminal: tuple[int, int]) -> None:
    """As piped in (`lenient_stdin`): read as U+FFFD, a typed byte was an answer any prompt
    for free text took, where the README says no prompt takes it."""
    keyboard, screen = terminal
    os.write(keyboard, b"caf\xe9 \xff ok\n")
    assert read_terminal_line(screen) == "caf\udce9 \udcff ok"


def test_only_a_terminal_on_the_main_thread_is_waited_on(
    terminal: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Elsewhere (a pipe, a test's fake stdin, another thread) reading is left to `input()`."""
    _, screen = terminal
    with open(screen, closefd=False) as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        assert terminal_stdin() == screen
        found: list[int | None] = []
        other = threading.Thread(target=lambda: found.append(terminal_stdin()))
        other.start()
        other.join()
        assert found == [None]
    read_end, write_end = os.pipe()
    with open(read_end) as pipe:
        monkeypatch.setattr(sys, "stdin", pipe)
        assert terminal_stdin() is None
    os.close(write_end)
    monkeypatch.setattr(sys, "stdin", io.StringIO("typed"))
    assert terminal_stdin() is None


def _wait_until_blocked(timeout: float = 20) -> None:
    """Wait until this process's main thread sleeps (in the read's wait)."""
    stat = Path(f"/proc/self/task/{os.getpid()}/stat")
    if not stat.exists():
        pytest.skip("no /proc here")
    deadline = time.monotonic() + timeout
    while stat.read_text().rpartition(")")[2].split()[0] != "S":
        assert time.monotonic() < deadline
        time.sleep(0.01)


class Interrupted(Exception):
    pass


def test_a_signal_whose_handler_raises_ends_the_wait(terminal: tuple[int, int]) -> None:
    """Ctrl-C's KeyboardInterrupt, here SIGUSR1's own exception: the half-typed line is left."""
    keyboard, screen = terminal

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, interrupt)
    main = threading.get_ident()

    def press() -> None:
        os.write(keyboard, b"half-typed")
        _wait_until_blocked()
        signal.pthread_kill(main, signal.SIGUSR1)

    presser = threading.Thread(target=press)
    try:
        presser.start()
        with pytest.raises(Interrupted):
            read_terminal_line(screen)
    finally:
        presser.join()
        signal.signal(signal.SIGUSR1, previous)


def test_a_signal_caught_while_waiting_reaches_the_wakeup_fd_it_replaced(
    terminal: tuple[int, int],
) -> None:
    """A signal whose handler returns leaves the wait waiting, and the wakeup fd that was in
    place before (asyncio's, which dispatches its handlers by it) still learns of it."""
    keyboard, screen = terminal
    seen: list[int] = []
    previous_handler = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous_fd = signal.set_wakeup_fd(write_end)
    main = threading.get_ident()

    def press() -> None:
        _wait_until_blocked()
        signal.pthread_kill(main, signal.SIGUSR1)
        os.write(keyboard, b"after the signal\n")

    presser = threading.Thread(target=press)
    try:
        presser.start()
        assert read_terminal_line(screen) == "after the signal"
    finally:
        presser.join()
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGUSR1, previous_handler)
    assert seen == [signal.SIGUSR1]
    assert os.read(read_end, 16) == bytes([signal.SIGUSR1])
    os.close(read_end)
    os.close(write_end)


def test_a_half_character_before_ctrl_d_reads_as_a_lone_surrogate(
    terminal: tuple[int, int],
) -> None:
    """The bytes of a character cut short by the end of input are not dropped silently, nor
    read as a character a prompt could take."""
    keyboard, screen = terminal
    os.write(keyboard, b"caf\xc3\x04\x04")
    assert read_terminal_line(screen) == "caf\udcc3"


def test_the_wakeup_fd_in_place_before_is_put_back(terminal: tuple[int, int]) -> None:
    """asyncio dispatches its signal handlers by the wakeup fd: after the read it is its own
    again, not the closed pipe the read waited on."""
    keyboard, screen = terminal
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous_fd = signal.set_wakeup_fd(write_end)
    try:
        os.write(keyboard, b"yes\n")
        assert read_terminal_line(screen) == "yes"
    finally:
        assert signal.set_wakeup_fd(previous_fd) == write_end
        os.close(read_end)
        os.close(write_end)


def test_a_terminal_that_hands_over_bytes_as_typed_is_read_one_line_at_a_time(
    terminal: tuple[int, int],
) -> None:
    """Without line editing (ICANON off) the terminal hands over whatever is typed, lines
    pasted at once too: the next line stays for the next read."""
    keyboard, screen = terminal
    tty.setcbreak(screen)
    os.write(keyboard, b"first\nsecond\n")
    assert read_terminal_line(screen) == "first"
    assert read_terminal_line(screen) == "second"


class _Screen(io.StringIO):
    """A console's file that tells when a prompt is out (`prompted`)."""

    def __init__(self) -> None:
        super().__init__()
        self.prompted = threading.Event()

    def write(self, text: str) -> int:
        if "(y/N)" in text:
            self.prompted.set()
        return super().write(text)


def _approval() -> so.InputRequest:
    return so.InputRequest.model_validate(
        {
            "kind": "tool-approval",
            "id": "req_1",
            "session_id": "ses_1",
            "turn_id": "trn_1",
            "agent": "payer",
            "action": {
                "call_id": "call_1",
                "tool_name": "pay",
                "input": {"to": "mallory", "amount": 9999},
                "input_hash": "sha256:x",
            },
            "created_at": 0.0,
        }
    )


def _typing_once_prompted(screen: _Screen, keyboard: int, typed: bytes) -> threading.Thread:
    def type_it() -> None:
        assert screen.prompted.wait(20)
        os.write(keyboard, typed)

    typist = threading.Thread(target=type_it)
    typist.start()
    return typist


def test_a_line_typed_before_a_prompt_is_shown_does_not_answer_it(
    terminal: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`y` and Enter typed while tools ran (meant for a prompt gone by) approved the next call
    the moment it was shown, unseen. What was typed before the prompt is discarded, the person
    told so; the answer is the line typed once it is shown."""
    keyboard, screen = terminal
    with open(screen, closefd=False) as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        os.write(keyboard, b"y\n")
        shown = _Screen()
        channel = TerminalChannel(Console(file=shown, width=200, highlight=False))
        typist = _typing_once_prompted(shown, keyboard, b"n\nnot this one\n")
        try:
            answer = channel.ask(_approval())
        finally:
            typist.join()
    assert answer == so.InputResponse(request_id="req_1", option_id="cancel", text="not this one")
    assert "what you typed before this was asked is discarded" in shown.getvalue()


def test_nothing_typed_ahead_is_nothing_discarded(terminal: tuple[int, int]) -> None:
    keyboard, screen = terminal
    with open(screen, closefd=False) as stdin:
        original, sys.stdin = sys.stdin, stdin
        try:
            assert discard_typed_ahead() is False
            os.write(keyboard, b"y\n")
            assert discard_typed_ahead() is True
            os.write(keyboard, b"n\n")
            assert read_terminal_line(screen) == "n"
        finally:
            sys.stdin = original


def test_answers_piped_in_ahead_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A script pipes its answers in before any prompt is shown: none is discarded."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"y\n")
    os.close(write_end)
    with open(read_end) as pipe:
        monkeypatch.setattr(sys, "stdin", pipe)
        assert discard_typed_ahead() is False
        shown = _Screen()
        channel = TerminalChannel(Console(file=shown, width=200, highlight=False))
        assert channel.ask(_approval()) == so.InputResponse(request_id="req_1", option_id="approve")
    assert "discarded" not in shown.getvalue()


def _in_a_thread(ask: Callable[[], so.InputResponse | None]) -> so.InputResponse | None:
    """`ask()` where a hub's terminal channel runs it: in a thread, reading by `input()`."""
    got: list[so.InputResponse | None] = []
    asker = threading.Thread(target=lambda: got.append(ask()))
    asker.start()
    asker.join(30)
    assert got, "the prompt failed (see the thread's exception above)"
    return got[0]


def test_a_byte_not_utf8_is_asked_again_where_input_is_decoded_strictly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under a locale whose standard input Python decodes strictly (en_US.UTF-8), a byte that
    is not UTF-8 raised UnicodeDecodeError out of the prompt (and lost every line read with
    it): `signoff chat` crashed, a hub's prompt died. It is read as a lone surrogate, which
    answers no prompt: asked again, as in a C.UTF-8 locale."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"y\xe9\ny\n")
    os.close(write_end)
    with io.TextIOWrapper(open(read_end, "rb"), encoding="utf-8", errors="strict") as strict:
        monkeypatch.setattr(sys, "stdin", strict)
        shown = _Screen()
        channel = TerminalChannel(Console(file=shown, width=200, highlight=False))
        answer = _in_a_thread(lambda: channel.ask(_approval()))
        assert strict.errors == "surrogateescape"
    assert answer == so.InputResponse(request_id="req_1", option_id="approve")
    assert shown.getvalue().count("(y/N)") == 2 and "answer y or n" in shown.getvalue()


def test_a_line_that_cannot_be_decoded_is_asked_again(
    terminal: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Standard input read strictly before the channel's first prompt keeps its strict
    decoding (Python changes it only before the first read): the line it cannot decode is
    asked again, not the prompt's end."""
    keyboard, screen = terminal
    raw = open(screen, "rb", buffering=0, closefd=False)
    with io.TextIOWrapper(raw, encoding="utf-8", errors="strict") as strict:
        monkeypatch.setattr(sys, "stdin", strict)
        os.write(keyboard, b"read before\n")
        assert strict.readline() == "read before\n"
        shown = _Screen()
        channel = TerminalChannel(Console(file=shown, width=200, highlight=False))
        typist = _typing_once_prompted(shown, keyboard, b"\xe9\ny\n")
        try:
            answer = _in_a_thread(lambda: channel.ask(_approval()))
        finally:
            typist.join()
        assert strict.errors == "strict"
    assert answer == so.InputResponse(request_id="req_1", option_id="approve")
    assert "that line could not be read" in shown.getvalue()


def _printed_until(fd: int, marker: bytes, seen: bytes = b"") -> bytes:
    """What was printed to `fd` so far (`seen` and more) until `marker` is printed once more
    than in `seen` (a prompt, which ends no line)."""
    wanted = seen.count(marker) + 1
    deadline = time.monotonic() + 30
    while seen.count(marker) < wanted:
        left = deadline - time.monotonic()
        assert left > 0, seen
        if select.select([fd], [], [], left)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the other end closed: it ended
                chunk = b""
            assert chunk, seen
            seen += chunk
    return seen


@pytest.mark.parametrize(
    ("target", "answers", "then"),
    [
        (TARGET, [(b"(y/N)", b"n"), (b"Reason", b"bro\xe9ken")], b"Not refunded: broken."),
        ("tests._cli:sizer", [(b"or your answer):", b"ba\xe9g")], b"You chose bag."),
    ],
    ids=["denial-reason", "free-text"],
)
def test_a_byte_not_utf8_typed_at_chat_answers_no_prompt(
    url: str, target: str, answers: list[tuple[bytes, bytes]], then: bytes
) -> None:
    """At a real terminal, `signoff chat` took a typed byte that is not UTF-8 as U+FFFD, in a
    denial's reason or a question's free text (`bro\ufffdken` told to the model); piped in,
    it is asked again. Typed, it is too: the same answers, the byte left out, are taken."""
    keyboard, screen = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "signoff", "chat", target, "--store", url],
        cwd=ROOT,
        stdin=screen,
        stdout=screen,
        stderr=subprocess.PIPE,
    )
    os.close(screen)
    try:
        seen = b""
        os.write(keyboard, b"refund 1042\n")
        for typed in (answers, [(p, a.replace(b"\xe9", b"")) for p, a in answers]):
            for prompt, answer in typed:  # each typed once shown: typed before, it is discarded
                seen = _printed_until(keyboard, prompt, seen)
                os.write(keyboard, answer + b"\n")
        seen = _printed_until(keyboard, then, seen)
        os.write(keyboard, b"/exit\n")
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        os.close(keyboard)
    assert proc.returncode == 0, (seen, stderr)
    assert b"InvalidAnswer" in seen and b"\xef\xbf\xbd" not in seen, seen
