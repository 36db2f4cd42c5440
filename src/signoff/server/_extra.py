"""Checks that the `server` extra is installed, so that a missing package is named with its
install line on import rather than found later (e.g. as a 500 on the dashboard's first form)."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec

from .._exceptions import UsageError

# Each package of the extra, with the modules that may provide it.
SERVER_EXTRA = {
    "fastapi": ("fastapi",),
    "starlette": ("starlette",),
    "uvicorn": ("uvicorn",),
    "jinja2": ("jinja2",),
    "python-multipart": ("python_multipart", "multipart"),
    "httpx": ("httpx",),
}

STARLETTE_AT_LEAST = (0, 44)
"""Its `Request.form(max_part_size=)`: a dashboard form's field is bounded by the body limit."""


def _older_starlette() -> str | None:
    """The installed Starlette's version when older than the server needs, else None."""
    try:
        shown = version("starlette")
    except PackageNotFoundError:
        return None  # named as missing
    # The leading digits of its first two parts: "0.45rc1" is (0, 45), "1.0.0.dev1" (1, 0).
    parts = [int(m.group()) if (m := re.match(r"\d+", p)) else 0 for p in shown.split(".")[:2]]
    return shown if tuple(parts) < STARLETTE_AT_LEAST else None


_missing = [dist for dist, mods in SERVER_EXTRA.items() if not any(map(find_spec, mods))]
if _missing:
    raise UsageError(
        f"the signoff server needs {', '.join(_missing)}: pip install 'signoff[server]'"
    )
_older = _older_starlette()
if _older is not None:
    raise UsageError(
        f"the signoff server needs Starlette 0.44 or later, not {_older}: "
        "pip install --upgrade 'signoff[server]'"
    )
