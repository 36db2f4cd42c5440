"""`HubLease`: the OS file lock that lets one `ChannelHub` at a time deliver to a channel.

The lock is taken on a file next to the state (`<state>-<hub name>.<channel name>.lock`, never
deleted: a waiter could otherwise lock a file no longer there) and held while the hub runs. The
OS lets go of it when the process ends, however it ends, so a standby takes over at once.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys

from .._exceptions import StoreError

__all__ = ["HubLease"]


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
