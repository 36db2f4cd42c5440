"""Webhook URLs (`channels._webhook_urls`): what is refused when a channel is configured, named,
with any password in the URL masked, however httpx would read it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.channels import ChannelHub, WebhookChannel
from signoff.channels._webhook_outbox import digest
from signoff.channels._webhook_urls import masked

from .test_webhooks import SECRET, Receiver, manual, refund_agent


def test_a_url_no_connection_can_use_is_refused_when_configured() -> None:
    """A port past 65535 made every send raise (an ExceptionGroup, not a failed attempt) and
    a malformed IDNA host raised a UnicodeError: both are configuration errors, by name."""
    for bad in ("http://127.0.0.1:99999/hook", "http://127.0.0.1:0/hook", "http://xn--/hook"):
        with pytest.raises(so.UsageError, match="URL"):
            WebhookChannel(bad, SECRET)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1 :8080/hook", "http://exa mple.com/hook", "http://a%41b.example/h"]
)
def test_a_host_no_lookup_can_find_is_refused_when_configured(url: str) -> None:
    """httpx reads `exa mple.com` (a stray space) as the host `exa%20mple.com`: the channel
    was made, then every delivery failed to resolve it and was retried for good."""
    with pytest.raises(so.UsageError, match="names no usable host"):
        WebhookChannel(url, SECRET)


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1]:8080/hook",
        "http://b\u00fccher.example/hook",
        "http://xn--bcher-kva.example/hook",
        "http://hooks_internal.example/hook",
        "https://10.0.0.7/hook",
    ],
)
def test_hosts_that_resolve_are_accepted(url: str) -> None:
    """IPv6 in brackets, an international name, an underscore of an internal name."""
    assert WebhookChannel(url, SECRET).urls


@pytest.mark.parametrize("url", [123, None, b"http://example.com/hook"])
def test_a_url_that_is_not_text_is_a_usage_error(url: object) -> None:
    """Masking a password in the URL an error names must not fail on what is no text at all:
    it raised AttributeError ('int' object has no attribute 'partition') instead."""
    with pytest.raises(so.UsageError, match=r"must be http\(s\)://\.\.\., not"):
        WebhookChannel([url], SECRET)  # type: ignore[list-item]


@pytest.mark.parametrize("urls", [None, 123])
def test_urls_that_are_no_url_nor_list_are_a_usage_error(urls: object) -> None:
    # A raw TypeError ('NoneType' object is not iterable).
    with pytest.raises(so.UsageError, match="takes a URL or a list of URLs, not"):
        WebhookChannel(urls, SECRET)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "url",
    [
        "http://hook:s3cr3t#pw@example.com/x",
        "http://hook:s3cr3t/pw@example.com/x",
        "http://hook:s3cr3t?pw@example.com/x",
    ],
)
def test_a_password_that_breaks_the_url_is_not_shown_in_the_error(url: str) -> None:
    """A password with `#`, `/` or `?` not percent-encoded ends the host part where the mask
    looked for it: the error showed the URL whole, and httpx's message ('Invalid port: ...')
    quoted the password's start."""
    with pytest.raises(so.UsageError, match="not a usable webhook URL") as refused:
        WebhookChannel(url, SECRET)
    assert "s3cr3t" not in str(refused.value) and "pw" not in str(refused.value)
    assert "hook:***@example.com/x" in str(refused.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # httpx reads `hook:123` as a host and port: no Basic auth, the rest a path, query or
        # fragment; a person meant the password `123/s3cr3t` (it was shown whole)
        ("http://hook:123/s3cr3t@example.com/x", "http://hook:***@example.com/x"),
        ("http://hook:12?s3cr3t@example.com/x", "http://hook:***@example.com/x"),
        ("http://hook:12#s3cr3t@example.com/x", "http://hook:***@example.com/x"),
        # httpx sends the password `p` to host `ss`; a person meant `p@ss/s3cr3t`
        ("http://hook:p@ss/s3cr3t@example.com/x", "http://hook:***@example.com/x"),
        # httpx reads the last `@` before the path: the password is `s3cr3t@example.com\`
        ("http://hook:s3cr3t@example.com\\@evil.example/x", "http://hook:***@evil.example/x"),
        ("HTTP://hook:s3cr3t@example.com/x", "HTTP://hook:***@example.com/x"),
        ("http://hook:s3%2Fcr3t@example.com/x", "http://hook:***@example.com/x"),
        ("http://:s3cr3t@example.com/x", "http://:***@example.com/x"),
        ("http://hook:s3cr3t@[::1]:8080/x", "http://hook:***@[::1]:8080/x"),
        # a password the user name holds: the user name is masked too
        ("http://hook:ook@example.com/x", "http://***@example.com/x"),
        # a token as the user name is sent as Basic auth too
        ("http://s3cr3t-token@example.com/x", "http://***@example.com/x"),
        # an `@` in the query is no login: the host is shown (the query's value is masked)
        ("https://example.com/hook?to=ops@example.com", "https://example.com/hook?to=***"),
        # nothing secret: shown as given
        ("http://[::1]:8080/x@y", "http://[::1]:8080/x@y"),
        ("http://example.com:8080/x", "http://example.com:8080/x"),
    ],
)
def test_a_password_is_masked_however_the_url_reads(url: str, shown: str) -> None:
    """A URL httpx takes but reads differently from its writer (`http://u:123/pw@host` is host
    `u`, port 123) was logged whole: all that httpx sends as Basic auth, and all before the
    last `@` a password may reach, is masked."""
    import httpx

    shown_url = masked(url)
    assert shown_url == shown
    assert "s3cr3t" not in str(shown_url)
    assert "s3%2F" not in str(shown_url) and ":ook" not in str(shown_url)
    parsed = httpx.URL(url)
    if parsed.password:  # what httpx sends is not in the userinfo shown
        assert parsed.password not in str(shown_url).partition("://")[2].rpartition("@")[0]
    if (
        url != shown
        and url.startswith("http://")
        and parsed.host
        and (parsed.port is None or 0 < parsed.port < 65536)
    ):
        with pytest.raises(so.UsageError, match="is given twice") as given_twice:
            WebhookChannel([url, url], SECRET)
        assert f"{shown!r} is given twice" in str(given_twice.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://example.com/hook?token=s3cr3t", "https://example.com/hook?token=***"),
        ("https://example.com/h?to=ops&key=s3cr3t", "https://example.com/h?to=***&key=***"),
        ("https://example.com/h?a=1;sig=s3cr3t", "https://example.com/h?a=***;sig=***"),
        ("https://example.com/h?s3cr3t", "https://example.com/h?***"),  # a bare value
        ("https://example.com/h?empty=&s3cr3t", "https://example.com/h?empty=&***"),
        ("https://example.com/h#s3cr3t", "https://example.com/h#***"),
        ("https://example.com/h?", "https://example.com/h?"),
        ("https://hook:s3cr3t@example.com/h?t=s3cr3t", "https://hook:***@example.com/h?t=***"),
        # a query of a password httpx reads as a port and path is masked with it
        ("http://hook:12?s3cr3t@example.com/x?k=s3cr3t", "http://hook:***@example.com/x?k=***"),
        ("HTTPS://Example.com:8443/h?Token=s3cr3t", "HTTPS://Example.com:8443/h?Token=***"),
    ],
)
def test_query_values_and_a_fragment_are_masked(url: str, shown: str) -> None:
    """A receiver often checks a token in the query (`?token=...`): it was logged whole, in
    every retry, refusal and give-up line and in configuration errors. Each value is masked,
    its name kept (to tell URLs apart)."""
    assert masked(url) == shown
    with pytest.raises(so.UsageError, match="is given twice") as given_twice:
        WebhookChannel([url, url], SECRET)
    assert "s3cr3t" not in str(given_twice.value)


def test_an_unusable_url_with_a_token_in_its_query_does_not_show_it() -> None:
    with pytest.raises(so.UsageError, match="not a usable webhook URL") as refused:
        WebhookChannel("http://example.com:abc/x?token=s3cr3t", SECRET)
    assert "'http://example.com:abc/x?token=***' (Invalid port: 'abc')" in str(refused.value)
    assert "s3cr3t" not in str(refused.value)
    with pytest.raises(so.UsageError, match="must be http") as refused:
        WebhookChannel("ftp://example.com/x?token=s3cr3t", SECRET)
    assert "s3cr3t" not in str(refused.value)


def test_an_unusable_url_with_a_password_still_says_what_is_wrong() -> None:
    """A password httpx reads as one is masked, and the parser's message about the rest (a bad
    port) is kept: it quotes nothing of the password."""
    with pytest.raises(so.UsageError, match="not a usable webhook URL") as refused:
        WebhookChannel("http://hook:s3cr3t@example.com:abc/x", SECRET)
    assert "'http://hook:***@example.com:abc/x' (Invalid port: 'abc')" in str(refused.value)
    assert "s3cr3t" not in str(refused.value)


@pytest.mark.parametrize("scheme", ["HTTP", "Http", "hTTp"])
async def test_a_scheme_in_capitals_is_the_same_url(scheme: str) -> None:
    """A scheme is case-insensitive (RFC 3986 3.1): `HTTP://...` was refused as no http(s)
    URL. It is taken in lowercase, delivered to, and counts as the same URL as its lowercase
    spelling (one queue per URL)."""
    async with Receiver([]) as receiver:
        rest = receiver.url.removeprefix("http://")
        hooks = WebhookChannel(f"{scheme}://{rest}", SECRET)
        assert hooks.urls == [receiver.url]
        request = so.InputRequest(
            kind="question", id="req_1", session_id="s", turn_id="t", agent="a", created_at=0.0
        )
        await hooks.enqueue("request.opened", request)
        await hooks.drain()
        await hooks.close()
    assert [json.loads(b)["type"] for _, b in receiver.accepted] == ["request.opened"]
    assert WebhookChannel("HTTPS://example.com/hook", SECRET).urls == ["https://example.com/hook"]
    with pytest.raises(so.UsageError, match="'https://example.com/hook' is given twice"):
        WebhookChannel(["HTTPS://example.com/hook", "https://example.com/hook"], SECRET)
    for other in ("FTP://example.com/hook", "HTTPS:/example.com/hook", " HTTPS://example.com/h"):
        with pytest.raises(so.UsageError, match=r"must be http\(s\)://\.\.\., not"):
            WebhookChannel(other, SECRET)


def test_a_host_in_capitals_or_its_default_port_is_the_same_url() -> None:
    """A host name is case-insensitive and `:443` is https's own port: `https://Example.com/hook`
    and `https://example.com:443/hook` are `https://example.com/hook`, not a queue each (two
    deliveries of every event to one receiver). A path's case is the receiver's: kept."""
    assert WebhookChannel("https://Example.COM:443/Hook?Q=A#F", SECRET).urls == [
        "https://example.com/Hook?Q=A#F"
    ]
    assert WebhookChannel("http://User:PW@EXAMPLE.com:80/X", SECRET).urls == [
        "http://User:PW@example.com/X"
    ]
    assert WebhookChannel("https://[::ABC]:443/x", SECRET).urls == ["https://[::abc]/x"]
    for kept in ("https://[::1]:8443/x", "http://example.com:443/x", "https://example.com:80/x"):
        assert WebhookChannel(kept, SECRET).urls == [kept]  # not the scheme's own port
    spellings = ("https://Example.com/hook", "https://example.com:0443/hook", "HTTPS://E.X")
    for spelling in spellings:
        same = "https://e.x/" if spelling.startswith("HTTPS") else "https://example.com/hook"
        with pytest.raises(so.UsageError, match=f"'{same}' is given twice"):
            WebhookChannel([spelling, same], SECRET)
    assert len(WebhookChannel(["https://h.x/hook", "https://h.x/Hook"], SECRET).urls) == 2


@pytest.mark.parametrize(
    "kept_as",
    [["https://Example.COM:443/hook"], ["https://Example.com/hook", "https://example.com/hook"]],
)
async def test_a_delivery_kept_under_an_older_spelling_of_the_url_is_sent_once(
    tmp_path: Path, kept_as: list[str]
) -> None:
    """A delivery an earlier version kept under the URL as it was written (host in capitals,
    port given) is the same URL's now: sent on the next start, once, though it was kept under
    two spellings (an older hub's two queues), and then forgotten, not dropped as a URL no
    longer configured nor sent again at each start."""
    sent: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append((str(request.url), request.headers["Signoff-Delivery"]))
        return httpx.Response(204)

    async with so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        # A request the store has: the opening of one it no longer has (erased) is not sent.
        [request] = (await rt.generate("support", prompt="Refund 1042")).pending
        for _ in range(2):  # the second start sends nothing
            client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
            hooks = WebhookChannel("https://Example.com/hook", SECRET, client=client)
            hub = ChannelHub(rt, [hooks], state=tmp_path / "hub.db")
            if not sent:
                body = hooks.payload("request.opened", request)
                kept = {"event": "request.opened", "body": json.dumps(body)}
                for url in kept_as:
                    hub.state.remember("webhooks", f"outbox:{url} {body['id']}", kept, hub=hub.name)
            async with manual(hub):
                await asyncio.wait_for(hooks.drain(), 10)
                assert hub.state.memos("webhooks", "outbox:", hub=hub.name) == []
            await client.aclose()
    assert sent == [("https://example.com/hook", body["id"])]


def test_a_url_without_a_path_is_the_same_as_with_slash() -> None:
    """httpx sends `http://host` to `/`: it and `http://host/` were two URLs, a queue each, so
    each delivery went twice to one receiver. No path is written `/`."""
    assert WebhookChannel("https://Example.com", SECRET).urls == ["https://example.com/"]
    assert WebhookChannel("http://h.x?token=t", SECRET).urls == ["http://h.x/?token=t"]
    assert WebhookChannel("http://[::1]:8080", SECRET).urls == ["http://[::1]:8080/"]
    for pair in (["http://h.x", "http://h.x/"], ["http://h.x/?a=1", "http://H.x:80?a=1"]):
        with pytest.raises(so.UsageError, match="is given twice"):
            WebhookChannel(pair, SECRET)


@pytest.mark.parametrize("configured", ["https://example.com", "https://example.com/"])
@pytest.mark.parametrize("kept_in", ["state and store", "store"])
async def test_a_delivery_kept_under_a_url_without_a_path_is_sent_once(
    store_url: str, tmp_path: Path, configured: str, kept_in: str
) -> None:
    """A delivery an earlier version kept unsent under `https://example.com` (in the state, and
    its copy in the store under that spelling's digest) is `https://example.com/`'s now: sent
    by the next start, once, also by a hub on another state (the state lost with its machine),
    and then kept nowhere: not dropped as a URL no longer configured, nor sent again by each
    start from a copy left under the old digest."""
    sent: list[tuple[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append((str(request.url), request.headers["Signoff-Delivery"]))
        return httpx.Response(204)

    async with so.Runtime([refund_agent()], store=store_url) as rt:
        [request] = (await rt.generate("support", prompt="Refund 1042")).pending
        store: Any = rt.store
        for n in range(2):  # the second start sends nothing
            client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
            hooks = WebhookChannel(configured, SECRET, client=client)
            hub = ChannelHub(rt, [hooks], state=tmp_path / "hub.db")
            if n == 0:
                body = hooks.payload("request.opened", request)
                kept = {"event": "request.opened", "body": json.dumps(body)}
                old = "https://example.com"
                if kept_in == "state and store":
                    hub.state.remember("webhooks", f"outbox:{old} {body['id']}", kept, hub=hub.name)
                name = f"{hub.name}.webhooks:outbox:{digest(old)} {body['id']}"
                await store.keep_channel_memos({name: json.dumps(kept)}, rt.now())
            async with manual(hub):
                await asyncio.wait_for(hooks.drain(), 10)
                assert hub.state.memos("webhooks", "outbox:", hub=hub.name) == []
            assert await store.channel_memos(f"{hub.name}.webhooks:outbox:") == []
            await client.aclose()
    assert sent == [("https://example.com/", body["id"])]


async def test_a_wait_kept_under_a_url_without_a_path_is_waited_out(store_url: str) -> None:
    """What `https://example.com` asked with `Retry-After`, kept in the store under that
    spelling's digest, holds back `https://example.com/` too, and is kept again under its own
    digest (so a later answer lifts it), not left to be waited out again."""
    async with so.Runtime([refund_agent()], store=store_url) as rt:
        store: Any = rt.store
        hooks = WebhookChannel("https://example.com", SECRET)
        hub = ChannelHub(rt, [hooks])
        old = f"{hub.name}.webhooks:asked:{digest('https://example.com')}"
        await store.keep_channel_memos({old: json.dumps({"seconds": 600})}, rt.now())
        async with manual(hub):
            assert 590 < hooks._waits.left("https://example.com/") <= 600
            kept = await store.channel_memos(f"{hub.name}.webhooks:asked:")
        assert [name for name, _, _ in kept] == [
            f"{hub.name}.webhooks:asked:{digest('https://example.com/')}"
        ]


async def test_a_wait_kept_in_the_state_under_a_url_without_a_path_is_waited_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a store without channel memos, what `https://example.com` asked with `Retry-After`,
    kept in the hub's state under that spelling, holds back `https://example.com/` too, and is
    kept again under it, the old memo gone: it was ignored (no wait) and left for good."""
    from signoff.channels import _shared

    monkeypatch.setattr(_shared.Shared, "kept", property(lambda self: False))
    async with so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path}/s.db") as rt:
        hooks = WebhookChannel("https://example.com", SECRET)
        hub = ChannelHub(rt, [hooks], state=tmp_path / "hub.db")
        until = hooks.clock() + 600
        hub.state.remember("webhooks", "asked:https://example.com", {"until": until}, hub=hub.name)
        async with manual(hub):
            assert 590 < hooks._waits.left("https://example.com/") <= 600
            kept = hooks.memos("asked:")
        assert [name for name, _ in kept] == ["asked:https://example.com/"]
        assert 590 < kept[0][1]["until"] - hooks.clock() <= 600
