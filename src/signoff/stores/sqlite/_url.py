"""The SQLite store's URL: `sqlite:///` and the file's path, relative or absolute, percent-decoded
as any URL's path is (so a `#` or `?` in it can be written), with no query or fragment."""

from __future__ import annotations

import os
import urllib.parse

from ..._exceptions import StoreError

__all__ = ["path_from_url", "refuse_undecoded", "sqlite_url"]


def sqlite_url(path: str | os.PathLike[str]) -> str:
    """The `sqlite:///` URL of the file at `path`, relative or absolute: its `%`, `?` and `#`
    percent-encoded, as the URL's path is decoded, and the rest left as it is, to be read."""
    text = os.fspath(path)
    return "sqlite:///" + text.replace("%", "%25").replace("?", "%3F").replace("#", "%23")


def _unescaped(path: str) -> str:
    """A URL's path percent-decoded: each `%` and two hex digits is that byte (a byte that is no
    UTF-8 kept as `os.fsencode` gives it back); a `%` without them stays, as it always did."""
    return urllib.parse.unquote(path, errors="surrogateescape")


def path_from_url(url: str) -> str:
    """The file a `sqlite:///` URL names, its `%XX` decoded; a URL of another form, or naming
    no file a path can hold, is a `StoreError`."""
    if not isinstance(url, str) or not url.startswith("sqlite://"):
        raise StoreError(f"not a SQLite URL: {url!r} (expected sqlite:///path/to/file.db)")
    rest = url[len("sqlite://") :]
    if not rest.startswith("/"):
        raise StoreError(
            f"SQLite URL needs three slashes: sqlite:///relative or sqlite:////abs: {url!r}"
        )
    if "?" in rest or "#" in rest:
        raise StoreError(
            f"SQLite URL takes no query or fragment (the store sets its own options): {url!r}; "
            "a '?' or '#' in the file's path is written percent-encoded, as %3F or %23"
        )
    path = _unescaped(rest[1:])
    if not path:
        raise StoreError(f"SQLite URL names no file: {url!r}")
    try:  # a byte that is no UTF-8 comes as a surrogate os.fsencode gives back
        unusable = "\x00" in path or not os.fsencode(path)
    except UnicodeEncodeError:
        unusable = True
    if unusable:  # else a raw ValueError or UnicodeEncodeError at the first call
        raise StoreError(
            f"SQLite URL names no file a path can hold (a NUL or lone surrogate): {url!r}"
        )
    if path == "~" or path.startswith("~/"):  # nothing expands it in a URL, not even a shell
        home = os.path.expanduser(path)  # what was meant, to name in the message
        meant = "sqlite:////full/path.db"
        if path != "~" and home.startswith("/"):  # expanded: a file under the home directory
            meant = sqlite_url(home)
        raise StoreError(
            "SQLite URL path starts with '~', which names a folder '~' here, not your home "
            f"directory (nothing expands it in a URL): {url!r}; give the full path instead, "
            f"such as {meant!r}"
        )
    if path.endswith("/"):  # SQLite would open `x/` as the file `x`, creating one if none
        raise StoreError(f"SQLite URL ends in '/', which names a folder, not a file: {url!r}")
    return path


def refuse_undecoded(url: str, path: str) -> None:
    """Refuse a URL whose `%XX` a signoff that did not decode them took as they are, when the
    file so named exists and the decoded `path` does not: a new store made there would hide
    that one's sessions."""
    undecoded = url[len("sqlite:///") :]
    if undecoded == path or os.path.lexists(path) or not os.path.lexists(undecoded):
        return
    raise StoreError(
        f"SQLite URL {url!r} names {path} (its %-escapes decoded), which does not exist, but "
        f"{undecoded} does: to open that one, write each '%' in its path as %25"
    )
