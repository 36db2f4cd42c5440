"""The Click classes of the `signoff` commands: help that reads as Click and the README write it
(`REQUEST_ID [MODULE:RUNTIME]`, no `<str>` or `<bool>`, each docstring paragraph on one line),
and a quiet stop when whoever reads the output stops reading (`signoff events ... | head -1`)."""

from __future__ import annotations

import errno
import inspect
import io
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import typer
from rich.console import Console

# Typer's public API cannot write this help, checked against Typer 0.29.2 (the CLI tests pin it:
# tests/test_cli_commands.py), so these are Typer's internals, tied to its minor version:
# - `<str>` beside an argument: `TyperArgument.display_type_rich` shows the Python type even when
#   the argument has a metavar (an option's shows its metavar instead). `typer.Argument` has no
#   setting to hide it and Typer no way to choose an argument's class: `_plain` swaps the class.
# - `<bool>` beside a flag: shown for every flag, Typer's own `--help` too, which Typer builds
#   itself (`typer.Option(metavar="")` could clear ours, not that one): `_plain` sets the metavar.
# - `{REQUEST_ID}` in the usage line: written by `TyperArgument._usage_display_name` (private);
#   `collect_usage_pieces` of the command class is the one place to write it otherwise.
# - `Typer(cls=...)` and `Typer.command(cls=...)` are public and take subclasses of `TyperGroup`
#   and `TyperCommand` (typer.core). The Click they extend has been vendored since Typer 0.26 as
#   `typer._click`, which Typer says is not for applications; it is the only source of the types
#   their methods take (`typer.Context` subclasses Click's: mypy refuses it in an override).
# - Rich exits with status 1 on a broken pipe (`Console.on_broken_pipe`), and Typer makes the
#   console that writes help itself (`rich_utils`, private): `format_help` is where to catch it.
# - One-line paragraphs (`finish_help`): Typer's rich help keeps a docstring's line breaks, and
#   `rich_markup_mode="markdown"`, which joins them, also drops the backticks from `(y/N)`.
from typer import _click
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from ..channels.terminal import printable

__all__ = ["ClosedOutput", "Command", "Group", "closed_pipe", "finish_help"]


class _Argument(TyperArgument):
    """An argument shown by its metavar alone: Typer puts `<str>` beside even a named one."""

    def display_type_rich(self, ctx: _click.Context) -> str | None:
        return None


def _plain(params: list[_click.Parameter]) -> None:
    """Show each of `params` by its name and metavar alone, with no Python type beside it."""
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""  # a flag takes no value: not `<bool>`
        elif type(param) is TyperArgument:
            param.__class__ = _Argument


def _help(show: Callable[[], None]) -> None:
    """Show a command's help, ending as `closed_pipe` says when its reader has gone: Rich, which
    Typer writes help with, exits with status 1 then, as for an error."""
    try:
        show()
    except SystemExit as exc:
        if exc.code == 1:  # Rich's `Console.on_broken_pipe`, the one way its print exits
            closed_pipe()
        raise


class Command(TyperCommand):
    """A command whose usage line names a required argument bare and an optional one in
    brackets (Typer writes `{REQUEST_ID}`), with no `<str>` or `<bool>` in its help."""

    def format_help(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        _help(lambda: super(Command, self).format_help(ctx, formatter))

    def get_params(self, ctx: _click.Context) -> list[_click.Parameter]:
        params = super().get_params(ctx)
        _plain(params)
        return params

    def collect_usage_pieces(self, ctx: _click.Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = param.display_name_raw
                name = name if param.required else f"[{name}]"
                pieces.append(name + ("..." if param.nargs != 1 else ""))
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces


class Group(TyperGroup):
    """A group of commands whose own flags (`--version`, `--help`) show no `<bool>`, and which
    ends a command whose output nobody reads any more as `closed_pipe` says."""

    def get_params(self, ctx: _click.Context) -> list[_click.Parameter]:
        params = super().get_params(ctx)
        _plain(params)
        return params

    def format_help(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        _help(lambda: super(Group, self).format_help(ctx, formatter))

    def invoke(self, ctx: _click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            closed_pipe()
        except KeyboardInterrupt:  # outside a command's event loop (`serve` loading its runtime)
            _interrupted()

    def main(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().main(*args, **kwargs)
        except OSError as exc:
            if exc.errno not in _WRITE_FAILED:
                raise
            _unwritable(exc)


def _interrupted() -> NoReturn:
    """End a command stopped by Ctrl-C as every command ends then: one line, status 130 (Typer
    exits 130 without a word)."""
    try:
        Console(stderr=True, highlight=False).print("[dim]interrupted[/]")
    except OSError:  # stderr gone: the status says it
        pass
    raise typer.Exit(130)


_WRITE_FAILED = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EBADF})
"""What a write of the output meets on a full disk or a failing device (`> /dev/full`), or
closed (`>&-`): the store's own such failures come as its errors, so at the top of a command
these are the output's."""


def _unwritable(exc: OSError) -> NoReturn:
    """End a command whose output could not be written as any failed command ends: one red line
    on stderr, status 1, and not Python's "Exception ignored" at exit from flushing it again."""
    _drop_stdout()
    message = " ".join(str(exc).split())
    try:
        Console(stderr=True, highlight=False).print(
            f"[bold red]error:[/] [red]{type(exc).__name__}: {printable(message)}[/]",
            soft_wrap=True,
        )
    except OSError:  # stderr fails too: the status says it
        pass
    raise SystemExit(1)


def _drop_stdout() -> None:
    """Point standard output at the null device, so that Python's own flush at exit does not
    fail on it and print to stderr after all."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, sys.stdout.fileno())
        finally:
            os.close(null)
    except (OSError, ValueError, io.UnsupportedOperation):  # no file descriptor (a test's)
        pass


def closed_pipe() -> NoReturn:
    """Stop, with no traceback and nothing more written, once the reader of our output has gone
    (`| head -1`): status 141, 128 + SIGPIPE, which the shell reports for git or ls there too.

    Click would exit 1, as for an error. Standard output is pointed at the null device so that
    Python's own flush at exit does not fail on the closed pipe and print to stderr after all."""
    _drop_stdout()
    raise typer.Exit(141)


def finish_help(typer_app: typer.Typer) -> None:
    """Make every command of `typer_app` a `Command` and give it its docstring as help with
    each paragraph on one line: Typer's rich help keeps a docstring's line breaks, which then
    cut the terminal's wrapping."""
    for command in typer_app.registered_commands:
        if command.cls in (None, TyperCommand):
            command.cls = Command
        if command.help is None and command.callback is not None:
            doc = inspect.getdoc(command.callback) or ""
            command.help = "\n\n".join(" ".join(part.split()) for part in doc.split("\n\n"))
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            finish_help(group.typer_instance)


class ClosedOutput(io.TextIOBase):
    """Standard output that was closed: each write fails as a write to a closed descriptor
    does, so the command names the error and exits 1, as for a full disk."""

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")

    def writable(self) -> bool:
        return True
