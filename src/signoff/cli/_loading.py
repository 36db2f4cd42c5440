"""Loading the runtime a command names as `MODULE:RUNTIME`: a `Runtime`, an `Agent` or a factory
of either, imported as `python -m` would, with every way that goes wrong said as a `UsageError`.
"""

from __future__ import annotations

import importlib
import inspect
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .._agent import Agent
from .._exceptions import SignoffError, UsageError
from .._runtime import Runtime

__all__ = ["load_runtime", "split_target"]


def split_target(target: str) -> tuple[str, str]:
    """`MODULE:RUNTIME` as (module, attribute), checked before anything is imported: every
    command that takes one refuses one of the wrong form with this error."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise UsageError(
            f"expected MODULE:RUNTIME such as examples.support:runtime, got {target!r}"
        )
    return module_name, attribute


def load_runtime(target: str, store: str | None = None) -> Runtime:
    """Import `MODULE:RUNTIME` (a `Runtime` or an `Agent`); `store` replaces its store URL."""
    module_name, attribute = split_target(target)
    with _interruptible():
        return _loaded(target, module_name, attribute, store)


@contextmanager
def _interruptible() -> Iterator[None]:
    """Let a Ctrl-C stop what runs inside at once, as a `KeyboardInterrupt`: importing a
    runtime's module (a model library, say) can take long, and when a command does so in its
    event loop, asyncio's handler only cancels the loop's task, which it does not see until the
    import is over. Nothing to do outside the main thread, where no signal handler runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _file_path_hint(module_name: str, attribute: str) -> str:
    """What to name instead of a file path given as MODULE (`app.py`, `./app`, `pkg/app.py`),
    an easy first mistake: the module's dotted name, as `python -m` takes it. "" for a name
    that is no path."""
    path = module_name.replace("\\", "/")
    if "/" not in path and not path.startswith(".") and not path.endswith(".py"):
        return ""
    parts = [part for part in path.removesuffix(".py").split("/") if part not in ("", ".")]
    said = "that is a file path, and MODULE:RUNTIME takes a module's dotted name, as python -m does"
    if path.startswith("/") or ".." in parts or not parts:
        name = parts[-1] if parts else "MODULE"
        return f"{said}: run the command in the file's directory, with {name}:{attribute}"
    return f"{said}: {'.'.join(parts)}:{attribute}"


def _close_unstarted(exc: BaseException) -> None:
    """Close the coroutines the frames of `exc`'s traceback hold that never started (the one a
    module importing in a command's event loop gave `asyncio.run`), as Python would warn of each
    when it exits."""
    tb = exc.__traceback__
    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            if inspect.iscoroutine(value) and inspect.getcoroutinestate(value) == "CORO_CREATED":
                value.close()
        tb = tb.tb_next


def _loaded(target: str, module_name: str, attribute: str, store: str | None) -> Runtime:
    try:
        cwd = os.getcwd()
    except FileNotFoundError:  # a traceback: the command's error is the directory's
        raise UsageError(
            f"cannot load {target!r}: the current directory no longer exists; cd to one that does"
        ) from None
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # like `python -m`: modules of the current directory load
    path_hint = _file_path_hint(module_name, attribute)
    if path_hint and not module_name.endswith(".py"):  # `./app`, `pkg/app`: no module's name
        raise UsageError(f"cannot import {module_name!r}: {path_hint}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (
            module_name == exc.name or module_name.startswith(exc.name + ".")
        ):
            where = f"no such module in {cwd} or the installed packages"
            raise UsageError(f"cannot import {module_name!r}: {path_hint or where}") from None
        raise UsageError(f"importing {module_name!r} failed: {exc}") from exc
    except SignoffError:
        raise
    except SystemExit as exc:  # a script's `sys.exit(main())`: the command ended as if done
        raise UsageError(
            f"importing {module_name!r} exited ({_exited(exc)}): it runs a script when "
            "imported (a script's run goes under if __name__ == '__main__':)"
        ) from None
    except Exception as exc:
        said = f"importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        if isinstance(exc, RuntimeError) and "asyncio.run() cannot be called" in str(exc):
            _close_unstarted(exc)  # no "coroutine 'main' was never awaited" after the one line
            said += " (it runs asyncio.run() when imported: a script's run goes under "
            said += "if __name__ == '__main__':)"
        raise UsageError(said) from exc
    obj: Any = module
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"module {module_name!r} has no attribute {attribute!r}") from None
    named = target
    if callable(obj) and not isinstance(obj, (Agent, Runtime)):
        named = f"{target}() returned a value that"  # what is wrong is what it made
        try:
            obj = obj()  # a factory: `def make_runtime() -> Runtime`
        except SignoffError:
            raise
        except SystemExit as exc:
            raise UsageError(
                f"{target}() exited ({_exited(exc)}) instead of returning a signoff Runtime or "
                "Agent"
            ) from None
        except Exception as exc:
            raise UsageError(f"{target}() failed: {type(exc).__name__}: {exc}") from exc
        if inspect.iscoroutine(obj):
            obj.close()  # never run: no "was never awaited" warning beside the error
            raise UsageError(
                f"{target}() is a coroutine: a runtime factory must be a plain function "
                "returning a signoff Runtime or Agent"
            )
    if isinstance(obj, Agent):
        return Runtime([obj], store=store)
    if isinstance(obj, Runtime):
        return obj if store is None else obj.with_store(store)
    raise UsageError(f"{named} is a {type(obj).__name__}, not a signoff Runtime or Agent")


def _exited(exc: SystemExit) -> str:
    """How code that called `sys.exit` (or raised `SystemExit`) exited, as its caller wrote it."""
    return "sys.exit()" if exc.code is None else f"sys.exit({exc.code!r})"
