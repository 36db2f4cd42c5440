"""The SQLite store's URL: its path percent-decoded as any URL's is, so that a directory holding
`#` or `?` can be named; a real query or fragment refused; and a file an undecoded `%XX` named
before not hidden by a new store made at the decoded path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import signoff as so
from signoff.stores import SQLiteStore
from signoff.stores.sqlite._url import path_from_url, sqlite_url
from signoff.testing import reply, scripted_agent, sqlite_runtime

from ._cli import invoke, park


def test_sqlite_runtime_takes_a_directory_holding_a_hash_or_question_mark(
    tmp_path: Path,
) -> None:
    """`sqlite_runtime` put the directory into the URL as it was, and a `#` or `?` in it was
    then refused as a fragment or query: no test could run under such a directory."""
    for name in ("proj#2", "what?", "100%", "a b"):
        where = tmp_path / name
        where.mkdir()
        with sqlite_runtime(where, scripted_agent("a", [reply("hi")])) as rt:
            assert rt.generate_sync("a", prompt="x").text == "hi"
            assert isinstance(rt.store, SQLiteStore)
            assert rt.store.path == str(where / "state.db")
        assert (where / "state.db").is_file()
    assert sorted(os.listdir(tmp_path)) == ["100%", "a b", "proj#2", "what?"]


@pytest.mark.parametrize(
    ("written", "meant"),
    [
        ("proj%232/state.db", "proj#2/state.db"),
        ("what%3F/state.db", "what?/state.db"),
        ("a%20b/state.db", "a b/state.db"),
        ("50%25/state.db", "50%/state.db"),
        ("caf%C3%A9/state.db", "café/state.db"),
    ],
)
def test_a_percent_encoded_path_opens_the_file_it_decodes_to(
    tmp_path: Path, written: str, meant: str
) -> None:
    """`%23` opened a directory literally named `proj%232`: a different file from the one
    meant, silently. The path is percent-decoded now, as a URL's path is."""
    url = f"sqlite:///{tmp_path}/{written}"
    with so.Runtime([scripted_agent("a", [reply("hi")])], store=url) as rt:
        assert rt.generate_sync("a", prompt="x").text == "hi"
    assert (tmp_path / meant).is_file()
    assert os.listdir(tmp_path) == [meant.split("/")[0]]


@pytest.mark.parametrize("path", ["data/100%.db", "50%zz.db", "a%2.db", "%"])
def test_a_percent_sign_not_starting_an_escape_stays_as_it_is(path: str) -> None:
    """A store whose path holds a `%` not followed by two hex digits keeps its file."""
    assert SQLiteStore(f"sqlite:///{path}").path == path


def test_a_byte_that_is_no_utf8_is_the_byte() -> None:
    assert os.fsencode(SQLiteStore("sqlite:////x/%FF.db").path) == b"/x/\xff.db"


@pytest.mark.parametrize("url", ["sqlite:///a%00.db", "sqlite:///%2E%00"])
def test_an_encoded_nul_is_refused(url: str) -> None:
    with pytest.raises(so.StoreError, match="a NUL or lone surrogate"):
        SQLiteStore(url)


@pytest.mark.parametrize("url", ["sqlite:////x/proj#2/state.db", "sqlite:///state.db?mode=ro"])
def test_a_query_or_fragment_is_refused_saying_how_to_write_one_in_a_path(url: str) -> None:
    with pytest.raises(so.StoreError) as caught:
        so.Runtime([], store=url)
    assert "takes no query or fragment" in str(caught.value)
    assert "%3F or %23" in str(caught.value)


@pytest.mark.parametrize(
    "path",
    ["/x/proj#2/state.db", "rel/what?.db", "/x/100%.db", "/x/50%25.db", "/x/a b/c:d~e.db"],
)
def test_sqlite_url_is_read_back_as_the_path_it_was_made_from(path: str) -> None:
    url = sqlite_url(path)
    assert url.startswith("sqlite:////" if path.startswith("/") else "sqlite:///")
    assert "#" not in url and "?" not in url
    assert path_from_url(url) == path


def test_a_file_an_undecoded_url_named_is_refused_not_hidden(tmp_path: Path) -> None:
    """A store made at `a%20b.db` before URLs were decoded is not silently replaced by a new
    empty one at `a b.db`: the URL is refused, saying how to name the old file, and nothing
    is created."""
    old = tmp_path / "a%20b.db"
    session_id, _ = park(f"sqlite:///{tmp_path}/a%2520b.db")  # the old file, `%` encoded
    assert old.is_file()
    url = f"sqlite:///{tmp_path}/a%20b.db"
    with pytest.raises(so.StoreError) as caught:
        so.Runtime([], store=url).state_sync(session_id)
    assert "write each '%' in its path as %25" in str(caught.value)
    assert str(old) in str(caught.value)
    result = invoke("sessions", "--store", url)
    assert result.exit_code == 1, result.output
    assert "write each '%' in its path as %25" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["a%20b.db"]


def test_the_cli_opens_a_store_under_a_directory_holding_a_hash(tmp_path: Path) -> None:
    where = tmp_path / "proj#2"
    url = sqlite_url(where / "state.db")
    session_id, request_id = park(url)
    result = invoke("pending", "--store", url, "--json")
    assert result.exit_code == 0, result.output
    assert request_id in result.stdout and session_id in result.stdout
    assert sorted(os.listdir(tmp_path)) == ["proj#2"]
