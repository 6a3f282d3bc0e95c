"""Direct dispatch against the real API server (etcd + kube-apiserver + kwok): the queue creates,
lists, watches, stops and reaps Pods with each provider's own connection (a path, inline
content moved into the secret store, or a ``$secret``), with ``context`` switching identities."""

from __future__ import annotations

import asyncio
import base64
import os
import stat
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.kube.credentials import CredentialPolicy, staged_kubeconfig
from nymph.kube.netguard import ServerPolicy
from nymph.kube.pods import Connection, open_api
from nymph.localcluster import LocalCluster
from nymph.queue.direct.settings import DirectSettings
from nymph.queue.direct.wiring import CONNECTOR, DIRECT
from nymph.queue.http.keys import STORE
from tests.support.apicount import log_requests
from tests.support.kube_fixtures import SaKubeconfig
from tests.support.queue_helpers import FAST, Queue, open_queue

POD_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
]
NS = "/v1/namespaces/default"


DIRECT_TEST_SETTINGS = DirectSettings(
    reap_after=0.5, watch_idle=1.0, interval=0.2, kube_server_allow=("127.0.0.1",)
)


async def _serve(tmp_path: Path, queue_db: Path | str, *, reap_after: float) -> AsyncIterator[Queue]:
    (tmp_path / "kubeconfigs").mkdir()
    (tmp_path / "stage").mkdir()
    direct = DirectSettings(
        kubeconfig_dirs=(tmp_path / "kubeconfigs",),
        tmp_root=str(tmp_path / "stage"),
        reap_after=reap_after,
        watch_idle=1.0,
        interval=0.2,
        # the test cluster's API server is on loopback, refused to user kubeconfigs by default
        kube_server_allow=("127.0.0.1",),
    )
    q, runner = await open_queue(tmp_path, replace(FAST, direct=direct), db=queue_db)
    try:
        yield q
    finally:
        await q.close()
        await runner.cleanup()


@pytest.fixture
async def direct_queue(tmp_path: Path, queue_db: Path | str) -> AsyncIterator[Queue]:
    async for q in _serve(tmp_path, queue_db, reap_after=0.5):
        yield q


@pytest.fixture
async def unreaped_queue(tmp_path: Path, queue_db: Path | str) -> AsyncIterator[Queue]:
    """A direct queue whose reaper leaves finished Pods alone for the whole test."""
    async for q in _serve(tmp_path, queue_db, reap_after=3600.0):
        yield q


async def _provider(q: Queue, name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    body = {"name": name, "launcher": "Kube", "dispatch": "direct", "kwargs": kwargs}
    r = await q.call("POST", NS + "/providers", json_body=body)
    assert r.status == 201, r.body
    r = await q.call(
        "POST",
        NS + "/modes",
        json_body={"name": f"{name}-m", "provider": name, "fields": {"image": "busybox"}},
    )
    assert r.status == 201, r.body
    return dict(body["kwargs"])


async def _launch(q: Queue, provider: str, **tags: str) -> Any:
    body = {"mode": f"{provider}-m", "script": "print('hi')", "tags": {"sim.nymph.io/run": "1h", **tags}}
    return await q.call("POST", f"{NS}/providers/{provider}/launch", json_body=body)


async def _wait_state(q: Queue, provider: str, iid: str, state: str) -> dict[str, Any]:
    version = -1
    for _ in range(60):
        r = await q.call("GET", f"{NS}/providers/{provider}/instances/{iid}?after={version}&wait=5")
        assert r.status == 200, r.body
        if r.body["state"] == state:
            return dict(r.body)
        version = r.body["version"]
    raise AssertionError(f"{iid} never reached {state}: {r.body}")


def _pods(kube: LocalCluster, namespace: str) -> list[str]:
    items = kube.api("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
    return [p["metadata"]["name"] for p in items]


def _two_context_kubeconfig(
    kube: LocalCluster, tmp: Path, *, a: tuple[str, Path], b: tuple[str, Path]
) -> str:
    """One kubeconfig whose contexts ctx-a / ctx-b act as two ServiceAccounts in two namespaces."""
    users, contexts = [], []
    cluster = None
    for label, (ns, path) in (("a", a), ("b", b)):
        doc = yaml.safe_load(path.read_text())
        cluster = doc["clusters"][0]
        users.append({"name": f"user-{label}", "user": doc["users"][0]["user"]})
        contexts.append(
            {
                "name": f"ctx-{label}",
                "context": {"cluster": cluster["name"], "user": f"user-{label}", "namespace": ns},
            }
        )
    cfg = {"apiVersion": "v1", "kind": "Config", "clusters": [cluster], "users": users, "contexts": contexts}
    cfg["current-context"] = "ctx-a"
    return yaml.safe_dump(cfg)


async def test_path_inline_and_secret_kubeconfigs_launch_list_and_stop(
    kube: LocalCluster, namespace: str, sa_kubeconfig: SaKubeconfig, direct_queue: Queue, tmp_path: Path
) -> None:
    q = direct_queue
    kc = sa_kubeconfig(namespace=namespace, rules=POD_RULES, name="launcher")
    allowed = tmp_path / "kubeconfigs" / "launcher.kubeconfig"
    allowed.write_text(kc.read_text())
    await _provider(q, "by-path", {"kubeconfig": str(allowed), "namespace": namespace})
    stored = await _provider(q, "inline", {"kubeconfig": kc.read_text(), "namespace": namespace})
    r = await q.call("GET", NS + "/providers/inline")
    assert r.body["kwargs"]["kubeconfig"] == {"$secret": "provider.inline.kubeconfig"}
    assert stored["kubeconfig"] not in r.text
    r = await q.call("PUT", NS + "/secrets/team-kube", json_body={"value": kc.read_text()})
    assert r.status == 200 and set(r.body) == {"name", "createdAt", "updatedAt"}
    await _provider(q, "by-secret", {"kubeconfig": {"$secret": "team-kube"}, "namespace": namespace})

    ids = {}
    for provider in ("by-path", "inline", "by-secret"):
        r = await _launch(q, provider)
        assert r.status == 202, r.body
        assert r.body["state"] == "starting" and r.body["providerName"] == provider
        ids[provider] = r.body["instanceId"]
    assert sorted(_pods(kube, namespace)) == sorted(ids.values())
    assert os.listdir(tmp_path / "stage") == []  # nothing staged outlives a call

    for provider, iid in ids.items():
        inst = await _wait_state(q, provider, iid, "running")
        assert [h["state"] for h in inst["history"]][:2] == ["queued", "starting"] and inst["node"]
        r = await q.call("GET", f"{NS}/providers/{provider}/instances")
        assert [i["instanceId"] for i in r.body["items"]] == [iid]  # listed by the three labels

    # A Pod with the reserved labels that the queue never recorded is listed too.
    labels = {"lakeshore": "true", "lakeshore.namespace": "default", "lakeshore.provider": "by-path"}
    kube.api(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "metadata": {"name": "lakeshore-feedf00d", "labels": labels},
            "spec": {"containers": [{"name": "user", "image": "busybox"}]},
        },
    )
    r = await q.call("GET", f"{NS}/providers/by-path/instances")
    assert {i["instanceId"] for i in r.body["items"]} == {ids["by-path"], "lakeshore-feedf00d"}

    iid = ids["by-secret"]
    for _ in range(2):  # idempotent: the second DELETE finds the Pod gone or going
        r = await q.call("DELETE", f"{NS}/providers/by-secret/instances/{iid}")
        assert r.status == 204, r.body
    inst = await _wait_state(q, "by-secret", iid, "stopped")
    assert inst["reason"] == "Stopped"
    for _ in range(50):
        if iid not in _pods(kube, namespace):
            break
        await asyncio.sleep(0.1)
    assert iid not in _pods(kube, namespace)
    r = await q.call("DELETE", f"{NS}/providers/by-secret/instances/{iid}")
    assert r.status == 204


async def test_finished_direct_pods_are_reaped_and_still_listed(
    kube: LocalCluster, namespace: str, sa_kubeconfig: SaKubeconfig, direct_queue: Queue
) -> None:
    q = direct_queue
    kc = sa_kubeconfig(namespace=namespace, rules=POD_RULES, name="reaped")
    r = await q.call("PUT", NS + "/secrets/kc", json_body={"value": kc.read_text()})
    await _provider(q, "short", {"kubeconfig": {"$secret": "kc"}, "namespace": namespace})
    r = await _launch(q, "short", **{"sim.nymph.io/run": "1s"})
    assert r.status == 202, r.body
    iid = r.body["instanceId"]
    inst = await _wait_state(q, "short", iid, "stopped")
    assert inst["reason"] == "Completed"
    for _ in range(100):
        if iid not in _pods(kube, namespace):
            break
        await asyncio.sleep(0.1)
    assert iid not in _pods(kube, namespace)  # reaped after reap_after
    r = await q.call("GET", f"{NS}/providers/short/instances")
    assert [(i["instanceId"], i["state"]) for i in r.body["items"]] == [(iid, "stopped")]  # history kept
    watches = q.app[DIRECT].watches.watches
    for _ in range(50):  # nothing left to watch: the watch stops after watch_idle
        if not watches:
            break
        await asyncio.sleep(0.1)
    assert watches == {}


async def test_a_direct_pod_whose_log_is_stored_whole_is_reaped_without_reading_its_log(
    kube: LocalCluster, namespace: str, sa_kubeconfig: SaKubeconfig, direct_queue: Queue
) -> None:
    """Once the queue holds a direct Pod's whole log (with output), neither its follower nor its
    reaper asks the API server for that log again, and the stored log is what readers get."""
    q = direct_queue
    kc = sa_kubeconfig(namespace=namespace, rules=POD_RULES, name="whole-log")
    r = await q.call("PUT", NS + "/secrets/kc", json_body={"value": kc.read_text()})
    await _provider(q, "short", {"kubeconfig": {"$secret": "kc"}, "namespace": namespace})
    before = log_requests(kube)
    r = await _launch(q, "short", **{"sim.nymph.io/run": "1s"})
    assert r.status == 202, r.body
    iid = r.body["instanceId"]
    # what the live follower stores of a log it read to its end (its container has not started)
    await q.app[STORE].output.append(instance_id=iid, offset=0, data=b"hi\n", final=True)
    await _wait_state(q, "short", iid, "stopped")
    for _ in range(100):
        if iid not in _pods(kube, namespace):
            break
        await asyncio.sleep(0.1)
    assert iid not in _pods(kube, namespace)
    assert log_requests(kube) == before
    r = await q.call("GET", f"{NS}/providers/short/instances/{iid}/logs")
    assert r.status == 200 and r.body["logs"] == "hi\n", r.body


async def test_direct_pods_on_a_node_without_an_address_are_asked_for_their_log_once(
    kube: LocalCluster, namespace: str, sa_kubeconfig: SaKubeconfig, direct_queue: Queue
) -> None:
    """A kwok node lists no address, so it serves no container log: the first direct Pod's log
    follower learns so from its one request, and the follower of the next Pod on that node
    ends at once without one; both logs are complete, with the node's answer as their note.
    Their reaps read no log tail either (it would be refused the same way): after both Pods
    are reaped the API server has still been asked once, and the logs are as followed."""
    q = direct_queue
    kc = sa_kubeconfig(namespace=namespace, rules=POD_RULES, name="no-log")
    await q.call("PUT", NS + "/secrets/kc", json_body={"value": kc.read_text()})
    await _provider(q, "nolog", {"kubeconfig": {"$secret": "kc"}, "namespace": namespace})
    before = log_requests(kube)
    iids = []
    for _ in range(2):
        r = await _launch(q, "nolog", **{"sim.nymph.io/run": "1s"})
        assert r.status == 202, r.body
        iids.append(r.body["instanceId"])
        await _wait_state(q, "nolog", iids[-1], "stopped")
    for _ in range(150):
        if not set(iids) & set(_pods(kube, namespace)):
            break
        await asyncio.sleep(0.1)
    assert not set(iids) & set(_pods(kube, namespace))  # both reaped
    for iid in iids:
        st = await q.app[STORE].output.status(instance_id=iid)
        assert st is not None and st.complete and st.total == 0, st
        assert (st.note or "").startswith("no container log: no preferred addresses"), st.note
    assert log_requests(kube) - before == 1


async def test_a_launch_follows_its_provider_to_the_other_dispatch_path_at_once(
    kube: LocalCluster, namespace: str, sa_kubeconfig: SaKubeconfig, direct_queue: Queue
) -> None:
    """The queue remembers a provider's path only as a guess: the launch after a provider
    changed its dispatch takes the new path, both ways, and the one sent down the wrong path
    first leaves nothing behind (no instance, Pod or task)."""
    q = direct_queue
    kc = sa_kubeconfig(namespace=namespace, rules=POD_RULES, name="switch")
    await q.call("PUT", NS + "/secrets/kc", json_body={"value": kc.read_text()})
    direct = {"kubeconfig": {"$secret": "kc"}, "namespace": namespace}
    await _provider(q, "switch", direct)

    async def put(dispatch: str, kwargs: dict[str, Any]) -> None:
        body = {"name": "switch", "launcher": "Kube", "dispatch": dispatch, "kwargs": kwargs}
        r = await q.call("PUT", NS + "/providers/switch", json_body=body)
        assert r.status == 200, r.body

    seen: list[tuple[str, bool]] = []
    for dispatch in ("direct", "daemon", "daemon", "direct", "direct", "daemon"):
        if seen and dispatch != ("direct" if seen[-1][1] else "daemon"):
            await put(dispatch, direct if dispatch == "direct" else {"namespace": namespace})
        r = await _launch(q, "switch")
        assert r.status == 202, r.body
        iid = r.body["instanceId"]
        has_pod = iid in _pods(kube, namespace)
        assert r.body["state"] == ("starting" if dispatch == "direct" else "queued"), (dispatch, r.body)
        assert has_pod == (dispatch == "direct"), dispatch
        seen.append((iid, dispatch == "direct"))
    r = await q.call("GET", f"{NS}/providers/switch/instances")
    listed = {i["instanceId"] for i in r.body["items"]}
    assert listed == {iid for iid, _ in seen}  # one instance per launch: none from a wrong path
    pods = set(_pods(kube, namespace))
    assert {iid for iid, d in seen if d} <= pods and not {iid for iid, d in seen if not d} & pods


async def test_a_direct_launch_sent_again_with_its_key_gets_the_same_launch(
    kube: LocalCluster, namespace: str, sa_kubeconfig: SaKubeconfig, direct_queue: Queue
) -> None:
    """A direct launch sent again with its Idempotency-Key gets the same launch back (its
    state as recorded now) and creates no second Pod or instance."""
    q = direct_queue
    kc = sa_kubeconfig(namespace=namespace, rules=POD_RULES, name="keyed")
    await q.call("PUT", NS + "/secrets/kc", json_body={"value": kc.read_text()})
    await _provider(q, "keyed", {"kubeconfig": {"$secret": "kc"}, "namespace": namespace})
    body = {"mode": "keyed-m", "script": "print('hi')", "tags": {"sim.nymph.io/run": "1h"}}
    url, key = f"{NS}/providers/keyed/launch", {"Idempotency-Key": "once-only"}
    first = await q.call("POST", url, json_body=body, headers=key)
    assert first.status == 202 and first.body["state"] == "starting", first.body
    again = await q.call("POST", url, json_body=body, headers=key)
    assert again.status == 202, again.body
    assert again.body["instanceId"] == first.body["instanceId"]
    assert again.body["launchedAt"] == first.body["launchedAt"]
    assert again.body["state"] in ("starting", "running")
    assert _pods(kube, namespace) == [first.body["instanceId"]]
    r = await q.call("GET", f"{NS}/providers/keyed/instances")
    assert [i["instanceId"] for i in r.body["items"]] == [first.body["instanceId"]]


async def test_stopping_a_finished_direct_instance_deletes_its_pod_now(
    kube: LocalCluster, namespace: str, sa_kubeconfig: SaKubeconfig, unreaped_queue: Queue
) -> None:
    """DELETE of a direct instance that already ended removes its Pod at once (not after the
    reaper's delay) and keeps its history; a second DELETE is a 204 too."""
    q = unreaped_queue
    kc = sa_kubeconfig(namespace=namespace, rules=POD_RULES, name="stopper")
    await q.call("PUT", NS + "/secrets/kc", json_body={"value": kc.read_text()})
    await _provider(q, "done", {"kubeconfig": {"$secret": "kc"}, "namespace": namespace})
    r = await _launch(q, "done", **{"sim.nymph.io/run": "1s"})
    assert r.status == 202, r.body
    iid = r.body["instanceId"]
    await _wait_state(q, "done", iid, "stopped")
    assert iid in _pods(kube, namespace)  # the reaper would wait an hour
    for _ in range(2):
        r = await q.call("DELETE", f"{NS}/providers/done/instances/{iid}")
        assert r.status == 204, r.body
        assert iid not in _pods(kube, namespace)
    r = await q.call("GET", f"{NS}/providers/done/instances/{iid}")
    assert r.status == 200 and r.body["state"] == "stopped", r.body


async def test_one_client_serves_a_connection_until_its_secret_changes(
    kube: LocalCluster, namespace: str, sa_kubeconfig: SaKubeconfig, direct_queue: Queue
) -> None:
    q = direct_queue
    allowed = sa_kubeconfig(namespace=namespace, rules=POD_RULES, name="kept")
    assert (await q.call("PUT", NS + "/secrets/kc", json_body={"value": allowed.read_text()})).status == 200
    await _provider(q, "kept", {"kubeconfig": {"$secret": "kc"}, "namespace": namespace})
    clients = q.app[CONNECTOR].clients
    before = clients.opened
    ids = []
    for _ in range(6):
        r = await _launch(q, "kept")
        assert r.status == 202, r.body
        ids.append(r.body["instanceId"])
    assert clients.opened - before == 1  # launches, the watch and the log followers share it
    assert set(ids) <= set(_pods(kube, namespace))

    # the secret now holds an identity that may not create Pods: the next launch uses it
    forbidden = sa_kubeconfig(namespace=namespace, rules=[], name="nobody")
    assert (await q.call("PUT", NS + "/secrets/kc", json_body={"value": forbidden.read_text()})).status == 200
    r = await _launch(q, "kept")
    assert r.status == 403, r.body
    assert clients.opened - before == 2
    assert len(_pods(kube, namespace)) == len(ids)


async def test_context_switches_identity_and_a_forbidden_one_leaves_nothing(
    kube: LocalCluster, sa_kubeconfig: SaKubeconfig, direct_queue: Queue, tmp_path: Path
) -> None:
    q = direct_queue
    spaces = []
    for label in ("a", "b"):
        ns = f"ctx-{label}-{os.urandom(3).hex()}"
        kube.api("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        kube.wait_default_sa(ns)
        spaces.append((ns, sa_kubeconfig(namespace=ns, rules=POD_RULES, name=f"sa-{label}")))
    (ns_a, _), (ns_b, _) = spaces
    two = _two_context_kubeconfig(kube, tmp_path, a=spaces[0], b=spaces[1])
    assert (await q.call("PUT", NS + "/secrets/two", json_body={"value": two})).status == 200
    ref = {"$secret": "two"}
    await _provider(q, "to-a", {"kubeconfig": ref, "context": "ctx-a", "namespace": ns_a})
    await _provider(q, "to-b", {"kubeconfig": ref, "context": "ctx-b", "namespace": ns_b})
    await _provider(q, "a-into-b", {"kubeconfig": ref, "context": "ctx-a", "namespace": ns_b})

    a = await _launch(q, "to-a")
    b = await _launch(q, "to-b")
    assert a.status == b.status == 202, (a.body, b.body)
    assert _pods(kube, ns_a) == [a.body["instanceId"]] and _pods(kube, ns_b) == [b.body["instanceId"]]

    r = await _launch(q, "a-into-b")
    assert r.status == 403 and r.body["error"] == "kube_forbidden", r.body
    assert "the Kubernetes API server refused" in r.body["detail"]
    assert f"system:serviceaccount:{ns_a}:sa-a" in r.body["detail"]  # the server's own message
    assert _pods(kube, ns_b) == [b.body["instanceId"]]  # no Pod
    r = await q.call("GET", f"{NS}/providers/a-into-b/instances")
    assert r.status == 403  # listing with that identity is refused as clearly
    rows = await q.store.db.read(
        lambda c: c.execute("SELECT COUNT(*) FROM instances WHERE provider = 'a-into-b'").fetchone()[0]
    )
    assert rows == 0  # nor a record

    await _provider(q, "no-ctx", {"kubeconfig": ref, "context": "ctx-z", "namespace": ns_a})
    r = await _launch(q, "no-ctx")
    assert r.status == 400 and "context 'ctx-z' is not in kubeconfig" in r.body["detail"]
    assert "ctx-a, ctx-b" in r.body["detail"]


async def test_paths_are_read_only_inside_allowed_dirs_after_resolving_symlinks(
    direct_queue: Queue, tmp_path: Path
) -> None:
    q = direct_queue
    outside = tmp_path / "elsewhere.kubeconfig"
    outside.write_text("apiVersion: v1\nclusters: []\ncontexts: []\nusers: []\n")
    link = tmp_path / "kubeconfigs" / "link.kubeconfig"
    link.symlink_to(outside)
    for path in (str(outside), str(link), str(tmp_path / "kubeconfigs" / ".." / "elsewhere.kubeconfig")):
        body = {"name": "p", "launcher": "Kube", "dispatch": "direct", "kwargs": {"kubeconfig": path}}
        r = await q.call("POST", NS + "/providers", json_body=body)
        assert r.status == 400 and r.body["error"] == "kubeconfig_path_refused", path
        assert "--kubeconfig-dir" in r.body["detail"]


async def test_providers_test_checks_rbac_and_a_server_dry_run(
    kube: LocalCluster, namespace: str, sa_kubeconfig: SaKubeconfig, direct_queue: Queue
) -> None:
    q = direct_queue
    full = sa_kubeconfig(namespace=namespace, rules=POD_RULES, name="full")
    read_only = sa_kubeconfig(
        namespace=namespace, rules=[{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}], name="ro"
    )
    for name, kc in (("full", full), ("ro", read_only)):
        await q.call("PUT", f"{NS}/secrets/{name}", json_body={"value": kc.read_text()})
        await _provider(q, name, {"kubeconfig": {"$secret": name}, "namespace": namespace})
    results = {}
    for name in ("full", "ro"):
        r = await q.call("POST", f"{NS}/providers/{name}/test", json_body={})
        assert r.status == 202
        task = (await q.call("GET", f"{NS}/tasks/{r.body['taskId']}")).body
        results[name] = task
    assert results["full"]["status"] == "done" and results["full"]["result"]["ok"] is True
    checks = {c["name"]: c["ok"] for c in results["full"]["result"]["checks"]}
    assert checks["dry-run create"] and checks["rbac: create pods"]
    assert results["ro"]["status"] == "failed"
    checks = {c["name"]: c["ok"] for c in results["ro"]["result"]["checks"]}
    assert checks["rbac: get pods"] and not checks["rbac: create pods"] and not checks["dry-run create"]
    assert _pods(kube, namespace) == []  # a dry run leaves nothing


def _check_staging(text: str, tmp_path: Path) -> None:
    with staged_kubeconfig(text, tmpdir=str(tmp_path)) as path:
        assert path is not None and stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert Path(path).read_text() == text
    assert os.listdir(tmp_path) == []
    with pytest.raises(RuntimeError), staged_kubeconfig(text, tmpdir=str(tmp_path)) as path:
        assert path is not None and os.path.exists(path)
        raise RuntimeError("the call failed")
    assert os.listdir(tmp_path) == []


async def test_staged_files_are_0600_during_the_call_and_gone_after_also_on_failure(
    kube: LocalCluster, tmp_path: Path
) -> None:
    text = kube.kubeconfig.read_text()
    _check_staging(text, tmp_path)
    # Through the API client too: the certificate and key files go before it is handed out.
    servers = ServerPolicy.from_allow(["127.0.0.1"])
    policy = CredentialPolicy(kubeconfig_dirs=(), ambient=False, servers=servers)
    async with open_api(Connection(kubeconfig=text), policy=policy, tmp_root=str(tmp_path)) as api:
        assert os.listdir(tmp_path) == []
        assert await api.call_api(
            "/version", "GET", response_types_map={200: "object"}, _return_http_data_only=True
        )
    with pytest.raises(Exception, match="is not in kubeconfig"):
        async with open_api(
            Connection(kubeconfig=text, context="nope"), policy=policy, tmp_root=str(tmp_path)
        ):
            pass
    assert os.listdir(tmp_path) == []


def test_secret_store_refuses_a_lost_key(tmp_path: Path) -> None:
    from nymph.queue.secrets import KeySource, SecretBox, SecretKeyError

    key = tmp_path / "db.secret-key"
    box = SecretBox(source=KeySource(path=key, create=True))
    blob = box.seal(ns="team-a", name="kc", value="v4lue-text", have_secrets=False)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and b"v4lue" not in blob
    assert box.open(ns="team-a", name="kc", blob=blob) == "v4lue-text"
    with pytest.raises(SecretKeyError):  # bound to its namespace
        box.open(ns="team-b", name="kc", blob=blob)
    key.unlink()
    with pytest.raises(SecretKeyError, match="is missing, but the database holds encrypted secrets"):
        SecretBox(source=KeySource(path=key, create=True)).check(sample=("team-a", "kc", blob))
    assert not key.exists()  # never silently reset
    other = tmp_path / "other.key"
    other.write_text(base64.urlsafe_b64encode(os.urandom(32)).decode())
    with pytest.raises(SecretKeyError, match="does not open with the key"):
        SecretBox(source=KeySource(path=other, create=False)).check(sample=("team-a", "kc", blob))


async def test_a_direct_group_is_created_retried_and_stopped_without_leaving_pods(
    kube: LocalCluster, namespace: str, sa_kubeconfig: SaKubeconfig, direct_queue: Queue
) -> None:
    """On the direct path a group's Pods are created in turn by the queue; a failing member
    with a retry policy gets exactly its one retry (one Pod each); the group's stop deletes
    every running member's Pod."""
    q = direct_queue
    kc = sa_kubeconfig(namespace=namespace, rules=POD_RULES, name="grouped")
    await q.call("PUT", NS + "/secrets/kc", json_body={"value": kc.read_text()})
    await _provider(q, "g", {"kubeconfig": {"$secret": "kc"}, "namespace": namespace})
    retry = {"limit": 1, "on": ["Error"], "backoff": "0s"}
    failing = {
        "mode": "g-m",
        "script": "print(1)",
        "count": 2,
        "tags": {"sim.nymph.io/outcome": "fail", "sim.nymph.io/run": "1s"},
        "fields": {"retry": retry},
    }
    r = await q.call("POST", f"{NS}/providers/g/launches", json_body=failing)
    assert r.status == 202, r.body
    failed_group = NS + f"/groups/{r.body['groupId']}"
    for _ in range(300):
        members = (await q.call("GET", failed_group + "/instances")).body["items"]
        if len(members) == 4 and all(m["state"] == "stopped" for m in members):
            break
        await asyncio.sleep(0.1)
    assert sorted((m["groupIndex"], m.get("attempt"), m["reason"]) for m in members) == [
        (0, 1, "Error"),
        (0, 2, "Error"),
        (1, 1, "Error"),
        (1, 2, "Error"),
    ]

    running = {"mode": "g-m", "script": "print(1)", "count": 3, "tags": {"sim.nymph.io/run": "1h"}}
    r = await q.call("POST", f"{NS}/providers/g/launches", json_body=running)
    gid = r.body["groupId"]
    for _ in range(300):
        if (await q.call("GET", NS + f"/groups/{gid}")).body["counts"] == {"running": 3}:
            break
        await asyncio.sleep(0.1)
    for _ in range(2):
        assert (await q.call("DELETE", NS + f"/groups/{gid}")).status == 204
    selector = f"labelSelector=nymph.io%2Fgroup%3D{gid}"
    for _ in range(100):
        if not kube.api("GET", f"/api/v1/namespaces/{namespace}/pods?{selector}")["items"]:
            break
        await asyncio.sleep(0.1)
    assert kube.api("GET", f"/api/v1/namespaces/{namespace}/pods?{selector}")["items"] == []
    for _ in range(100):  # the watch reports each deletion
        group = (await q.call("GET", NS + f"/groups/{gid}")).body
        if group["counts"] == {"stopped": 3}:
            break
        await asyncio.sleep(0.1)
    assert group["counts"] == {"stopped": 3} and group["reasons"] == {"Stopped": 3}
