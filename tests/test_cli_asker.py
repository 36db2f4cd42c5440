"""What `signoff chat` and `signoff approve` say after the default rule refused an answer
(`_asker`): the `--as` that answers as the asker when it names them, and for a scheduled turn's
request, which the app asked and no `--as` can name, that only the application can settle it;
and that their hints naming a MODULE:RUNTIME name no store but one typed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

import signoff as so
from signoff.cli import app

from ._cli import (
    TARGET,
    agent,
    invoke,
    log,
    park,
    park_flaky,
    refunds_run,
    runtime_module,
    url,
)

__all__ = ["url"]  # the fixture, used by name

WIDE = {"COLUMNS": "300"}


def scheduled(url: str) -> tuple[str, str]:
    """A scheduled turn parked on an approval the app asked: (session id, request id)."""
    rt = so.Runtime([agent], store=url)
    try:
        r = rt.schedule_sync("support", "Refund order 1042")
        assert r.status == "waiting" and r.pending[0].requested_by == so.APP_PRINCIPAL
        return r.session_id, r.pending[0].id
    finally:
        rt.close_sync()


def test_chat_names_the_as_that_answers_as_the_asker(url: str) -> None:
    """Chat said "answer as the asker with --as AUTHENTICATOR:ID" whoever asked; it names the
    asker as `--as` takes them, as `signoff approve` does, in a command that runs as printed
    (it said `signoff chat ... --session`, with no runtime or store)."""
    session_id, _ = park(url, auth=so.Principal(authenticator="web", principal_id="alice"))
    args = ["chat", TARGET, "--session", session_id, "--store", url]
    refused = CliRunner().invoke(app, args, input="y\n", env=WIDE)
    assert refused.exit_code == 1, refused.output
    assert "NotAllowed" in refused.output
    hint = shlex.join([*args, "--as", "web:alice"])
    assert f"by default only the asker may answer; as them, run signoff {hint}\n" in refused.output
    assert "AUTHENTICATOR:ID" not in refused.output
    done = CliRunner().invoke(app, shlex.split(hint), input="y\n", env=WIDE)
    assert done.exit_code == 0, done.output
    assert refunds_run(log(url, session_id)) == 1


def test_chat_tells_no_as_for_a_request_the_app_asked(url: str) -> None:
    """A scheduled turn's request is the app's: chat told the person to answer with `--as`,
    which names a user, never the app (`--as app:signoff:app` is refused too). It says only the
    application can settle it."""
    session_id, _ = scheduled(url)
    args = ["chat", TARGET, "--session", session_id, "--store", url]
    for extra in ([], ["--as", "app:signoff:app"]):
        refused = CliRunner().invoke(app, [*args, *extra], input="y\n", env=WIDE)
        assert refused.exit_code == 1, refused.output
        assert "was asked by app:signoff:app (runtime)" in refused.output
        assert "answer as the asker" not in refused.output
        assert "run signoff" not in refused.output
        assert (
            "only the application can settle it, from Python with principal=so.APP_PRINCIPAL"
        ) in refused.output
    assert refunds_run(log(url, session_id)) == 0


def test_approve_says_only_the_app_settles_a_request_the_app_asked(url: str) -> None:
    session_id, request_id = scheduled(url)
    refused = invoke("approve", request_id, TARGET, "--store", url)
    assert refused.exit_code == 1, refused.output
    assert "NotAllowed" in refused.stderr and "run signoff" not in refused.stderr
    assert "only the application can settle it" in refused.stderr
    assert refunds_run(log(url, session_id)) == 0


def test_approve_with_a_runtime_hints_it_with_the_store(url: str) -> None:
    """`approve ID MODULE:RUNTIME --store URL` refused to another than the asker said to run
    `signoff approve ID --as web:alice`: without the runtime it only records the decision, and
    without the store (run where it was) it finds none. It names both, and runs as printed."""
    session_id, request_id = park(url, auth=so.Principal(authenticator="web", principal_id="alice"))
    refused = invoke("approve", request_id, TARGET, "--store", url, "--as", "web:carol")
    assert refused.exit_code == 1, refused.output
    _, hint = refused.stderr.split("; as them, run signoff ")
    assert shlex.split(hint) == [
        *("approve", request_id, TARGET, "--store", url, "--as", "web:alice")
    ]
    done = invoke(*shlex.split(hint))
    assert done.exit_code == 0, done.output
    assert refunds_run(log(url, session_id)) == 1


def test_a_runtime_with_its_own_store_is_hinted_without_one(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`approve ID MODULE:RUNTIME` with no `--store` names no store in its hint: the runtime
    opens its own, and its URL as shown (a password masked) would not open it (a PostgreSQL
    store with a password failed authentication run as printed). It runs as printed."""
    target = runtime_module(tmp_path, monkeypatch, "own_store", repr(url))
    session_id, request_id = park(url, auth=so.Principal(authenticator="web", principal_id="alice"))
    refused = invoke("approve", request_id, target, "--as", "web:carol")
    assert refused.exit_code == 1, refused.output
    _, hint = refused.stderr.split("; as them, run signoff ")
    assert shlex.split(hint) == ["approve", request_id, target, "--as", "web:alice"]
    done = invoke(*shlex.split(hint))
    assert done.exit_code == 0, done.output
    assert refunds_run(log(url, session_id)) == 1


def test_chat_hints_a_response_policys_runtime_without_its_own_store(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request left pending at chat's prompt whose tool has a response policy is answered
    with the runtime, which opens its own store: the hint named that store too, its password as
    `***`, so that run as printed it failed (PostgreSQL refused the password)."""
    target = runtime_module(tmp_path, monkeypatch, "own_store", repr(url), agent="deployer")
    chat = CliRunner().invoke(app, ["chat", target], input="Deploy prod\n", env=WIDE)
    assert chat.exit_code == 0, chat.output
    later = re.search(r"answer it later with `signoff (approve [^`]+)`", chat.output)
    assert later, chat.output
    with so.Runtime([], store=url) as rt:
        [request] = rt.pending_sync()
    assert shlex.split(later.group(1)) == ["approve", request.id, target]
    # as printed, but by another than the asker, whom the policy lets approve
    done = invoke(*shlex.split(later.group(1)), "--as", "web:bob")
    assert done.exit_code == 0, done.output
    assert "deployer: Deployed." in done.stdout


def test_a_failed_turns_resume_command_names_no_runtimes_own_store(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`approve ID MODULE:RUNTIME`, whose turn then fails, says the `signoff chat` that resumes
    it: with the runtime, which opens its own store, and so without that store's URL (a
    password masked in it, it failed as printed). It resumes the turn as printed."""
    target = runtime_module(tmp_path, monkeypatch, "own_store", repr(url), agent="flaky")
    parked = park_flaky(url)
    result = invoke("approve", parked.pending[0].id, target)
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        "error: the turn failed: ModelError: upstream timed out; it resumes with signoff chat "
        f"{target} --session {parked.session_id}\n"
    )
    _, resume = result.stderr.split("; it resumes with signoff ")
    resumed = CliRunner().invoke(app, shlex.split(resume), input="")
    assert resumed.exit_code == 0, resumed.output
    assert "flaky: Refunded 180.00." in resumed.output


def test_no_as_is_hinted_for_an_asker_one_line_cannot_show(url: str) -> None:
    """An asker whose id holds a line break or a control character was hinted `--as` as the
    one-line error showed it (`'web:al ice'`, `'web:al\\x1bice'`), which names someone else:
    the refusal names no `--as` then."""
    for principal_id in ("al\nice", "al\x1bice"):
        asker = so.Principal(authenticator="web", principal_id=principal_id)
        _, request_id = park(url, auth=asker)
        refused = invoke("deny", request_id, "--as", "web:carol", "--store", url)
        assert refused.exit_code == 1, refused.output
        assert refused.stderr.endswith("carol may not settle it\n"), refused.stderr
        assert "run signoff" not in refused.stderr
