"""The console in a real browser (Debian's chromium): sign in, launch from the form, watch the
instance's state and log change live while its daemon works, stop it, download its result,
markup shown as text, a team refused another's pages, and the security headers on every answer."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from nymph.client import QueueClient
from nymph.protocol import iso, now
from nymph.queue.models import Role
from tests.queue.console.browser import Shots, browser, on_queue, shots
from tests.support.queue_helpers import Served

pytestmark = pytest.mark.sqlite_only
__all__ = ["browser", "shots"]

XSS = "<script>alert('pwned')</script>"
PROVIDER = "/console/ns/default/providers/kind/"


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def _catalog(served: Served, token: str, namespace: str = "default", kube_ns: str = "jobs") -> None:
    async def add(c: Any) -> None:
        await c.create_provider(
            name="kind", kwargs={"namespace": kube_ns}, dispatch="daemon", namespace=namespace
        )
        await c.create_mode(
            name="small", provider="kind", fields={"image": "python:3.12-slim"}, namespace=namespace
        )

    on_queue(served, token, add)


def _token(served: Served, role: Role, namespace: str | None = None) -> str:
    from nymph.queue.auth import create_token

    async def make() -> str:
        from nymph.queue.db import Database  # the served queue's own SQLite file

        db = Database(path=served.db_path)
        await db.open()
        try:
            created = await db.write(lambda conn: create_token(conn, role=role, namespace=namespace))
        finally:
            await db.close()
        return created.token

    return served.run(make())


class Watched:
    """A browser context whose every answer from the console is kept (to check its headers)."""

    def __init__(self, browser: Any, url: str) -> None:
        self.context = browser.new_context(accept_downloads=True, base_url=url)
        self.page = self.context.new_page()
        self.answers: list[Any] = []
        self.dialogs: list[str] = []
        self.page.on("response", lambda r: self.answers.append(r))
        self.page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        self.page.set_default_timeout(15_000)

    def sign_in(self, token: str) -> None:
        self.page.goto("/console/")
        self.page.fill("#token", token)
        self.page.click("button[type=submit]")
        self.page.wait_for_selector("nav")

    def close(self) -> None:
        self.context.close()

    def check_headers(self) -> int:
        """Every answer the browser got came from the console, with its CSP; returns how many."""
        assert all("/console" in a.url for a in self.answers), [a.url for a in self.answers]
        console = self.answers
        for a in console:
            csp = a.headers.get("content-security-policy", "")
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp, (a.url, a.status)
        return len(console)


class Daemon:
    """Daemon d1 on node n1, acting on the served queue as a nymph daemon would (one session)."""

    def __init__(self, served: Served) -> None:
        self.served = served

        async def make() -> QueueClient:
            return QueueClient(base_url=served.url, token=served.daemon_token, timeout=20)

        self.client = served.run(make())
        self.seq = 0

    def __call__(self, call: Callable[[QueueClient], Awaitable[Any]]) -> Any:
        return self.served.run(call(self.client))

    def close(self) -> None:
        self.served.run(self.client.close())

    def report(self, iid: str, state: str, reason: str | None = None) -> None:
        self.seq += 1
        report = {
            "seq": self.seq,
            "instanceId": iid,
            "state": state,
            "node": "n1",
            "at": iso(now()),
            "reason": reason,
        }
        self(lambda d: d.report(daemon_id="d1", stream="s1", reports=[report]))

    def take(self, kind: str) -> None:
        async def claim(d: QueueClient) -> None:
            (task,) = await d.claim(daemon_id="d1", node="n1", capacity=1, wait=5)
            assert task["kind"] == kind
            await d.complete(daemon_id="d1", task_id=task["taskId"], ok=True)

        self(claim)


def test_launch_follow_stop_and_download(browser: Any, served: Served, shots: Shots) -> None:
    """Sign in, launch from the form, see it run with its log appearing live (markup as text,
    no script run), stop it from its page, download its result; every answer carries the CSP."""
    _catalog(served, served.user_token)
    w = Watched(browser, served.url)
    ship = Daemon(served)
    try:
        page = w.page
        page.goto("/console/")
        shots.take(page, "signin")
        w.sign_in(served.user_token)
        shots.take(page, "namespaces", docs=True)
        page.click(f"a[href='{PROVIDER}']")
        page.fill("#script", f"print({XSS!r})")
        page.fill("#tags", "team=a")
        page.click("form.launch button[type=submit]")
        page.wait_for_url(re.compile(r"/instances/lakeshore-[0-9a-f]{8}$"))
        iid = page.url.rsplit("/", 1)[1]
        assert page.inner_text("#state") == "queued"
        assert "<script>alert(" in page.inner_text("pre.pod")  # the Pod's script, as text
        ship.take("launch")
        ship.report(iid, "running")
        expect(page.locator("#state")).to_have_text("running")
        ship(lambda d: d.ship_log_chunk(daemon_id="d1", instance_id=iid, offset=0, data=b"step one\n"))
        expect(page.locator("#log")).to_contain_text("step one")
        line = f"{XSS}\n".encode()
        ship(lambda d: d.ship_log_chunk(daemon_id="d1", instance_id=iid, offset=9, data=line))
        expect(page.locator("#log")).to_contain_text(XSS)
        assert page.inner_text("#log").rstrip().endswith(XSS) and not w.dialogs
        shots.take(page, "instance-running", docs=True)
        listing = w.context.new_page()  # a list of instances, left open: it follows them
        listing.goto(PROVIDER)
        expect(listing.locator(f"tr:has-text('{iid}') .state")).to_have_text("running")
        page.click("button.danger")
        expect(page.locator("#state")).to_have_text(re.compile("^stopp(ing|ed)$"))
        ship.take("stop")
        ship(
            lambda d: d.upload_result(
                daemon_id="d1", instance_id=iid, path="out/metrics.json", data=b'{"ok": 1}', eof=True
            )
        )
        ship(
            lambda d: d.ship_log_chunk(
                daemon_id="d1", instance_id=iid, offset=9 + len(line), data=b"", final=True
            )
        )
        ship.report(iid, "stopped", reason="Completed")
        page.wait_for_selector("a[download]")
        expect(listing.locator(f"tr:has-text('{iid}') .state")).to_have_text("stopped")
        listing.close()
        assert page.inner_text("#state") == "stopped"
        with page.expect_download() as got:
            page.click("a[download]")
        assert Path(got.value.path()).read_bytes() == b'{"ok": 1}'
        shots.take(page, "instance-stopped")
        page.goto(PROVIDER)
        assert iid in page.inner_text("table.instances") and "stopped" in page.inner_text("table.instances")
        shots.take(page, "instances", docs=True)
        page.goto("/console/daemons")
        assert "n1" in page.inner_text("table")
        shots.take(page, "daemons")
        assert not w.dialogs and w.check_headers() > 10
    finally:
        w.close()
        ship.close()


def test_a_team_is_refused_another_teams_pages(browser: Any, served: Served, shots: Shots) -> None:
    """A team-b token signed in sees team-b only and gets a 403 page for team-a's; an admin
    sees every namespace and the quotas."""
    a_token = _token(served, Role.USER, "team-a")
    _catalog(served, a_token, namespace="team-a", kube_ns="a-jobs")
    b_token = _token(served, Role.USER, "team-b")
    w = Watched(browser, served.url)
    try:
        w.sign_in(b_token)
        assert "team-a" not in w.page.inner_text("main")
        answer = w.page.goto("/console/ns/team-a/providers/kind/")
        assert answer is not None and answer.status == 403
        assert "scoped to namespace 'team-b'" in w.page.inner_text("main")
        shots.take(w.page, "refused")
        assert w.check_headers() > 3
    finally:
        w.close()
    admin = Watched(browser, served.url)
    try:
        admin.sign_in(served.admin_token)
        assert "team-a" in admin.page.inner_text("main")
        admin.page.goto("/console/quotas")
        assert admin.page.inner_text("h1") == "Quotas and usage"
        shots.take(admin.page, "quotas")
    finally:
        admin.close()
