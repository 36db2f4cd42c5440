"""A journaled step that raised: what its exception was, written down when it raised, and the
same exception raised again on replay, so a tool that catches it (`except Declined:`) takes the
same path on every run without running the step again."""

from __future__ import annotations

import asyncio
import math
import sys
from typing import Any, NoReturn

from ._error_text import error_message
from ._events import FITS_BITS, check_digits
from ._exceptions import SignoffError, StepFailed, TooLarge, rebuild_error
from ._tool_json import MAX_INPUT_DEPTH, copied

__all__ = ["MAX_GROUP_DEPTH", "failure_of", "raise_recorded"]


MAX_GROUP_DEPTH = 20
"""How deeply exception groups nested in a step's failure are kept to be built again on replay
(deeper, it replays as `StepFailed`)."""


def failure_of(
    exc: Exception | asyncio.CancelledError, *, cut: int | None = None, attributes: bool = True
) -> dict[str, Any]:
    """How `exc`, raised by a step (a `CancelledError` of its own code too), is journaled: its
    class by module and name, its message, and its arguments and attributes when they are plain
    JSON (to build it again on replay); an exception group's (a `TaskGroup` in the step) its own
    message and its exceptions so. With `cut` (for one too big to store), the message's first
    `cut` characters and no arguments; without `attributes`, none of a class not signoff's own
    (too big to store)."""
    return _failure(exc, cut, 0, attributes)


def _failure(
    exc: Exception | asyncio.CancelledError, cut: int | None, depth: int, attributes: bool = True
) -> dict[str, Any]:
    cls = type(exc)
    message = error_message(exc)
    reduced, pickled = _reduced(exc)
    args: list[Any] | None = reduced
    group = None
    if isinstance(exc, ExceptionGroup) and depth < MAX_GROUP_DEPTH:
        args = [exc.message]
        group = [_failure(e, None, depth + 1, attributes) for e in exc.exceptions]
    if cut is not None:
        message, args, group = message[:cut] + " [cut]", None, None
    error: dict[str, Any] = {
        "module": cls.__module__,
        "type": cls.__qualname__,
        "message": message,
        "args": args if _plain(args) else None,
    }
    if isinstance(exc, SignoffError) and cut is None:
        # Most take other arguments than the message their `args` hold: rebuilt as pickle
        # rebuilds them, from their args and attributes (`request_ids`, `session_id`, ...).
        state = dict(vars(exc))
        if _plain(state):
            error["state"] = state
    elif cut is None and attributes:
        # Its attributes, as pickle keeps them: set by its constructor from keywords its `args`
        # lack (`HttpError("not found", status=404)`, a CalledProcessError's output) or added
        # (`add_note`), they came back at their defaults; and those only its pickled state
        # holds (an `ImportError`'s `name` and `path`). Those that are not JSON are left out.
        attrs = {**vars(exc), **pickled}
        kept = {k: v for k, v in attrs.items() if isinstance(k, str) and _plain(v)}
        if kept:
            error["state"] = kept
    if group is not None:
        error["group"] = group
    return error


def raise_recorded(step: str, error: dict[str, Any]) -> NoReturn:
    """Raise again the exception a step raised when it ran: the same class with the same
    arguments when the class is loaded and they give the same message (an exception group's
    exceptions each so), else `StepFailed`."""
    again = _rebuilt(error, 0)
    if again is not None:
        raise again
    module, qualname = str(error.get("module")), str(error.get("type"))
    name = qualname if module == "builtins" else f"{module}.{qualname}"
    raise StepFailed(step, name, str(error.get("message", "")))


def _rebuilt(error: dict[str, Any], depth: int) -> BaseException | None:
    """The exception `error` records, built again, or None when it cannot be as it was."""
    cls = _loaded_class(str(error.get("module")), str(error.get("type")))
    args = error.get("args")
    if cls is None or not isinstance(args, list):
        return None
    group = error.get("group")
    if group is not None:
        if not isinstance(group, list) or not group or depth >= MAX_GROUP_DEPTH:
            return None
        members = [_rebuilt(m, depth + 1) if isinstance(m, dict) else None for m in group]
        if any(m is None for m in members):
            return None  # one of them would replay otherwise: the whole group is StepFailed
        args = [*args, members]
    state = error.get("state")
    try:
        if issubclass(cls, SignoffError) and isinstance(state, dict):
            again = rebuild_error(cls, tuple(args), state)
        else:
            again = cls(*args)
            if isinstance(state, dict):
                _restore(again, copied(state))
    except Exception:  # a class whose arguments are not its args: rebuilt differently
        return None
    if isinstance(again, cls) and error_message(again) == str(error.get("message", "")):
        return again
    return None


def _restore(exc: BaseException, state: dict[str, Any]) -> None:
    """Set the attributes `state` keeps on `exc`, as unpickling restores them: each by `setattr`,
    so a slot of the class's own (an `ImportError`'s `name`) is set too; one that refuses it is
    kept in the instance's `__dict__`, as it was before."""
    for key, value in state.items():
        try:
            setattr(exc, key, value)
        except Exception:
            exc.__dict__[key] = value


def _reduced(exc: BaseException) -> tuple[list[Any], dict[str, Any]]:
    """The arguments that build `exc` again and the state set on it after, as pickle takes them
    (`__reduce__`): an `OSError`'s file and a `JSONDecodeError`'s document are in its message
    but not in its `args`, and an `ImportError`'s `name` and `path` are in its state alone."""
    try:
        reduced = exc.__reduce__()
    except Exception:
        reduced = None
    if isinstance(reduced, tuple) and len(reduced) >= 2 and reduced[0] is type(exc):
        if isinstance(reduced[1], tuple):
            state = reduced[2] if len(reduced) >= 3 else None
            return list(reduced[1]), state if isinstance(state, dict) else {}
    return list(exc.args), {}


def _loaded_class(module: str, qualname: str) -> type[BaseException] | None:
    """The exception class by name, only from a module already imported: a journal never makes
    signoff import code. An `Exception`, or a `CancelledError` (the only other kind a step's
    failure is journaled as): never a `SystemExit` or `KeyboardInterrupt`."""
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        if found is None or part == "<locals>":
            return None
        found = getattr(found, part, None)
    if isinstance(found, type) and issubclass(found, (Exception, asyncio.CancelledError)):
        return found
    return None


def _plain(value: Any) -> bool:
    """Whether `value` is JSON as it is (so it comes back from the log equal to itself) and can
    be written: an integer of more digits than a stored number may have, or nesting deeper than
    `MAX_INPUT_DEPTH`, made the journal's record raise instead of keeping the step's failure
    (its body saw a `ValueError` or `RecursionError`, and its replay a `ReplayError`)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if item is None or isinstance(item, (str, bool)):
            continue
        if isinstance(item, int):
            if item.bit_length() > FITS_BITS:
                try:
                    check_digits(item)
                except TooLarge:
                    return False
        elif isinstance(item, float):
            if not math.isfinite(item):
                return False
        elif isinstance(item, (list, dict)) and depth < MAX_INPUT_DEPTH:
            if isinstance(item, dict):
                if not all(isinstance(k, str) for k in item):
                    return False
                item = item.values()
            stack.extend((v, depth + 1) for v in item)
        else:
            return False
    return True
