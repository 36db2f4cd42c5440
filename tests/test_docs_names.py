"""Every name, link, default, event type and table the docs show matches the code: public names
and docstrings, classes and errors, extras, relative links, tracing attributes.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest

import signoff as so

from ._docs import DOCS, ROOT, blocks_text


def test_each_extra_the_docs_name_exists_and_brings_the_client_its_message_promises() -> None:
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    texts += sorted((ROOT / "src" / "signoff").rglob("*.py"))
    named = {
        extra
        for p in texts
        for group in re.findall(r"signoff\[([a-z,]+)\]", p.read_text())
        for extra in group.split(",")  # 'signoff[server,slack]' names two
    }
    assert named and named <= set(extras), sorted(named - set(extras))
    # `so.Client` says "pip install 'signoff[server]'" when httpx is missing
    assert any(dep.startswith("httpx") for dep in extras["server"])


def _own_doc(obj: object) -> str:
    """The docstring `obj` carries itself: not its class's, nor a dataclass's generated one."""
    import inspect

    doc = inspect.getdoc(obj) or ""
    name = getattr(obj, "__name__", "")
    if not doc or doc.startswith(f"{name}(") or doc == inspect.getdoc(type(obj)):
        return ""
    if isinstance(obj, type) and any(doc == inspect.getdoc(base) for base in obj.__mro__[1:]):
        return ""  # inherited from a base class, e.g. pydantic's BaseModel
    return doc


def test_every_public_class_and_function_says_what_it_is() -> None:
    import inspect

    import signoff as so

    missing = [
        name
        for name in so.__all__
        if (inspect.isclass(obj := getattr(so, name)) or inspect.isfunction(obj))
        and not _own_doc(obj)
    ]
    methods = [
        f"Runtime.{name}"
        for cls in so.Runtime.__mro__[:-1]
        for name, fn in vars(cls).items()
        if not name.startswith("_") and not name.endswith("_sync") and inspect.isfunction(fn)
        if not _own_doc(getattr(so.Runtime, name))
    ]
    assert missing + methods == [], missing + methods


def test_every_table_in_the_docs_is_one_table() -> None:
    """A Markdown table ends at the first line that is not a row: rows after a paragraph that
    cuts a table show as plain text with pipes. So each run of rows starts with a header row
    and its `|---|` separator, outside code blocks."""
    cut = []
    for doc in DOCS:
        lines = (ROOT / doc).read_text().splitlines()
        fenced = False
        for i, line in enumerate(lines):
            if line.startswith("```"):
                fenced = not fenced
            starts = line.startswith("|") and not (i and lines[i - 1].startswith("|"))
            if starts and not fenced:
                following = lines[i + 1] if i + 1 < len(lines) else ""
                if not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", following):
                    cut.append((doc, i + 1, line[:60]))
    assert cut == []


def test_docs_api_lists_every_public_name_and_only_those() -> None:
    """docs/api.md's tables name each of `signoff.__all__` once, and nothing else."""
    import signoff as so

    api = (ROOT / "docs" / "api.md").read_text()
    rows = re.findall(r"^\| ((?:`[\w.]+`(?:, )?)+) \|", api, re.M)
    listed = [name for row in rows for name in re.findall(r"`([\w.]+)`", row)]
    assert sorted(listed) == sorted(set(listed)), "listed twice"
    assert sorted(listed) == sorted(so.__all__), (
        sorted(set(so.__all__) - set(listed)),
        sorted(set(listed) - set(so.__all__)),
    )


def test_every_signoff_name_the_docs_use_exists() -> None:
    """Each `so.X`, `signoff.X.Y` and `from signoff.X import Y` of the README and docs/ (text
    and code) names something the package has, so a documented name is never an AttributeError."""
    import importlib

    def resolve(dotted: str) -> object:
        parts = dotted.split(".")
        obj: object = importlib.import_module(parts[0])
        for n, part in enumerate(parts[1:], 2):
            try:
                obj = getattr(obj, part)
            except AttributeError:  # a subpackage not imported by its parent
                obj = importlib.import_module(".".join(parts[:n]))
        return obj

    # The `signoff.*` span attributes and events the tracing docs name are the ones it sets.
    tracing = (ROOT / "src" / "signoff" / "_tracing.py").read_text()
    traced = set(re.findall(r"\"(signoff\.[a-z_.]+)\"", tracing))
    # So are the loggers the docs name in a sample log line (`signoff.worker: claimed ...`).
    sources = "".join(p.read_text() for p in (ROOT / "src" / "signoff").rglob("*.py"))
    traced |= set(re.findall(r"getLogger\(\"(signoff\.[a-z_.]+)\"\)", sources))
    checked = 0
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        names = {f"signoff.{n}" for n in re.findall(r"\bso\.([A-Za-z_][\w.]*\w)", text)}
        names |= {f"signoff.{n}" for n in re.findall(r"\bsignoff\.([a-z_][\w.]*\w)", text)}
        for module, imported in re.findall(r"from (signoff[\w.]*) import ([\w, ]+)", text):
            names |= {f"{module}.{n.strip()}" for n in imported.split(",")}
        for name in sorted(names - traced):
            try:
                resolve(name)
            except (AttributeError, ImportError) as exc:
                raise AssertionError(f"{doc} names {name}, which does not exist") from exc
            checked += 1
    assert checked >= 40, checked


def _slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_every_relative_link_and_path_the_docs_name_resolves() -> None:
    """Each relative Markdown link (and its `#anchor`) of the README and docs/ leads to a file
    and heading that exist, and each repository path they name in code spans (`docs/api.md`,
    `tests/test_fuzz.py`, `scripts/`), script they run (`./scripts/demo`) and module they run
    (`python -m bench.overhead`) is there, so a reader following one is not lost."""
    prefixes = ("docs/", "bench/", "tests/", "examples/", "src/", "scripts/")
    checked = 0
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+:", target):
                continue  # http(s): and mailto: links leave the repository
            path, _, anchor = target.partition("#")
            file = (ROOT / doc).parent / path if path else ROOT / doc
            assert file.exists(), (doc, target)
            if anchor:
                headings = re.findall(r"^#+ (.+)$", file.read_text(), re.M)
                assert anchor in {_slug(h) for h in headings}, (doc, target)
            checked += 1
        for path in re.findall(r"`([\w./-]+)`", prose):
            if path.startswith(prefixes):
                assert (ROOT / path).exists(), (doc, path)
                checked += 1
        for script in re.findall(r"(?<![\w/])\./(scripts/[\w.-]+)", text):  # ./scripts/demo
            assert (ROOT / script).is_file(), (doc, script)
            checked += 1
        for module in re.findall(r"python -m ([\w.]+)", text):  # bench.overhead, signoff
            path = ROOT / "src" / module if module == "signoff" else ROOT / module.replace(".", "/")
            assert path.with_suffix(".py").is_file() or (path / "__main__.py").is_file(), module
            checked += 1
    assert checked >= 15, checked


def test_the_drawn_hierarchy_names_every_error_signoff_raises() -> None:
    """The README sends readers to `src/signoff/_exceptions.py` for the hierarchy of errors:
    it draws every `SignoffError` subclass the package defines, under its real base."""
    import importlib

    import signoff as so

    drawing = (so._exceptions.__doc__ or "").split("\n\n")[1]
    depth = {}
    for line in drawing.splitlines():
        found = re.match(r"^([ │├└─]*)([A-Z]\w+)", line.strip("\n"))
        if found:
            depth[found.group(2)] = len(found.group(1))
    defined: dict[str, type] = {}
    for path in sorted((ROOT / "src" / "signoff").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT / "src").with_suffix("").parts)
        if "class " not in path.read_text() or module.endswith("__main__"):
            continue
        for obj in vars(importlib.import_module(module.removesuffix(".__init__"))).values():
            if isinstance(obj, type) and issubclass(obj, so.SignoffError):
                defined[obj.__name__] = obj
    assert sorted(defined) == sorted(depth), (
        sorted(set(defined) - set(depth)),
        sorted(set(depth) - set(defined)),
    )
    names = list(depth)
    for n, name in enumerate(names[1:], 1):
        # the class's base is the nearest line above drawn less deep
        base = next(b for b in reversed(names[:n]) if depth[b] < depth[name])
        assert defined[name].__bases__ == (defined[base],), (name, base)


def test_every_class_name_the_docs_use_exists() -> None:
    """Each CamelCase name in a code span of the README's and docs/' prose (`ConflictingAnswer`,
    `TerminalTextChannel`) is a class or type the package defines, or one of the few outside
    names the docs mention, so a misspelt exception is not caught by an `except` that never
    matches."""
    source = "".join(p.read_text() for p in (ROOT / "src" / "signoff").rglob("*.py"))
    defined = set(re.findall(r"^\s*class (\w+)", source, re.M))
    defined |= set(re.findall(r"^([A-Z]\w*)(?: *:[^=\n]*)? *=", source, re.M))  # type aliases
    outside = {"ValidationError", "KeyboardInterrupt", "SystemExit", "EventSource"}
    outside |= {"HttpOnly", "SameSite"}  # cookie attributes
    outside |= {"SecretStr", "SecretBytes"}  # pydantic's
    outside |= {"CancelledError"}  # asyncio's
    outside |= {"RuntimeError", "ExceptionGroup", "TaskGroup", "ImportError"}  # Python's
    outside |= {"AsyncRateLimitErrorRetryHandler"}  # slack_sdk's
    checked = 0
    for doc in DOCS:
        prose = re.sub(r"```.*?```", "", (ROOT / doc).read_text(), flags=re.S)
        for name in set(re.findall(r"`([A-Z][a-z0-9]+[A-Z][a-z]\w*)\b[^`]*`", prose)):
            assert name in defined | outside, (doc, name)
            checked += 1
    assert checked >= 40, checked


def test_the_defaults_the_docs_state_are_the_code_s() -> None:
    """Each default the docs state in numbers is the one the code has, so a changed default
    fails here, naming the sentence to update."""
    import inspect

    import signoff as so
    from signoff import _idempotency, stores
    from signoff._ask import MAX_QUESTION_CHARS
    from signoff._tool_context import MAX_STEP_NAME_CHARS
    from signoff._types import MAX_OPTIONS
    from signoff.channels import WebhookChannel, verify_webhook
    from signoff.channels.slack import _channel as slack_channel
    from signoff.server import AsyncClient, Client, create_app
    from signoff.server._serve import DEFAULT_WORKERS
    from signoff.stores._prompt import REQUEST_WAIT
    from signoff.stores.postgres._borrowed import OPERATION_TIMEOUT
    from signoff.stores.postgres._outage import GRACE

    def d(fn: Any, name: str) -> Any:
        return inspect.signature(fn).parameters[name].default

    mib, readme, server = 1 << 20, "README.md", "docs/server.md"
    stated = [
        (readme, "`Limits(max_result_bytes=)` (1 MiB", d(so.Limits, "max_result_bytes"), mib),
        (readme, "`Limits(max_response_bytes=)` (1 MiB)", d(so.Limits, "max_response_bytes"), mib),
        (
            readme,
            "`Limits(max_calls_per_response=)` (128;",
            d(so.Limits, "max_calls_per_response"),
            128,
        ),
        (readme, "`so.MAX_TEXT_BYTES` (4 MiB", so.MAX_TEXT_BYTES, 4 * mib),
        (readme, "a question of more than 1,000 options", MAX_OPTIONS, 1000),
        (readme, "a question over 2,000 characters", MAX_QUESTION_CHARS, 2000),
        (readme, "a step name over 1,000 characters", MAX_STEP_NAME_CHARS, 1000),
        (readme, "up to four calls and 30 s of waiting", slack_channel.NOTE_TRIES, 4),
        (readme, "up to four calls and 30 s of waiting", slack_channel.NOTE_WAIT, 30),
        (readme, "tried again every 30 s with a warning", slack_channel.ABSENT_WAIT, 30),
        (
            "docs/events.md",
            "`name` (1,000 characters at most)",
            MAX_STEP_NAME_CHARS,
            1000,
        ),
        (readme, "`signoff.stores.READ_BYTES` (4 MiB)", stores.READ_BYTES, 4 * mib),
        (readme, "a session remembers its last 32 keys", _idempotency.KEPT, 32),
        (readme, "`?outage_grace=` seconds of an outage (10 by default)", GRACE, 10),
        (readme, "`?operation_timeout=` seconds (30 by default", OPERATION_TIMEOUT, 30),
        (readme, "`?request_pool_timeout=` seconds (3 by default)", REQUEST_WAIT, 3),
        (readme, "`Runtime(lease_ttl=…)`, 30 s by default)", d(so.Runtime, "lease_ttl"), 30),
        (readme, "`expiring_within` seconds (300 by", d(WebhookChannel, "expiring_within"), 300),
        (readme, "the age (300 s by default)", d(verify_webhook, "tolerance"), 300),
        (server, "(`--workers N`, 4 by default;", DEFAULT_WORKERS, 4),
        (server, "`create_app(workers=N)`, 0 by default)", d(create_app, "workers"), 0),
        (server, "(max_body_size=...)`, 4 MiB by default", d(create_app, "max_body_size"), 4 * mib),
        (server, "12 hours by default", d(create_app, "sign_in_lifetime"), 12 * 3600),
        (
            server,
            "(max_streams=...)` streams open at once in a server process, 100 by default",
            d(create_app, "max_streams"),
            100,
        ),
        (server, "the server's `heartbeat` (15 s)", d(create_app, "heartbeat"), 15),
        (server, "`timeout`, 60 s by default", d(Client, "timeout"), 60),
        (server, "`timeout`, 60 s by default", d(AsyncClient, "timeout"), 60),
        (server, "`retries` failures in a row (5 by default", d(AsyncClient.events, "retries"), 5),
    ]
    for model in (so.models.OpenAIChat, so.models.Anthropic):
        stated += [
            (readme, "(`max_retries=2`)", d(model, "max_retries"), 2),
            (readme, "`timeout=120`", d(model, "timeout"), 120),
            (readme, "`max_reply_bytes` (16 MiB", d(model, "max_reply_bytes"), 16 * mib),
        ]
    texts = {doc: " ".join((ROOT / doc).read_text().split()) for doc in DOCS}
    for doc, sentence, actual, documented in stated:
        assert sentence in texts[doc], (doc, sentence)
        assert actual == documented, (doc, sentence, actual)
    assert f"`SIGNOFF_STORE` (default `{stores.DEFAULT_URL}`)" in texts[readme]


def channel_figures() -> list[tuple[str, str, Any, Any]]:
    """The README's figures of the channel hub, its state file and the Slack channel."""
    import inspect

    from signoff.channels import ChannelHub, _given_up, _hub_stop, _state
    from signoff.channels.slack import _blocks, _channel, _identity, _inbox, _replies

    hub = inspect.signature(ChannelHub).parameters
    state = inspect.signature(_state.ChannelState).parameters
    readme = "README.md"
    return [
        (readme, "within a poll (half a second)", hub["poll_interval"].default, 0.5),
        (readme, "a write waits up to five seconds", state["busy_timeout"].default, 5),
        (readme, "(up to ten seconds)", _hub_stop.STOP_GRACE, 10),
        (readme, "delivered again once a minute while the hub runs", _given_up.REDO_EVERY, 60),
        (readme, "sent again once a minute while the hub runs", _given_up.REDO_EVERY, 60),
        (readme, "is clipped to 3,000 characters", _blocks._MAX_TEXT, 3000),
        (readme, "over 100 options in groups", _blocks._MAX_OPTIONS, 100),
        (readme, "takes replies for seven days", _replies.KEEP_THREADS, 7 * 86400),
        (readme, "left for ten minutes by another process", _inbox.RESUME_AFTER, 600),
        (readme, "given two seconds, well inside Slack's three", _inbox.ACK_WITHIN, 2),
        (readme, "five-minute window", _channel.TOLERANCE, 300),
        (readme, "each `users.info` answer is kept five minutes", _identity.CACHE_FOR, 300),
        (readme, "kept five minutes, 1,000 users at most", _identity.CACHED_USERS, 1000),
        (readme, "both taking more than ten seconds", _identity.LOOKUP_WITHIN, 10),
    ]


def test_the_limits_and_waits_the_docs_quote_are_the_code_s() -> None:
    """Each bound and wait the docs quote in numbers beyond the defaults above (the server's
    probes, throttle and clipping, the client's reply bound, tracing's cut, the runtime's
    limits and graces) is the code's, so a changed constant fails here, naming the sentence."""
    import signoff as so
    from signoff import (
        _answering,
        _candidates,
        _closing,
        _idempotency,
        _leasing,
        _recording,
        _subagents,
        _tool_context,
        _tool_json,
        _tracing,
        _types,
    )
    from signoff import _async_client as client
    from signoff.server import _health, _login, _metrics, _pages, _serve, _throttle

    server, readme = "docs/server.md", "README.md"
    kib, mib = 1 << 10, 1 << 20
    work = inspect.signature(so.Runtime.work)
    stated = [
        (
            server,
            "one indexed read (a session that does not exist: nothing is written) within 2 s",
            _health.READY_TIMEOUT,
            2,
        ),
        (server, "a few indexed queries per scrape, given 2 s", _metrics.STORE_TIMEOUT, 2),
        (server, "longer than 10,000 characters (as JSON) is shown clipped", _pages.CLIP, 10_000),
        (server, "30 days past the sign-in's lifetime", _login._REMEMBERED, 30 * 86400),
        (server, "An address that failed 10 times in 60 s", _throttle.PER_CLIENT, 10),
        (server, "An address that failed 10 times in 60 s", _throttle.WINDOW, 60),
        (server, "all addresses together failed 100 times in 60 s", _throttle.OVERALL, 100),
        (server, "for at most 10 000 addresses", _throttle.MAX_CLIENTS, 10_000),
        (server, "Bloom filter (128 KiB)", _throttle._FORGOTTEN_BITS // 8, 128 * kib),
        (server, "**`max_reply_bytes`** (64 MiB)", client.DEFAULT_MAX_REPLY_BYTES, 64 * mib),
        (server, "drops such connections 2 s after it begins to stop", _serve.STALLED_GRACE, 2),
        ("docs/tracing.md", "cut past 16,384 characters", _tracing._TEXT_MAX, 16_384),
        ("docs/subagents.md", "nests at most 8 deep", _subagents.MAX_DEPTH, 8),
        (readme, "`SIGNOFF_KEEP_ALIVE_TIMEOUT`, 5 by default)", _serve.KEEP_ALIVE_TIMEOUT, 5),
        (readme, "nests deeper than 100 levels", _tool_json.MAX_INPUT_DEPTH, 100),
        (readme, "lists its first 20 errors", _recording.SHOWN_ERRORS, 20),
        (readme, "One call answers at most 1,000 requests", _answering.MAX_ANSWERS, 1000),
        (readme, "up to 2 s after the last one did", _tool_context.REPLAY_GRACE, 2),
        (readme, "the policy's timeout and 5 s more", _candidates.RECOVERY_GRACE, 5),
        (readme, "once its measurement is a minute old", _leasing.CLOCK_CHECK_EVERY, 60),
        (readme, "tried again 10 s later", _leasing.CLOCK_RETRY, 10),
        (readme, "waited for half a second as the worker exits", _closing.ANSWER_WAIT, 0.5),
        (readme, "(every 5 s by default)", work.parameters["sweep_every"].default, 5),
        (
            readme,
            "`max_steps` (50)",
            inspect.signature(so.Limits).parameters["max_steps"].default,
            50,
        ),
        (readme, "1 to 200 printable ASCII characters", _idempotency.MAX_KEY, 200),
        (readme, "from 0.1 s to 86400 s (a day)", _leasing.LEASE_TTL_MIN, 0.1),
        (readme, "from 0.1 s to 86400 s (a day)", _leasing.LEASE_TTL_MAX, 86400),
        (readme, "more than 2**53 - 1 input", _types.MAX_REPLY_TOKENS, 2**53 - 1),
        (readme, "a cost over 1e18 USD", _types.MAX_REPLY_COST_USD, 1e18),
    ]
    stated += channel_figures()
    texts = {doc: " ".join((ROOT / doc).read_text().split()) for doc in DOCS}
    for doc, sentence, actual, documented in stated:
        assert sentence in texts[doc], (doc, sentence)
        assert actual == documented, (doc, sentence, actual)


def test_every_event_type_the_docs_name_is_one_signoff_writes() -> None:
    """Each `session.*`, `turn.*`, `model.*`, `tool.*`, `input.*` and `approval.*` the docs name
    is an event type of the log, and each `request.*` a webhook event or a request's field, so
    a consumer filtering on a documented type gets events."""
    import signoff as so
    from signoff._events import EVENT_TYPES

    channels = ROOT / "src/signoff/channels"
    modules = [channels / "webhooks.py", *sorted(channels.glob("_webhook_*.py"))]
    webhooks = "".join(m.read_text() for m in modules)
    sent = set(re.findall(r"(?:enqueue|payload)\(\"(request\.\w+)\"", webhooks))
    fields = {f"request.{name}" for name in so.InputRequest.model_fields}
    assert {"request.opened", "request.escalated", "request.resolved", "request.expiring"} <= sent
    named: set[str] = set()
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        kinds = "session|turn|model|tool|input|approval|request"
        named |= set(re.findall(rf"`((?:{kinds})\.\w+)`", text))
    events = {n for n in named if not n.startswith("request.")}
    assert len(events) >= 8 and events - EVENT_TYPES == set(), sorted(events - EVENT_TYPES)
    requests = named - events
    assert requests - sent - fields == set(), sorted(requests - sent - fields)


def test_every_gen_ai_attribute_the_tracing_docs_name_is_one_signoff_sets() -> None:
    """The `gen_ai.*` span attributes docs/tracing.md lists are ones the tracing code sets (the
    `signoff.*` ones are checked with the other names above)."""
    source = (ROOT / "src" / "signoff" / "_tracing.py").read_text()
    set_ = set(re.findall(r"\"(gen_ai\.[a-z_.]+)\"", source))
    named = set(re.findall(r"`(gen_ai\.[a-z_.]+)`", blocks_text("tracing")))
    assert len(named) >= 10 and named - set_ == set(), sorted(named - set_)


def test_every_variable_that_picks_a_model_is_named_where_the_readme_says_how() -> None:
    """Each environment variable `so.models.from_env` reads is named in the README's quick start
    (the example agent) and its list of models (the quick start left out `OPENAI_BASE_URL`)."""
    source = (ROOT / "src" / "signoff" / "models" / "_from_env.py").read_text()
    read = set(re.findall(r"env\.get\(\"([A-Z_]+)\"", source))
    assert read == {"SIGNOFF_MODEL", "OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY"}
    readme = (ROOT / "README.md").read_text()
    for start, end in [("## Quick start", "```bash\n./scripts/test "), ("- Models:", "- Stores:")]:
        part = readme[readme.index(start) :]
        part = part[: part.index(end)]
        assert {v for v in read if f"`{v}`" not in part} == set(), start


def test_the_readme_says_which_model_from_env_picks_and_how_signoff_model_names_one() -> None:
    """The README told which variables `from_env` reads but not what `SIGNOFF_MODEL` holds nor
    which model a bare API key picks: a reader could not set either. What it says now is what
    `from_env` does, and the default models it names are the code's."""
    import signoff as so
    from signoff.models._from_env import DEFAULT_ANTHROPIC_MODEL, DEFAULT_OPENAI_MODEL

    readme = " ".join((ROOT / "README.md").read_text().split())
    for said in (
        "`SIGNOFF_MODEL` names the model as `openai:NAME`, `anthropic:NAME` or a bare name "
        "(`claude-*` goes to Anthropic, any other to the OpenAI-compatible endpoint, such as "
        "`SIGNOFF_MODEL=qwen3:8b`",
        f"`ANTHROPIC_API_KEY` picks Anthropic's `{DEFAULT_ANTHROPIC_MODEL}`, else "
        f"`OPENAI_API_KEY` or `OPENAI_BASE_URL` picks `{DEFAULT_OPENAI_MODEL}`, else "
        "`from_env(fallback=...)` is used (without one, a `UsageError`)",
    ):
        assert said in readme, said
    local = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "x"}
    both = {**local, "ANTHROPIC_API_KEY": "y"}
    picked = [
        ({**both, "SIGNOFF_MODEL": "openai:gpt-x"}, so.models.OpenAIChat, "gpt-x"),
        ({**both, "SIGNOFF_MODEL": "anthropic:claude-x"}, so.models.Anthropic, "claude-x"),
        ({**both, "SIGNOFF_MODEL": "claude-y"}, so.models.Anthropic, "claude-y"),
        ({**both, "SIGNOFF_MODEL": "qwen3:8b"}, so.models.OpenAIChat, "qwen3:8b"),
        (both, so.models.Anthropic, DEFAULT_ANTHROPIC_MODEL),
        (local, so.models.OpenAIChat, DEFAULT_OPENAI_MODEL),
        ({"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}, so.models.OpenAIChat, DEFAULT_OPENAI_MODEL),
    ]
    for env, kind, name in picked:
        model = so.models.from_env(env=env)
        assert isinstance(model, kind) and getattr(model, "model", None) == name, (env, model)
    fallback = so.models.Scripted([])
    assert so.models.from_env(fallback, env={}) is fallback
    with pytest.raises(so.UsageError):
        so.models.from_env(env={})


def test_every_span_attribute_and_event_signoff_sets_is_in_the_tracing_docs() -> None:
    """The other way round: each `gen_ai.*` and `signoff.*` name the tracing code sets (an
    attribute, a span event or its attribute) is in docs/tracing.md, so a trace query written
    from the page finds everything (`signoff.turn.retryable` was not there)."""
    source = (ROOT / "src" / "signoff" / "_tracing.py").read_text()
    set_ = set(re.findall(r"\"((?:gen_ai|signoff)\.[a-z_.]+)\"", source))
    named = set(re.findall(r"`((?:gen_ai|signoff)\.[a-z_.]+)`", blocks_text("tracing")))
    assert len(set_) >= 20 and set_ - named == set(), sorted(set_ - named)


def test_every_keyword_the_docs_pass_to_a_signoff_call_is_one_it_takes() -> None:
    """`create_app(max_streams=...)`, `so.always(approvers=2)`, `rt.sessions(agent=...)`: each
    keyword the docs' prose and examples pass to one of signoff's calls is a parameter (or a
    field) of it, so a setting copied from the docs is not refused as unexpected."""
    import signoff as so
    from signoff.channels import ChannelHub, WebhookChannel, verify_webhook
    from signoff.channels.slack import SlackChannel
    from signoff.server import TokenAuth, create_app, serve
    from signoff.stores import SQLiteStore
    from signoff.stores.postgres import PostgresStore

    rt = so.Runtime
    calls: dict[str, Any] = {
        "create_app": create_app,
        "serve": serve,
        "Client": so.Client,
        "AsyncClient": so.AsyncClient,
        "ChannelHub": ChannelHub,
        "WebhookChannel": WebhookChannel,
        "SlackChannel": SlackChannel,
        "SQLiteStore": SQLiteStore,
        "PostgresStore": PostgresStore,
        "TokenAuth": TokenAuth,
        "verify_webhook": verify_webhook,
        "Runtime": rt,
        "Limits": so.Limits,
        "Agent": so.Agent,
        "Principal": so.Principal,
        "InputResponse": so.InputResponse,
        "Decision": so.Decision,
        "ApprovalSpec": so.ApprovalSpec,
        "tool": so.tool,
        "always": so.always,
        "once": so.once,
        "auto": so.auto,
        "delegate": so.delegate,
        "tool_policy": so.tool_policy,
        "OpenAIChat": so.models.OpenAIChat,
        "Anthropic": so.models.Anthropic,
        "Scripted": so.models.Scripted,
        "from_env": so.models.from_env,
        "ask": so.ToolContext.ask,
        **{m: getattr(rt, m) for m in ("generate", "respond", "send", "cancel", "schedule")},
        **{
            m: getattr(rt, m)
            for m in ("create_session", "pending", "events", "work", "sessions", "audit")
        },
    }
    checked = 0
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        # a store's own methods (`Store.audit(after_id=...)`) are not the runtime's
        for name, args in re.findall(r"(?<![Ss]tore\.)\b(\w+)\(([^()`]*)\)", text):
            if name not in calls:
                continue
            params = inspect.signature(calls[name]).parameters
            taken = set(params) | set(getattr(calls[name], "model_fields", {}))
            for keyword in re.findall(r"(?:^|[,(]\s*|\s)(\w+)=", args):
                assert keyword in taken, (doc, f"{name}({args})", keyword)
                checked += 1
    assert checked >= 100, checked


def test_every_rt_r_and_ctx_attribute_the_docs_use_exists() -> None:
    """`rt.X` (a `Runtime`), `r.X` (a `GenerateResult`) and `ctx.X` (a tool's, a policy's or a
    response policy's context) in the docs name something those have: the `so.X` check above
    does not reach them."""
    import dataclasses

    import signoff as so

    def members(*classes: type) -> set[str]:
        found: set[str] = set()
        for cls in classes:
            found |= set(dir(cls)) | set(getattr(cls, "model_fields", {}))
            if dataclasses.is_dataclass(cls):
                found |= {f.name for f in dataclasses.fields(cls)}
        return found

    kinds = {
        "rt": members(so.Runtime),
        "r": members(so.GenerateResult),
        "ctx": members(so.ToolContext, so.ApprovalContext, so.ResponseContext),
    }
    checked = 0
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        for prefix, names in kinds.items():
            for name in set(re.findall(rf"(?<![\w.]){prefix}\.(\w+)", text)):
                assert name in names, (doc, f"{prefix}.{name}")
                checked += 1
    assert checked >= 40, checked


def test_every_option_of_the_public_constructors_is_documented() -> None:
    """The docs name each keyword a public constructor takes (`name=`, `` `name` ``,
    `.name` or `name:`): `ChannelHub(max_attempts=, retry_backoff=)`, `WebhookChannel(
    backoff=, sleep=)`, `OpenAIChat(temperature=)`, both models' `params=`, `TerminalChannel(
    console=)`, `SlackChannel(path=)` and `Agent(instructions=, guardrails=, limits=)` were
    explained only in docstrings. A new option is documented with it."""
    import inspect
    import re

    from signoff.channels import ChannelHub, WebhookChannel
    from signoff.channels.slack import SlackChannel
    from signoff.channels.terminal import TerminalChannel
    from signoff.models import Anthropic, OpenAIChat, Scripted
    from signoff.server import create_app

    text = (ROOT / "README.md").read_text() + "".join(
        p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))
    )
    made: list[Any] = [so.Runtime, so.Agent, so.Limits, so.ApprovalSpec, so.tool, so.always]
    made += [ChannelHub, WebhookChannel, SlackChannel, TerminalChannel]
    made += [OpenAIChat, Anthropic, Scripted, create_app]
    undocumented = []
    for made_by in made:
        first, *rest = inspect.signature(made_by).parameters.values()
        for p in rest if first.kind is not first.KEYWORD_ONLY else [first, *rest]:
            if p.kind is not p.KEYWORD_ONLY and p.default is p.empty:
                continue  # what it is made of, positional: shown in every example
            if not re.search(rf"(\b{p.name}=|`{p.name}`|\.{p.name}\b|\b{p.name}: )", text):
                undocumented.append(f"{made_by.__name__}({p.name}=)")
    assert undocumented == []
