"""The commands, options and environment variables the docs show are the ones the CLI takes, and
every one it takes is documented.
"""

from __future__ import annotations

import re
from typing import Any

from ._docs import DOCS, ROOT, blocks


def test_every_command_and_option_the_docs_show_is_one_the_cli_takes() -> None:
    """Each `signoff ...` line of a shell block in the README and docs/ names a command the CLI
    has and only options that command takes, so a command copied from the docs is not refused."""
    import typer.main

    from signoff.cli import app

    root: Any = typer.main.get_command(app)
    shown = 0
    for doc in ["README.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md")))]:
        text = "\n".join(b for lang in ("bash", "sh", "") for b in blocks(doc, lang))
        for line in re.sub(r"\\\n\s*", " ", text).splitlines():
            words = line.strip().removeprefix("$ ").split()
            if words[:1] != ["signoff"]:
                continue
            command = root
            for word in words[1:]:
                if word not in getattr(command, "commands", {}):
                    break
                command = command.commands[word]
            assert not hasattr(command, "commands"), (doc, line)  # a command, not a group
            taken = {o for p in command.params for o in p.opts}
            used = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", line.split("#")[0]))
            assert used <= taken, (doc, line, sorted(used - taken))
            shown += 1
    assert shown >= 10, shown


def test_the_readme_shows_every_command() -> None:
    """Every command of the CLI is shown in a shell block of the README, where an operator
    looks for what the command line can do (`signoff sessions` was only named in passing)."""
    import typer.main

    from signoff.cli import app

    root: Any = typer.main.get_command(app)
    every = {
        " ".join([name, *([sub] if sub else [])])
        for name, command in root.commands.items()
        for sub in getattr(command, "commands", None) or [""]
    }
    text = "\n".join(b for lang in ("bash", "sh", "") for b in blocks("README.md", lang))
    shown: set[str] = set()
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["signoff"]:
            shown |= {" ".join(words[1:2]), " ".join(words[1:3])}
    assert every - shown == set()
    # and in the status's list of what exists today, which left out cancel, delete and prune
    listed = re.search(r"- The command line: (.*?)\.\n", (ROOT / "README.md").read_text(), re.S)
    assert listed is not None
    assert set(re.findall(r"`([^`]+)`", listed.group(1))) == every


def test_every_command_and_option_the_docs_name_in_their_text_exists() -> None:
    """The `signoff ...` code spans of the README's and docs/' prose name commands with options
    those commands take, and every `--option` the text names is one some command takes (but
    `--quick`, a benchmark's, and `--strict`, mypy's)."""
    import typer.main

    from signoff.cli import app

    root: Any = typer.main.get_command(app)
    every: set[str] = set()

    def collect(command: Any) -> None:
        every.update(o for p in command.params for o in p.opts)
        for sub in getattr(command, "commands", {}).values():
            collect(sub)

    collect(root)
    spans = 0
    for doc in DOCS:
        prose = re.sub(r"```.*?```", "", (ROOT / doc).read_text(), flags=re.S)
        for span in re.findall(r"`(signoff [^`]*)`", prose):
            command = root
            for word in span.split()[1:]:
                if word not in getattr(command, "commands", {}):
                    break
                command = command.commands[word]
            assert not hasattr(command, "commands"), (doc, span)
            used = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", span))
            assert used <= {o for p in command.params for o in p.opts}, (doc, span)
            spans += 1
        named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", prose)) - {"--quick", "--strict"}
        assert named <= every, (doc, sorted(named - every))
    assert spans >= 20, spans


def test_every_environment_variable_the_cli_reads_is_documented() -> None:
    """An option the CLI also reads from the environment (`SIGNOFF_STORE`, `SIGNOFF_TOKENS`)
    is named in the README or docs/, so a variable left exported is not a surprise."""
    import typer.main

    from signoff.cli import app

    docs = "".join((ROOT / doc).read_text() for doc in DOCS)
    read: set[str] = set()

    def collect(command: Any) -> None:
        read.update(p.envvar for p in command.params if isinstance(p.envvar, str))
        for sub in getattr(command, "commands", {}).values():
            collect(sub)

    collect(typer.main.get_command(app))
    assert len(read) >= 5 and {v for v in read if f"`{v}`" not in docs} == set()


def test_every_option_of_the_cli_is_documented() -> None:
    """Each `--option` some command takes is named in the README or docs/, so the docs are
    where a user finds what the command line can do, not only `--help`."""
    import typer.main

    from signoff.cli import app

    docs = "".join((ROOT / doc).read_text() for doc in DOCS)
    missing: list[str] = []

    def collect(command: Any, path: str) -> None:
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("--") and not re.search(rf"{opt}(?![\w-])", docs):
                    missing.append(f"{path} {opt}")
        for name, sub in getattr(command, "commands", {}).items():
            collect(sub, f"{path} {name}")

    collect(typer.main.get_command(app), "signoff")
    assert missing == []


def test_every_install_hint_in_the_help_shows_as_written() -> None:
    """An option's or command's help that names an extra (`pip install 'signoff[metrics]'`)
    shows it whole in `--help`: rich takes `[metrics]` for markup and printed `pip install
    'signoff'`, a hint that installs nothing the option needs. `serve` and `--slack-channel`,
    which need an extra a bare `pip install signoff` lacks, say which."""
    import typer.main
    from typer.testing import CliRunner

    from signoff.cli import app

    hinted: list[tuple[list[str], str]] = []

    def collect(command: Any, path: list[str]) -> None:
        for param in [*command.params, command]:
            text = " ".join(str(getattr(param, "help", "") or "").split())
            hinted.extend((path, h) for h in re.findall(r"signoff\\?\[\w+\]", text))
        for name, sub in getattr(command, "commands", {}).items():
            collect(sub, [*path, name])

    collect(typer.main.get_command(app), [])
    assert {(tuple(path), hint.replace("\\", "")) for path, hint in hinted} >= {
        (("serve",), "signoff[server]"),
        (("serve",), "signoff[slack]"),
        (("serve",), "signoff[metrics]"),
    }, hinted
    for path, hint in hinted:
        shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "1000"})
        assert shown.exit_code == 0, shown.output
        assert hint.replace("\\", "") in shown.output, (path, hint)


def test_every_number_an_option_takes_has_its_range_in_the_help() -> None:
    """The README says each command's help lists its options with their defaults, and the
    numbers with their range: every option taking a number (`N`, `SECONDS`, `BYTES`, `PORT`,
    `SEQ`) says which it takes (`events --after` did not)."""
    import typer.main

    from signoff.cli import app

    numeric = {"N", "SECONDS", "BYTES", "PORT", "SEQ"}
    found: list[str] = []
    missing: list[str] = []

    def collect(command: Any, path: str) -> None:
        for param in command.params:
            if getattr(param, "metavar", None) in numeric:
                found.append(f"{path} {param.opts[0]}")
                text = " ".join(str(param.help or "").split())
                if not re.search(r"\bfrom -?[\d.]+\b|a positive number", text):
                    missing.append(f"{path} {param.opts[0]}")
        for name, sub in getattr(command, "commands", {}).items():
            collect(sub, f"{path} {name}")

    collect(typer.main.get_command(app), "signoff")
    assert len(found) >= 10 and missing == []
