"""The `signoff` command: chat with an agent, work the approval queue, read a session's log.

Every command reports a signoff error as one red line naming its class and exits with status 1;
a command line Click rejects, or one found wrong before anything runs, exits 2, Ctrl-C 130
(`worker` and `events --follow` stop on it, 0), output nobody reads any more 141, output that
cannot be written (a full disk) one red line and 1. The commands
that only read (`pending`, `sessions`, `events`) and those that ask first (`delete`, `prune`)
never upgrade the store's schema; the others do, as a `Runtime` does.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

__all__ = ["app", "load_runtime", "local_principal", "main", "parse_principal"]

if TYPE_CHECKING:
    from ._main import app, load_runtime, local_principal, parse_principal
else:

    def __getattr__(name: str) -> object:
        """The exported names, from `_main`, which loads the whole command line."""
        if name in __all__:
            from . import _main

            return getattr(_main, name)
        raise AttributeError(f"module 'signoff.cli' has no attribute {name!r}")


def main() -> None:
    """Entry point of the `signoff` console script. It imports the command line (most of a
    second) itself, so that a Ctrl-C meanwhile ends it as one anywhere else does, not with a
    traceback: this module and the `signoff` package import next to nothing."""
    try:
        from ._main import run

        run()
    except KeyboardInterrupt:
        try:
            sys.stderr.write("interrupted\n")
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr gone: the status says it
            pass
        raise SystemExit(130) from None
