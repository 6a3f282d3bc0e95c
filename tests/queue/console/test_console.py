"""The web console over real HTTP on both backends, without a browser: sign-in and its cookie,
the security headers on every answer, CSRF on every form, the API's own authorization and
validation, and every text a launch carries shown escaped."""

from __future__ import annotations

import asyncio
import html
import logging
import re
from collections.abc import AsyncIterator

import aiohttp
import pytest
import structlog

from nymph.queue.models import Principal, Role
from tests.queue.console.helpers import CSP, Console, ship_output
from tests.support.dispatch_helpers import apply
from tests.support.queue_helpers import Queue, add_kind

PROVIDER = "/console/ns/default/providers/kind/"
XSS = "<script>alert('x')</script>"
LAUNCH = {"mode": "small", "script": "print(1)"}


@pytest.fixture
async def console(kind: Queue) -> AsyncIterator[Console]:
    c = Console(kind)
    try:
        yield c
    finally:
        await c.close()


def _no_inline_script(csp: str) -> None:
    scripts = [d for d in csp.split(";") if d.strip().startswith(("script-src", "default-src"))]
    assert scripts and all("unsafe-inline" not in d and "unsafe-eval" not in d for d in scripts), csp


async def test_sign_in_page_answers_and_the_cookie_is_a_strict_session_cookie(
    kind: Queue, console: Console
) -> None:
    """/console/ is the sign-in page (never a bare 401); a signed-in session's cookie is
    HttpOnly, SameSite=Strict, session-only (no Secure over plain HTTP), and a bad token or a
    form without its CSRF token signs nobody in."""
    bare = await console.get("/console")
    assert bare.status == 303 and bare.headers["Location"] == "/console/"
    page = await console.get("/console/")
    assert page.status == 200 and 'name="token"' in page.text
    refused = await console.post("/console/signin", {"csrf": "forged", "token": kind.user_token})
    assert refused.status == 403 and not any("nymph_console=" in c for c in refused.set_cookies)
    wrong = await console.sign_in("nyq_not-a-token-of-this-queue")
    assert wrong.status == 401 and "not a user or admin token" in wrong.text
    daemon = await console.sign_in(kind.daemon_token)
    assert daemon.status == 401
    ok = await console.sign_in(kind.user_token)
    assert ok.status == 303 and ok.headers["Location"] == "/console/"
    (cookie,) = [c for c in ok.set_cookies if c.startswith("nymph_console=")]
    attrs = {a.strip().split("=")[0].lower() for a in cookie.split(";")[1:]}
    assert {"httponly", "samesite", "path"} <= attrs and "SameSite=Strict" in cookie
    assert not attrs & {"max-age", "expires", "secure"}, cookie
    home = await console.get("/console/")
    assert home.status == 200 and "kind" in home.text and "small" in home.text
    assert kind.user_token not in home.text
    proxied = Console(kind)
    try:  # behind a proxy that terminated TLS, the cookies are Secure
        tls = {"X-Forwarded-Proto": "https"}
        form = await proxied.get("/console/", headers=tls)
        assert all("Secure" in c for c in form.set_cookies)
        sent = {**tls, "Cookie": f"nymph_console_pre={form.csrf}"}  # a Secure cookie, over plain HTTP here
        ok = await proxied.post(
            "/console/signin", {"csrf": form.csrf, "token": kind.user_token}, headers=sent
        )
        assert ok.status == 303 and any(
            c.startswith("nymph_console=") and "Secure" in c for c in ok.set_cookies
        )
    finally:
        await proxied.close()


async def test_the_api_takes_only_the_authorization_header(kind: Queue, console: Console) -> None:
    """A signed-in browser's cookie opens the console's pages, never a JSON API route."""
    await console.sign_in(kind.user_token)
    async with console.http.get(kind.url + "/v1/namespaces/default/providers") as r:
        assert r.status == 401
    assert (await console.get(PROVIDER)).status == 200


async def test_every_answer_carries_the_security_headers(kind: Queue, console: Console) -> None:
    """Pages, redirects, errors, static files and streams of the console all carry a CSP with
    no inline script, and a caller not signed in is sent to the sign-in page."""
    answers = [
        await console.get("/console"),
        await console.get("/console/"),
        await console.get(PROVIDER),  # not signed in: a redirect
        await console.get("/console/no/such/page"),
        await console.get("/console/static/console.js"),
    ]
    assert answers[2].status == 303 and answers[2].headers["Location"] == "/console/"
    assert answers[3].status in (303, 404)
    await console.sign_in(kind.user_token)
    answers += [
        await console.get("/console/no/such/page"),
        await console.get("/console/ns/Not_A_Label/"),
        await console.get(PROVIDER),
        await console.get(PROVIDER + "instances/lakeshore-00000000"),
        await console.post(PROVIDER + "launch", {"csrf": "forged"}),
        await console.get("/console/daemons"),
        await console.get("/console/quotas"),
    ]
    assert [a.status for a in answers[5:]] == [404, 400, 200, 404, 403, 200, 403]
    for a in answers:
        _no_inline_script(a.headers[CSP])
        assert a.headers["X-Frame-Options"] == "DENY" and a.headers["X-Content-Type-Options"] == "nosniff"


async def test_a_team_token_sees_its_own_namespace_alone(kind: Queue, console: Console) -> None:
    """A team-b token signed in lists team-b only and is refused team-a's pages (403), as the
    API refuses it."""
    a_token = await kind.token(Role.USER, namespace="team-a")
    await add_kind(kind, namespace="team-a", kube_ns="a-jobs", token=a_token)
    b_token = await kind.token(Role.USER, namespace="team-b")
    await console.sign_in(b_token)
    home = await console.get("/console/")
    assert "team-b" in home.text and "team-a" not in home.text and ">default<" not in home.text
    for path in ("/console/ns/team-a/", "/console/ns/team-a/providers/kind/"):
        refused = await console.get(path)
        assert refused.status == 403 and "scoped to namespace &#39;team-b&#39;" in refused.text
    accepted = await kind.call(
        "POST", "/v1/namespaces/team-a/providers/kind/launch", token=a_token, json_body=LAUNCH
    )
    theirs = f"/console/ns/team-a/providers/kind/instances/{accepted.body['instanceId']}"
    for path in ("", "/log?follow=true", "/instance.json?after=0&wait=5", "/results/out/x.txt"):
        assert (await console.get(theirs + path)).status == 403, path
    stop = await console.post(theirs + "/stop", {"csrf": (await console.get("/console/")).csrf})
    assert stop.status == 403
    inst = await kind.call(
        "GET", f"/v1/namespaces/team-a/providers/kind/instances/{accepted.body['instanceId']}", token=a_token
    )
    assert inst.body["state"] == "queued"
    admin = Console(kind)
    try:
        await admin.sign_in(kind.admin_token)
        seen = await admin.get("/console/")
        assert "team-a" in seen.text and "default" in seen.text
        assert (await admin.get("/console/quotas")).status == 200
    finally:
        await admin.close()


async def test_forms_need_their_csrf_token(kind: Queue, console: Console) -> None:
    """Launch, stop and sign-out without the page's CSRF token, or from another origin, change
    nothing."""
    await console.sign_in(kind.user_token)
    page = await console.get(PROVIDER)
    form = {"mode": "small", "script": "print(1)", "tags": ""}
    assert (await console.post(PROVIDER + "launch", form)).status == 403
    forged = page.csrf[:-1] + ("1" if page.csrf.endswith("0") else "0")  # one character off
    assert (await console.post(PROVIDER + "launch", {**form, "csrf": forged})).status == 403
    other = await console.post(
        PROVIDER + "launch", {**form, "csrf": page.csrf}, headers={"Origin": "https://evil.example"}
    )
    assert other.status == 403
    listed = await kind.call("GET", "/v1/namespaces/default/providers/kind/instances")
    assert listed.body["items"] == []
    assert (await console.post("/console/signout", {})).status == 403
    launched = await console.post(PROVIDER + "launch", {**form, "csrf": page.csrf})
    assert launched.status == 303
    instance = launched.headers["Location"]
    assert (await console.post(instance + "/stop", {})).status == 403
    assert (await console.get(instance)).text.count("Stop</button>") == 1
    out = await console.post("/console/signout", {"csrf": page.csrf})
    assert out.status == 303 and (await console.get(PROVIDER)).status == 303


async def test_launch_errors_are_the_apis_next_to_their_field(kind: Queue, console: Console) -> None:
    """A launch the queue refuses re-shows the form with the API's reason by the field it is
    about, and the text typed kept (escaped)."""
    await console.sign_in(kind.user_token)
    csrf = (await console.get(PROVIDER)).csrf
    bad_mode = await console.post(
        PROVIDER + "launch", {"csrf": csrf, "mode": "nope", "script": XSS, "tags": ""}
    )
    assert bad_mode.status == 400 and 'id="mode-error"' in bad_mode.text
    assert XSS not in bad_mode.text and "&lt;script&gt;" in bad_mode.text
    bad_tags = await console.post(
        PROVIDER + "launch", {"csrf": csrf, "mode": "small", "script": "print(1)", "tags": "no equals sign"}
    )
    assert bad_tags.status == 400 and 'id="tags-error"' in bad_tags.text
    listed = await kind.call("GET", "/v1/namespaces/default/providers/kind/instances")
    assert listed.body["items"] == []


async def test_tags_script_log_and_results_are_shown_as_text(kind: Queue, console: Console) -> None:
    """A launch whose tags, script, log and result names hold markup is shown escaped on every
    page; its result downloads byte for byte, and its Pod is shown with its script."""
    await console.sign_in(kind.user_token)
    csrf = (await console.get(PROVIDER)).csrf
    launched = await console.post(
        PROVIDER + "launch",
        {"csrf": csrf, "mode": "small", "script": f"print({XSS!r})", "tags": f"team=a\nnote={XSS}"},
    )
    if launched.status == 400:  # a tag value with markup is refused: the refusal is escaped too
        assert 'id="tags-error"' in launched.text and XSS not in launched.text
        launched = await console.post(
            PROVIDER + "launch",
            {"csrf": csrf, "mode": "small", "script": f"print({XSS!r})", "tags": "team=a"},
        )
    assert launched.status == 303
    instance = launched.headers["Location"]
    iid = instance.rsplit("/", 1)[1]
    assert await apply(kind.daemon()) == [iid]
    await ship_output(
        kind, iid, log=f"{XSS}\nline two\n".encode(), result=("out/<b>x</b>.txt", b"\x00\x01data")
    )
    page = await console.get(instance)
    assert page.status == 200 and XSS not in page.text
    assert page.text.count("&lt;script&gt;") >= 2  # the log and the Pod's script
    assert "line two" in page.text and "/tmp/u.py" in page.text
    assert "&lt;b&gt;x&lt;/b&gt;.txt" in page.text and "<b>x</b>" not in page.text
    got = await console.get(instance + "/results/out/%3Cb%3Ex%3C/b%3E.txt")
    assert got.status == 200 and got.headers[CSP]
    async with console.http.get(kind.url + instance + "/results/out/%3Cb%3Ex%3C/b%3E.txt") as r:
        assert await r.read() == b"\x00\x01data"
    log = await console.get(instance + "/log?follow=false", headers={"Accept": "text/plain"})
    assert (
        log.status == 200
        and log.text.startswith(XSS)
        and log.headers["Content-Type"].startswith("text/plain")
    )
    whole = await console.get(instance + "/log.txt")
    assert whole.status == 200 and whole.text == f"{XSS}\nline two\n" and whole.headers[CSP]
    assert whole.headers["Content-Type"].startswith("text/plain")
    listing = await console.get(PROVIDER)
    assert iid in listing.text and XSS not in listing.text


@pytest.mark.sqlite_only
async def test_a_thousand_instances_page_by_page(kind: Queue, console: Console) -> None:
    """A provider with 1,000 instances lists them 50 a page, each once, by following the Next
    links (the API's own continue tokens), and filters by state."""
    principal = Principal(token_id="tok-bulk", role=Role.USER, name="bulk")
    launch = kind.store.launch
    accepted = await asyncio.gather(
        *(
            launch(ns="default", provider="kind", body=LAUNCH, idempotency_key=None, principal=principal)
            for _ in range(1000)
        )
    )
    launched = [a["instanceId"] for a in accepted]
    await console.sign_in(kind.user_token)
    seen: list[str] = []
    path: str | None = PROVIDER
    pages = 0
    while path is not None:
        listing = await console.get(path)
        assert listing.status == 200
        seen += re.findall(r">(lakeshore-[0-9a-f]{8})</a>", listing.text)
        found = re.search(r'<a rel="next" href="([^"]+)"', listing.text)
        path = None if found is None else html.unescape(found.group(1))
        pages += 1
    assert pages == 20 and sorted(seen) == sorted(launched)
    running = await console.get(PROVIDER + "?state=running")
    assert running.status == 200 and "no instance in state running" in running.text
    bad = await console.get(PROVIDER + "?state=bogus")
    assert bad.status == 400 and "not an instance state" in bad.text


async def test_the_token_is_never_logged_or_shown(
    kind: Queue, console: Console, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """Signing in (with a good and a bad token), browsing and launching log the token's id,
    never the token, and no page or redirect shows it."""
    caplog.set_level(logging.DEBUG)
    wrong = "nyq_console-token-that-does-not-exist-0123"
    with structlog.testing.capture_logs() as captured:
        texts = [(await console.sign_in(wrong)).text]
        signed = await console.sign_in(kind.user_token)
        texts += [signed.headers.get("Location", ""), (await console.get(PROVIDER)).text]
        csrf = (await console.get(PROVIDER)).csrf
        launched = await console.post(
            PROVIDER + "launch", {"csrf": csrf, "mode": "small", "script": "print(1)"}
        )
        texts += [launched.headers["Location"], (await console.get(launched.headers["Location"])).text]
    seen = "".join(texts) + repr(captured) + caplog.text + "".join(capsys.readouterr())
    assert "console sign-in" in repr(captured) and "tok-" in repr(captured)
    for token in (wrong, kind.user_token):
        assert token not in seen and token[4:20] not in seen
    assert csrf not in repr(captured)


@pytest.mark.sqlite_only
async def test_a_long_log_shows_its_end(kind: Queue, console: Console) -> None:
    """An instance's page shows the last 256 KiB of a longer log, says how much it leaves out,
    and links the whole log as text."""
    await console.sign_in(kind.user_token)
    csrf = (await console.get(PROVIDER)).csrf
    instance = (await console.post(PROVIDER + "launch", {"csrf": csrf, **LAUNCH})).headers["Location"]
    iid = instance.rsplit("/", 1)[1]
    assert await apply(kind.daemon()) == [iid]
    log = b"FIRST LINE\n" + b"x" * 99 + b"\n" + b"".join(b"line %06d\n" % i for i in range(30_000))
    await ship_output(kind, iid, log=log)
    page = await console.get(instance)
    skipped = len(log) - 256 * 1024
    assert f"its first {skipped} bytes are not shown here" in page.text
    assert "FIRST LINE" not in page.text and "line 029999" in page.text
    whole = await console.get(instance + "/log.txt")
    assert whole.text.encode() == log


async def test_a_script_can_be_a_file(kind: Queue, console: Console) -> None:
    """The launch form takes the script as an uploaded file (multipart), with its CSRF token."""
    await console.sign_in(kind.user_token)
    csrf = (await console.get(PROVIDER)).csrf
    form = aiohttp.FormData()
    for key, value in (("csrf", csrf), ("mode", "small"), ("script", ""), ("tags", "from=file")):
        form.add_field(key, value)
    form.add_field("script_file", b"print('from a file')\n", filename="job.py", content_type="text/x-python")
    async with console.http.post(kind.url + PROVIDER + "launch", data=form, allow_redirects=False) as r:
        assert r.status == 303, await r.text()
        instance = r.headers["Location"]
    page = await console.get(instance)
    assert "print(&#39;&#39;from a file" in page.text and "from: file" in page.text
