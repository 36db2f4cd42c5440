"""What a user installs: the wheel's files and metadata, the sdist, and the install hints.

The wheel and sdist are built offline with hatchling's PEP 517 hooks (the `dev` extra has it),
as pip would build them; a missing extra is simulated by blocking its modules in a subprocess.
"""

from __future__ import annotations

import email
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "signoff"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]


def _build(kind: str, source: Path, out: Path) -> Path:
    """Build a wheel or sdist of `source` into `out` with the build backend, offline."""
    out.mkdir(parents=True, exist_ok=True)
    code = f"import sys, hatchling.build as b; print(b.build_{kind}(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return out / done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[zipfile.ZipFile]:
    path = _build("wheel", ROOT, tmp_path_factory.mktemp("wheel"))
    with zipfile.ZipFile(path) as zf:
        yield zf


def _metadata(zf: zipfile.ZipFile) -> Message:
    return email.message_from_string(zf.read(f"signoff-{VERSION}.dist-info/METADATA").decode())


def _source_files() -> set[str]:
    return {
        f"signoff/{p.relative_to(SRC).as_posix()}"
        for p in SRC.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_the_wheel_holds_the_package_with_its_data_and_nothing_else(wheel) -> None:
    names = set(wheel.namelist())
    dist_info = f"signoff-{VERSION}.dist-info/"
    assert {n for n in names if not n.startswith(dist_info)} == _source_files()
    for needed in (
        "signoff/py.typed",
        "signoff/server/static/app.css",
        "signoff/server/static/app.js",
        "signoff/server/static/ages.js",
        "signoff/server/static/aim.js",
        "signoff/server/static/drafts.js",
        "signoff/server/static/forms.js",
        "signoff/server/templates/base.html",
        "signoff/server/templates/login.html",
    ):
        assert needed in names, needed
    assert len([n for n in names if n.startswith("signoff/server/templates/")]) == len(
        list((SRC / "server" / "templates").glob("*.html"))
    )
    stray = [n for n in names if n.split("/")[0] in {"tests", "bench", "examples", "scripts"}]
    assert stray == [] and not any("fixtures" in n for n in names)


def test_the_wheel_metadata_names_version_license_readme_and_entry_point(wheel) -> None:
    import signoff

    meta = _metadata(wheel)
    assert (
        (meta["Name"], meta["Version"]) == ("signoff", VERSION) == ("signoff", signoff.__version__)
    )
    assert meta["Requires-Python"] == ">=3.11"
    assert meta["License-Expression"] == "MIT"
    # MIT asks for its notice to travel with every copy: the wheel carries the file
    assert meta["License-File"] == "LICENSE"
    licence = wheel.read(f"signoff-{VERSION}.dist-info/licenses/LICENSE").decode()
    assert licence == (ROOT / "LICENSE").read_text() and "MIT License" in licence
    assert meta["Description-Content-Type"] == "text/markdown"
    assert str(meta.get_payload()).strip() == (ROOT / "README.md").read_text().strip()
    extras = set(meta.get_all("Provides-Extra") or [])
    assert {"postgres", "openai", "anthropic", "slack", "server", "webhooks", "otel"} <= extras
    entry_points = wheel.read(f"signoff-{VERSION}.dist-info/entry_points.txt").decode()
    assert "[console_scripts]\nsignoff = signoff.cli:main" in entry_points
    from signoff.cli import main

    assert callable(main)


def test_the_sdist_builds_the_same_wheel(wheel, tmp_path: Path) -> None:
    sdist = _build("sdist", ROOT, tmp_path / "sdist")
    with tarfile.open(sdist) as tf:
        tf.extractall(tmp_path / "unpacked", filter="data")
    again = _build("wheel", tmp_path / "unpacked" / f"signoff-{VERSION}", tmp_path / "again")
    with zipfile.ZipFile(again) as rebuilt:
        assert sorted(rebuilt.namelist()) == sorted(wheel.namelist())
        changed = [n for n in wheel.namelist() if wheel.read(n) != rebuilt.read(n)]
        assert changed == []


# Lowest versions the code is known to work with; a lower floor lets pip keep an older one.
FLOORS = {
    # typer < 0.12.4 rejects `str | None` options, and 0.12.4 to 0.15.3 break with click >= 8.2
    # (which they allow): `signoff --help` fails either way.
    "typer": "0.16",
    # `thinking=`, which `so.models.Anthropic` passes through, arrived in anthropic 0.47.
    "anthropic": "0.47",
}
# The tests' own needs: `AsyncConnection.notifies(timeout=...)` arrived in psycopg 3.2 (the
# store itself works with 3.1).
DEV_FLOORS = {"psycopg": "3.2"}


def _floors(declared: list[str]) -> dict[str, list[Version]]:
    floors: dict[str, list[Version]] = {}
    for line in declared:
        req = Requirement(line)
        mins = [Version(s.version) for s in req.specifier if s.operator == ">="]
        floors.setdefault(req.name, []).extend(mins)
    return floors


def test_dependency_floors_are_versions_the_code_works_with() -> None:
    declared = [*PYPROJECT["project"]["dependencies"]]
    for deps in PYPROJECT["project"]["optional-dependencies"].values():
        declared += deps
    floors = _floors(declared)
    for name, least in FLOORS.items():
        assert floors.get(name), f"{name} has no lower bound"
        assert min(floors[name]) >= Version(least), (name, floors[name])
    dev = _floors(PYPROJECT["project"]["optional-dependencies"]["dev"])
    for name, least in DEV_FLOORS.items():
        assert dev.get(name) and min(dev[name]) >= Version(least), (name, dev.get(name))


def _blocked(modules: str, code: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter in which importing any of `modules` fails."""
    prelude = f"import sys\nsys.modules.update(dict.fromkeys({modules.split(',')!r}))\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("modules", "code", "hint"),
    [
        ("fastapi", "import signoff.server", "signoff[server]"),
        ("uvicorn", "from signoff.server import create_app", "signoff[server]"),
        ("python_multipart,multipart", "import signoff.server", "signoff[server]"),
        ("jinja2", "import signoff.server", "signoff[server]"),
        ("httpx", "import signoff as so; so.Client", "signoff[server]"),
        (
            "opentelemetry",
            "import signoff as so; so.Runtime([], tracer_provider=1)",
            "signoff[otel]",
        ),
        (
            "psycopg,psycopg_pool",
            "import signoff as so; so.Runtime([], store='postgresql://u@h/db').open_sync()",
            "signoff[postgres]",
        ),
        # the store's own package, imported directly, and one package of the extra missing
        ("psycopg", "import signoff.stores.postgres", "signoff[postgres]"),
        ("psycopg_pool", "from signoff.stores.postgres import PostgresStore", "signoff[postgres]"),
        ("openai", "import signoff as so; so.models.OpenAIChat('m', api_key='k')", "[openai]"),
        ("anthropic", "import signoff as so; so.models.Anthropic('m', api_key='k')", "[anthropic]"),
        ("slack_sdk", "import signoff.channels.slack", "signoff[slack]"),
        ("aiohttp", "import signoff.channels.slack", "signoff[slack]"),
        (
            "httpx",
            "from signoff.channels import WebhookChannel; WebhookChannel('http://h/x', secret='s')",
            "signoff[webhooks]",
        ),
        (
            "prometheus_client",
            "import signoff as so; from signoff.server import create_app\n"
            "create_app(so.Runtime([]), dev=True, metrics=True)",
            "signoff[metrics]",
        ),
    ],
)
def test_a_missing_extra_fails_with_its_install_hint(modules: str, code: str, hint: str) -> None:
    done = _blocked(modules, code)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("signoff._exceptions.UsageError: ") and hint in last, done.stderr


@pytest.mark.parametrize(
    ("found", "refused"),
    [("0.36.3", True), ("0.43.9", True), ("0.44.0rc1", False), ("0.45rc1", False), ("1.0", False)],
)
def test_a_starlette_too_old_for_the_dashboard_s_forms_fails_with_its_install_hint(
    found: str, refused: bool
) -> None:
    """`fastapi>=0.110` alone lets Starlette 0.36 in, whose `Request.form` takes no
    `max_part_size`: every dashboard form would fail with a TypeError, a 500. The server says
    so on import instead, naming the version found and the upgrade line; a release from 0.44 on,
    pre-releases too, is taken."""
    code = (
        "import importlib.metadata as m\n"
        "real = m.version\n"
        f"m.version = lambda name: {found!r} if name == 'starlette' else real(name)\n"
        "import signoff.server\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if not refused:
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "signoff._exceptions.UsageError: the signoff server needs Starlette 0.44 or later, not "
        f"{found}: pip install --upgrade 'signoff[server]'"
    ), done.stderr


@pytest.mark.parametrize(
    ("modules", "flags", "hint"),
    [
        ("fastapi", [], "signoff[server]"),
        ("uvicorn", [], "signoff[server]"),
        ("prometheus_client", ["--metrics"], "signoff[metrics]"),
        (
            "slack_sdk",
            ["--slack-channel", "C1", "--slack-token", "x", "--slack-signing-secret", "s"],
            "signoff[slack]",
        ),
    ],
)
def test_serve_without_an_extra_is_one_line_with_the_hint(
    modules: str, flags: list[str], hint: str, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path}/s.db"
    argv = ["signoff", "serve", "examples.support:runtime", "--store", store, *flags]
    code = f"from signoff.cli import main\nsys.argv = {argv!r}\nmain()"
    done = _blocked(modules, code, cwd=ROOT)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: UsageError: ") and hint in done.stderr
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("modules", "argv", "hint"),
    [
        ("psycopg", ["sessions", "--store", "postgresql://u@127.0.0.1:1/db"], "signoff[postgres]"),
        ("psycopg_pool", ["db", "upgrade", "--store", "postgresql://u@h/db"], "signoff[postgres]"),
        # a runtime whose model needs a provider's SDK: the example agent with a key set
        ("openai", ["chat", "examples.support:runtime"], "signoff[openai]"),
        ("anthropic", ["worker", "examples.support:runtime"], "signoff[anthropic]"),
    ],
)
def test_a_command_needing_a_missing_extra_is_one_line_with_the_hint(
    modules: str, argv: list[str], hint: str, tmp_path: Path
) -> None:
    """What a bare `pip install signoff` lacks, named by any command that needs it: a
    PostgreSQL store, or the SDK of the provider a runtime's model uses."""
    key = "ANTHROPIC_API_KEY" if modules == "anthropic" else "OPENAI_API_KEY"
    chosen = ("SIGNOFF_MODEL", "OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY")
    if argv[0] in ("chat", "worker"):
        argv = [*argv, "--store", f"sqlite:///{tmp_path}/s.db"]
    code = (
        f"import os\nfor name in {chosen!r}:\n    os.environ.pop(name, None)\n"
        f"os.environ[{key!r}] = 'k'\n"
        f"from signoff.cli import main\nsys.argv = {['signoff', *argv]!r}\nmain()"
    )
    done = _blocked(modules, code, cwd=ROOT)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: UsageError: ") and hint in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_wheel_metadata_classifies_the_package_truthfully(wheel) -> None:
    """Trove classifiers a package index shows: each a known one; the Python versions those
    `requires-python` admits, from its floor up; typed (the wheel has `py.typed`); no licence
    classifier beside the SPDX `License-Expression` (PEP 639 forbids both)."""
    import trove_classifiers

    meta = _metadata(wheel)
    classifiers = meta.get_all("Classifier") or []
    assert classifiers, "no classifiers"
    assert [c for c in classifiers if c not in trove_classifiers.classifiers] == []
    floor = Version(meta["Requires-Python"].removeprefix(">="))
    versions = sorted(
        Version(c.rsplit(" :: ", 1)[1])
        for c in classifiers
        if c.startswith("Programming Language :: Python :: 3.")
    )
    assert versions and versions[0] == floor, versions
    assert [v.minor for v in versions] == list(range(floor.minor, floor.minor + len(versions)))
    assert "Programming Language :: Python :: 3 :: Only" in classifiers
    assert "Typing :: Typed" in classifiers and "signoff/py.typed" in wheel.namelist()
    assert not any(c.startswith("License ::") for c in classifiers)
    # FastAPI is the server extra's framework; the runtime is asyncio and pydantic 2
    assert {"Framework :: FastAPI", "Framework :: AsyncIO", "Framework :: Pydantic :: 2"} <= set(
        classifiers
    )


def test_the_readme_links_nothing_a_package_index_cannot_resolve() -> None:
    """The README is the long description on PyPI, which resolves no path relative to the
    repository: an image or link to `docs/...` there is broken. Only absolute URLs and anchors."""
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)", text) + re.findall(r"<img[^>]+src=\"([^\"]+)", text)
    relative = [t for t in targets if not t.startswith(("https://", "http://", "#", "mailto:"))]
    assert relative == [], relative


def test_import_signoff_is_quiet_and_loads_no_extra_nor_the_cli() -> None:
    """`import signoff` under `-W error` warns about nothing and imports none of the extras'
    packages, nor the command line's Typer and Rich: a runtime in a script or web app pays for
    what it uses only (the HTTP client, a provider, PostgreSQL load on first use)."""
    heavy = [
        *("fastapi", "starlette", "uvicorn", "jinja2", "multipart", "python_multipart", "httpx"),
        *("psycopg", "psycopg_pool", "openai", "anthropic", "slack_sdk", "aiohttp"),
        *("typer", "click", "rich", "opentelemetry"),
    ]
    code = (
        "import sys, signoff\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.strip() == "[]"
