"""Every numeric option of every `signoff` command refuses nan, infinity, a negative, a huge or
a non-number value by name and range, with its usage and exit status 2, and takes its bounds."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.core import TyperArgument, TyperOption
from typer.testing import CliRunner

from signoff.cli import app
from signoff.cli._numbers import Bounded, number_of_seconds, seconds, whole

from .test_cli_commands import ALL, params

RANGES = {
    ("pending", "--limit"): "a whole number from 1 to 100000",
    ("sessions", "--limit"): "a whole number from 1 to 100000",
    ("pending", "--offset"): "a whole number from 0 to 9223372036854775807",
    ("sessions", "--offset"): "a whole number from 0 to 9223372036854775807",
    ("events", "--after"): "a whole number from 0 to 9223372036854775807",
    ("serve", "--port"): "a whole number from 0 to 65535",
    ("serve", "--workers"): "a whole number from 0 to 100000",
    ("serve", "--sign-in-lifetime"): "must be a positive, finite number of seconds",
    ("serve", "--lease-ttl"): "a number of seconds from 0.1 to 86400",
    ("serve", "--max-streams"): "a whole number from 1 to 100000",
    ("serve", "--max-body-size"): "a whole number from 1 to 1073741824",
    ("serve", "--max-connections"): "a whole number from 1 to 1000000",
    ("serve", "--keep-alive-timeout"): "a number of seconds from 0.1 to 3600",
    ("worker", "--concurrency"): "a whole number from 1 to 100000",
    ("worker", "--lease-ttl"): "a number of seconds from 0.1 to 86400",
    ("worker", "--idle-wait"): "a number of seconds from 0.01 to 60",
    ("worker", "--sweep-every"): "a number of seconds from 0.1 to 3600",
    ("prune", "--older-than"): "is not a duration such as 90d, 12h, 30m, 3600s or 3600 (seconds)",
    ("prune", "--limit"): "a whole number from 1 to 1000000",
}
"""What the refusal of each numeric option says of its range."""

ARGUMENTS = {"MODULE:RUNTIME": "no_such_module:runtime", "REQUEST_ID": "req_1", "SESSION_ID": "s"}

BAD = ["nan", "NaN", "inf", "-inf", "-1", "1e400", "9" * 30, "12h", "", "1.5.0"]


def numeric_options() -> list[tuple[tuple[str, ...], TyperOption]]:
    found = []
    for path, command in ALL:
        for param in params(command):
            if isinstance(param, TyperOption) and param.type_descriptor.annotation in (int, float):
                found.append((path, param))
    return found


def test_every_numeric_option_is_known_with_its_range() -> None:
    """A numeric option added later must say its range here, so the test below covers it."""
    assert {(" ".join(path), p.opts[0]) for path, p in numeric_options()} == set(RANGES)


def invoke_with(path: tuple[str, ...], option: str, value: str) -> str:
    command = dict(ALL)[path]
    args = [
        ARGUMENTS[p.display_name_raw]
        for p in params(command)
        if isinstance(p, TyperArgument) and p.required
    ]
    result = CliRunner().invoke(app, [*path, *args, f"{option}={value}"])
    assert result.exit_code == 2, (option, value, result.output)
    assert result.stderr.startswith("Usage: "), result.stderr
    assert "Traceback" not in result.output
    return " ".join(ln.strip("│ ") for ln in result.stderr.splitlines() if ln.startswith("│"))


@pytest.mark.parametrize(("command", "option"), sorted(RANGES))
@pytest.mark.parametrize("value", BAD)
def test_a_numeric_option_out_of_range_names_itself_and_its_range(
    command: str, option: str, value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if option == "--sign-in-lifetime" and value == "9" * 30:
        return  # 1e30 seconds is a positive, finite lifetime: not a mistake
    if option == "--older-than" and value in ("9" * 30, "12h"):
        return  # durations it takes (1e30 seconds: nothing is that old)
    monkeypatch.chdir(tmp_path)  # a store created by mistake would land here, not in the tree
    message = " ".join(invoke_with(tuple(command.split()), option, value).split())
    assert option in message, message
    if value in ("12h", "", "1.5.0") and option == "--sign-in-lifetime":
        assert f"{value!r} is not a number of seconds" in message, message
    else:
        assert RANGES[command, option] in message, message
    assert "less than or equal" not in message and "greater than" not in message, message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("parser", "good", "bad"),
    [
        (whole(1, 10), [("1", 1), (" 10 ", 10), (5, 5)], ["0", "11", "1.0", "1e1", True, "x"]),
        (
            seconds(0.1, 3600),
            [("0.1", 0.1), ("3600", 3600.0), ("1e3", 1000.0), (5.0, 5.0), (2, 2.0)],
            ["0.09", "3600.5", "nan", "inf", "-inf", "1e400", 10**400, True, "5s"],
        ),
    ],
)
def test_bounds_are_inclusive_and_nothing_else_passes(
    parser: Bounded, good: list[tuple[object, float]], bad: list[object]
) -> None:
    for value, number in good:
        assert parser(value) == number and type(parser(value)) is parser.kind, value
    for value in bad:
        with pytest.raises(typer.BadParameter, match=parser.range):
            parser(value)


def test_a_lifetime_is_any_number_for_the_command_to_check() -> None:
    assert number_of_seconds("nan") != number_of_seconds("nan")  # nan: the command refuses it
    assert number_of_seconds("900") == 900.0 == number_of_seconds(900)
    with pytest.raises(typer.BadParameter, match="'12h' is not a number of seconds"):
        number_of_seconds("12h")
