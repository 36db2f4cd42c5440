"""A provider's failure as both adapters record it: the credentials a call sends, through the
client or through `params=` (`extra_headers`, `extra_query`), never in the turn's error, not even
a part of one that the cut of a long error text split."""

from __future__ import annotations

import base64
import json
import traceback
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import anthropic
import openai
import pytest

import signoff as so

from ._models import request, support_agent
from .fakes.llm import API_KEY, FakeLLM, Received, Reply

FLAVORS = ["openai", "anthropic"]

GATEWAY_KEY = "pk-live-gateway-7d41c0a9"
GATEWAY_TOKEN = "gw-bearer-token-93be51f0"


def provider_model(flavor: str, fake: FakeLLM, **options: Any) -> Any:
    kind = so.models.OpenAIChat if flavor == "openai" else so.models.Anthropic
    return kind("m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, **options)


def echo_headers(got: Received) -> Reply:
    """A gateway refusing the call, quoting the credential headers it was sent."""
    portkey = got.headers.get("x-portkey-api-key")
    bearer = got.headers.get("cf-aig-authorization", "").rpartition(" ")[2]
    message = f"invalid x-portkey-api-key {portkey}; token {bearer} unknown"
    return Reply({"error": {"type": "authentication_error", "message": message}}, 401)


@pytest.mark.parametrize("flavor", FLAVORS)
async def test_a_credential_sent_in_params_extra_headers_is_not_recorded(
    flavor: str, tmp_path: Path
) -> None:
    """A gateway key given as `params={"extra_headers": ...}` (Portkey's, Cloudflare AI
    Gateway's) and echoed by the gateway was stored whole in the turn's failure: only the
    client's own headers were hidden."""
    headers = {
        "x-portkey-api-key": GATEWAY_KEY,
        "cf-aig-authorization": f"Bearer {GATEWAY_TOKEN}",
        "x-trace-id": "trace-0123456789",  # not named as a credential: shown
    }
    with FakeLLM(flavor) as fake:
        fake.queue(echo_headers)
        model = provider_model(flavor, fake, params={"extra_headers": headers})
        store = f"sqlite:///{tmp_path}/s.db"
        async with model, so.Runtime([support_agent(model)], store=store) as rt:
            r = await rt.generate("support", prompt="hi")
            assert (r.status, r.retryable) == ("failed", True)
            assert r.error is not None
            assert (
                "invalid x-portkey-api-key [redacted]; token [redacted] unknown"
                in r.error["message"]
            )
            logged = json.dumps([e.data for e in await rt.store.read_events(r.session_id)])
            state = await rt.state(r.session_id)
        assert fake.received[0].headers["x-portkey-api-key"] == GATEWAY_KEY  # it was sent
    assert state.turn is not None and GATEWAY_KEY not in json.dumps(state.turn.error)
    assert GATEWAY_KEY not in logged and GATEWAY_TOKEN not in logged


@pytest.mark.parametrize("flavor", FLAVORS)
async def test_the_sdk_error_under_it_does_not_show_the_extra_headers_either(flavor: str) -> None:
    with FakeLLM(flavor) as fake:
        fake.queue(echo_headers)
        params = {"extra_headers": {"x-portkey-api-key": GATEWAY_KEY}}
        async with provider_model(flavor, fake, params=params) as model:
            with pytest.raises(so.ModelError) as info:
                await model.complete(request())
    shown = "".join(traceback.format_exception(info.value))
    assert info.value.__cause__ is not None
    assert "invalid x-portkey-api-key [redacted]" in shown and GATEWAY_KEY not in shown


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("given", ["params", "client"])
@pytest.mark.parametrize("key", [GATEWAY_KEY, "Zm9v+YmFy/c2VjcmV0LXNpZw=="])
async def test_a_credential_sent_as_a_query_parameter_is_not_recorded(
    flavor: str, given: str, key: str
) -> None:
    """A key sent as a query parameter (`?key=`), by `params={"extra_query": ...}` or a
    client's `default_query`, is one too: the fake refuses the path, query and all, as a
    server that quotes the URL it could not route does. One holding characters a URL encodes
    (a base64 signature's `+`, `/`, `=`) is echoed encoded, and hidden so too."""
    query = {"key": key, "api-version": "2024-10-21"}
    with FakeLLM(flavor) as fake:
        if given == "params":
            model = provider_model(flavor, fake, params={"extra_query": query})
        elif flavor == "openai":
            client: Any = openai.AsyncOpenAI(
                base_url=fake.base_url, api_key=API_KEY, default_query=query, max_retries=0
            )
            model = so.models.OpenAIChat("m", client=client)
        else:
            client = anthropic.AsyncAnthropic(
                base_url=fake.base_url, api_key=API_KEY, default_query=query, max_retries=0
            )
            model = so.models.Anthropic("m", client=client)
        async with model:
            with pytest.raises(so.ModelError) as info:
                await model.complete(request())
        if given == "client":
            await client.close()
    message = str(info.value)
    assert "HTTP 404" in message and "key=[redacted]" in message
    assert "api-version=2024-10-21" in message and key not in message
    assert "YmFy" not in message


class LoginGateway(FakeLLM):
    """A gateway reading its own login (basic authentication) in place of an API key."""

    def _authorized(self, got: Received) -> bool:
        return True


def echo_login(got: Received) -> Reply:
    """A gateway refusing the login of the URL it was sent: the basic-auth header, and the
    user name and password it decoded from it."""
    header = got.headers.get("authorization", "")
    basic = header.removeprefix("Basic ")
    login = base64.b64decode(basic).decode() if basic != header else "none"
    message = f"authorization {header!r} refused: login {login!r} unknown"
    return Reply({"error": {"type": "authentication_error", "message": message}}, 401)


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize(
    "login", ["tok-8f3a91c2e7", "tok-8f3a91c2e7:", "gateway-user:pw-4d2c7b9e", "tok%2F8f3a91c2e7"]
)
async def test_the_login_in_the_base_url_is_not_recorded(flavor: str, login: str) -> None:
    """The user name and password of the base URL (`https://TOKEN@gateway`) are sent too, as
    basic authentication: a gateway that echoed them had them recorded in `turn.failed`."""
    with LoginGateway(flavor) as fake:
        fake.queue(echo_login)
        base = fake.base_url.replace("://", f"://{login}@", 1)
        kind = so.models.OpenAIChat if flavor == "openai" else so.models.Anthropic
        async with kind("m", base_url=base, api_key=API_KEY, max_retries=0) as model:
            with pytest.raises(so.ModelError, match="HTTP 401") as info:
                await model.complete(request())
        sent = fake.received[0].headers.get("authorization", "")
    shown = "".join(traceback.format_exception(info.value))
    user, _, password = login.partition(":")
    # A user name beside a password is no secret (the repr shows it), one alone often a token.
    told = f"{unquote(user)}:[redacted]" if password else "[redacted]"
    assert f"authorization 'Basic [redacted]' refused: login '{told}" in shown, shown
    secrets = [sent.removeprefix("Basic ")] + ([password] if password else [user, unquote(user)])
    assert all(secret not in shown for secret in secrets), shown
    assert "8f3a91c2e7" not in shown and "4d2c7b9e" not in shown


# Where the cut of a long error text falls: 2,000 characters in, 9 of the key's kept before it.
_KEPT = 9


def _straddling(prefix: int) -> str:
    """Words then the key, so that the key begins `_KEPT` characters before character
    `prefix + _KEPT` of the text."""
    return "x" * (prefix - len(" bad key ")) + " bad key " + API_KEY + " was rejected"


def _json_error(got: Received) -> Reply:
    return Reply({"error": {"message": _straddling(2000 - _KEPT)}}, 400)


def _error_in_a_200(got: Received) -> Reply:
    return Reply({"error": {"message": _straddling(2000 - _KEPT)}})


def _page(got: Received) -> Reply:
    # A proxy's page of 32 KB of markup: its words are read from its first 32,000 characters.
    page = "<p>" + "<i></i>" * 4568 + "<br>bad key " + API_KEY + " was rejected</p>"
    assert page.index(API_KEY) == 32000 - _KEPT
    return Reply(page.encode(), 502, headers={"Content-Type": "text/html"})


def _text_200(got: Received) -> Reply:
    # A 200 that is not JSON: its first 200 characters are shown.
    text = "x" * (200 - _KEPT - len(" bad key ")) + " bad key " + API_KEY
    return Reply(text.encode(), headers={"Content-Type": "text/plain"})


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("reply", [_json_error, _error_in_a_200, _page, _text_200])
async def test_no_part_of_a_key_the_cut_of_an_error_splits_is_recorded(
    flavor: str, reply: Any
) -> None:
    """The error text was cut before the key in it was hidden, so `... bad key sk-fake-t
    [cut]` kept its first characters: each cut now comes after the hiding."""
    with FakeLLM(flavor) as fake:
        fake.queue(reply)
        async with provider_model(flavor, fake) as model:
            with pytest.raises(so.ModelError) as info:
                await model.complete(request())
    shown = "".join(traceback.format_exception(info.value))
    assert "bad key [reda" in shown
    assert API_KEY[:_KEPT] not in shown and API_KEY[:4] not in shown
