"""SDK clients made from a given set of environment variables, none read from the process's.

Both SDKs fall back to `os.environ` for every setting left as None (base URL, keys,
organization, custom headers): a model made by `from_env(env=...)` passes each one explicitly
so a stray `ANTHROPIC_BASE_URL` or `OPENAI_ORG_ID` of the process cannot redirect or alter it.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Mapping
from types import ModuleType
from typing import Any

__all__ = [
    "OPENAI_BASE_URL",
    "ANTHROPIC_BASE_URL",
    "anthropic_betas",
    "anthropic_client",
    "openai_client",
]

# The SDKs' own defaults, used when neither the argument nor the given environment names one.
OPENAI_BASE_URL = "https://api.openai.com/v1"
ANTHROPIC_BASE_URL = "https://api.anthropic.com"


def _parse_headers(text: str | None) -> dict[str, str]:
    """`NAME: value` lines, as the SDKs read `*_CUSTOM_HEADERS`."""
    headers: dict[str, str] = {}
    for line in (text or "").split("\n"):
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip()] = value.strip()
    return headers


def anthropic_betas(client: Any, env: Mapping[str, str] | None, params: Mapping[str, Any]) -> str:
    """The `anthropic-beta` header the model's calls send, as far as can be told: `params`'
    `extra_headers`, else the client's headers (a `client=` given, or `ANTHROPIC_CUSTOM_HEADERS`
    of `env` or the process, which the SDK sends)."""
    for headers in (
        params.get("extra_headers"),
        getattr(client, "default_headers", None) if client is not None else None,
        _parse_headers((os.environ if env is None else env).get("ANTHROPIC_CUSTOM_HEADERS")),
    ):
        if isinstance(headers, Mapping):
            for name, value in headers.items():
                if isinstance(name, str) and name.lower() == "anthropic-beta":
                    return str(value)
    return ""


def _headers(sdk: ModuleType, env: Mapping[str, str], variable: str) -> dict[str, Any]:
    """`default_headers=` sending the custom headers `env` names and none the process's do: the
    SDK merges those in whatever is passed, so each is removed again with the SDK's `Omit`."""
    process = _parse_headers(os.environ.get(variable))
    dropped: dict[str, Any] = {name: sdk.Omit() for name in process}
    return {**dropped, **_parse_headers(env.get(variable))}


def openai_client(
    sdk: ModuleType,
    env: Mapping[str, str],
    *,
    api_key: str,
    base_url: str | None,
    max_retries: int,
    timeout: float,
    http_client: Any,
) -> Any:
    """An `AsyncOpenAI` whose settings all come from the arguments and `env`."""
    client = sdk.AsyncOpenAI(
        api_key=api_key,
        base_url=base_url or OPENAI_BASE_URL,
        max_retries=max_retries,
        timeout=timeout,
        http_client=http_client,
        default_headers=_headers(sdk, env, "OPENAI_CUSTOM_HEADERS"),
    )
    # None means "read the process environment" to the constructor: set after it instead.
    client.organization = env.get("OPENAI_ORG_ID") or None
    client.project = env.get("OPENAI_PROJECT_ID") or None
    client.admin_api_key = env.get("OPENAI_ADMIN_KEY") or None
    client.webhook_secret = env.get("OPENAI_WEBHOOK_SECRET") or None
    return client


def anthropic_client(
    sdk: ModuleType,
    env: Mapping[str, str],
    *,
    api_key: str | None,
    auth_token: str | None,
    base_url: str | None,
    max_retries: int,
    timeout: float,
    http_client: Any,
) -> Any:
    """An `AsyncAnthropic` whose settings all come from the arguments and `env` (an explicit key
    or token also keeps the SDK from looking for profiles and federation settings)."""
    telemetry: dict[str, Any] = {}
    if "open_telemetry" in inspect.signature(sdk.AsyncAnthropic).parameters:
        # Given none, the SDK reads its ANTHROPIC_OPEN_TELEMETRY* variables from the process
        # (a process's "content" mode would trace the prompts of a model made apart from it).
        telemetry["open_telemetry"] = _open_telemetry(env)
    client = sdk.AsyncAnthropic(
        api_key=api_key,
        auth_token=auth_token,
        base_url=base_url or ANTHROPIC_BASE_URL,
        max_retries=max_retries,
        timeout=timeout,
        http_client=http_client,
        default_headers=_headers(sdk, env, "ANTHROPIC_CUSTOM_HEADERS"),
        **telemetry,
    )
    client.webhook_key = env.get("ANTHROPIC_WEBHOOK_SIGNING_KEY") or None
    return client


def _open_telemetry(env: Mapping[str, str]) -> dict[str, Any]:
    """The `open_telemetry=` option the SDK would make of its variables, made of `env`'s: only
    what a variable changes from the SDK's defaults, as `anthropic._tracing` reads them."""
    traces: dict[str, Any] = {}
    if env.get("ANTHROPIC_OPEN_TELEMETRY", "").lower() == "false":
        traces["enabled"] = False
    if env.get("ANTHROPIC_OPEN_TELEMETRY_TRACES_CONTENT_MODE", "").lower() == "content":
        traces["content_mode"] = "content"
    most = env.get("ANTHROPIC_OPEN_TELEMETRY_TRACES_MAX_CONTENT_BYTES", "").strip()
    if most.isascii() and most.isdigit() and len(most) <= 18 and int(most) >= 1:
        traces["max_content_bytes"] = int(most)
    options: dict[str, Any] = {"traces": traces}
    if env.get("ANTHROPIC_OPEN_TELEMETRY_PROPAGATION", "").lower() == "false":
        options["propagation"] = False
    return options
