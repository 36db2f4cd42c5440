"""Where `signoff serve` and `signoff worker` send the runtime's own log (and its database
driver's): stderr, timestamped."""

from __future__ import annotations

import logging
import sys

__all__ = ["LOG_FORMAT", "LOG_LEVELS", "log_to_stderr"]

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
"""The levels the commands take, uvicorn's (`trace` is its own, below debug)."""

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def log_to_stderr(level: str = "info") -> None:
    """Send the `signoff` loggers' records at `level` and above to stderr, one timestamped line
    each, unless logging is already set up (a handler on `signoff` or on the root logger): an
    application that configured its own keeps it, levels included, and nothing is logged twice."""
    logger = logging.getLogger("signoff")
    if logger.handlers or logging.getLogger().handlers:
        return
    least = logging.DEBUG if level == "trace" else getattr(logging, level.upper())
    logger.setLevel(least)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.addHandler(handler)
    # psycopg's pool warns of every failed reconnection (several a second while the database is
    # down), which signoff logs once when it starts and once when it ends: below debug, only
    # its errors are shown, in the same format.
    driver = logging.getLogger("psycopg")
    driver.setLevel(least if least <= logging.DEBUG else max(least, logging.ERROR))
    driver.addHandler(handler)
