"""An id given empty on the command line (`signoff approve "$REQ"` with the variable unset) is a
usage error, exit 2, found before any store is opened, as an empty filter is: it was looked up,
and said to be an unknown request or session (exit 1), as if the store had lost it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._cli import TARGET, invoke, refused_usage


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["approve", ""], "REQUEST_ID"),
        (["deny", "", TARGET], "REQUEST_ID"),
        (["answer", "", "--text", "x"], "REQUEST_ID"),
        (["events", ""], "SESSION_ID"),
        (["events", "", "--follow"], "SESSION_ID"),
        (["chat", TARGET, "--session", ""], "--session"),
        (["chat", TARGET, "--agent", ""], "--agent"),
    ],
    ids=[
        "approve",
        "deny-runtime",
        "answer",
        "events",
        "events-follow",
        "chat-session",
        "chat-agent",
    ],
)
def test_an_empty_id_is_refused_as_a_usage_error(
    tmp_path: Path, argv: list[str], what: str
) -> None:
    store = tmp_path / "none.db"
    result = invoke(*argv, "--store", f"sqlite:///{store}")
    message = refused_usage(result)
    assert f"{what} is empty" in message, message
    assert not store.exists()  # refused before any store was opened, or made
