"""`params=`, the extra SDK arguments a model passes to each call: what they may not set."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from .._exceptions import UsageError

__all__ = ["check_params"]


def check_params(
    owner: str,
    params: object,
    reserved: set[str],
    sdk_create: Any = None,
    given_create: Any = None,
) -> dict[str, Any]:
    """Validate `params=`: extra SDK arguments that may not replace what signoff sends or ask
    for a stream (the reply is read whole), nor through `extra_body`, which the SDK merges into
    the request over them; nor name one the SDK's `create` does not take, which failed every
    call of the agent (a typo: `temprature`); nor send an `extra_headers` value no header
    carries."""
    if params is None:
        return {}
    if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
        raise UsageError(f"{owner}: params must be a mapping of argument names, not {params!r}")
    # A `client=` whose `create` is not the SDK's own (a tracing wrapper: langsmith's takes
    # `langsmith_extra`) judges its own arguments.
    own = given_create is None or getattr(given_create, "__func__", None) is sdk_create
    unknown = _not_taken(sdk_create, params) if own else []
    if unknown:
        raise UsageError(
            f"{owner}: params names {', '.join(map(repr, unknown))}, which the SDK's create() "
            "does not take (a field of your server's own goes in params={'extra_body': {...}})"
        )
    taken = sorted(reserved & set(params))
    extra = params.get("extra_body")
    if isinstance(extra, Mapping):
        taken += [f"extra_body's {k}" for k in sorted(reserved & set(extra))]
    if taken:
        raise UsageError(f"{owner}: params may not set {', '.join(taken)}; {_why_reserved(taken)}")
    _check_headers(owner, params.get("extra_headers"))
    return dict(params)


def _why_reserved(taken: list[str]) -> str:
    """Why signoff sets the arguments `taken` itself."""
    why = []
    if any(not name.endswith("stream") for name in taken):
        why.append("signoff sends the model, the conversation and the agent's tools itself")
    if any(name.endswith("tools") for name in taken):
        why[-1] += " (a provider's server tools, such as Anthropic's web search, cannot be "
        why[-1] += "declared)"
    if any(name.endswith("stream") for name in taken):
        why.append("signoff reads whole replies, not streams")
    return "; ".join(why)


def _check_headers(owner: str, headers: object) -> None:
    """Raise `UsageError` for an `extra_headers` value no header carries (a key read from a
    file with its line break, a control or non-ASCII character), naming the header, never its
    value: the HTTP client refused each call, its error showing the whole value."""
    if not isinstance(headers, Mapping):
        return
    for name, value in headers.items():
        if isinstance(value, str) and (
            value != value.strip() or not all(" " <= c <= "~" for c in value)
        ):
            raise UsageError(
                f"{owner}: params' extra_headers {name!r} has whitespace around its value or a "
                "control or non-ASCII character in it, which no header carries (the value is "
                "not shown)"
            )


def _not_taken(create: Any, names: Iterable[str]) -> list[str]:
    """Those of `names` that `create` takes no keyword argument of; none when it takes any
    (`**kwargs`: a client of your own) or its signature cannot be read."""
    if create is None:
        return []
    try:
        parameters = inspect.signature(create).parameters.values()
    except (TypeError, ValueError):
        return []
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return []
    taken = {p.name for p in parameters}
    return sorted(name for name in names if name not in taken)
