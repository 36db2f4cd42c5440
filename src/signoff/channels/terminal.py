"""`TerminalChannel`: shows a request in a terminal and reads the person's answer inline.

An approval is one line naming the call, its input as compact JSON, and a yes/no prompt whose
default is no: `? Run issue_refund({"order_id":"1042",...})? (y/N)`; a question shows numbered
choices and, when the request allows it, takes free text. An input or payload longer than
`SHOWN_CHARS` is cut there, saying how much is left out, and `v` at the prompt prints all of it.
"""

from __future__ import annotations

import inspect
import json
import re
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.emoji import Emoji

from .._exceptions import UsageError
from .._option_names import folded, how_to_choose, named_options, numbers_clash
from .._sync import checked_clock, is_async
from .._text import HIDDEN, escape_as_json, is_blank, is_utf8
from .._types import InputRequest, InputResponse
from ._tty import discard_typed_ahead, lenient_stdin, read_terminal_line, terminal_stdin

__all__ = ["SHOWN_CHARS", "TerminalChannel", "compact_json", "duration", "printable"]

SHOWN_CHARS = 1000
"""How much of a call's input (or its tool's payload) an approval shows before its prompt: a
200 KB argument printed whole filled thousands of lines, the prompt lost at their end. `v` at
the prompt prints it all."""

_YES = frozenset({"y", "yes"})
_NO = frozenset({"n", "no", ""})
_VIEW = frozenset({"v", "view"})


def _cut(text: str) -> str:
    """`text`, or its first `SHOWN_CHARS` characters and how many more there are."""
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{text[:SHOWN_CHARS]}… ({len(text) - SHOWN_CHARS:,} more characters)"


def compact_json(value: Any) -> str:
    """A call's input as JSON on one line, with no spaces after separators and non-ASCII text as
    it is, so an approval prompt stays short; whole-number floats read as integers (`180`).
    Invisible and bidirectional characters show as `\\u` escapes, as on the dashboard and in
    Slack, so what a reviewer reads is what runs (the JSON still parses to `value`)."""
    text = json.dumps(_tidy(value), separators=(",", ":"), ensure_ascii=False, default=str)
    return HIDDEN.sub(escape_as_json, text)


# C0 and C1 controls but tab and newline (ESC starts the sequences that retitle, clear or rewrite
# a terminal), DEL, the bidirectional controls that reorder what is around them (`_text.BIDI`),
# and lone surrogates (a model can produce one; a UTF-8 terminal or pipe cannot take it).
_CONTROLS = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


_TRAILING_BACKSLASHES = re.compile(r"\\+\Z")
_OPENING = re.compile(r"(\\*)\[")
_TAG = re.compile(r"[a-z#/@][^[]*?]")
"""What Rich reads as a tag after a `[` (`rich.markup.RE_TAGS`)."""

_END = "[none][/none]"
"""An empty span of no style: Rich reads backslashes just before it as escaping it (two print
one), so doubled they print as they are whatever markup follows."""

_APART = f"{_END}:{_END}"
"""A colon in a span of its own: Rich reads emoji codes only within the text between tags."""


def printable(text: str) -> str:
    """`text` as Rich markup that prints it as it is and cannot steer the terminal: markup is
    escaped and control characters (from a model, a reviewer, a store) show as `\\x1b` and
    the like, a lone surrogate as `\\udcff`. Where an emoji code (`:thumbs_up:`, which Rich
    shows as its emoji) could be read in it or with the text around, each colon stands apart
    (`_APART`), and the text between colons is escaped on its own."""
    shown = _CONTROLS.sub(lambda m: ascii(m.group())[1:-1], text)
    if not _may_read_as_emoji(shown):
        return _escaped(shown)
    return _APART.join(_escaped(part) for part in shown.split(":"))


def _escaped(text: str) -> str:
    """`text` as markup of itself. Rich reads a backslash before any `[` as escaping it: before
    a tag the backslashes are doubled and one more escapes it (as `rich.markup.escape` does),
    and before any other `[` one more is added, which that function left out (so `\\[x \\]`
    showed as `[x \\]`). Backslashes ending it are doubled and closed off (`_END`), else they
    escaped the style's end after them, or printed one too many at the end of a line."""

    trailing = _TRAILING_BACKSLASHES.search(text)
    head = text if trailing is None else text[: trailing.start()]

    def bracket(match: re.Match[str]) -> str:
        backslashes = match.group(1)
        if _TAG.match(head, match.end()):
            return f"{backslashes * 2}\\["
        return f"{backslashes}\\[" if backslashes else "["

    escaped = _OPENING.sub(bracket, head)
    return escaped if trailing is None else escaped + trailing.group() * 2 + _END


def shows_as_is(text: str) -> bool:
    """Whether `printable(text)`, printed on one line, shows `text` itself, so that a command
    copied from it runs with it: no control character (shown escaped), tab (expanded) or line
    break (which a one-line error joins)."""
    return _CONTROLS.search(text) is None and "\t" not in text and text.splitlines() in ([], [text])


def _may_read_as_emoji(text: str) -> bool:
    """Whether Rich could read an emoji code in `text`, or with a colon of the markup around
    it: a code lies between two colons with no colon between (Rich's `Emoji.replace` says)."""
    parts = text.split(":")
    return len(parts) > 1 and any(
        len(part) <= 64 and Emoji.replace(f":{part}:") != f":{part}:" for part in parts
    )


def _tidy(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _tidy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tidy(v) for v in value]
    return value


class TerminalChannel:
    """Renders requests on a Rich console and turns typed answers into `InputResponse`s.

    `read` reads one line after showing a prompt and returns None at end of input (Ctrl-D);
    by default it is the console's own `input`. A `None` answer leaves the request pending.
    `clock` counts how long a request has left: the runtime's (`Runtime.now`), which set its
    deadline; by default this machine's, or in a hub (`TerminalTextChannel`) the runtime's.
    """

    def __init__(
        self,
        console: Console | None = None,
        *,
        read: Callable[[str], str | None] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if console is not None and not isinstance(console, Console):
            raise UsageError(f"console must be a rich Console or None, not {console!r}")
        if read is not None and not callable(read):
            raise UsageError(f"read must be a function, not {read!r}")
        if read is not None and is_async(read):  # read in a thread, never awaited
            raise UsageError(
                f"read must be a plain function (prompt) -> str | None, not {read!r}, an async "
                "one: the channel calls it in a thread, without awaiting it"
            )
        if clock is not None:  # else each request failed to be shown
            checked_clock(clock, "TerminalChannel: clock")
        self.console = console or Console(highlight=False)
        self._read = read or self._console_read
        self.clock = clock

    def _console_read(self, prompt: str) -> str | None:
        """The console's `input`, but at a terminal a wait that Ctrl-C ends at any moment:
        `input()` misses a SIGINT that comes just after its prompt until the next Enter. A
        line holding a byte that is not UTF-8, piped or typed, is read as a lone surrogate
        (`lenient_stdin`, `read_terminal_line`), which no prompt takes. Standard input an
        application read strictly before cannot be made lenient: a line it cannot decode is
        told and the prompt asked again, but what was read with it (the rest of a piped chunk)
        is lost with it."""
        lenient_stdin()
        while True:
            try:
                fd = terminal_stdin()
                if fd is None:
                    return self.console.input(prompt)
                self.console.print(prompt, end="")
                return read_terminal_line(fd)
            except EOFError:
                return None
            except UnicodeDecodeError as exc:
                self.console.print(f"  [red]that line could not be read: {printable(str(exc))}[/]")

    def read(self, prompt: str) -> str | None:
        """Show `prompt` (Rich markup) and read one line; None at end of input."""
        line = self._read(prompt)
        if line is None:
            return None
        if not isinstance(line, str):  # else an AttributeError on `strip`, or bytes never "y"
            if inspect.iscoroutine(line):
                line.close()
            raise UsageError(f"read returned {line!r}, not a line of text (str) or None")
        return line.strip()

    def read_message(self) -> str | None:
        """The next chat message: `? you: …`."""
        return self.read("[bold green]?[/] [bold]you:[/] ")

    def approval_prompt(self, request: InputRequest) -> str:
        """The inline question for a tool approval, as plain text: the input cut at
        `SHOWN_CHARS`, saying how much is left out."""
        return f"Run {request.tool_name}({_cut(compact_json(request.input))})?"

    def _cut_short(self, request: InputRequest) -> bool:
        """Whether the approval shows `request`'s input or payload cut."""
        return any(
            value is not None and len(compact_json(value)) > SHOWN_CHARS
            for value in (
                request.input,
                request.payload if request.kind == "tool-approval" else None,
            )
        )

    def _show_all(self, request: InputRequest) -> None:
        """Print the payload and the input whole (`v` at the prompt), as the terminal wraps
        them: what is approved is there to read, however long."""
        if request.payload is not None:
            self.console.print(
                f"  [dim]{printable(request.tool_name or 'tool')} asks for approval:[/] "
                f"{printable(compact_json(request.payload))}",
                soft_wrap=True,
            )
        self.console.print(
            f"  [dim]input:[/] {printable(compact_json(request.input))}", soft_wrap=True
        )

    def show(self, request: InputRequest) -> None:
        """Print what a reviewer should know before the prompt: payload, policy errors."""
        if request.kind == "tool-approval":
            if request.payload is not None:
                self.console.print(
                    f"  [dim]{printable(request.tool_name or 'tool')} asks for approval:[/] "
                    f"{printable(_cut(compact_json(request.payload)))}"
                )
            if request.source == "guardrail":
                self.console.print("  [dim]required by the agent's tool policy[/]")
        if request.auto_verdict:
            why = f": {request.auto_reason}" if request.auto_reason else ""
            self.console.print(
                f"  [dim]auto review said {printable(request.auto_verdict + why)}[/]"
            )
        if request.policy_error:
            self.console.print(
                f"  [yellow]the approval policy failed ({printable(request.policy_error)}); "
                "asking you instead[/]"
            )
        if request.approvers > 1:
            so_far = ", ".join(request.approved_by) or "nobody yet"
            self.console.print(
                f"  [dim]needs {request.approvers} approvals; approved by {printable(so_far)}[/]"
            )
        if request.expires_at is not None:
            left = request.expires_at - (time.time() if self.clock is None else self.clock())
            then = {"deny": "denied", "approve": "approved", "escalate": "escalated"}
            self.console.print(
                f"  [dim]expires in {duration(left)}; then it is {then[request.on_timeout]}[/]"
            )

    def ask(self, request: InputRequest) -> InputResponse | None:
        """Show one request, read the answer; None leaves it pending (the input ended, also at
        a denial's reason prompt: the denial is not sent). What was typed at the terminal
        before it is shown is discarded, not taken as the answer to a prompt not yet seen."""
        discarded = self._read == self._console_read and discard_typed_ahead()
        self.show(request)
        if discarded:
            self.console.print("  [yellow]what you typed before this was asked is discarded[/]")
        if request.kind == "tool-approval":
            return self._ask_approval(request)
        return self._ask_question(request)

    def _ask_approval(self, request: InputRequest) -> InputResponse | None:
        hint = "(y/N, v shows all of it)" if self._cut_short(request) else "(y/N)"
        prompt = f"[bold yellow]?[/] {printable(self.approval_prompt(request))} [dim]{hint}[/] "
        while True:
            answer = self.read(prompt)
            if answer is None:
                return None
            if not is_utf8(answer):  # a byte not UTF-8 (piped in), which `folded` would drop
                self.console.print("  [red]answer y or n[/]")
                continue
            answer = folded(answer)  # as the text channel reads it: `ｙｅｓ` is yes
            if answer in _VIEW:
                self._show_all(request)
                continue
            if answer in _YES:
                return InputResponse(request_id=request.id, option_id="approve")
            if answer in _NO:
                reason = self.read("[bold yellow]?[/] Reason [dim](optional):[/] ")
                if reason is None:  # the input ended: left pending, as at the question itself
                    return None
                return InputResponse(request_id=request.id, option_id="cancel", text=reason or None)
            self.console.print("  [red]answer y or n[/]")

    def _ask_question(self, request: InputRequest) -> InputResponse | None:
        question = request.question or f"{request.agent} asks for input"
        self.console.print(f"[bold yellow]?[/] {printable(question)}")
        for i, option in enumerate(request.options, 1):
            detail = f" [dim]- {printable(option.description)}[/]" if option.description else ""
            self.console.print(f"  {i}. {printable(option.label)}{detail}")
        n = len(request.options)
        if n and numbers_clash(request.options):  # a typed 2 may be a label: #2 is the second
            hint = f"#1-#{n}, a label" + (" or your answer" if request.allow_text else "")
        elif request.options and request.allow_text:
            hint = f"1-{len(request.options)} or your answer"
        elif request.options:
            hint = f"1-{len(request.options)}"
        else:
            hint = "your answer"
        while True:
            answer = self.read(f"  [dim]({hint}):[/] ")
            if answer is None:
                return None
            # A byte not UTF-8 names no option (`1` and one would be the first): text refused.
            named = named_options(request.options, answer) if is_utf8(answer) else []
            if len(named) == 1:
                return InputResponse(request_id=request.id, option_id=named[0].id)
            if len(named) > 1:  # a label that is another option's number: never guessed
                self.console.print(f"  [red]{printable(how_to_choose(request.options, named))}[/]")
                continue
            if request.allow_text and not is_blank(answer):
                return InputResponse(request_id=request.id, text=answer)
            self.console.print(f"  [red]choose {hint}[/]")


_YEAR = 31_557_600
"""A Julian year in seconds (365.25 days)."""


def duration(seconds: float) -> str:
    """A short human duration: `45s`, `12m`, `3h`, `2d` (`0s` once past); a century or more
    in years, and past 9999 of them `over 9999y`, not a number of days hundreds of digits long
    (a deadline `expires_in=1e300` away is valid)."""
    seconds = max(0, int(seconds))
    if seconds >= 100 * _YEAR:
        years = seconds // _YEAR
        return f"{years}y" if years <= 9999 else "over 9999y"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
