"""What a dashboard form's button or menu entry sends for a question's option, and the option id
it names: an id a browser would not send back as it is travels as a JSON string instead."""

from __future__ import annotations

import json
import re

from .._text import BIDI

__all__ = ["chosen_option", "option_value"]

# What a browser changes between the page and the form it posts: a line break (CR becomes LF in
# the page, every LF CRLF in the form), a NUL (U+FFFD in the page), a bidirectional control (the
# page writes it as its escape, `\u202e`), a lone surrogate (U+FFFD).
_CHANGED = re.compile("[\r\n\x00\ud800-\udfff]")

# A JSON string begins with one: an id that does too is sent as one, so a value never means two.
_QUOTE = '"'


def option_value(option_id: str) -> str:
    """The value that names option `option_id` in a form: the id itself, or its JSON string
    (printable ASCII, sent back unchanged) where the browser would change the id on the way
    or it begins with a quote."""
    if option_id.startswith(_QUOTE) or _CHANGED.search(option_id) or BIDI.search(option_id):
        return json.dumps(option_id)
    return option_id


def chosen_option(value: str) -> str:
    """The option id a form's `value` names (see `option_value`): a JSON string's text, or the
    value as it is (an id the request lacks is refused naming its options, as any is)."""
    if value.startswith(_QUOTE):
        try:
            decoded = json.loads(value)
        except ValueError:
            return value
        if isinstance(decoded, str):
            return decoded
    return value
