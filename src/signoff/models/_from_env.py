"""`from_env`: pick a real provider from the environment, or fall back to a given model."""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import partial

from .._exceptions import UsageError
from ._anthropic import Anthropic
from ._base import Model, not_a_model_class
from ._openai import OpenAIChat
from ._urls import credential

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
    # Checked whatever the environment holds: a fallback that is no model (a model's name, say)
    # was returned as it was where no provider was configured, and ignored where one was.
    not_a_model_class(fallback, "from_env(fallback=...)")
    if fallback is not None and not callable(getattr(fallback, "complete", None)):
        raise UsageError(
            "from_env(fallback=...) must be a signoff model, used when the environment names "
            f"none (e.g. so.models.Scripted([...])), not {fallback!r}"
        )
    if env is not None and not isinstance(env, Mapping):
        raise UsageError(
            f"from_env(env=...) must map names to text, as os.environ does, not {env!r}"
        )
    given = env
    env = os.environ if env is None else env
    wanted = (_text("SIGNOFF_MODEL", env.get("SIGNOFF_MODEL")) or "").strip()
    base_url = _text("OPENAI_BASE_URL", env.get("OPENAI_BASE_URL"))
    # A key from a secret file ends in a line break: the key without it, one of blanks unset.
    # Each checked only once its provider is the one used: a bad key of the other is not read.
    openai_key = partial(_key, "OPENAI_API_KEY", env.get("OPENAI_API_KEY"))
    anthropic_key = partial(_key, "ANTHROPIC_API_KEY", env.get("ANTHROPIC_API_KEY"))
    if wanted:
        provider, _, name = wanted.partition(":")
        provider, name = provider.strip(), name.strip()  # `openai: gpt-4o`, as a .env file has it
        if provider not in ("openai", "anthropic"):  # a bare name, maybe with a tag: qwen3:8b
            provider = "anthropic" if wanted.startswith("claude") else "openai"
            name = wanted
        if not name:
            raise UsageError(f"SIGNOFF_MODEL={wanted!r} names no model")
        if provider == "anthropic":
            return Anthropic(name, api_key=anthropic_key(), env=given)
        return OpenAIChat(name, base_url=base_url, api_key=openai_key(), env=given)
    if key := anthropic_key():
        return Anthropic(DEFAULT_ANTHROPIC_MODEL, api_key=key, env=given)
    if (key := openai_key()) or base_url:
        return OpenAIChat(DEFAULT_OPENAI_MODEL, base_url=base_url, api_key=key, env=given)
    if fallback is None:
        raise UsageError(
            "no model configured: set SIGNOFF_MODEL, ANTHROPIC_API_KEY, OPENAI_API_KEY or "
            "OPENAI_BASE_URL, or pass a fallback model"
        )
    return fallback


def _text(name: str, value: object) -> str | None:
    """The setting `name` read as `value`, None when unset or empty; a value that is not text
    is refused by name (it was a bare AttributeError, or passed on to the SDK as a key)."""
    if value is not None and not isinstance(value, str):
        raise UsageError(f"from_env(env=...): {name} must be text, not {type(value).__name__}")
    return value or None


def _key(name: str, value: object) -> str | None:
    """The API key the setting `name` holds (`value`), the whitespace around it left out; None
    when unset or blank; a `UsageError` naming it for one no header can carry (a line break
    within)."""
    return credential("from_env()", name, _text(name, value)) or None
