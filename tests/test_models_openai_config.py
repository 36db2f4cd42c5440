"""Making an `OpenAIChat`: its arguments and their usage errors, a client passed in, two event
loops, and picking the model and provider from the environment (`from_env`)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import openai
import pytest

import signoff as so

from ._models import request
from ._models_openai import fake, model
from .fakes.llm import API_KEY, FakeLLM, openai_completion

__all__ = ["fake", "model"]  # the fixtures, used by name


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": -1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"price_per_mtok": (1.0,)}, "price_per_mtok"),
        ({"price_per_mtok": (1.0, -2.0)}, "price_per_mtok"),
        # Each priced a response as inf or NaN (every turn failed as "not plain JSON"), or
        # raised a bare OverflowError when the model was made.
        ({"price_per_mtok": (float("inf"), 1.0)}, "price_per_mtok"),
        ({"price_per_mtok": (1.0, 10**400)}, "price_per_mtok"),
        ({"price_per_mtok": (1e300, 1.0)}, "price_per_mtok"),
        ({"price_per_mtok": (1.0, 10**5000)}, "price_per_mtok"),  # too long even to write out
        ({"max_retries": -1}, "max_retries"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),  # passed `<= 0`: no bound on the call
        ({"timeout": float("inf")}, "timeout"),
        ({"temperature": float("nan")}, "temperature"),  # sent to the provider as NaN
    ],
)
def test_bad_arguments_are_usage_errors(kwargs, match) -> None:
    with pytest.raises(so.UsageError, match=match):
        so.models.OpenAIChat("m", base_url="http://127.0.0.1:1/v1", **kwargs)


def test_a_model_name_is_required() -> None:
    with pytest.raises(so.UsageError, match="model name"):
        so.models.OpenAIChat("")


async def test_client_and_base_url_together_are_a_usage_error() -> None:
    client = openai.AsyncOpenAI(api_key="x", base_url="http://127.0.0.1:1/v1")
    try:
        with pytest.raises(so.UsageError, match="either client"):
            so.models.OpenAIChat("m", client=client, base_url="http://127.0.0.1:2/v1")
    finally:
        await client.close()


def test_a_missing_key_is_a_usage_error_unless_a_base_url_is_given(monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(so.UsageError, match="OPENAI_API_KEY"):
        so.models.OpenAIChat("gpt-4.1-mini")
    so.models.OpenAIChat("llama3.2", base_url="http://127.0.0.1:11434/v1")  # Ollama needs none
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:11434/v1")
    assert "11434" in repr(so.models.OpenAIChat("llama3.2"))


def test_a_missing_sdk_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)
    with pytest.raises(so.UsageError, match=r"pip install 'signoff\[openai\]'"):
        so.models.OpenAIChat("gpt-4.1-mini", api_key="x")


async def test_a_client_passed_in_is_used_and_left_open(fake) -> None:
    fake.strict = False  # the last call sends no messages at all
    client = openai.AsyncOpenAI(api_key=API_KEY, base_url=fake.base_url, max_retries=0)
    fake.queue(openai_completion("one"), openai_completion("two"))
    m = so.models.OpenAIChat("m", client=client)
    assert (await m.complete(request())).text == "one"
    await m.aclose()
    assert not client.is_closed()
    assert (await client.chat.completions.create(model="m", messages=[])).choices
    await client.close()


async def test_one_model_serves_two_live_event_loops(
    fake: FakeLLM, model: so.models.OpenAIChat
) -> None:
    # Runtime's *_sync twins run on a loop of their own; an HTTP pool cannot cross loops.
    fake.queue(*(openai_completion(t) for t in ("main", "thread", "main again")))
    assert (await model.complete(request())).text == "main"

    def in_another_loop() -> str:
        async def call() -> str:
            try:
                return (await model.complete(request())).text
            finally:
                await model.aclose()  # closes this loop's client only

        return asyncio.run(call())

    assert await asyncio.to_thread(in_another_loop) == "thread"
    assert (await model.complete(request())).text == "main again"


async def test_from_env_reaches_a_compatible_server_by_name(fake: FakeLLM) -> None:
    env = {"SIGNOFF_MODEL": "qwen3:8b", "OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": API_KEY}
    m = so.models.from_env(env=env)
    assert isinstance(m, so.models.OpenAIChat)
    fake.queue(openai_completion("hi from qwen"))
    try:
        assert (await m.complete(request())).text == "hi from qwen"
    finally:
        await m.aclose()
    assert fake.bodies[0]["model"] == "qwen3:8b"


async def test_from_env_with_env_reads_nothing_from_the_process(fake, monkeypatch) -> None:
    # The process points elsewhere, with an organization, a project and a header of its own:
    # none of it may reach a model made from an explicit env.
    with FakeLLM("openai") as elsewhere:
        monkeypatch.setenv("OPENAI_BASE_URL", elsewhere.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-the-process-key")
        monkeypatch.setenv("OPENAI_ORG_ID", "org-of-the-process")
        monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-of-the-process")
        monkeypatch.setenv("OPENAI_CUSTOM_HEADERS", "X-Process: yes\nX-Both: process")
        env = {
            "SIGNOFF_MODEL": "qwen3:8b",
            "OPENAI_BASE_URL": fake.base_url,
            "OPENAI_API_KEY": API_KEY,
            "OPENAI_PROJECT_ID": "proj-given",
            "OPENAI_CUSTOM_HEADERS": "X-Both: given",
        }
        fake.queue(openai_completion("from the given server"))
        m = so.models.from_env(env=env)
        assert isinstance(m, so.models.OpenAIChat)
        try:
            assert (await m.complete(request())).text == "from the given server"
        finally:
            await m.aclose()
        # and without a base URL in env, the SDK's default, not the process's
        m = so.models.from_env(env={"OPENAI_API_KEY": API_KEY})
        assert isinstance(m, so.models.OpenAIChat)
        assert "api.openai.com" in str(m._clients.get().base_url)
        await m.aclose()
        assert elsewhere.received == []
    [got] = fake.received
    assert got.headers["authorization"] == f"Bearer {API_KEY}"
    assert "openai-organization" not in got.headers
    assert got.headers["openai-project"] == "proj-given"
    assert got.headers["x-both"] == "given"
    assert "x-process" not in got.headers


async def test_a_client_given_is_labelled_and_checked_by_itself(
    fake: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process's OPENAI_BASE_URL, which a client given does not use, named the model in its
    label (`signoff chat` prints it) and, not a URL, refused the model (`UsageError`), as
    Anthropic's does not."""
    monkeypatch.setenv("OPENAI_BASE_URL", "localhost:8080")
    client = openai.AsyncOpenAI(api_key=API_KEY, base_url=fake.base_url)
    m = so.models.OpenAIChat("gpt-4.1-mini", client=client)
    assert repr(m) == "OpenAIChat('gpt-4.1-mini')"
    fake.queue(openai_completion("ok"))
    assert (await m.complete(request())).text == "ok"
    await client.close()


def test_a_model_made_with_a_client_takes_no_env() -> None:
    client = openai.AsyncOpenAI(api_key="k")
    with pytest.raises(so.UsageError, match="either client= or"):
        so.models.OpenAIChat("m", client=client, env={})


def test_from_env_picks_the_provider() -> None:
    fallback = so.models.Scripted([so.ModelResponse(text="demo")])
    pick = so.models.from_env
    assert pick(fallback, env={}) is fallback
    m = pick(fallback, env={"OPENAI_API_KEY": "k"})
    assert isinstance(m, so.models.OpenAIChat) and m.model == "gpt-4.1-mini"
    m = pick(fallback, env={"ANTHROPIC_API_KEY": "k", "OPENAI_API_KEY": "k"})
    assert isinstance(m, so.models.Anthropic) and m.model == "claude-haiku-4-5"
    # Anthropic, like OpenAI, wants a key (a model made without one fails at construction)
    m = pick(env={"SIGNOFF_MODEL": "claude-opus-4-1", "ANTHROPIC_API_KEY": "k"})
    assert isinstance(m, so.models.Anthropic) and m.model == "claude-opus-4-1"
    m = pick(env={"SIGNOFF_MODEL": "anthropic:my-claude-proxy", "ANTHROPIC_API_KEY": "k"})
    assert isinstance(m, so.models.Anthropic) and m.model == "my-claude-proxy"
    m = pick(env={"SIGNOFF_MODEL": "openai:gpt-4o", "OPENAI_API_KEY": "k"})
    assert isinstance(m, so.models.OpenAIChat) and m.model == "gpt-4o"
    m = pick(env={"OPENAI_BASE_URL": "http://127.0.0.1:11434/v1"})
    assert isinstance(m, so.models.OpenAIChat) and "11434" in repr(m)
    # as a .env file may space it: the name sent had the blank, unknown to the provider
    m = pick(env={"SIGNOFF_MODEL": "openai: gpt-4o ", "OPENAI_API_KEY": "k"})
    assert isinstance(m, so.models.OpenAIChat) and m.model == "gpt-4o"
    m = pick(env={"SIGNOFF_MODEL": "anthropic :  claude-haiku-4-5", "ANTHROPIC_API_KEY": "k"})
    assert isinstance(m, so.models.Anthropic) and m.model == "claude-haiku-4-5"
    with pytest.raises(so.UsageError, match="the model name 'gpt-4o ' has blanks around it"):
        so.models.OpenAIChat("gpt-4o ", api_key="k")
    with pytest.raises(so.UsageError, match="names no model"):
        pick(env={"SIGNOFF_MODEL": "openai: "})
    with pytest.raises(so.UsageError, match="names no model"):
        pick(env={"SIGNOFF_MODEL": "openai:"})
    with pytest.raises(so.UsageError, match="no model configured"):
        pick(env={})


@pytest.mark.parametrize("env", [{}, {"OPENAI_API_KEY": "k"}], ids=["unset", "configured"])
def test_from_env_refuses_a_fallback_or_env_it_cannot_use(env: dict[str, str]) -> None:
    """A fallback that is no model (a model's name) was returned as it was where no provider
    was configured and ignored where one was, so the mistake showed on one machine only; an
    `env` that is no mapping, or holds a setting that is not text, was a bare AttributeError."""
    with pytest.raises(so.UsageError, match=r"^from_env\(fallback=...\) must be a signoff model"):
        so.models.from_env("gpt-4o", env=env)  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match=r"^from_env\(fallback=...\) is the class Scripted"):
        so.models.from_env(so.models.Scripted, env=env)  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match=r"^from_env\(env=...\) must map names to text"):
        so.models.from_env(env=["OPENAI_API_KEY=k"])  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match=r"SIGNOFF_MODEL must be text, not int"):
        so.models.from_env(env={**env, "SIGNOFF_MODEL": 5})  # type: ignore[dict-item]


def test_importing_signoff_does_not_import_the_sdks() -> None:
    code = "import sys, signoff; print('openai' in sys.modules, 'anthropic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


async def test_params_the_sdk_does_not_know_are_a_usage_error(fake: FakeLLM) -> None:
    """Refused when the model is made: at its first call, the agent's every turn had failed
    and been recorded so, each one retryable, before any session could tell."""
    with pytest.raises(so.UsageError, match=r"params names 'temprature', which the SDK's"):
        so.models.OpenAIChat(
            "m", base_url=fake.base_url, api_key=API_KEY, params={"temprature": 0.1}
        )
    assert fake.received == []
    with pytest.raises(so.UsageError, match="params may not set messages"):
        so.models.OpenAIChat("m", api_key="k", params={"messages": []})


@pytest.mark.parametrize("stream", [True, False])
def test_params_may_not_ask_for_a_stream(stream) -> None:
    # A streamed reply was parsed as a whole one: every turn failed with "returned no choices".
    with pytest.raises(so.UsageError, match="params may not set stream"):
        so.models.OpenAIChat("m", api_key="k", params={"stream": stream})


@pytest.mark.parametrize("taken", ["stream", "messages", "model", "tools"])
def test_extra_body_may_not_set_what_params_may_not(taken) -> None:
    # The SDK merges extra_body into the request over what signoff sends: the stream the check
    # refuses was asked for anyway (every turn failed on the event-stream body), or the
    # conversation, tools or model were replaced.
    with pytest.raises(so.UsageError, match=f"params may not set extra_body's {taken}"):
        so.models.OpenAIChat("m", api_key="k", params={"extra_body": {taken: True}})
    m = so.models.OpenAIChat("m", api_key="k", params={"extra_body": {"top_k": 5}})
    assert m.params == {"extra_body": {"top_k": 5}}


async def test_a_client_passed_in_used_on_a_second_loop_fails_saying_why(fake: FakeLLM) -> None:
    """A runtime's `*_sync` twins run on a loop of their own: a `client=` whose connections
    belong to the app's loop failed there with httpx's bare 'bound to a different event loop'."""
    client = openai.AsyncOpenAI(api_key=API_KEY, base_url=fake.base_url, max_retries=0)
    fake.queue(*(openai_completion(t) for t in ("main", "thread", "main again")))
    m = so.models.OpenAIChat("m", client=client)
    try:
        assert (await m.complete(request())).text == "main"

        def in_another_loop() -> BaseException | None:
            async def call() -> BaseException | None:
                try:
                    await m.complete(request())
                except Exception as exc:
                    return exc
                return None

            return asyncio.run(call())

        failed = await asyncio.to_thread(in_another_loop)
        assert isinstance(failed, so.ModelError), failed
        assert "first used on another event loop" in str(failed)
        assert "base_url=" in str(failed)
    finally:
        await client.close()


def test_params_a_client_of_your_own_takes_are_left_to_it() -> None:
    """A `client=` of your own (a wrapper taking `**kwargs`) may take arguments the SDK's does
    not: those are not refused, its own `create` is asked."""
    import types

    class Completions:
        async def create(self, **kwargs: Any) -> Any:
            raise AssertionError("not called")

    client: Any = types.SimpleNamespace(chat=types.SimpleNamespace(completions=Completions()))
    model = so.models.OpenAIChat("m", client=client, params={"gateway_route": "eu"})
    assert model.params == {"gateway_route": "eu"}


def test_params_a_wrapped_sdk_client_takes_are_left_to_it() -> None:
    """A tracing wrapper over the SDK's own client (as langsmith's `wrap_openai`: a
    `functools.wraps` of `create` taking a keyword of its own) was judged by the SDK's signature,
    which the wrapper reports, and refused its keyword. The SDK's client itself is still judged."""
    import functools

    client = openai.AsyncOpenAI(api_key="x", base_url="http://127.0.0.1:9")
    original = client.chat.completions.create

    @functools.wraps(original)
    async def traced(*args: Any, langsmith_extra: Any = None, **kwargs: Any) -> Any:
        return await original(*args, **kwargs)

    client.chat.completions.create = traced  # type: ignore[method-assign]
    model = so.models.OpenAIChat("m", client=client, params={"langsmith_extra": {"run": "a"}})
    assert model.params == {"langsmith_extra": {"run": "a"}}
    plain = openai.AsyncOpenAI(api_key="x", base_url="http://127.0.0.1:9")
    with pytest.raises(so.UsageError, match="params names 'temprature'"):
        so.models.OpenAIChat("m", client=plain, params={"temprature": 0.1})
