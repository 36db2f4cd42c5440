"""A model's base URL as its repr and its errors show it: a password in it (a gateway's basic
auth) is left out, since a model's error is recorded in the session's log, which anyone who may
read the session reads."""

from __future__ import annotations

import socket
from typing import Any

import pytest

import signoff as so
from signoff.models._provider import shown_url

from ._models import request
from .fakes.llm import API_KEY


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


MODELS: dict[str, tuple[Any, str]] = {
    "openai": (so.models.OpenAIChat, "/v1"),
    "anthropic": (so.models.Anthropic, ""),
}


@pytest.mark.parametrize("name", sorted(MODELS))
async def test_a_password_in_the_base_url_is_not_shown_nor_recorded(name: str) -> None:
    make, path = MODELS[name]
    base = f"http://bob:hunter2@127.0.0.1:{_closed_port()}{path}"
    async with make("m", base_url=base, api_key=API_KEY, max_retries=0) as m:
        assert "hunter2" not in repr(m) and "bob:***@127.0.0.1" in repr(m)
        with pytest.raises(so.ModelError, match="cannot connect") as info:
            await m.complete(request())
    assert "hunter2" not in str(info.value) and "bob:***@127.0.0.1" in str(info.value)


@pytest.mark.parametrize("name", sorted(MODELS))
async def test_a_user_name_beside_a_password_is_shown_not_blanked(name: str) -> None:
    """Only the password is hidden: a user name of 8 characters or more that is also the host
    (`localhost`) blanked the host in every error, `http://[redacted]:***@[redacted]:port`."""
    make, path = MODELS[name]
    base = f"http://localhost:pw-4d2c7b9e@localhost:{_closed_port()}{path}"
    async with make("m", base_url=base, api_key=API_KEY, max_retries=0) as m:
        with pytest.raises(so.ModelError, match="cannot connect") as info:
            await m.complete(request())
    assert "pw-4d2c7b9e" not in str(info.value)
    assert "http://localhost:***@localhost:" in str(info.value), str(info.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://localhost:11434/v1", "http://localhost:11434/v1"),
        ("https://gw.example/v1?api-version=1", "https://gw.example/v1?api-version=1"),
        ("https://bob:s3cret@gw.example:8443/v1", "https://bob:***@gw.example:8443/v1"),
        ("https://:s3cret@gw.example/v1", "https://:***@gw.example/v1"),
        # a user name with no password is the credential (`https://TOKEN@gateway`)
        ("https://bob@gw.example/v1", "https://***@gw.example/v1"),
        ("https://s3cret:@gw.example/v1", "https://***@gw.example/v1"),
        ("https://s3%2Fcret@[::1]:8443/v1?key=1", "https://***@[::1]:8443/v1?key=***"),
        ("https://@gw.example/v1", "https://@gw.example/v1"),
    ],
)
def test_shown_url_leaves_out_the_password_or_a_lone_user_name(url: str, shown: str) -> None:
    assert shown_url(url) == shown


@pytest.mark.parametrize("name", sorted(MODELS))
async def test_a_token_as_the_base_urls_user_name_is_not_shown_nor_recorded(name: str) -> None:
    """`https://TOKEN@gateway` (no password): the token was in the model's repr and in every
    error recorded in `turn.failed`, where only a password was left out."""
    make, path = MODELS[name]
    base = f"http://tok-hunter2-8f3a@127.0.0.1:{_closed_port()}{path}"
    async with make("m", base_url=base, api_key=API_KEY, max_retries=0) as m:
        assert "hunter2" not in repr(m) and "http://***@127.0.0.1" in repr(m)
        with pytest.raises(so.ModelError, match="cannot connect") as info:
            await m.complete(request())
    assert "hunter2" not in str(info.value) and "http://***@127.0.0.1" in str(info.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://gw.example/v1?key=s3cret", "https://gw.example/v1?key=***"),
        (
            "https://gw.example/v1?api-version=2&api_key=s3cret",
            "https://gw.example/v1?api-version=2&api_key=***",
        ),
        ("https://gw.example/v1?sv=1&sig=s3cret&x=", "https://gw.example/v1?sv=1&sig=***&x="),
        ("https://bob:pw@gw.example/v1?Token=s3cret", "https://bob:***@gw.example/v1?Token=***"),
    ],
)
def test_shown_url_leaves_out_a_credential_in_the_query(url: str, shown: str) -> None:
    """A gateway keyed by its URL (`?key=`, an Azure `sig=`) had the key shown in the model's
    repr and recorded with each error naming its endpoint; other parameters stay."""
    assert shown_url(url) == shown


@pytest.mark.parametrize("name", sorted(MODELS))
async def test_a_key_in_the_base_urls_query_is_not_shown_nor_recorded(name: str) -> None:
    make, path = MODELS[name]
    base = f"http://127.0.0.1:{_closed_port()}{path}?key=hunter2hunter2"
    async with make("m", base_url=base, api_key=API_KEY, max_retries=0) as m:
        assert "hunter2" not in repr(m) and "key=***" in repr(m)
        with pytest.raises(so.ModelError, match="cannot connect") as info:
            await m.complete(request())
    assert "hunter2" not in str(info.value), str(info.value)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("localhost:11434/v1", "'localhost:11434/v1'"),
        ("ftp://gw.example/v1", "'ftp://gw.example/v1'"),
        ("https:///v1", "'https:///v1'"),
        ("http://bob:hunter2@[::1", "'[::1'"),
        (11434, "a value of type int"),
    ],
    ids=["no-scheme", "ftp", "no-host", "malformed", "number"],
)
def test_a_base_url_no_request_could_reach_is_refused_when_the_model_is_made(
    name: str, url: Any, shown: str
) -> None:
    """It was taken, and every turn then failed with a model error (`UnsupportedProtocol:
    Request URL is missing an 'http://' or 'https://' protocol`); a password is not shown."""
    make, _ = MODELS[name]
    with pytest.raises(so.UsageError, match="base_url must be an http:// or https:// URL") as e:
        make("m", base_url=url, api_key=API_KEY)
    assert str(e.value).endswith(f", not {shown}") and "hunter2" not in str(e.value)
    with pytest.raises(so.UsageError, match="api_key must be text, not int"):
        make("m", base_url="http://localhost:11434/v1", api_key=5)


@pytest.mark.parametrize(
    ("name", "variable"), [("openai", "OPENAI_BASE_URL"), ("anthropic", "ANTHROPIC_BASE_URL")]
)
def test_a_base_url_from_the_environment_is_checked_alike(name: str, variable: str) -> None:
    make, _ = MODELS[name]
    with pytest.raises(so.UsageError, match=r"base_url must be .*, not 'localhost:8080'"):
        make("m", env={variable: "localhost:8080"}, api_key=API_KEY)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://localhost:11434/v1\r", "it holds '\\r', and a URL holds no control or invisible"),
        ("http://localhost:11434/v1\n", "it holds '\\n'"),
        ("http://local\thost:11434/v1", "it holds '\\t'"),
        (" http://localhost:11434/v1", "it has spaces around it"),
        ("http://localhost:11434/v1\u200b", "it holds '\\u200b'"),
        ("http://localhost:114340/v1", "its port is not a number from 0 to 65535"),
        ("http://localhost:11434abc/v1", "its port is not a number from 0 to 65535"),
        ("http://localhost:-1/v1", "its port is not a number from 0 to 65535"),
        ("http://\u0660/v1", "InvalidURL: Invalid IDNA hostname"),
    ],
    ids=[
        "cr",
        "lf",
        "tab",
        "space",
        "zero-width",
        "port-range",
        "port-letters",
        "port-sign",
        "idna",
    ],
)
def test_a_base_url_the_http_client_refuses_is_refused_when_the_model_is_made(
    name: str, url: str, why: str
) -> None:
    """`urlsplit` drops a tab or line break (an env file written on Windows) and reads no port
    until asked: each passed, and every turn then failed with an `InvalidURL`, "readonly
    attribute" or "unhandled errors in a TaskGroup" from the SDK."""
    make, _ = MODELS[name]
    with pytest.raises(so.UsageError, match="base_url must be an http:// or https:// URL") as e:
        make("m", base_url=url, api_key=API_KEY)
    assert why in str(e.value), str(e.value)
    variable = f"{name.upper()}_BASE_URL"
    with pytest.raises(so.UsageError, match="base_url must be"):
        make("m", env={variable: url}, api_key=API_KEY)
    with pytest.raises(so.UsageError, match="base_url must be"):
        so.models.from_env(env={variable: url, f"{name.upper()}_API_KEY": API_KEY})


@pytest.mark.parametrize("name", sorted(MODELS))
async def test_an_sdk_client_that_cannot_be_made_fails_the_call_as_a_model_error(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK client is made at the first call: its own refusal (a bare `InvalidURL` from its
    constructor) failed each turn unnamed, as no `ModelError`, the key unhidden."""
    make, path = MODELS[name]
    sdk = __import__(name)
    kind = "AsyncOpenAI" if name == "openai" else "AsyncAnthropic"

    def refuse(**options: Any) -> Any:
        raise ValueError(f"cannot make a client with key {options['api_key']}")

    monkeypatch.setattr(sdk, kind, refuse)
    async with make("m", base_url=f"http://localhost:9{path}", api_key=API_KEY) as m:
        with pytest.raises(so.ModelError) as info:
            await m.complete(request())
    message = str(info.value)
    assert message.startswith(f"{type(m).__name__}('m', base_url='http://localhost:9{path}')")
    assert "the SDK client could not be made: ValueError: cannot make a client with key" in message
    assert API_KEY not in message and "[redacted]" in message


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_space_inside_a_base_urls_path_is_taken_as_the_http_client_takes_it(name: str) -> None:
    """The HTTP library sends a space in a path percent-encoded: such a base URL worked, and
    was refused by the check of line breaks a moment; a space around it is still refused."""
    make, _ = MODELS[name]
    make("m", base_url="http://gw.example/my team/v1", api_key=API_KEY)
    with pytest.raises(so.UsageError, match="it has spaces around it"):
        make("m", base_url="http://gw.example/v1 ", api_key=API_KEY)
    with pytest.raises(so.UsageError, match="its host holds a space"):
        make("m", base_url="http://local host:8000/v1", api_key=API_KEY)
