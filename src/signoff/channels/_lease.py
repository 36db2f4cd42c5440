"""`HubLease`: the OS file lock that lets one `ChannelHub` at a time deliver to a channel, and
`Presence`: the one that says a channel object is alive, so work it took is left to it.

The lock is taken on a file next to the state (`<state>-<hub name>.<channel name>.lock`, never
deleted: a waiter could otherwise lock a file no longer there) and held while the hub runs. The
OS lets go of it when the process ends, however it ends, so a standby takes over at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import sys
import threading

from .._exceptions import StoreError

__all__ = ["HubLease", "Presence", "alive"]


class HubLease:
    """An exclusive, non-blocking lock named `name` (the hub's and the channel's) on the channel
    state at `state_path`.

    `flock` locks belong to one open file, so two hubs in one process exclude each other too.
    """

    def __init__(self, state_path: str, name: str) -> None:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        if safe != name:  # keep names that differ only in unsafe characters apart
            safe += "-" + hashlib.sha256(name.encode()).hexdigest()[:8]
        self.path = f"{state_path}-{safe}.lock"
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        """Take the lock if nobody holds it; False (at once) if another hub does."""
        if self._fd is not None:
            return True
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot open the channel hub's lock {self.path}: {exc}") from exc
        try:
            locked = _try_lock(fd)
        except OSError as exc:
            os.close(fd)
            raise StoreError(f"cannot lock the channel hub's lock {self.path}: {exc}") from exc
        if not locked:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        """Let go of the lock (closing the file does it)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


_HELD: set[str] = set()  # the tokens of the presences this process holds
_GUARD = threading.Lock()  # presences are taken in worker threads (memo saves), maybe two at once


class Presence:
    """An OS lock next to the state at `state_path` under `name` and a random `token`, held by
    a channel object while it may act on work it took (saved with the token): another process
    leaves that work to it until the lock goes, when it closes or its process dies. On a state
    in memory (`":memory:"`, shared by no other process) only this process's table says so."""

    def __init__(self, state_path: str, name: str) -> None:
        self.token = secrets.token_hex(8)
        self.state_path = state_path
        self.name = name
        self._lease = (
            None if state_path == ":memory:" else HubLease(state_path, _named(name, self.token))
        )

    def hold(self) -> str:
        """Take the lock (once), and the token; a `StoreError` if its file cannot be locked."""
        with _GUARD:
            if self.token not in _HELD:
                if self._lease is not None and not self._lease.acquire():
                    raise StoreError(f"the lock {self._lease.path} is held elsewhere")
                _HELD.add(self.token)
        return self.token

    def release(self) -> None:
        """Let go of it, its file removed (a process that dies leaves it, for `alive` to)."""
        with _GUARD:
            if self.token not in _HELD:
                return
            _HELD.discard(self.token)
            if self._lease is not None:
                with contextlib.suppress(OSError):
                    os.unlink(self._lease.path)
                self._lease.release()


def alive(state_path: str, name: str, token: str) -> bool:
    """Whether the `Presence` of `name` and `token` on the state at `state_path` is held (in
    this or another process); the file of one whose process died is removed. One that cannot be
    checked counts as held: its work waits for a later scan rather than run twice."""
    if token in _HELD:
        return True
    if state_path == ":memory:":
        return False
    path = HubLease(state_path, _named(name, token)).path
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        free = _try_lock(fd)
        if free:
            with contextlib.suppress(OSError):
                os.unlink(path)
    except OSError:
        free = False
    finally:
        os.close(fd)
    return not free


def _named(name: str, token: str) -> str:
    return f"{name}.{token}.live"


if sys.platform == "win32":  # pragma: no cover - the tests run on POSIX
    import msvcrt

    def _try_lock(fd: int) -> bool:
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:  # held elsewhere (msvcrt does not tell it apart from other failures)
            return False
        return True

else:
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True
