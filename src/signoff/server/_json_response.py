"""`JSONText`: the API's and the dashboard's JSON responses, which can carry a lone surrogate.

A model's text or a tool's result may hold one (the store keeps it), and UTF-8 cannot: a
response written as plain UTF-8 failed with a 500 after an answer was already recorded, and
every later read of that session did too. Such a response escapes it (`"\\ud800"`), as the
event stream's JSON always does; every other response stays compact UTF-8.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

__all__ = ["JSONText"]


class JSONText(JSONResponse):
    """A JSON response whose text may hold lone surrogates, written as JSON escapes."""

    def render(self, content: Any) -> bytes:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: only ASCII escapes can carry it
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")
