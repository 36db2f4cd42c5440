"""The HTTP API the docs describe is the server's: its routes, request and response schemas,
error codes, queue filters, the client's calls and the server extra.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ._docs import DOCS, ROOT, blocks_text


def test_the_api_table_names_the_routes_the_server_has(tmp_path: Path) -> None:
    """Every `METHOD /v1/...` docs/server.md names is a route of the app, and the table lists
    every route of the API."""
    import signoff as so
    from signoff.server import create_app

    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/state.db")
    paths = create_app(rt, dev=True).openapi()["paths"]
    served = {
        (method.upper(), re.sub(r"\{\w+\}", "{id}", path))
        for path, ops in paths.items()
        for method in ops
    }
    named = set(re.findall(r"`(GET|POST|PUT|PATCH|DELETE) (/v1/[^`?]*)`", blocks_text("server")))
    assert named == served, (sorted(named - served), sorted(served - named))


def test_the_client_calls_are_the_ones_docs_server_md_names(tmp_path: Path) -> None:
    """docs/server.md: `Client` has the calls it lists with `AsyncClient`'s parameters (its
    `events` without following), `session()` is `AsyncClient`'s only, turn calls return the
    runtime's types, and `pending()` / `sessions()` / `state()` return a page with its total (twice)
    and a dict."""
    import inspect

    import examples.support as support

    import signoff as so
    from signoff.server import AsyncClient, Client, create_app

    from .test_server_common import running

    text = " ".join(blocks_text("server").split())
    calls = ["generate", "send", "respond", "cancel", "state", "pending", "sessions", "events"]
    assert f"(`{'`, `'.join(calls)}`, which returns the events so far" in text
    for name in calls:
        sync = inspect.signature(getattr(Client, name)).parameters
        async_ = dict(inspect.signature(getattr(AsyncClient, name)).parameters)
        if name == "events":
            del async_["follow"]  # `retries` it takes too
        assert list(sync) == list(async_), name
    assert hasattr(AsyncClient, "session") and not hasattr(Client, "session")
    arguments = ["base_url", "token", "timeout", "transport", "max_reply_bytes", "verify"]
    for cls in (Client, AsyncClient):
        assert list(inspect.signature(cls).parameters) == arguments
    assert f"Both take the same arguments (`{'`, `'.join(arguments)}`;" in text
    assert '`(requests, total)` (50 a page, `status="pending"` by default' in text
    assert "`(summaries, total)` (`so.stores.SessionSummary`s" in text

    demo = so.Agent(
        name="support",
        model=so.models.Scripted([support.demo_model], repeat_last=True),
        tools=list(support.agent.tools.values()),
    )
    rt = so.Runtime([demo], store=f"sqlite:///{tmp_path}/s.db")
    with running(create_app(rt, dev=True)) as base, Client(base) as c:
        r = c.generate("support", "refund order 1042, it arrived broken")
        assert r.status == "waiting" and isinstance(r.pending[0], so.InputRequest)
        page, total = c.pending()
        assert ([p.id for p in page], total) == ([r.pending[0].id], 1)
        state = c.state(r.session_id)
        assert isinstance(state, dict) and state["status"] == "waiting"
        summaries, total = c.sessions()
        assert total == 1 and isinstance(summaries[0], so.stores.SessionSummary)
        assert summaries[0].id == r.session_id and summaries[0].status == "waiting"
        done = c.respond(r.session_id, [{"request_id": r.pending[0].id, "option_id": "approve"}])
        assert done.status == "completed" and isinstance(done.outcomes[0], so.Outcome)
    rt.close_sync()


def _error_table() -> set[tuple[int, str]]:
    """The (status, code) pairs of docs/server.md's error table."""
    table = blocks_text("server").split("### Errors", 1)[1].split("\n### ", 1)[0]
    pairs = set()
    for status, codes in re.findall(r"^\| (\d{3}) \| (.*) \|$", table, re.M):
        # a code is the first span of the cell or one after a comma or semicolon
        found = re.findall(r"(?:^|[,;] |, and |, also |also )`([a-z_]+)`", codes)
        pairs |= {(int(status), code) for code in found}
    return pairs


def test_the_error_table_lists_every_code_the_server_sends_and_only_those() -> None:
    """docs/server.md's error table names each (status, code) the API can answer with: the
    codes of the errors the runtime raises (by `status_for`) and the ones the server's routes
    write themselves; and every `NNN code` the docs' prose names is one of those, so a client
    written against the docs handles what it gets."""
    from signoff import _exceptions
    from signoff.server._errors import ERROR_RESPONSES, status_for

    abstract = {
        _exceptions.SignoffError,  # bases, never raised as themselves
        _exceptions.SessionError,
        _exceptions.AnswerError,
        _exceptions.StepFailed,  # raised inside a tool body, which reads it
        _exceptions.RemoteError,  # the client's, not the server's
    }
    sent = {
        (status_for(cls.__new__(cls)), cls.code)  # status_for goes by the class alone
        for cls in vars(_exceptions).values()
        if isinstance(cls, type) and issubclass(cls, _exceptions.SignoffError)
        if cls not in abstract
    }
    source = "\n".join(p.read_text() for p in (ROOT / "src/signoff/server").glob("*.py"))
    written = {
        (int(status), code)
        for status, code in re.findall(r"\b([1-5]\d\d)(?:,|:)\s*\"([a-z_]+)\"", source)
        if code != "error"
    }
    dashboard = {(403, "csrf_failed"), (400, "invalid_form"), (409, "form_already_sent")}
    dashboard |= {(429, "too_many_sign_ins")}  # the sign-in form's, named in its section
    dashboard |= {(503, "shutting_down")}  # `/readyz`'s, named in its section, not the API's
    assert dashboard <= written  # the dashboard's own, named in its section, not the API's
    table = _error_table()
    assert table == (sent | written) - dashboard, (
        sorted(table - sent - written),
        sorted((sent | written) - dashboard - table),
    )
    # the OpenAPI document's error responses describe the same codes (but 405: a route is
    # never called with a method it does not have)
    described = {(405, "method_not_allowed")} | {
        (int(status), code)
        for status, response in ERROR_RESPONSES.items()
        for code in re.findall(r"`([a-z_]+)`", response["description"])
    }
    assert described == table, (sorted(described - table), sorted(table - described))
    for doc in DOCS:
        prose = " ".join((ROOT / doc).read_text().split())
        named = {(int(s), c) for s, c in re.findall(r"\b([1-5]\d\d) `([a-z_]+)`", prose)}
        assert named <= table | dashboard, (doc, sorted(named - table - dashboard))


def test_the_server_extra_is_what_the_server_checks_for() -> None:
    """`pip install 'signoff[server]'` installs the packages whose absence the server names."""
    import tomllib

    from signoff.server._extra import SERVER_EXTRA

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    named = {re.split(r"[<>=\[ ]", dep)[0] for dep in extras["server"]}
    assert named == set(SERVER_EXTRA)


def test_the_queue_s_filters_are_the_ones_the_api_takes(tmp_path: Path) -> None:
    """docs/server.md names the values `GET /v1/requests` takes for `kind` and `status`, its
    default status and its page size, as the OpenAPI document has them."""
    import signoff as so
    from signoff.server import create_app

    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/state.db")
    params = {
        p["name"]: p["schema"]
        for p in create_app(rt, dev=True).openapi()["paths"]["/v1/requests"]["get"]["parameters"]
    }
    text = " ".join(blocks_text("server").split())
    said = re.search(r"filters by `kind` \((.*?)\) and `status` \((.*?)\),", text)
    assert said, "the sentence on GET /v1/requests' filters is gone"
    kinds = re.findall(r"`([a-z-]+)`", said.group(1))
    statuses = re.findall(r"`([a-z-]+)`", said.group(2))
    assert kinds == params["kind"]["anyOf"][0]["enum"]
    assert statuses == params["status"]["enum"] and params["status"]["default"] == "pending"
    assert "`pending` by default" in said.group(2)
    limit = params["limit"]
    assert f"`limit` (1 to {limit['maximum']}, {limit['default']} by default)" in text


def test_the_api_table_s_bodies_are_the_request_schemas(tmp_path: Path) -> None:
    """The body column of docs/server.md's API table names each field a POST takes, `?` on the
    optional ones, as the OpenAPI document's request schemas have them (a list's items too), so
    a body written from the table is not refused as an unknown or missing field."""
    import signoff as so
    from signoff.server import create_app

    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/state.db")
    doc = create_app(rt, dev=True).openapi()
    schemas = doc["components"]["schemas"]

    def fields(schema: dict[str, Any]) -> set[str]:
        """`name` or `name?` for each property, with a list's items' as `name: [...]`."""
        if "$ref" in schema:
            schema = schemas[schema["$ref"].rsplit("/", 1)[1]]
        if "properties" not in schema:  # an optional body: `anyOf` it and null
            schema = next(s for s in schema["anyOf"] if s.get("type") != "null")
            return fields(schema)
        required = set(schema.get("required", []))
        found = set()
        for name, prop in schema.get("properties", {}).items():
            found.add(name if name in required else f"{name}?")
            items = prop.get("items")
            if items is not None:
                found |= {f"{name}: {inner}" for inner in fields(items)}
        return found

    def said(body: str) -> set[str]:
        """The same, read from the table's `{agent, message?}` notation."""
        body = re.sub(r': "\w+"(?:, "\w+")*', "", body.strip("`{} "))  # a value's choices
        found = set()
        for name, items in re.findall(r"(\w+\??)(?:: \[\{(.*?)\}\])?(?:,|$)", body):
            found.add(name)
            if items:
                inner = re.findall(r"(\w+\??)", items)
                found |= {f"{name.rstrip('?')}: {i}" for i in inner}
        return found

    table = blocks_text("server").split("## API", 1)[1].split("\n\n", 2)[1]
    checked = 0
    row = re.compile(r"^\| `POST (/v1/[^`]+)` \| (`[^|]*?(?:\\\|[^|]*?)*`)", re.M)
    for path, body in row.findall(table):
        schema = doc["paths"][path.replace("{id}", "{session_id}")]["post"]["requestBody"]
        documented = said(body.replace("\\|", "|").replace(" | ", ", "))
        actual = fields(schema["content"]["application/json"]["schema"])
        # a field either of two (`optionId | text`) is optional in the schema, required in words
        assert {f.rstrip("?") for f in documented} == {f.rstrip("?") for f in actual}, (
            path,
            sorted(documented),
            sorted(actual),
        )
        checked += 1
    assert checked == 7, checked


def test_the_api_table_s_response_shapes_are_the_response_schemas(tmp_path: Path) -> None:
    """A response shape the API table gives (`{items, total, limit, offset}`) names every key
    of that route's OpenAPI response schema and no other, so a client written from it reads
    the body it gets."""
    import signoff as so
    from signoff.server import create_app

    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/state.db")
    doc = create_app(rt, dev=True).openapi()
    schemas = doc["components"]["schemas"]
    table = blocks_text("server").split("## API", 1)[1].split("\n\n", 2)[1]
    row = re.compile(r"^\| `GET (/v1/[^`]+)` \|[^|]*\| [^|]*?`\{([\w, ]+)\}`", re.M)
    checked = 0
    for path, shape in row.findall(table):
        route = path.replace("/requests/{id}", "/requests/{request_id}")
        responses = doc["paths"][route.replace("{id}", "{session_id}")]["get"]["responses"]
        ref = responses["200"]["content"]["application/json"]["schema"]["$ref"]
        properties = schemas[ref.rsplit("/", 1)[1]]["properties"]
        assert shape.split(", ") == list(properties), (path, shape, list(properties))
        checked += 1
    assert checked == 3, checked


async def test_the_metrics_table_is_what_a_scrape_serves(tmp_path: Path) -> None:
    """docs/server.md's table of metrics names each `signoff_*` family a scrape serves, with its
    type and labels, and no other, so a dashboard built from the page finds its series."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    import signoff as so
    from signoff.server import TokenAuth, create_app

    documented: dict[str, tuple[set[str], str]] = {}
    for name, labels, kind in re.findall(
        r"^\| `(signoff_\w+)(?:\{([\w,]+)\})?` \| (\w+) \|", blocks_text("server"), re.M
    ):
        documented[name] = (set(labels.split(",")) - {""}, kind)
    assert len(documented) >= 8
    agent = so.Agent(name="a", model=so.models.Scripted([so.ModelResponse(text="hi")]))
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db")
    admin = {"Authorization": "Bearer admin-token"}
    app = create_app(
        runtime,
        auth=TokenAuth(
            {
                "admin-token": so.Principal(
                    authenticator="token", principal_id="root", attributes={"admin": True}
                )
            }
        ),
        sweep_every=None,
        close_runtime=True,
        metrics=True,
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
    ):
        r = await c.post("/v1/sessions", json={"agent": "a", "message": "hi"}, headers=admin)
        assert r.status_code in (200, 201), r.text
        answer = {"inputResponses": [{"requestId": "req_x", "optionId": "approve"}]}
        refused = await c.post("/v1/sessions/ses_x/responses", json=answer, headers=admin)
        assert refused.status_code == 404, refused.text
        scraped = await c.get("/metrics", headers=admin)
        assert scraped.status_code == 200, scraped.text
    served: dict[str, tuple[set[str], str]] = {}
    for family in text_string_to_metric_families(scraped.text):
        # `*_created` is prometheus_client's own series beside each counter and histogram
        if family.name.startswith("signoff_") and not family.name.endswith("_created"):
            labels = {k for s in family.samples for k in s.labels} - {"le"}
            name = family.name + ("_total" if family.type == "counter" else "")
            served[name] = (labels, family.type)
    assert set(served) == set(documented)
    for name, (labels, kind) in served.items():
        assert documented[name][1] == kind, name
        assert labels <= documented[name][0], (name, labels)


def test_the_hosts_the_api_docs_page_loads_from_are_named(tmp_path: Path) -> None:
    """`/v1/docs` is FastAPI's Swagger UI, whose assets come from a CDN: on a machine that
    cannot reach it (an offline or locked-down one) the page is blank. docs/server.md names
    every host its scripts and stylesheets load from, and the document that works without."""
    import httpx

    import signoff as so
    from signoff.server import create_app

    from .test_server_common import running

    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/state.db")
    with running(create_app(rt, dev=True)) as base:
        page = httpx.get(f"{base}/v1/docs").text
    assets = re.findall(r"<script[^>]+src=['\"]([^'\"]+)|<link[^>]+href=['\"]([^'\"]+\.css)", page)
    hosts = {re.sub(r"^https?://([^/]+)/.*", r"\1", a or b) for a, b in assets}
    assert hosts, page
    text = " ".join(blocks_text("server").split())
    for host in hosts:
        assert f"`{host}`" in text, host
    assert "the page stays blank, and `/v1/openapi.json` is the same document" in text
