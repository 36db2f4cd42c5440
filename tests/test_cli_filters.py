"""The listing commands' filters given empty (`--agent "$AGENT"` with the variable unset): refused
as a misuse, where they matched nothing and said the queue was empty, with exit status 0."""

from __future__ import annotations

import pytest

from tests._cli import invoke, park, refused_usage, url

__all__ = ["url"]  # the fixture, used by name


@pytest.mark.parametrize(
    "args",
    [
        ["pending", "--agent", ""],
        ["pending", "--tool", ""],
        ["pending", "--session", ""],
        ["pending", "--json", "--agent", ""],
        ["sessions", "--agent", ""],
        ["sessions", "--json", "--agent", ""],
    ],
    ids=" ".join,
)
def test_an_empty_filter_is_refused_not_an_empty_queue(args: list[str], url: str) -> None:
    """No agent, tool or session has an empty name, so the filter could match nothing: a
    script counting `pending --json --agent "$AGENT"` saw `[]` and raised no alarm."""
    park(url)
    message = refused_usage(invoke(*args, "--store", url))
    option = args[-2]
    assert f"{option} takes" in message and "not ''" in message, message


def test_a_filter_that_matches_nothing_still_lists_nothing(url: str) -> None:
    """A name that is no agent's is not refused: the listing is empty, as before."""
    park(url)
    result = invoke("pending", "--json", "--agent", "nobody", "--store", url)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "[]"
