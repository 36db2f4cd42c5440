"""Where the SQLite store's file is and what this process may do with it: how to open it
(read-write, read-only through a writer's -wal, or immutable), and why SQLite could not (a full
disk among the reasons); and what tells the file, its -wal and -shm from others put there."""

from __future__ import annotations

import os
import sqlite3

__all__ = [
    "beside",
    "identity",
    "no_room",
    "no_space",
    "open_access",
    "permitted",
    "stamp",
    "unopenable",
    "wal_files",
]

SHM_BYTES = 32768
"""The -shm SQLite makes first when it opens a file in WAL mode: every open connection's is as
large, at least."""

ROOM = 2 * SHM_BYTES
"""Bytes free below which a file system is full to the store: too little for the -shm and a
few pages of -wal."""


def beside(path: str, suffix: str) -> str:
    """The -wal or -shm file (`suffix`) of the database at `path`: SQLite keeps them beside the
    file a symlink names, not beside the link."""
    return os.path.realpath(path) + suffix


def open_access(path: str) -> str:
    """How to open the file at `path`: "rw" if this process may write it (and create its -wal
    and -shm files if missing); else read-only, "ro" while its -wal exists (a writer has it open,
    so SQLite reads the writer's -shm) or "immutable" when it has none: SQLite would have to
    create both, which it may not, or which would then belong to this user and stop the owner's
    writes. Also "immutable" on a full disk (`no_room`) while no connection uses a -wal: SQLite
    could not make the -shm it reads through."""
    if path == ":memory:" or not os.path.exists(path):
        return "rw"
    if permitted(path):
        return "immutable" if no_room(path) and _wal_unused(path) else "rw"
    return "ro" if os.path.exists(beside(path, "-wal")) else "immutable"


def permitted(path: str) -> bool:
    """Whether this process may write the existing file at `path`, and create its -wal and -shm
    files if missing (the -wal there: a writer has it open, and its -shm)."""
    wal = os.path.exists(beside(path, "-wal"))
    folder = os.path.dirname(os.path.realpath(path))
    return os.access(path, os.W_OK) and (wal or os.access(folder, os.W_OK))


def no_room(path: str) -> bool:
    """Whether the file system holding the file at `path` (or its directory, for a new one) has
    less than `ROOM` free to this user. One that tells no sizes (some network and FUSE file
    systems say 0 blocks) is taken to have room."""
    try:
        st = os.statvfs(os.path.dirname(os.path.realpath(path)))
    except (OSError, AttributeError):  # no statvfs on Windows
        return False
    free = st.f_bfree if os.geteuid() == 0 else st.f_bavail  # root may use the reserved blocks
    return st.f_blocks > 0 and free * st.f_frsize < ROOM


def no_space(path: str, error: sqlite3.Error) -> str:
    """What to add to SQLite's `error` for the file at `path` ("disk I/O error", "database or
    disk is full") when its file system is full (`no_room`): that it is."""
    code = getattr(error, "sqlite_errorcode", 0) & 0xFF
    if code not in (sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL) or not no_room(path):
        return ""
    return f" (no space left on the device holding {os.path.dirname(os.path.realpath(path))})"


def _wal_unused(path: str) -> bool:
    """Whether the file at `path` holds every commit: it has no -wal, or an empty one beside a
    -shm (if any) smaller than any open connection's, as one that could not make its -shm on a
    full disk leaves them. A writer commits only after making its -shm, or into its -wal."""
    try:
        if os.path.getsize(beside(path, "-wal")) > 0:
            return False
        return os.path.getsize(beside(path, "-shm")) < SHM_BYTES
    except OSError:  # either missing
        return True


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


def identity(path: str) -> tuple[int, int] | None:
    """The device and inode of the file at `path`, or None if there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def stamp(path: str) -> tuple[int, int, int] | None:
    """When the file at `path` last changed, and its size: what an immutable reader compares to
    see that a writer came and went (checkpointing into the file) between two of its reads."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_ctime_ns, st.st_size


def wal_files(paths: tuple[str, str]) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """The identities of the -wal and -shm files at `paths` (`beside` the database's)."""
    return identity(paths[0]), identity(paths[1])


def _read_only(folder: str) -> bool:
    """Whether `folder` is on a file system mounted read-only (a container's volume, often)."""
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False
