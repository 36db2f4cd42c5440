"""A model made with `env=` takes its proxies and CA bundle from that mapping, never from the
process environment, through the real SDKs against loopback servers and a loopback proxy."""

from __future__ import annotations

import os
import socket
import ssl
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import certifi
import httpx2
import pytest
from httpx2._utils import get_environment_proxies

import signoff as so
from signoff.models import ModelRequest
from signoff.models._http_env import proxy_routes

from ._loopback import LoopbackServer, read_head
from .fakes.llm import API_KEY, FakeLLM, anthropic_message, openai_completion

FLAVORS = ["openai", "anthropic"]


class ForwardProxy(LoopbackServer):
    """A loopback HTTP proxy: each connection's request goes on, in origin form and with
    `Connection: close`, to the server its absolute URL names; the answer is relayed back."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def handle(self, conn: socket.socket) -> None:
        read = read_head(conn)
        if read is None:
            return
        head, rest = read
        line, *headers = head.decode("latin-1").split("\r\n")
        self.requests.append(line)
        method, target, version = line.split(" ")
        url = urlsplit(target)
        kept = [h for h in headers if not h.lower().startswith(("connection:", "proxy-"))]
        origin = url.path + (f"?{url.query}" if url.query else "")
        out = "\r\n".join([f"{method} {origin} {version}", *kept, "Connection: close"])
        with socket.create_connection((url.hostname or "", url.port or 80)) as upstream:
            upstream.sendall(out.encode("latin-1") + b"\r\n\r\n" + rest)
            threading.Thread(target=_pipe, args=(conn, upstream), daemon=True).start()
            _pipe(upstream, conn)


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass


def _dead_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as s:
        return int(s.getsockname()[1])


@pytest.fixture(autouse=True)
def no_process_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever proxies the machine running the tests has, each test sets its own."""
    for name in list(os.environ):
        if name.lower().endswith("_proxy") or name in ("SSL_CERT_FILE", "SSL_CERT_DIR"):
            monkeypatch.delenv(name)


@pytest.fixture(params=FLAVORS)
def fake(request: pytest.FixtureRequest) -> Iterator[FakeLLM]:
    with FakeLLM(request.param) as server:
        yield server


def _env(fake: FakeLLM, **more: str) -> dict[str, str]:
    prefix = "OPENAI" if fake.flavor == "openai" else "ANTHROPIC"
    name = "qwen3:8b" if fake.flavor == "openai" else "claude-haiku-4-5"
    return {
        "SIGNOFF_MODEL": f"{fake.flavor}:{name}",
        f"{prefix}_BASE_URL": fake.base_url,
        f"{prefix}_API_KEY": API_KEY,
        **more,
    }


def _reply(fake: FakeLLM, text: str) -> dict[str, object]:
    return openai_completion(text) if fake.flavor == "openai" else anthropic_message(text)


async def _complete(model: so.models.Model) -> str:
    request = ModelRequest(
        session_id="ses_test",
        agent="support",
        instructions="",
        messages=[so.UserMessage(text="hello")],
        tools=[],
        response_index=0,
    )
    try:
        return (await model.complete(request)).text
    finally:
        await model.aclose()  # type: ignore[attr-defined]


def _from_env(env: dict[str, str], **kwargs: Any) -> so.models.Model:
    model = so.models.from_env(env=env)
    if kwargs:  # the same model, with a setting from_env has no argument for
        assert isinstance(model, so.models.OpenAIChat | so.models.Anthropic)
        model = type(model)(model.model, env=env, max_retries=0, **kwargs)
    return model


# -- the process's settings do not apply --------------------------------------------------------


async def test_the_process_proxies_and_ca_bundle_do_not_apply_to_a_model_made_with_env(
    fake: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = f"http://127.0.0.1:{_dead_port()}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, dead)
    fake.queue(_reply(fake, "straight to the server"))
    model = _from_env(_env(fake))
    # Made (per event loop) after the process named a CA bundle that does not exist.
    monkeypatch.setenv("SSL_CERT_FILE", "/nonexistent/ca.pem")
    assert await _complete(model) == "straight to the server"
    assert len(fake.received) == 1


async def test_without_env_the_process_proxies_still_apply(
    fake: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The contrast: the same proxy setting does reach a model configured by arguments.
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{_dead_port()}")
    kind = so.models.OpenAIChat if fake.flavor == "openai" else so.models.Anthropic
    model = kind("m", base_url=fake.base_url, api_key=API_KEY, max_retries=0)
    with pytest.raises(so.ModelError):
        await _complete(model)
    assert fake.received == []


# -- the mapping's settings do ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"])
async def test_a_proxy_the_env_names_carries_the_call(fake: FakeLLM, name: str) -> None:
    with ForwardProxy() as proxy:
        fake.queue(_reply(fake, "through the proxy"))
        assert await _complete(_from_env(_env(fake, **{name: proxy.url}))) == "through the proxy"
    [line] = proxy.requests
    assert line.startswith(f"POST {fake.base_url}/")
    assert len(fake.received) == 1


async def test_the_lower_case_name_wins_over_the_upper_case_one(fake: FakeLLM) -> None:
    dead = f"http://127.0.0.1:{_dead_port()}"
    with ForwardProxy() as proxy:
        fake.queue(_reply(fake, "through the proxy"))
        env = _env(fake, HTTP_PROXY=dead, http_proxy=proxy.url)
        assert await _complete(_from_env(env)) == "through the proxy"
    assert len(proxy.requests) == 1


@pytest.mark.parametrize("no_proxy", ["127.0.0.1", "*", "localhost,127.0.0.0/8"])
async def test_no_proxy_in_the_env_sends_the_call_directly(fake: FakeLLM, no_proxy: str) -> None:
    with ForwardProxy() as proxy:
        fake.queue(_reply(fake, "direct"))
        env = _env(fake, HTTP_PROXY=proxy.url, NO_PROXY=no_proxy)
        assert await _complete(_from_env(env)) == "direct"
    assert proxy.requests == []


async def test_the_reply_cap_still_applies_through_the_proxy(fake: FakeLLM) -> None:
    with ForwardProxy() as proxy:
        fake.queue(_reply(fake, "x" * 4096))
        model = _from_env(_env(fake, HTTP_PROXY=proxy.url), max_reply_bytes=1024)
        with pytest.raises(so.ModelError, match="over max_reply_bytes"):
            await _complete(model)
    assert len(proxy.requests) == 1


async def test_a_ca_bundle_the_env_names_is_the_one_trusted(fake: FakeLLM) -> None:
    model = _from_env(_env(fake, SSL_CERT_FILE=certifi.where()))
    http_env = model._http_env  # type: ignore[attr-defined]
    assert isinstance(http_env.verify, ssl.SSLContext)
    assert http_env.verify.cert_store_stats()["x509_ca"] > 100
    http = model._clients.get()._client  # type: ignore[attr-defined]
    assert http.trust_env is False
    assert http._transport._pool._ssl_context is http_env.verify  # the pool the calls go through
    await model.aclose()  # type: ignore[attr-defined]


@pytest.mark.parametrize("flavor", FLAVORS)
def test_a_ca_bundle_that_cannot_be_loaded_is_a_usage_error(flavor: str, tmp_path) -> None:
    key = "OPENAI_API_KEY" if flavor == "openai" else "ANTHROPIC_API_KEY"
    env = {key: API_KEY, "SSL_CERT_FILE": str(tmp_path / "missing.pem")}
    with pytest.raises(so.UsageError, match="SSL_CERT_FILE=.*cannot be loaded"):
        so.models.from_env(env=env)
    (tmp_path / "garbage.pem").write_text("not a certificate")
    env["SSL_CERT_FILE"] = str(tmp_path / "garbage.pem")
    with pytest.raises(so.UsageError, match="SSL_CERT_FILE=.*cannot be loaded"):
        so.models.from_env(env=env)


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("proxy", ["ftp://proxy.example:21", "http://[::1"])
def test_a_proxy_that_cannot_be_used_is_a_usage_error(flavor: str, proxy: str) -> None:
    key = "OPENAI_API_KEY" if flavor == "openai" else "ANTHROPIC_API_KEY"
    named = r"the proxy URL HTTPS_PROXY names \(.*\) is not usable"
    with pytest.raises(so.UsageError, match=named):
        so.models.from_env(env={key: API_KEY, "HTTPS_PROXY": proxy})


# -- read as httpx reads the environment --------------------------------------------------------


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"HTTPS_PROXY": "proxy.example:3128"},
        {"HTTP_PROXY": "http://a:1", "https_proxy": "http://b:2", "ALL_PROXY": "socks5://c:3"},
        {"HTTPS_PROXY": "http://upper:1", "https_proxy": "http://lower:2"},
        {"HTTPS_PROXY": "http://upper:1", "https_proxy": ""},
        {"HTTP_PROXY": "http://cgi:1", "REQUEST_METHOD": "GET"},
        {"ALL_PROXY": "http://p:1", "NO_PROXY": "*"},
        {
            "ALL_PROXY": "http://p:1",
            "no_proxy": "example.com, .example.org,*.example.net,localhost,10.0.0.0/8,"
            "192.168.1.1,::1,fe80::/10,[::2],https://direct.example,a/b",
        },
    ],
)
def test_the_routes_are_the_ones_httpx_makes_of_the_same_environment(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert proxy_routes(env) == get_environment_proxies()


def test_an_entry_httpx_cannot_parse_is_ignored_as_httpx_ignores_it() -> None:
    env = {"OPENAI_API_KEY": API_KEY, "HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.0.0.1/99,x.y"}
    model = so.models.from_env(env=env)
    assert model._http_env.routes == {  # type: ignore[attr-defined]
        "https://": "http://p:1",
        "all://*x.y": None,
    }
    with pytest.raises(httpx2.InvalidURL):
        httpx2.AsyncClient(mounts={"all://10.0.0.1/99": None})
