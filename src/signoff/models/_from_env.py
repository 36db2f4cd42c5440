"""`from_env`: pick a real provider from the environment, or fall back to a given model."""

from __future__ import annotations

import os
from collections.abc import Mapping

from .._exceptions import UsageError
from ._anthropic import Anthropic
from ._base import Model
from ._openai import OpenAIChat

__all__ = ["DEFAULT_ANTHROPIC_MODEL", "DEFAULT_OPENAI_MODEL", "from_env"]

DEFAULT_OPENAI_MODEL = "gpt-4.1-mini"
DEFAULT_ANTHROPIC_MODEL = "claude-haiku-4-5"


def from_env(fallback: Model | None = None, *, env: Mapping[str, str] | None = None) -> Model:
    """The model the environment asks for, else `fallback`.

    `SIGNOFF_MODEL` names it, as `openai:NAME`, `anthropic:NAME` or a bare name (`claude-*` is
    Anthropic's, anything else goes to the OpenAI-compatible endpoint, e.g. `qwen3:8b` on an
    Ollama server at `OPENAI_BASE_URL`). Without it, `ANTHROPIC_API_KEY` selects Anthropic's
    default model, and `OPENAI_API_KEY` or `OPENAI_BASE_URL` OpenAI's. With `env` given, every
    setting comes from it (the model passes it on as `env=`): nothing is read from `os.environ`.
    """
    given = env
    env = os.environ if env is None else env
    wanted = env.get("SIGNOFF_MODEL", "").strip()
    base_url = env.get("OPENAI_BASE_URL") or None
    openai_key = env.get("OPENAI_API_KEY") or None
    anthropic_key = env.get("ANTHROPIC_API_KEY") or None
    if wanted:
        provider, _, name = wanted.partition(":")
        if provider not in ("openai", "anthropic"):  # a bare name, maybe with a tag: qwen3:8b
            provider = "anthropic" if wanted.startswith("claude") else "openai"
            name = wanted
        if not name:
            raise UsageError(f"SIGNOFF_MODEL={wanted!r} names no model")
        if provider == "anthropic":
            return Anthropic(name, api_key=anthropic_key, env=given)
        return OpenAIChat(name, base_url=base_url, api_key=openai_key, env=given)
    if anthropic_key:
        return Anthropic(DEFAULT_ANTHROPIC_MODEL, api_key=anthropic_key, env=given)
    if openai_key or base_url:
        return OpenAIChat(DEFAULT_OPENAI_MODEL, base_url=base_url, api_key=openai_key, env=given)
    if fallback is None:
        raise UsageError(
            "no model configured: set SIGNOFF_MODEL, ANTHROPIC_API_KEY, OPENAI_API_KEY or "
            "OPENAI_BASE_URL, or pass a fallback model"
        )
    return fallback
