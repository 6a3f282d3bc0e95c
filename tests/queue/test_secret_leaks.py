"""Secrets: no token, credential or kubeconfig content reaches a log, the queue's database, the
audit log, an error body, the daemon's state or workdirs, or a temp file.

Recognisable secret values are planted: the queue's user and daemon tokens, forged bearer tokens
sent on every kind of route, the daemon's ServiceAccount token and client key from its
kubeconfig, and kubeconfig content sent inline as a provider's ``kwargs.kubeconfig`` (refused).
After launches have run to the end (and failed, and been stopped), every file the queue and the
daemon wrote under the test's directory is grepped for each value, and so are the error bodies
the queue answered with and the daemon's /metrics and /readyz.
"""

from __future__ import annotations

import asyncio
import secrets
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from nymph.localcluster import LocalCluster
from tests.support.harness import launch, wait_state
from tests.support.leaks import kubeconfig_secrets, scan_files, scan_texts
from tests.support.queue_peers import Checked
from tests.support.stack import FaultStack, running_stack
from tests.support.tally import TALLY

pytestmark = [pytest.mark.faults, pytest.mark.e2e, pytest.mark.slow]

PLANTED_KUBECONFIG = """apiVersion: v1
kind: Config
users:
- name: planted
  user:
    token: PLANTED-KUBECONFIG-TOKEN-{tag}
    client-key-data: PLANTED-CLIENT-KEY-{tag}
clusters:
- name: planted
  cluster: {{server: "https://planted.invalid:6443"}}
"""


def fetch(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return str(r.read().decode(errors="replace"))
    except OSError as exc:
        return str(exc)


@pytest.fixture
def stack(kube: LocalCluster, namespace: str, tmp_path: Path) -> Iterator[FaultStack]:
    yield from running_stack(kube, namespace, tmp_path, extra=("--reap-after", "2"))


async def test_no_secret_reaches_logs_db_audit_errors_or_temp_files(stack: FaultStack) -> None:
    tag = secrets.token_hex(8)
    forged = f"nyq_PLANTED-FORGED-{tag}"
    planted: dict[str, str] = {
        "user token": stack.queue.user_token,
        "daemon token": stack.queue.daemon_token,
        "forged bearer token": forged,
        "inline kubeconfig token": f"PLANTED-KUBECONFIG-TOKEN-{tag}",
        "inline kubeconfig key": f"PLANTED-CLIENT-KEY-{tag}",
    }
    for i, value in enumerate(kubeconfig_secrets(stack.daemon.kubeconfig)):
        planted[f"daemon kubeconfig credential {i}"] = value
    http = Checked(stack.queue.url)
    ns = "/v1/namespaces/default"
    bodies: dict[str, str] = {}

    def send(method: str, path: str, token: str, body: object = None) -> None:
        resp = http.send(method, path, token=token, json_body=body)
        if resp.status_code >= 400:
            bodies[f"{method} {path} -> {resp.status_code}"] = resp.text

    for path in (f"{ns}/providers", f"{ns}/providers/local/launch", "/v1/dispatch/claim", f"{ns}/daemons"):
        send("POST" if "launch" in path or "claim" in path else "GET", path, forged, {"mode": "py"})
    kubeconfig = PLANTED_KUBECONFIG.replace("{tag}", tag)
    for name, kw in (
        ("inline", {"namespace": stack.namespace, "kubeconfig": kubeconfig}),
        (
            "inline-map",
            {"namespace": stack.namespace, "kubeconfig": {"token": planted["inline kubeconfig token"]}},
        ),
    ):
        send("PUT", f"{ns}/providers/{name}", stack.queue.user_token, {"launcher": "Kube", "kwargs": kw})
    send(
        "POST", "/v1/dispatch/claim", stack.queue.user_token, {"daemonId": forged}
    )  # a user token on daemon routes
    send("GET", f"{ns}/providers", stack.queue.daemon_token)  # and the other way round
    # Launches that succeed, fail and are stopped, so the daemon writes what it ever writes.
    ok = await launch(stack.queue, tags={"sim.nymph.io/run": "1s"})
    bad = await launch(stack.queue, tags={"sim.nymph.io/run": "1s", "sim.nymph.io/outcome": "fail"})
    stopped = await launch(stack.queue, tags={"sim.nymph.io/run": "1h"})
    await wait_state(stack.queue, stopped, {"running"})
    async with stack.queue.client() as c:
        await c.stop(provider="local", instance_id=stopped)
    TALLY.launches += 3
    for iid in (ok, bad, stopped):
        await wait_state(stack.queue, iid, {"stopped"})
    await asyncio.sleep(3)  # past --reap-after: the reaper's writes too
    texts = dict(bodies)
    for route in ("metrics", "readyz", "healthz"):
        texts[f"daemon /{route}"] = await asyncio.to_thread(
            fetch, f"http://127.0.0.1:{stack.daemon.port}/{route}"
        )
    verify = stack.audit_verify()
    texts["nymph audit verify"] = verify.stdout + verify.stderr
    stack.queue.stop()  # flush the SQLite WAL into the file too
    # The daemon's kubeconfig is where its credential legitimately lives.
    skip = {stack.daemon.kubeconfig.resolve()}
    hits = scan_files([stack.tmp], planted, skip=skip) + scan_texts(texts, planted)
    TALLY.secret_leaks += len(hits)
    scanned = sum(1 for p in stack.tmp.rglob("*") if p.is_file())
    assert scanned >= 6, f"only {scanned} files were scanned"
    assert len(bodies) >= 6, bodies
    assert not hits, hits
    assert not http.failures, http.failures
