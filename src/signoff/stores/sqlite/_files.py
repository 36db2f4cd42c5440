"""Where the SQLite store's file is and what this process may do with it: how to open it
(read-write, read-only through a writer's -wal, or immutable), and why SQLite could not."""

from __future__ import annotations

import os

__all__ = ["beside", "open_access", "unopenable"]


def beside(path: str, suffix: str) -> str:
    """The -wal or -shm file (`suffix`) of the database at `path`: SQLite keeps them beside the
    file a symlink names, not beside the link."""
    return os.path.realpath(path) + suffix


def open_access(path: str) -> str:
    """How to open the file at `path`: "rw" if this process may write it (and create its -wal
    and -shm files if missing); else read-only, "ro" while its -wal exists (a writer has it open,
    so SQLite reads the writer's -shm) or "immutable" when it has none: SQLite would have to
    create both, which it may not, or which would then belong to this user and stop the owner's
    writes."""
    if path == ":memory:" or not os.path.exists(path):
        return "rw"
    wal = os.path.exists(beside(path, "-wal"))
    folder = os.path.dirname(os.path.realpath(path))
    if os.access(path, os.W_OK) and (wal or os.access(folder, os.W_OK)):
        return "rw"
    return "ro" if wal else "immutable"


def unopenable(path: str) -> str | None:
    """Why the file at `path` cannot be opened, where SQLite says only "unable to open database
    file": a directory, a named pipe or device, or a file (or the directory of a new one) this
    user may not use, or a -wal whose -shm it may not create."""
    if path == ":memory:":
        return None
    if os.path.isdir(path):
        return "it is a directory, not a file"
    if os.path.exists(path) and not os.path.isfile(path):
        return "it is no regular file (a named pipe, device or socket)"
    try:
        folder = os.path.dirname(os.path.abspath(path))
    except FileNotFoundError:  # a relative path, from a directory removed since
        return "the current directory no longer exists, which the path is relative to"
    if os.path.exists(path):
        if not os.access(path, os.R_OK):
            return "this user may not read it (permission denied)"
        real = os.path.dirname(beside(path, ""))
        shm = os.path.exists(beside(path, "-shm")) or os.access(real, os.W_OK)
        if os.path.exists(beside(path, "-wal")) and not shm:
            return (
                "its -wal file holds commits not yet in it, and reading them needs "
                f"{beside(path, '-shm')}, which this user may not create in {real}: open it once "
                "as a user who may write there, or copy it with its -wal to a directory this user "
                "may write"
            )
        return None
    if not os.access(folder, os.W_OK | os.X_OK):
        if _read_only(folder):  # no user may: chmod or another user mends nothing
            return f"the file system holding {folder} is mounted read-only"
        return f"this user may not create files in {folder} (permission denied)"
    return None


def _read_only(folder: str) -> bool:
    """Whether `folder` is on a file system mounted read-only (a container's volume, often)."""
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False
