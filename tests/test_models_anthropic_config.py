"""Making an `Anthropic` model: its arguments and their usage errors, a missing key or SDK, and
what it reads from an environment it is given."""

from __future__ import annotations

import sys
from typing import Any

import pytest

import signoff as so

from ._models import request
from ._models_anthropic import fake
from .fakes.llm import (
    API_KEY,
    FakeLLM,
    anthropic_message,
)

__all__ = ["fake"]  # the fixture, used by name


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_tokens": None}, "max_tokens is required"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"params": {"system": "x"}}, "params may not set system"),
        ({"params": {"stream": True}}, "params may not set stream"),
        ({"params": {"extra_body": {"stream": True}}}, "params may not set extra_body's stream"),
        ({"params": {"extra_body": {"system": "x"}}}, "params may not set extra_body's system"),
        # the agent's tools are sent: a server tool cannot be added (not "it reads streams")
        (
            {"params": {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}},
            r"may not set tools; signoff sends the model, the conversation and the agent's "
            r"tools itself \(a provider's server tools, such as Anthropic's web search, cannot "
            r"be declared\)$",
        ),
        (
            {"params": {"stream": True, "system": "x"}},
            r"set stream, system; signoff sends .* itself; signoff reads whole replies, not "
            r"streams$",
        ),
        ({"params": ["seed"]}, "params must be a mapping"),
        ({"params": {"temprature": 0.2}}, r"params names 'temprature', which the SDK's create"),
        ({"price_per_mtok": "cheap"}, "price_per_mtok"),
        ({"price_per_mtok": (float("inf"), 1.0)}, "price_per_mtok"),
        ({"price_per_mtok": (1.0, 10**400)}, "price_per_mtok"),
        ({"max_retries": 1.5}, "max_retries"),
        ({"timeout": float("nan")}, "timeout"),  # passed `<= 0`: no bound on the call
        ({"timeout": float("inf")}, "timeout"),
        # the API refuses such thinking on every call: each turn failed, retried in vain
        (
            {"params": {"thinking": {"type": "enabled", "budget_tokens": 4000}}},
            r"budget_tokens must be at least 1,024 and below max_tokens \(1,024\), not 4,000",
        ),
        (
            {"max_tokens": 4096, "params": {"thinking": {"type": "enabled", "budget_tokens": 512}}},
            r"budget_tokens must be at least 1,024 .* not 512",
        ),
        (  # `params` and its `extra_body` may set max_tokens too: the one sent counts
            {
                "max_tokens": 8000,
                "params": {
                    "max_tokens": 2000,
                    "extra_body": {"thinking": {"type": "enabled", "budget_tokens": 2000}},
                },
            },
            r"below max_tokens \(2,000\), not 2,000",
        ),
        (
            {
                "max_tokens": 8000,
                "params": {
                    "extra_body": {"max_tokens": 1500},
                    "thinking": {"type": "enabled", "budget_tokens": 2048},
                },
            },
            r"below max_tokens \(1,500\), not 2,048",
        ),
        ({"model": " claude-haiku-4-5"}, r"the model name ' claude-haiku-4-5' has blanks"),
    ],
)
def test_bad_arguments_are_usage_errors(kwargs, match) -> None:
    with pytest.raises(so.UsageError, match=match):
        so.models.Anthropic(**{"model": "claude-haiku-4-5", "api_key": "x", **kwargs})


@pytest.mark.parametrize(
    "params",
    [
        {"thinking": {"type": "enabled", "budget_tokens": 1024}},
        {"thinking": {"type": "disabled", "budget_tokens": 9000}},
        {"max_tokens": 9000, "thinking": {"type": "enabled", "budget_tokens": 8000}},
        {"extra_body": {"thinking": {"type": "enabled", "budget_tokens": 4095}}},
    ],
)
def test_thinking_within_max_tokens_is_taken(params) -> None:
    model = so.models.Anthropic("claude-haiku-4-5", api_key="x", max_tokens=4096, params=params)
    assert model.params == params


INTERLEAVED = "interleaved-thinking-2025-05-14"
WHOLE_TURN = {"thinking": {"type": "enabled", "budget_tokens": 20000}}


def test_interleaved_thinking_may_think_past_max_tokens_over_the_turn() -> None:
    """With the interleaved-thinking beta the budget is the whole turn's, above `max_tokens`
    as the API allows, whichever way the header is sent; its least still holds."""
    beta = {"anthropic-beta": f"{INTERLEAVED},other-beta"}
    made = [
        so.models.Anthropic(
            "claude-sonnet-4-5",
            api_key="x",
            max_tokens=16000,
            params={**WHOLE_TURN, "extra_headers": beta},
        ),
        so.models.Anthropic(
            "claude-sonnet-4-5",
            api_key="x",
            max_tokens=16000,
            params=WHOLE_TURN,
            env={"ANTHROPIC_CUSTOM_HEADERS": f"anthropic-beta: {INTERLEAVED}"},
        ),
    ]
    import anthropic

    client = anthropic.AsyncAnthropic(api_key="x", default_headers=beta)
    made.append(
        so.models.Anthropic("claude-sonnet-4-5", client=client, max_tokens=16000, params=WHOLE_TURN)
    )
    assert [m.params["thinking"]["budget_tokens"] for m in made] == [20000] * 3
    with pytest.raises(so.UsageError, match=r"at least 1,024, not 512"):
        so.models.Anthropic(
            "claude-sonnet-4-5",
            api_key="x",
            params={
                "thinking": {"type": "enabled", "budget_tokens": 512},
                "extra_headers": beta,
            },
        )
    # Another beta, or the header's value taken away by `extra_headers`: below max_tokens
    with pytest.raises(so.UsageError, match=r"below max_tokens \(16,000\), not 20,000"):
        so.models.Anthropic(
            "claude-sonnet-4-5",
            client=client,
            max_tokens=16000,
            params={**WHOLE_TURN, "extra_headers": {"Anthropic-Beta": "other-beta"}},
        )


async def test_a_missing_key_is_a_usage_error_unless_a_base_url_is_given(fake, monkeypatch) -> None:
    # as OpenAIChat: said when the model is made, not as an SDK complaint at every turn
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(so.UsageError, match="no API key; set ANTHROPIC_API_KEY"):
        so.models.Anthropic("claude-haiku-4-5")
    with pytest.raises(so.UsageError, match="ANTHROPIC_API_KEY"):
        so.models.from_env(env={"SIGNOFF_MODEL": "claude-haiku-4-5"})
    # a gateway on base_url may need none: the request is sent, and the fake wants a key
    async with so.models.Anthropic("claude-haiku-4-5", base_url=fake.base_url, max_retries=0) as m:
        with pytest.raises(so.ModelError, match="HTTP 401"):
            await m.complete(request())


async def test_from_env_with_env_reads_nothing_from_the_process(fake, monkeypatch) -> None:
    # ANTHROPIC_BASE_URL of the process was read by the SDK, past an explicit env=
    with FakeLLM("anthropic") as elsewhere:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", elsewhere.base_url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-the-process-key")
        monkeypatch.setenv("ANTHROPIC_CUSTOM_HEADERS", "X-Process: yes")
        env = {
            "SIGNOFF_MODEL": "claude-haiku-4-5",
            "ANTHROPIC_BASE_URL": fake.base_url,
            "ANTHROPIC_API_KEY": API_KEY,
            "ANTHROPIC_CUSTOM_HEADERS": "X-Given: yes",
        }
        fake.queue(anthropic_message("from the given server"))
        m = so.models.from_env(env=env)
        assert isinstance(m, so.models.Anthropic)
        try:
            assert (await m.complete(request())).text == "from the given server"
        finally:
            await m.aclose()
        # without a base URL in env, the SDK's default, not the process's
        m = so.models.from_env(env={"ANTHROPIC_API_KEY": API_KEY})
        assert isinstance(m, so.models.Anthropic)
        assert "api.anthropic.com" in str(m._clients.get().base_url)
        await m.aclose()
        # no key in env is no key, whatever the process has
        with pytest.raises(so.UsageError, match="no API key"):
            so.models.from_env(env={"SIGNOFF_MODEL": "claude-haiku-4-5"})
        assert elsewhere.received == []
    [got] = fake.received
    assert API_KEY in (got.headers.get("x-api-key"), got.headers.get("authorization", "")[7:])
    assert got.headers["x-given"] == "yes"
    assert "x-process" not in got.headers


async def test_an_auth_token_in_env_is_sent_as_a_bearer_token(fake) -> None:
    env = {"ANTHROPIC_AUTH_TOKEN": API_KEY, "ANTHROPIC_BASE_URL": fake.base_url}
    fake.queue(anthropic_message("ok"))
    async with so.models.Anthropic("claude-haiku-4-5", env=env, max_retries=0) as m:
        assert (await m.complete(request())).text == "ok"
    assert fake.received[0].headers["authorization"] == f"Bearer {API_KEY}"


def test_the_label_names_the_base_url_of_the_environment_as_openai_s_does(monkeypatch) -> None:
    """`signoff chat` shows the model by its repr (`model: ...`): one sent to the gateway in
    the process's ANTHROPIC_BASE_URL said `Anthropic('claude-haiku-4-5')`, as if it went to
    Anthropic's API, where OpenAIChat names its OPENAI_BASE_URL."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "k")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:4000")
    assert repr(so.models.Anthropic("claude-haiku-4-5")) == (
        "Anthropic('claude-haiku-4-5', base_url='http://127.0.0.1:4000')"
    )
    given = so.models.Anthropic("claude-haiku-4-5", base_url="http://127.0.0.1:5000")
    assert "5000" in repr(given)
    monkeypatch.delenv("ANTHROPIC_BASE_URL")
    assert repr(so.models.Anthropic("claude-haiku-4-5")) == "Anthropic('claude-haiku-4-5')"


async def test_env_sets_the_sdks_telemetry_not_the_process(monkeypatch) -> None:
    """Given no `open_telemetry=`, the SDK read its ANTHROPIC_OPEN_TELEMETRY* variables from the
    process, past `env=`: the process's "content" mode traced the prompts of a model made apart
    from it, whose mapping turned the SDK's spans off."""
    monkeypatch.setenv("ANTHROPIC_OPEN_TELEMETRY_TRACES_CONTENT_MODE", "content")
    monkeypatch.setenv("ANTHROPIC_OPEN_TELEMETRY_TRACES_MAX_CONTENT_BYTES", "99")
    given = {"ANTHROPIC_API_KEY": API_KEY, "ANTHROPIC_OPEN_TELEMETRY": "false"}
    m = so.models.Anthropic("claude-haiku-4-5", env=given)
    telemetry = m._clients.get().open_telemetry
    assert telemetry["traces"]["enabled"] is False
    assert telemetry["traces"]["content_mode"] == "metadata_only"
    assert telemetry["traces"]["max_content_bytes"] != 99
    both = {**given, "ANTHROPIC_OPEN_TELEMETRY": "true"}
    both["ANTHROPIC_OPEN_TELEMETRY_TRACES_CONTENT_MODE"] = "CONTENT"
    both["ANTHROPIC_OPEN_TELEMETRY_TRACES_MAX_CONTENT_BYTES"] = " 4096 "
    both["ANTHROPIC_OPEN_TELEMETRY_PROPAGATION"] = "false"
    made = so.models.from_env(env=both)
    assert isinstance(made, so.models.Anthropic)
    telemetry = made._clients.get().open_telemetry
    assert telemetry["traces"] == {
        "enabled": True,
        "content_mode": "content",
        "max_content_bytes": 4096,
    }
    assert telemetry["propagation"] is False
    await m.aclose()
    await made.aclose()


@pytest.mark.parametrize("variable", ["ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"])
async def test_an_empty_base_url_in_the_process_is_the_default(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    """`ANTHROPIC_BASE_URL=` (a compose file leaves it so) was unset to signoff but read again
    by the SDK, which took "" for a URL: every turn then failed to connect ("missing an 'http://'
    or 'https://' protocol"). The SDK's default URL is used."""
    monkeypatch.setenv(variable, "")
    if variable == "ANTHROPIC_BASE_URL":
        m: Any = so.models.Anthropic("claude-haiku-4-5", api_key=API_KEY)
        assert str(m._clients.get().base_url).startswith("https://api.anthropic.com")
    else:
        m = so.models.OpenAIChat("gpt-4.1-mini", api_key=API_KEY)
        assert str(m._clients.get().base_url).startswith("https://api.openai.com/v1")
    assert "base_url" not in repr(m)
    await m.aclose()


def test_a_missing_sdk_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)
    with pytest.raises(so.UsageError, match=r"pip install 'signoff\[anthropic\]'"):
        so.models.Anthropic("claude-haiku-4-5", api_key="x")
