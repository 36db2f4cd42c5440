"""`GET /metrics` (`create_app(metrics=True)`, the `metrics` extra): off unless asked for; for an
admin or the scrape token only; Prometheus text that parses, with counters that follow real
calls, labelled by route template and never by an id; a store that does not answer is
`signoff_store_up 0` in a scrape that still succeeds; a missing `prometheus_client` is named
with its install line when the app is made."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import signoff as so
from signoff.server import TokenAuth, _metrics, create_app

from ._cli import invoke, refused_usage
from .test_server_common import PLAIN, TOKENS, auth, make_agents, running

ADMIN = auth("admin-token")
SCRAPE = "scrape-s3cret"


@asynccontextmanager
async def metered(url: str, **kwargs: Any) -> AsyncIterator[tuple[so.Runtime, httpx.AsyncClient]]:
    """A running app with metrics on the store at `url`, and a client sending no credentials."""
    runtime = so.Runtime(make_agents(), store=url)
    kwargs.setdefault("auth", TokenAuth(TOKENS))
    app = create_app(
        runtime,
        sweep_every=None,
        close_runtime=True,
        metrics=True,
        **kwargs,
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
    ):
        yield runtime, c


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Each sample of a scrape by name and labels (sorted), as Prometheus parses it."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def scrape(c: httpx.AsyncClient, headers: dict[str, str] = ADMIN) -> dict[Any, float]:
    r = await c.get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=")
    return samples(r.text)


def requests_of(found: dict[Any, float], method: str, route: str, status: str) -> float:
    key = (
        "signoff_http_requests_total",
        (("method", method), ("route", route), ("status", status)),
    )
    return found.get(key, 0.0)


async def test_off_by_default_and_nothing_of_it_runs(tmp_path: Path) -> None:
    runtime = so.Runtime(make_agents(), store=f"sqlite:///{tmp_path}/s.db")
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True)
    assert not hasattr(app.state, "signoff_metrics")
    assert "Observed" not in [getattr(m.cls, "__name__", "") for m in app.user_middleware]
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
    ):
        r = await c.get("/metrics", headers=ADMIN)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


async def test_under_an_apps_own_access_rule_only_the_scrape_token_may_scrape(
    tmp_path: Path,
) -> None:
    """The admin flag grants nothing under an app's own rule (their queue shows their own
    tenant's only), yet `/metrics` served them every tenant's counts; `/v1/prune` refused."""

    def own_only(caller: so.Principal, initiator: so.Principal | None) -> bool:
        return initiator is not None and caller.same_as(initiator)

    async with metered(f"sqlite:///{tmp_path}/s.db", metrics_token=SCRAPE, access=own_only) as (
        _,
        c,
    ):
        r = await c.get("/metrics", headers=ADMIN)
        assert (r.status_code, r.json()["error"]["code"]) == (403, "admin_only")
        await scrape(c, auth(SCRAPE))
    runtime = so.Runtime(make_agents(), store=f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(so.UsageError, match="app's own access rule need a metrics_token"):
        create_app(runtime, auth=TokenAuth(TOKENS), metrics=True, access=own_only)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"metrics": "yes"}, "metrics must be True or False"),
        ({"metrics_token": SCRAPE}, "metrics_token is given but metrics is off"),
        ({"metrics": True, "metrics_token": ""}, "metrics_token must be a non-empty string"),
        ({"metrics": True, "metrics_token": " x "}, "not printable ASCII without spaces"),
        ({"metrics": True, "metrics_token": "admin-token"}, "also an API token"),
    ],
)
def test_bad_settings_are_refused_when_the_app_is_made(
    kwargs: dict[str, Any], message: str, tmp_path: Path
) -> None:
    runtime = so.Runtime(make_agents(), store=f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(so.UsageError, match=message) as caught:
        create_app(runtime, auth=TokenAuth(TOKENS), **kwargs)
    assert "admin-token" not in str(caught.value)  # a token is never shown


async def test_only_an_admin_or_the_scrape_token_may_scrape(store_url: str) -> None:
    async with metered(store_url, metrics_token=SCRAPE) as (_, c):
        r = await c.get("/metrics")
        assert (r.status_code, r.json()["error"]["code"]) == (401, "unauthenticated")
        r = await c.get("/metrics", headers=auth("alice-token"))
        assert (r.status_code, r.json()["error"]["code"]) == (403, "admin_only")
        r = await c.get("/metrics", headers=auth("not-a-token"))
        assert r.status_code == 401
        two = [("Authorization", f"Bearer {SCRAPE}"), ("Authorization", "Bearer admin-token")]
        r = await c.get("/metrics", headers=httpx.Headers(two))
        assert (r.status_code, r.json()["error"]["code"]) == (401, "unauthenticated")
        await scrape(c, ADMIN)
        await scrape(c, auth(SCRAPE))
        head = await c.head("/metrics", headers=auth(SCRAPE))
        assert (head.status_code, head.content) == (200, b"")
        # The scrape token opens /metrics and nothing else.
        r = await c.get("/v1/sessions", headers=auth(SCRAPE))
        assert (r.status_code, r.json()["error"]["code"]) == (401, "unauthenticated")
        spec = (await c.get("/v1/openapi.json")).json()
        assert "/metrics" not in spec["paths"]


async def test_a_guessed_scrape_token_is_throttled_as_any_guess(tmp_path: Path) -> None:
    async with metered(f"sqlite:///{tmp_path}/s.db", metrics_token=SCRAPE) as (_, c):
        codes = [
            (await c.get("/metrics", headers=auth(f"guess-{n}"))).status_code for n in range(40)
        ]
        assert codes[0] == 401 and codes[-1] == 429
        r = await c.get("/metrics", headers=auth(SCRAPE))  # the right one waits its turn too
        assert (r.status_code, r.json()["error"]["code"]) == (429, "too_many_failures")


def _proxy_auth(request: Any) -> so.Principal | None:
    """An app's own authenticator: a proxy's header names the caller; bearer tokens mean nothing."""
    user = request.headers.get("x-user")
    return None if not user else so.Principal(authenticator="proxy", principal_id=user)


async def test_a_guessed_scrape_token_is_throttled_under_an_apps_own_authenticator(
    tmp_path: Path,
) -> None:
    """Only `TokenAuth` counted a wrong token as a guess, so under an app's own authenticator
    (which never sees the scrape token) guessing it was unbounded: every guess a 401."""
    url = f"sqlite:///{tmp_path}/s.db"
    async with metered(url, metrics_token=SCRAPE, auth=_proxy_auth) as (_, c):
        codes = [
            (await c.get("/metrics", headers=auth(f"guess-{n}"))).status_code for n in range(40)
        ]
        assert codes[0] == 401 and codes[-1] == 429
        r = await c.get("/metrics", headers=auth(SCRAPE))  # the right one waits its turn too
        assert (r.status_code, r.json()["error"]["code"]) == (429, "too_many_failures")


def _proxy_admin(request: Any) -> so.Principal | None:
    """A proxy that names its user in a header and forwards a bearer of its own (an id token)."""
    user = request.headers.get("x-user")
    if not user:
        return None
    return so.Principal(authenticator="proxy", principal_id=user, attributes={"admin": True})


async def test_an_admin_behind_a_proxy_forwarding_a_bearer_is_not_throttled(
    tmp_path: Path,
) -> None:
    """The throttle was asked before the app's authenticator: after ten stale scrapes from the
    proxy's address (every client's), an admin's scrape with the proxy's forwarded bearer was
    429. The authenticator judges first; only a caller it names no one is a guess."""
    url = f"sqlite:///{tmp_path}/s.db"
    admin = {"x-user": "ops", **auth("forwarded-id-token")}
    async with metered(url, metrics_token=SCRAPE, auth=_proxy_admin) as (_, c):
        for n in range(20):
            await c.get("/metrics", headers=auth(f"guess-{n}"))
        await scrape(c, admin)


def _jwt_only(request: Any) -> so.Principal | None:
    """An app's authenticator that raises on any bearer it cannot read (every one here)."""
    if request.headers.get("authorization"):
        raise ValueError("not a JWT")
    return None


def _guest(request: Any) -> so.Principal | None:
    """An app's authenticator naming a guest when no proxy header names someone."""
    return so.Principal(authenticator="proxy", principal_id=request.headers.get("x-user", "guest"))


@pytest.mark.parametrize("app_auth", [_jwt_only, _guest], ids=["raising", "guest"])
async def test_the_scrape_token_is_not_handed_to_an_apps_own_authenticator(
    tmp_path: Path, app_auth: Any
) -> None:
    """The scrape token is compared first: handed to the app's authenticator, a scrape was a
    500 where it raised on a bearer it could not read, and a 403 where it named a guest."""
    url = f"sqlite:///{tmp_path}/s.db"
    async with metered(url, metrics_token=SCRAPE, auth=app_auth) as (_, c):
        await scrape(c, auth(SCRAPE))
        if app_auth is _jwt_only:  # it raises on these too: a 500 each, never a guess
            return
        for n in range(20):  # the guest is no admin: 403, no guess either
            await c.get("/metrics", headers=auth(f"guess-{n}"))
        await scrape(c, auth(SCRAPE))


async def test_while_held_the_scrape_token_is_refused_not_handed_to_the_authenticator(
    tmp_path: Path,
) -> None:
    """Held, the scrape token went to the app's authenticator (a 500 where it raised on it,
    the secret seen by it): it is refused 429 as a wrong token is."""
    seen: list[str] = []

    def recording(request: Any) -> so.Principal | None:
        bearer = request.headers.get("authorization", "")
        seen.append(bearer)
        if bearer.startswith("Bearer guess-"):
            return None
        raise ValueError("not a token the IdP knows the shape of")

    url = f"sqlite:///{tmp_path}/s.db"
    async with metered(url, metrics_token=SCRAPE, auth=recording) as (_, c):
        codes = [
            (await c.get("/metrics", headers=auth(f"guess-{n}"))).status_code for n in range(20)
        ]
        assert codes[0] == 401 and codes[-1] == 429
        r = await c.get("/metrics", headers=auth(SCRAPE))
        assert (r.status_code, r.json()["error"]["code"]) == (429, "too_many_failures")
    assert f"Bearer {SCRAPE}" not in seen


async def test_the_api_does_not_tell_the_scrape_token_under_an_apps_own_authenticator(
    tmp_path: Path,
) -> None:
    """The API told the scrape token from any other ("the metrics token opens /metrics only")
    with no throttle under an app's own authenticator: a free test of each guess."""
    url = f"sqlite:///{tmp_path}/s.db"
    async with metered(url, metrics_token=SCRAPE, auth=_proxy_auth) as (_, c):
        right = await c.get("/v1/sessions", headers=auth(SCRAPE))
        wrong = await c.get("/v1/sessions", headers=auth("guess"))
    assert right.status_code == wrong.status_code == 401
    assert right.json() == wrong.json()


async def test_a_scrape_with_the_token_under_an_apps_own_authenticator_is_no_guess(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    async with metered(url, metrics_token=SCRAPE, auth=_proxy_auth) as (_, c):
        for _ in range(40):
            await scrape(c, auth(SCRAPE))


async def test_the_scrape_token_sent_to_the_api_is_refused_as_such_not_as_a_guess(
    tmp_path: Path,
) -> None:
    """A scraper pointed at the wrong path was told its token is not one the server accepts,
    and each try counted as a guess: after ten the address (and every token from it, the
    scrape token on /metrics included) was held for a minute."""
    async with metered(f"sqlite:///{tmp_path}/s.db", metrics_token=SCRAPE) as (_, c):
        for _ in range(40):
            r = await c.get("/v1/sessions", headers=auth(SCRAPE))
            assert (r.status_code, r.json()["error"]["code"]) == (401, "unauthenticated")
            assert r.json()["error"]["message"].startswith("the metrics token opens /metrics only")
        await scrape(c, auth(SCRAPE))
        assert (await c.get("/v1/sessions", headers=auth("alice-token"))).status_code == 200


async def test_counters_follow_real_calls_by_route_template(store_url: str) -> None:
    async with metered(store_url) as (runtime, c):
        before = await scrape(c)
        assert before[("signoff_store_up", ())] == 1
        assert before[("signoff_open_requests", ())] == 0
        assert before[("signoff_turns_driven_total", ())] == 0
        alice = auth("alice-token")
        r = await c.post(
            "/v1/sessions", json={"agent": "support", "message": "Refund 1042"}, headers=alice
        )
        assert r.status_code == 201, r.text
        sid, rid = r.json()["session_id"], r.json()["pending"][0]["id"]
        assert (await c.get(f"/v1/sessions/{sid}", headers=alice)).status_code == 200
        assert (await c.get("/v1/sessions/ses_nope", headers=alice)).status_code == 404
        answer = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
        assert (
            await c.post(f"/v1/sessions/{sid}/responses", json=answer, headers=alice)
        ).status_code == 200
        wrong = {"inputResponses": [{"requestId": "req_nope", "optionId": "approve"}]}
        assert (
            await c.post(f"/v1/sessions/{sid}/responses", json=wrong, headers=alice)
        ).status_code == 404
        assert (await c.get(f"/v1/{sid}/nowhere", headers=alice)).status_code == 404
        waiting = await scrape(c)
        text = (await c.get("/metrics", headers=ADMIN)).text

    assert requests_of(waiting, "POST", "/v1/sessions", "2xx") == 1
    assert requests_of(waiting, "GET", "/v1/sessions/{session_id}", "2xx") == 1
    assert requests_of(waiting, "GET", "/v1/sessions/{session_id}", "4xx") == 1
    responses = "/v1/sessions/{session_id}/responses"
    assert requests_of(waiting, "POST", responses, "2xx") == 1
    assert requests_of(waiting, "POST", responses, "4xx") == 1
    assert requests_of(waiting, "GET", "unrouted", "4xx") == 1
    assert requests_of(waiting, "GET", "/metrics", "2xx") == 1  # the first scrape
    count = (
        "signoff_http_request_duration_seconds_count",
        (("method", "POST"), ("route", responses)),
    )
    assert waiting[count] == 2
    assert waiting[("signoff_turns_driven_total", ())] == 2  # parked, then completed
    assert waiting[("signoff_turns_failed_total", ())] == 0
    assert waiting[("signoff_answers_accepted_total", ())] == 1
    assert waiting[("signoff_answers_refused_total", (("code", "unknown_request"),))] == 1
    assert waiting[("signoff_open_requests", ())] == 0  # answered
    assert waiting[("signoff_event_streams_open", ())] == 0
    # Nothing names a session, a request, a principal or a tenant.
    for secret in (sid, rid, "req_nope", "ses_nope", "alice", "acme", "Refund"):
        assert secret not in text
    assert "process_cpu_seconds_total" in text  # the default process collectors


async def test_open_requests_are_the_stores_count(store_url: str) -> None:
    async with metered(store_url) as (runtime, c):
        for _ in range(2):
            await runtime.generate("batch", prompt="Refund two", auth=TOKENS["alice-token"])
        found = await scrape(c)
        assert found[("signoff_open_requests", ())] == 4
        assert found[("signoff_store_up", ())] == 1


async def test_a_store_that_fails_is_store_up_0_in_a_scrape_that_answers(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with metered(store_url) as (runtime, c):
        counted = runtime.store.count_pending

        async def down(flt: Any) -> int:
            raise so.StoreUnavailable("the database is down")

        monkeypatch.setattr(runtime.store, "count_pending", down)
        found = await scrape(c)
        assert found[("signoff_store_up", ())] == 0
        assert ("signoff_open_requests", ()) not in found  # no stale figure
        assert ("signoff_turns_driven_total", ()) in found

        timeout = _metrics.STORE_TIMEOUT
        monkeypatch.setattr(_metrics, "STORE_TIMEOUT", 0.05)

        async def stalled(flt: Any) -> int:
            await asyncio.sleep(5)
            return await counted(flt)

        monkeypatch.setattr(runtime.store, "count_pending", stalled)
        found = await scrape(c)
        assert found[("signoff_store_up", ())] == 0

        # Back to its own timeout: a loaded PostgreSQL can take more than 0.05 s to count.
        monkeypatch.setattr(_metrics, "STORE_TIMEOUT", timeout)
        monkeypatch.setattr(runtime.store, "count_pending", counted)
        found = await scrape(c)
        assert (found[("signoff_store_up", ())], found[("signoff_open_requests", ())]) == (1, 0)


async def test_a_scrape_answers_in_time_though_the_store_is_slow_to_give_up_its_call(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database host that froze: cancelling the count (psycopg then asks the server to cancel
    its query, which waits out its `connect_timeout`) held the scrape 10 s past its timeout."""
    monkeypatch.setattr(_metrics, "STORE_TIMEOUT", 0.05)
    async with metered(store_url) as (runtime, c):
        # A first scrape warms the app (0.1-1.6 s on a loaded machine), so the one timed below
        # measures the count given up, not what any first request costs.
        assert (await scrape(c))[("signoff_store_up", ())] == 1
        unwound, given_up = asyncio.Event(), asyncio.Event()

        async def frozen(flt: Any) -> int:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                await given_up.wait()  # giving up takes until the test says
                raise
            finally:
                unwound.set()
            return 0

        monkeypatch.setattr(runtime.store, "count_pending", frozen)
        began = time.monotonic()
        try:
            found = await asyncio.wait_for(scrape(c), 10)
            took = time.monotonic() - began
            assert not unwound.is_set()  # answered while the count still gives up
        finally:
            given_up.set()
        assert found[("signoff_store_up", ())] == 0
        assert took < 1.5, took  # its timeout (0.05 s), not the 2 s one it has by default
        await asyncio.wait_for(unwound.wait(), 10)


async def test_each_app_has_its_own_registry(tmp_path: Path) -> None:
    async with (
        metered(f"sqlite:///{tmp_path}/a.db") as (_, a),
        metered(f"sqlite:///{tmp_path}/b.db") as (_, b),
    ):
        for _ in range(3):
            await a.get("/healthz")
        assert requests_of(await scrape(a), "GET", "/healthz", "2xx") == 3
        assert requests_of(await scrape(b), "GET", "/healthz", "2xx") == 0


def test_open_event_streams_are_counted(tmp_path: Path) -> None:
    runtime = so.Runtime(make_agents(), store=f"sqlite:///{tmp_path}/s.db")
    app = create_app(
        runtime,
        auth=TokenAuth(TOKENS),
        sweep_every=None,
        close_runtime=True,
        metrics=True,
        poll_interval=0.02,
        heartbeat=0.1,
    )
    route = "/v1/sessions/{session_id}/events"
    took = ("signoff_http_request_duration_seconds_sum", (("method", "GET"), ("route", route)))
    with running(app) as base, httpx.Client(base_url=base, timeout=10, verify=PLAIN) as c:
        alice = auth("alice-token")
        made = c.post("/v1/sessions", json={"agent": "support", "message": "Hi"}, headers=alice)
        sid = made.json()["session_id"]
        with c.stream("GET", f"/v1/sessions/{sid}/events", headers=alice) as stream:
            assert stream.status_code == 200
            opened = time.monotonic()
            found = samples(c.get("/metrics", headers=ADMIN).text)
            assert found[("signoff_event_streams_open", ())] == 1
            time.sleep(0.5)
            held = time.monotonic() - opened
        for _ in range(100):
            found = samples(c.get("/metrics", headers=ADMIN).text)
            if found[("signoff_event_streams_open", ())] == 0 and took in found:
                break
            time.sleep(0.05)
        assert found[("signoff_event_streams_open", ())] == 0
        # A stream's latency is the time until it opened, not how long it was followed.
        assert found[took] < held


def test_without_prometheus_client_the_extra_is_named_at_startup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # `import` raises ImportError
    monkeypatch.delitem(sys.modules, "signoff.server._exporter", raising=False)
    runtime = so.Runtime(make_agents(), store=f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(so.UsageError, match=r"pip install 'signoff\[metrics\]'"):
        create_app(runtime, auth=TokenAuth(TOKENS), metrics=True)
    create_app(runtime, auth=TokenAuth(TOKENS))  # off, it is not needed


def test_serve_metrics_without_the_extra_is_one_line_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "signoff.server._exporter", raising=False)
    started: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: started.append(self))
    store = f"sqlite:///{tmp_path}/s.db"
    result = invoke("serve", "examples.support:runtime", "--store", store, "--metrics")
    # A missing extra is no mistake of the command line: as without the server extra (or the
    # postgres one), one red line naming the class and exit status 1, not a usage box and 2.
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        "error: UsageError: metrics need prometheus_client (import of prometheus_client halted; "
        "None in sys.modules): pip install 'signoff[metrics]'\n"
    )
    assert started == [] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("how", ["option", "env"])
def test_serve_metrics_and_its_token(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    served: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: served.append(self.config.app))
    args = ["serve", "examples.support:runtime", "--store", f"sqlite:///{tmp_path}/s.db"]
    if how == "option":
        args += ["--metrics", "--metrics-token", SCRAPE]
    else:
        monkeypatch.setenv("SIGNOFF_METRICS", "1")
        monkeypatch.setenv("SIGNOFF_METRICS_TOKEN", SCRAPE)
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert served[0].state.signoff.scrape_digest is not None


def test_serve_refuses_a_metrics_token_without_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import uvicorn

    served: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: served.append(self.config.app))
    monkeypatch.delenv("SIGNOFF_METRICS", raising=False)
    store = f"sqlite:///{tmp_path}/s.db"
    result = invoke("serve", "examples.support:runtime", "--store", store, "--metrics-token", "t")
    assert refused_usage(result) == "Invalid value: --metrics-token is given but no --metrics"
    assert served == []
    monkeypatch.setenv("SIGNOFF_METRICS_TOKEN", SCRAPE)  # exported for another run: unused
    result = invoke("serve", "examples.support:runtime", "--store", store)
    assert result.exit_code == 0, result.output
    assert not hasattr(served[0].state, "signoff_metrics")


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("s3cret", "metrics_token is also an API token: give the scraper a token of its own"),
        ("m\u00e9trics", "metrics_token is not printable ASCII without spaces around it"),
    ],
)
def test_serve_refuses_a_metrics_token_it_cannot_use_before_opening_the_store(
    token: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scrape token that is also a `--token` secret, or one no header could carry, is a
    usage error of the command line (exit 2) naming neither secret, as `create_app` refuses
    it; it was refused only once the store had been opened (and created), exit 1."""
    import uvicorn

    served: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: served.append(self))
    store = f"sqlite:///{tmp_path}/s.db"
    result = invoke(
        "serve", "examples.support:runtime", "--store", store, "--token", "s3cret=alice",
        "--metrics", "--metrics-token", token,
    )  # fmt: skip
    said = refused_usage(result)
    assert said.startswith(f"Invalid value: {message}"), said
    assert token not in said
    assert served == [] and list(tmp_path.iterdir()) == []


async def test_a_dashboard_static_file_is_counted_unrouted_as_the_docs_say(tmp_path: Path) -> None:
    async with metered(f"sqlite:///{tmp_path}/s.db") as (_, c):
        assert (await c.get("/_signoff/static/app.css")).status_code == 200
        assert requests_of(await scrape(c), "GET", "unrouted", "2xx") == 1


async def test_a_request_that_raised_is_counted_5xx_and_timed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected exception (the server answers 500) was counted `5xx` with no latency
    sample: the histogram's count fell behind the requests' and hid the slow failures."""
    async with metered(f"sqlite:///{tmp_path}/s.db") as (runtime, c):
        alice = auth("alice-token")
        made = await c.post(
            "/v1/sessions", json={"agent": "support", "message": "Hi"}, headers=alice
        )
        sid = made.json()["session_id"]

        async def broken(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(0.05)
            raise RuntimeError("a bug")

        app = c._transport.app  # type: ignore[attr-defined]
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as raw:
            monkeypatch.setattr(runtime, "state", broken)
            r = await raw.get(f"/v1/sessions/{sid}", headers=alice)
            assert r.status_code == 500
            monkeypatch.undo()
        found = await scrape(c)
    route = (("method", "GET"), ("route", "/v1/sessions/{session_id}"))
    assert requests_of(found, "GET", "/v1/sessions/{session_id}", "5xx") == 1
    assert found[("signoff_http_request_duration_seconds_count", route)] == 1
    assert found[("signoff_http_request_duration_seconds_sum", route)] >= 0.05


async def test_an_answer_to_an_unknown_session_is_a_refusal_on_every_answering_route(
    store_url: str,
) -> None:
    """The API refuses an answer to a session the caller cannot see before the runtime settles
    anything, so `unknown_session` never reached the count of refused answers that
    `unknown_request` reaches; a foreign session is refused (and counted) the same."""
    async with metered(store_url) as (_, c):
        alice, mallory = auth("alice-token"), auth("mallory-token")
        made = await c.post(
            "/v1/sessions", json={"agent": "support", "message": "Refund 1042"}, headers=alice
        )
        sid, rid = made.json()["session_id"], made.json()["pending"][0]["id"]
        answer = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
        decide = {"approvals": [{"id": rid, "approved": True}]}
        for path, body, who in [
            ("/v1/sessions/ses_nope/responses", answer, alice),
            ("/v1/sessions/ses_nope/approvals", decide, alice),
            (f"/v1/sessions/{sid}/responses", answer, mallory),  # another tenant's
        ]:
            r = await c.post(path, json=body, headers=who)
            assert (r.status_code, r.json()["error"]["code"]) == (404, "unknown_session"), path
        found = await scrape(c)
    assert found[("signoff_answers_refused_total", (("code", "unknown_session"),))] == 3
    assert found[("signoff_answers_accepted_total", ())] == 0


def test_a_dashboard_answer_to_an_unknown_request_is_a_refusal(tmp_path: Path) -> None:
    """The dashboard's form refuses a request the reviewer cannot see before the runtime
    settles anything, so the API's `unknown_request` was counted and the dashboard's was not."""
    from ._dashboard import csrf_of, signed_in

    runtime = so.Runtime(make_agents(), store=f"sqlite:///{tmp_path}/s.db")
    app = create_app(
        runtime, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True, metrics=True
    )
    with running(app) as base, signed_in(base) as alice:
        form = {"option": "approve", "csrf": csrf_of(alice.get("/_signoff/").text)}
        r = alice.post(
            "/_signoff/requests/req_nope/respond", data=form, headers={"Accept": "application/json"}
        )
        assert (r.status_code, r.json()["error"]["code"]) == (404, "unknown_request")
        found = samples(alice.get("/metrics", headers=ADMIN).text)
    assert found[("signoff_answers_refused_total", (("code", "unknown_request"),))] == 1


OPENMETRICS = "application/openmetrics-text"


@pytest.mark.parametrize(
    ("accept", "served"),
    [
        (OPENMETRICS, f"{OPENMETRICS}; version=1.0.0;"),
        (f"{OPENMETRICS}; version=x", f"{OPENMETRICS}; version=1.0.0;"),
        (f"{OPENMETRICS};version=1.x", f"{OPENMETRICS}; version=1.0.0;"),
        (f"{OPENMETRICS}; version=" + "9" * 5000, f"{OPENMETRICS};"),
        ("text/plain; version=abc, */*", "text/plain; version=0.0.4;"),
        ("text/plain; version=1.0.0", "text/plain; version=1.0.0;"),
    ],
    ids=["openmetrics", "letters", "no-space", "5000-digits", "text-letters", "text-1.0.0"],
)
async def test_a_scrape_s_accept_header_picks_the_format_and_a_malformed_version_is_ignored(
    tmp_path: Path, accept: str, served: str
) -> None:
    """`prometheus_client` compares an Accept header's `version` as numbers: `version=x` raised
    a TypeError, so a scraper's (or anyone's) malformed header got a 500 and a logged traceback
    instead of the metrics; such a version is now ignored, as an absent one is."""
    from prometheus_client.openmetrics.parser import (
        text_string_to_metric_families as openmetrics_families,
    )

    async with metered(f"sqlite:///{tmp_path}/s.db") as (_, c):
        app = c._transport.app  # type: ignore[attr-defined]
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as raw:
            r = await raw.get("/metrics", headers={**ADMIN, "Accept": accept})
    assert r.status_code == 200, r.text
    kind = r.headers["content-type"]
    assert kind.startswith(served) and len(kind) < 100
    parse = openmetrics_families if kind.startswith(OPENMETRICS) else None
    found = {f.name for f in (parse or text_string_to_metric_families)(r.text)}
    assert {"signoff_turns_driven", "signoff_store_up"} <= found


def test_a_dashboard_edit_it_refuses_is_an_invalid_answer_refusal(tmp_path: Path) -> None:
    """The dashboard's form refuses edited arguments that are not one JSON object (422
    `invalid_answer`) before the runtime settles anything, so the runtime never counted those
    refusals: `signoff_answers_refused_total{code="invalid_answer"}` missed them."""
    from ._dashboard import csrf_of, signed_in, start

    runtime = so.Runtime(make_agents(), store=f"sqlite:///{tmp_path}/s.db")
    app = create_app(
        runtime, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True, metrics=True
    )
    with running(app) as base, signed_in(base) as alice:
        rid = start(base)["pending"][0]["id"]
        csrf = csrf_of(alice.get("/_signoff/").text)
        json_please = {"Accept": "application/json"}
        for edit in ["not json", "[1]", '{"amount": 1, "amount": 2}']:
            form = {"option": "approve", "edited_input": edit, "csrf": csrf}
            r = alice.post(f"/_signoff/requests/{rid}/respond", data=form, headers=json_please)
            assert (r.status_code, r.json()["error"]["code"]) == (422, "invalid_answer"), edit
        found = samples(alice.get("/metrics", headers=ADMIN).text)
        still = alice.get(f"/v1/requests/{rid}", headers=ADMIN)
    assert found[("signoff_answers_refused_total", (("code", "invalid_answer"),))] == 3
    assert found[("signoff_answers_accepted_total", ())] == 0
    assert still.json()["status"] == "pending"


async def test_a_damaged_open_request_leaves_the_count_up(store_url: str) -> None:
    """A scrape counted by reading the queue's first and last rows as well: one of them
    damaged (its data not JSON) made `signoff_store_up` 0 while the store answered. The count
    reads no row; the store's listing of the queue still fails on it, so the damage is seen (the
    queue people read leaves it out, logged: test_listing_damaged_rows.py)."""
    from .test_store_edited_rows import edit

    async with metered(store_url) as (runtime, c):
        for _ in range(2):
            await runtime.generate("batch", prompt="Refund two", auth=TOKENS["alice-token"])
        first, *middle, last = await runtime.pending()
        for damaged in (first, last):
            edit(store_url, "UPDATE {t}requests SET data = {p} WHERE id = {p}", b"{", damaged.id)
        found = await scrape(c)
        assert (found[("signoff_store_up", ())], found[("signoff_open_requests", ())]) == (1, 4)
        with pytest.raises(so.StoreDamaged):
            await runtime.store.pending(so.stores.PendingFilter())
        assert [r.id for r in await runtime.pending()] == [r.id for r in middle]
