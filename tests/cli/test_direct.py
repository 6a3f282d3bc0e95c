"""The CLI on the direct path against a real API server: secrets, providers add/show naming the
dispatch and the kubeconfig ref, the provider given as a mode field, ``launch --wait``,
``instances``, ``providers test``; and a restart that reconciles recorded launches with Pods."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from nymph.localcluster import LocalCluster
from nymph.queue.direct.settings import DirectSettings
from nymph.queue.models import QueueSettings
from nymph.queue.sql import direct as sql_direct
from tests.support.kube_fixtures import SaKubeconfig
from tests.support.queue_helpers import FAST, Served, open_queue
from tests.support.queue_helpers import run_cli as run

POD_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
]


@pytest.fixture
def served_settings() -> QueueSettings:
    # the test cluster's API server is on loopback, refused to user kubeconfigs by default
    return replace(FAST, direct=DirectSettings(kube_server_allow=("127.0.0.1",)))


def test_direct_path_from_the_cli(
    served: Served,
    kube: LocalCluster,
    namespace: str,
    sa_kubeconfig: SaKubeconfig,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("NYMPH_URL", served.url)
    monkeypatch.setenv("NYMPH_TOKEN", served.user_token)
    monkeypatch.chdir(tmp_path)
    kc = sa_kubeconfig(namespace=namespace, rules=POD_RULES, name="cli")
    token_text = kc.read_text()

    code, out, _ = run(capsys, "secrets", "set", "kc", "--from-file", str(kc))
    assert code == 0 and '{"$secret": "kc"}' in out
    code, out, _ = run(capsys, "secrets", "list")
    assert code == 0 and out.splitlines()[1].split()[0] == "kc" and token_text not in out
    code, out, _ = run(
        capsys, "providers", "add", "c", "--launcher", "Kube", "--dispatch", "direct",
        "--kwarg", 'kubeconfig={"$secret": "kc"}', "--kwarg", f"namespace={namespace}",
    )  # fmt: skip
    assert code == 0 and "dispatch: direct" in out and "kubeconfig: <secret kc>" in out
    code, out, _ = run(
        capsys, "providers", "add", "inl", "--launcher", "Kube", "--dispatch", "direct",
        "--kwarg", f"kubeconfig={token_text}", "--kwarg", f"namespace={namespace}",
    )  # fmt: skip
    assert code == 0 and "kubeconfig: <secret provider.inl.kubeconfig>" in out, out
    code, out, _ = run(capsys, "providers", "show", "c")
    assert code == 0 and "kubeconfig: <secret kc>" in out and "# dispatch direct" in out
    code, out, err = run(capsys, "modes", "add", "m", "--field", "provider=c", "--field", "image=busybox")
    assert code == 0, err
    code, out, _ = run(capsys, "modes", "show", "m")
    assert "provider: c" in out

    script = tmp_path / "job.py"
    script.write_text("print('hi')\n")
    code, out, err = run(
        capsys,
        "launch",
        "c",
        "--mode",
        "m",
        "--script",
        str(script),
        "--tag",
        "sim.nymph.io/run=1s",
        "--wait",
    )
    assert code == 0, (out, err)
    assert out.startswith("lakeshore-") and "running" in err and "stopped" in err
    code, out, _ = run(capsys, "instances", "c")
    assert code == 0 and "stopped" in out
    code, out, _ = run(capsys, "providers", "test", "c")
    assert code == 0 and "dry-run create" in out and "provider c: ok" in out
    code, out, _ = run(capsys, "secrets", "rm", "kc")
    assert code == 0


async def test_a_restart_creates_recorded_pods_and_settles_vanished_ones(
    kube: LocalCluster, namespace: str, sa_kubeconfig: SaKubeconfig, tmp_path: Path, queue_db: Path | str
) -> None:
    settings = replace(
        FAST, direct=DirectSettings(interval=0.2, reap_after=3600, kube_server_allow=("127.0.0.1",))
    )
    kc = sa_kubeconfig(namespace=namespace, rules=POD_RULES, name="restart")
    q, runner = await open_queue(tmp_path, settings, db=queue_db)
    try:
        await q.call("PUT", "/v1/namespaces/default/secrets/kc", json_body={"value": kc.read_text()})
        kwargs = {"kubeconfig": {"$secret": "kc"}, "namespace": namespace}
        body = {"name": "p", "launcher": "Kube", "dispatch": "direct", "kwargs": kwargs}
        assert (await q.call("POST", "/v1/namespaces/default/providers", json_body=body)).status == 201
        mode = {"name": "m", "provider": "p", "fields": {"image": "busybox"}}
        assert (await q.call("POST", "/v1/namespaces/default/modes", json_body=mode)).status == 201
        launch = {"mode": "m", "script": "x", "tags": {"sim.nymph.io/run": "1h"}}
        live = await q.call("POST", "/v1/namespaces/default/providers/p/launch", json_body=launch)
        assert live.status == 202
        # A crash between recording a launch and creating its Pod:
        rec = await q.store.db.write(
            lambda c: sql_direct.record_launch(
                c, ns="default", provider_name="p", body=launch, idempotency_key=None, requester="t"
            )
        )
    finally:
        await q.close()
        await runner.cleanup()
    lost = rec.accepted["instanceId"]
    gone = live.body["instanceId"]
    kube.api("DELETE", f"/api/v1/namespaces/{namespace}/pods/{gone}?gracePeriodSeconds=0")
    for _ in range(50):
        names = [
            p["metadata"]["name"] for p in kube.api("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
        ]
        if gone not in names:
            break
        await asyncio.sleep(0.1)

    q, runner = await open_queue(tmp_path, settings, db=queue_db)
    try:
        states: dict[str, str] = {}
        for _ in range(100):
            r = await q.call("GET", "/v1/namespaces/default/providers/p/instances")
            states = {i["instanceId"]: i["state"] for i in r.body["items"]}
            if states.get(lost) == "running" and states.get(gone) == "stopped":
                break
            await asyncio.sleep(0.1)
        assert states == {lost: "running", gone: "stopped"}
        names = [
            p["metadata"]["name"] for p in kube.api("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
        ]
        assert names == [lost]  # created once, under its fixed name
        inst = (await q.call("GET", f"/v1/namespaces/default/providers/p/instances/{gone}")).body
        assert inst["reason"] == "Deleted"
    finally:
        await q.close()
        await runner.cleanup()
