"""Checks that the `server` extra is installed, so that a missing package is named with its
install line on import rather than found later (e.g. as a 500 on the dashboard's first form)."""

from __future__ import annotations

from importlib.util import find_spec

from .._exceptions import UsageError

# Each package of the extra, with the modules that may provide it.
SERVER_EXTRA = {
    "fastapi": ("fastapi",),
    "uvicorn": ("uvicorn",),
    "jinja2": ("jinja2",),
    "python-multipart": ("python_multipart", "multipart"),
    "httpx": ("httpx",),
}

_missing = [dist for dist, mods in SERVER_EXTRA.items() if not any(map(find_spec, mods))]
if _missing:
    raise UsageError(
        f"the signoff server needs {', '.join(_missing)}: pip install 'signoff[server]'"
    )
