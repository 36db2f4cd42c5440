"""The keys and header values a model sends: one read from a file with its line break is sent
without it, one no header can carry is refused by name when the model is made, never shown, and
an error showing one escaped (httpx's `Illegal header value b'Bearer sk-...\\n'`) hides it
too: the whole key was recorded in every turn's failure."""

from __future__ import annotations

import json
import traceback
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

import signoff as so

from ._models import request, support_agent
from .fakes.llm import API_KEY, FakeLLM, anthropic_message, openai_completion

FLAVORS = ["openai", "anthropic"]
SECRET = "sk-proj-SECRETSECRETSECRET1234"


def reply(flavor: str) -> dict[str, Any]:
    return openai_completion("ok") if flavor == "openai" else anthropic_message("ok")


def made(flavor: str, fake: FakeLLM, how: str, key: str) -> Any:
    """A model of `flavor` at `fake`, its key given as `how` says."""
    kind = so.models.OpenAIChat if flavor == "openai" else so.models.Anthropic
    prefix = "OPENAI" if flavor == "openai" else "ANTHROPIC"
    env = {f"{prefix}_BASE_URL": fake.base_url}
    if how == "api_key":
        return kind("m", base_url=fake.base_url, api_key=key, max_retries=0)
    if how == "token":  # Anthropic's auth token
        return kind("m", env={**env, "ANTHROPIC_AUTH_TOKEN": key}, max_retries=0)
    if how == "env":
        return kind("m", env={**env, f"{prefix}_API_KEY": key}, max_retries=0)
    return so.models.from_env(env={**env, f"{prefix}_API_KEY": key})


HOWS = [
    ("openai", "api_key"),
    ("openai", "env"),
    ("openai", "from_env"),
    ("anthropic", "api_key"),
    ("anthropic", "env"),
    ("anthropic", "token"),
    ("anthropic", "from_env"),
]


@pytest.mark.parametrize(("flavor", "how"), HOWS)
@pytest.mark.parametrize("ending", ["\n", "\r\n", " "])
async def test_a_key_read_with_its_line_break_is_sent_without_it(
    flavor: str, how: str, ending: str, tmp_path: Path
) -> None:
    """A key from a secret file (`OPENAI_API_KEY=$(cat key)` keeps none, a mounted file read
    whole does) ends in a line break: httpx refused the header in every call, and its error
    showed the whole key, recorded in `turn.failed` ("cannot connect")."""
    with FakeLLM(flavor) as fake:
        fake.queue(reply(flavor))
        model = made(flavor, fake, how, API_KEY + ending)
        store = f"sqlite:///{tmp_path}/s.db"
        async with model, so.Runtime([support_agent(model)], store=store) as rt:
            r = await rt.generate("support", prompt="hi")
            assert (r.status, r.text, r.error) == ("completed", "ok", None)
        [got] = fake.received
    assert f"Bearer {API_KEY}" in got.headers.values() or got.headers.get("x-api-key") == API_KEY


@pytest.mark.parametrize(("flavor", "how"), HOWS)
@pytest.mark.parametrize("inside", ["\n", "\r", "\t", "\x00", "\x7f", "\u00e9"])
def test_a_key_no_header_can_carry_is_refused_by_name(flavor: str, how: str, inside: str) -> None:
    """A line break (or another control character, or a non-ASCII one) within the key: every
    call failed, the key shown whole. It is refused when the model is made, naming the
    setting, never showing the key."""
    key = SECRET[:10] + inside + SECRET[10:]
    named = {
        "api_key": "api_key",
        "token": "ANTHROPIC_AUTH_TOKEN",
        "env": f"{flavor.upper()}_API_KEY",
        "from_env": f"{flavor.upper()}_API_KEY",
    }[how]
    with FakeLLM(flavor) as fake, pytest.raises(so.UsageError) as info:
        made(flavor, fake, how, key)
    message = str(info.value)
    assert f"{named} holds a control or non-ASCII character" in message, message
    assert SECRET[:10] not in message and SECRET[10:] not in message


def test_a_blank_key_from_the_environment_counts_as_unset() -> None:
    """`ANTHROPIC_API_KEY` of a line break picked Anthropic over the OpenAI key also set."""
    env = {"ANTHROPIC_API_KEY": "\n", "OPENAI_API_KEY": API_KEY}
    assert isinstance(so.models.from_env(env=env), so.models.OpenAIChat)
    with pytest.raises(so.UsageError, match="no API key; set OPENAI_API_KEY"):
        so.models.OpenAIChat("m", env={"OPENAI_API_KEY": "\r\n"})


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("value", [SECRET + "\n", " " + SECRET, SECRET[:9] + "\r\n" + SECRET[9:]])
def test_an_extra_header_no_header_can_carry_is_refused_by_name(flavor: str, value: str) -> None:
    """`params={"extra_headers": ...}` alike: a gateway key read with its line break failed
    every call, the whole key in the error."""
    kind = so.models.OpenAIChat if flavor == "openai" else so.models.Anthropic
    params = {"extra_headers": {"x-portkey-api-key": value}}
    with pytest.raises(so.UsageError) as info:
        kind("m", base_url="http://localhost:9/v1", api_key=API_KEY, params=params)
    message = str(info.value)
    assert "extra_headers 'x-portkey-api-key' has whitespace around its value" in message
    assert SECRET[:9] not in message and SECRET[9:] not in message


@pytest.mark.parametrize("flavor", FLAVORS)
async def test_a_key_the_http_client_shows_escaped_is_hidden(flavor: str, tmp_path: Path) -> None:
    """A `client=` passed in is used as it is, its key too: httpx's refusal shows the header
    as a bytes repr, `b'Bearer sk-...\\n'`, where the key as it is (with a real line break) was
    never found to be hidden. Nor is the failure a connection's."""
    with FakeLLM(flavor) as fake:
        if flavor == "openai":
            client: Any = openai.AsyncOpenAI(
                api_key=SECRET + "\n", base_url=fake.base_url, max_retries=0
            )
            model: Any = so.models.OpenAIChat("m", client=client)
        else:
            client = anthropic.AsyncAnthropic(
                api_key=SECRET + "\r\n", base_url=fake.base_url, max_retries=0
            )
            model = so.models.Anthropic("m", client=client)
        store = f"sqlite:///{tmp_path}/s.db"
        async with so.Runtime([support_agent(model)], store=store) as rt:
            r = await rt.generate("support", prompt="hi")
            assert r.status == "failed" and r.error is not None
            logged = json.dumps([e.data for e in await rt.store.read_events(r.session_id)])
        with pytest.raises(so.ModelError) as info:
            await model.complete(request())
        await client.close()
    assert "the request could not be sent (LocalProtocolError" in r.error["message"]
    assert "Illegal header value b'Bearer [redacted]'" in r.error["message"], r.error
    assert "SECRETSECRET" not in logged
    assert "SECRETSECRET" not in "".join(traceback.format_exception(info.value))


def test_each_escaped_form_of_a_secret_is_hidden() -> None:
    from signoff.models._provider_errors import hidden, secret_forms

    secret = 'sk-ant-"quoted"\t\u00e9\r\n'
    forms = secret_forms([secret, "short", None])
    for shown in (
        secret,
        repr(secret.encode()),
        repr(secret),
        secret.encode("unicode_escape").decode(),
        json.dumps(secret),
        json.dumps(secret, ensure_ascii=False),
        secret.strip(),
    ):
        assert hidden(f"got {shown}!", forms) in (
            "got [redacted]!",
            "got b'[redacted]'!",
            "got '[redacted]'!",
            'got "[redacted]"!',
        ), shown
    assert "short" not in forms  # too short to be a credential worth hiding
    assert forms == sorted(forms, key=len, reverse=True)


def test_only_the_key_of_the_provider_used_is_checked() -> None:
    """A key no header can carry is refused only where it would be sent: a bad
    `ANTHROPIC_API_KEY` beside `SIGNOFF_MODEL=openai:...` was refused, though never used."""
    env = {
        "SIGNOFF_MODEL": "openai:gpt-4o",
        "OPENAI_API_KEY": API_KEY,
        "ANTHROPIC_API_KEY": "sk-ant-\u00e9x",
    }
    assert isinstance(so.models.from_env(env=env), so.models.OpenAIChat)
    with pytest.raises(so.UsageError, match="ANTHROPIC_API_KEY"):
        so.models.from_env(env={**env, "SIGNOFF_MODEL": "anthropic:claude-haiku-4-5"})


def test_a_credential_in_extra_body_is_hidden_as_one_in_a_header_is() -> None:
    """A gateway key sent in the body (`params={"extra_body": {...}}`) was stored whole when the
    gateway's 400 quoted the body back; it is among the secrets hidden, nested too."""
    from signoff.models._provider_errors import client_secrets

    body = {"gateway_key": "gw-SECRET-IN-EXTRA-BODY-9876", "meta": [{"auth": "tok-NESTED-12345"}]}
    found = client_secrets(object(), {"extra_body": body, "temperature": 0})
    assert "gw-SECRET-IN-EXTRA-BODY-9876" in found and "tok-NESTED-12345" in found
    assert client_secrets(object(), {"extra_body": {"user": "alice-the-user"}}) == []
    shapes = {"api_keys": ["sk-live-0123456789"], "authorization": {"value": "sk-live-abcdefgh"}}
    found = client_secrets(object(), {"extra_body": shapes})
    assert "sk-live-0123456789" in found and "sk-live-abcdefgh" in found


def test_a_proxy_urls_password_is_not_shown_when_it_is_refused() -> None:
    """The refusal of an unusable proxy URL repeated it whole, its password too (the HTTP
    library's own part of the message leaves it out)."""
    env = {"HTTPS_PROXY": "ftp://user:SECRETPASSWORD@proxy:8080", "OPENAI_API_KEY": API_KEY}
    with pytest.raises(so.UsageError, match="HTTPS_PROXY") as refused:
        so.models.OpenAIChat("gpt-4o", env=env)
    assert "SECRETPASSWORD" not in str(refused.value)
    token = {"HTTPS_PROXY": "ftp://sk-live-tokenABCDEF@proxy:8080", "OPENAI_API_KEY": API_KEY}
    with pytest.raises(so.UsageError, match="HTTPS_PROXY") as refused:
        so.models.OpenAIChat("gpt-4o", env=token)
    assert "sk-live-tokenABCDEF" not in str(refused.value)
