"""The secret store over HTTP, and the grep: secret text never reaches a log line, an error
body, the database file (or its WAL) in clear, or a temp dir after the call."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml

from nymph.localcluster import LocalCluster
from nymph.logsetup import configure_logging
from nymph.queue.direct.settings import DirectSettings
from tests.support.kube_fixtures import SaKubeconfig
from tests.support.queue_helpers import FAST, Queue, open_queue

NS = "/v1/namespaces/default"
POD_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]}
]


@pytest.fixture
async def squeue(tmp_path: Path) -> AsyncIterator[Queue]:
    (tmp_path / "stage").mkdir()
    # the test cluster's API server is on loopback, refused to user kubeconfigs by default
    direct = DirectSettings(tmp_root=str(tmp_path / "stage"), interval=0.2, kube_server_allow=("127.0.0.1",))
    settings = replace(FAST, direct=direct)
    q, runner = await open_queue(tmp_path, settings)
    try:
        yield q
    finally:
        await q.close()
        await runner.cleanup()


async def test_secrets_are_per_namespace_listed_by_name_and_never_returned(
    squeue: Queue, tmp_path: Path
) -> None:
    q = squeue
    r = await q.call("PUT", NS + "/secrets/kc", json_body={"value": "v4lue-one"})
    assert r.status == 200 and set(r.body) == {"name", "createdAt", "updatedAt"}
    assert (await q.call("PUT", NS + "/secrets/kc", json_body={"value": "v4lue-two"})).status == 200
    r = await q.call("GET", NS + "/secrets")
    assert [i["name"] for i in r.body["items"]] == ["kc"] and "v4lue" not in r.text
    assert (await q.call("GET", "/v1/namespaces/team-b/secrets")).body == {"items": []}
    for bad, code in (
        ({"value": ""}, "invalid_body"),
        ({"value": 3}, "invalid_body"),
        ({"v": "x"}, "invalid_body"),
    ):
        r = await q.call("PUT", NS + "/secrets/kc2", json_body=bad)
        assert r.status in (400, 422) and r.body["error"] == code, r.body
    r = await q.call("PUT", NS + "/secrets/bad%2Fname", json_body={"value": "x"})
    assert r.status in (400, 404)
    assert (await q.call("DELETE", NS + "/secrets/kc")).status == 204
    r = await q.call("DELETE", NS + "/secrets/kc")
    assert r.status == 404 and r.body["error"] == "secret_not_found"
    key = tmp_path / "queue.db.secret-key"
    assert key.exists() and oct(key.stat().st_mode & 0o777) == "0o600"


async def test_a_provider_cannot_reference_another_namespaces_secret(squeue: Queue) -> None:
    q = squeue
    await q.call(
        "PUT", "/v1/namespaces/team-b/secrets/kc", json_body={"value": "apiVersion: v1\nusers: []\n"}
    )
    body = {
        "name": "p",
        "launcher": "Kube",
        "dispatch": "direct",
        "kwargs": {"kubeconfig": {"$secret": "kc"}},
    }
    assert (await q.call("POST", "/v1/namespaces/team-a/providers", json_body=body)).status == 201
    await q.call(
        "POST",
        "/v1/namespaces/team-a/modes",
        json_body={"name": "m", "provider": "p", "fields": {"image": "busybox"}},
    )
    r = await q.call(
        "POST", "/v1/namespaces/team-a/providers/p/launch", json_body={"mode": "m", "script": "x"}
    )
    assert r.status == 400 and "no secret 'kc' in namespace 'team-a'" in r.body["detail"]


def _files_holding(root: Path, needles: list[bytes], *, since: float, skip: Path) -> list[str]:
    hits = []
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            if p == skip:
                continue  # the test's own kubeconfig, where the secret comes from
            try:
                st = p.lstat()
                if not p.is_file() or st.st_mtime < since or st.st_size > 4 * 1024 * 1024:
                    continue
                data = p.read_bytes()
            except OSError:
                continue
            hits += [str(p) for n in needles if n in data]
    return hits


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp dir of this process and its children for the test: what the queue leaves there
    is then the test's to grep (the shared one holds every other test's and process's files)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("TMPDIR", str(tmp))
    return tmp


async def test_secret_text_is_nowhere_to_be_found(
    kube: LocalCluster,
    namespace: str,
    sa_kubeconfig: SaKubeconfig,
    private_tmp: Path,
    squeue: Queue,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    q = squeue
    started = time.time() - 1
    buf = io.StringIO()
    configure_logging(fmt="json", stream=buf, level="debug")
    caplog.set_level(logging.DEBUG)
    try:
        kc_path = sa_kubeconfig(namespace=namespace, rules=POD_RULES, name="grepped")
        kc_text = kc_path.read_text()
        token = yaml.safe_load(kc_text)["users"][0]["user"]["token"]
        marker = "n0t-a-kubec0nfig-marker-71"
        broken = f"clusters: [{marker}\n  - {marker}: {{\n"
        bodies: list[str] = []

        async def call(method: str, path: str, body: object) -> int:
            r = await q.call(method, NS + path, json_body=body)
            bodies.append(r.text)
            return r.status

        assert await call("PUT", "/secrets/good", {"value": kc_text}) == 200
        assert await call("PUT", "/secrets/broken", {"value": broken}) == 200
        # a secret that is not a kubeconfig is refused when a provider names it, as inline content is
        broken_ref = {"kubeconfig": {"$secret": "broken"}, "namespace": namespace}
        assert (
            await call(
                "POST",
                "/providers",
                {"name": "broken", "launcher": "Kube", "dispatch": "direct", "kwargs": broken_ref},
            )
            == 400
        )
        for name, ref in (("good", {"$secret": "good"}), ("inline", kc_text)):
            kwargs = {"kubeconfig": ref, "namespace": namespace}
            assert (
                await call(
                    "POST",
                    "/providers",
                    {"name": name, "launcher": "Kube", "dispatch": "direct", "kwargs": kwargs},
                )
                == 201
            )
            assert (
                await call(
                    "POST", "/modes", {"name": f"{name}-m", "provider": name, "fields": {"image": "busybox"}}
                )
                == 201
            )
        wrong_ctx = {"kubeconfig": {"$secret": "good"}, "context": "nope", "namespace": namespace}
        assert (
            await call(
                "POST",
                "/providers",
                {"name": "ctx", "launcher": "Kube", "dispatch": "direct", "kwargs": wrong_ctx},
            )
            == 201
        )
        assert (
            await call("POST", "/modes", {"name": "ctx-m", "provider": "ctx", "fields": {"image": "busybox"}})
            == 201
        )
        elsewhere = {"kubeconfig": {"$secret": "good"}, "namespace": "default"}
        assert (
            await call(
                "POST",
                "/providers",
                {"name": "denied", "launcher": "Kube", "dispatch": "direct", "kwargs": elsewhere},
            )
            == 201
        )
        assert (
            await call(
                "POST", "/modes", {"name": "denied-m", "provider": "denied", "fields": {"image": "busybox"}}
            )
            == 201
        )
        bad_inline = {"kubeconfig": broken, "namespace": namespace}
        assert (
            await call(
                "POST",
                "/providers",
                {"name": "x", "launcher": "Kube", "dispatch": "direct", "kwargs": bad_inline},
            )
            == 400
        )

        for provider, status in (
            ("good", 202),
            ("inline", 202),
            ("broken", 404),
            ("ctx", 400),
            ("denied", 403),
        ):
            got = await call(
                "POST", f"/providers/{provider}/launch", {"mode": f"{provider}-m", "script": "print(1)"}
            )
            assert got == status, (provider, bodies[-1])
            await call("GET", f"/providers/{provider}/instances", None)
            await call("POST", f"/providers/{provider}/test", {})
        assert any("does not parse as a kubeconfig" in b for b in bodies)
    finally:
        structlog.reset_defaults()

    needles = [token, marker, kc_text]
    texts = {
        "structlog": buf.getvalue(),
        "stdlib logging": caplog.text,
        "captured": "".join(capfd.readouterr()),
    }
    texts["error bodies"] = "\n".join(bodies)
    for where, text in texts.items():
        for n in needles:
            assert n not in text, f"secret text in {where}"
    assert len(buf.getvalue()) > 0 and any(
        "direct launch created" in line for line in buf.getvalue().splitlines()
    )
    _grep_files(tmp_path, [token.encode(), marker.encode()], since=started, skip=kc_path, tmp=private_tmp)


def _grep_files(tmp_path: Path, raw: list[bytes], *, since: float, skip: Path, tmp: Path) -> None:
    db_files = [p for p in tmp_path.iterdir() if p.name.startswith("queue.db")]
    assert db_files and all(n not in p.read_bytes() for p in db_files for n in raw), "in the database"
    assert os.listdir(tmp_path / "stage") == []
    assert _files_holding(tmp, raw, since=since, skip=skip) == []


async def test_a_missing_secret_key_file_is_named_in_the_answer_not_a_bare_500(tmp_path: Path) -> None:
    """An operator's --secret-key-file that does not exist: a write says which file and what to
    do (code ``secret_key``), and nothing is stored."""
    (tmp_path / "stage").mkdir()
    missing = tmp_path / "keys" / "queue.key"
    direct = DirectSettings(tmp_root=str(tmp_path / "stage"), interval=0.2, secret_key_file=missing)
    q, runner = await open_queue(tmp_path, replace(FAST, direct=direct))
    try:
        r = await q.call("PUT", NS + "/secrets/kc", json_body={"value": "v4lue-one"})
        assert r.status == 500 and r.body["error"] == "secret_key", r.body
        assert str(missing) in r.body["detail"] and "create it" in r.body["detail"]
        assert "v4lue" not in r.text
        assert (await q.call("GET", NS + "/secrets")).body == {"items": []}
        assert not missing.exists()  # an operator's key file is never made up
    finally:
        await q.close()
        await runner.cleanup()


async def test_a_value_read_for_calls_is_reused_briefly_and_a_change_here_is_seen_at_once(
    squeue: Queue,
) -> None:
    """A call's credential (``max_age``) is read from the store again only once it is that old:
    a value another replica wrote meanwhile is used from then on, and one written through this
    replica (put, delete) at once. A read without ``max_age`` always reads the store."""
    from nymph.queue.direct.wiring import SECRETS
    from nymph.queue.errors import NotFound
    from nymph.queue.sql import secrets as secret_sql

    store = squeue.app[SECRETS]
    await store.put(ns="default", name="kc", value="first-value")
    assert await store.plaintext(ns="default", name="kc", max_age=0.3) == "first-value"

    async def elsewhere(value: str) -> None:  # as another replica writes it: not through this store
        blob = store.box.seal(ns="default", name="kc", value=value, have_secrets=True)
        await store.db.write(
            lambda c: secret_sql.put(c, ns="default", name="kc", ciphertext=blob, ts=time.time())
        )

    await elsewhere("second-value")
    assert await store.plaintext(ns="default", name="kc", max_age=0.3) == "first-value"
    assert await store.plaintext(ns="default", name="kc") == "second-value"
    await asyncio.sleep(0.35)
    assert await store.plaintext(ns="default", name="kc", max_age=0.3) == "second-value"

    await store.put(ns="default", name="kc", value="third-value")
    assert await store.plaintext(ns="default", name="kc", max_age=60) == "third-value"
    await store.delete(ns="default", name="kc")
    with pytest.raises(NotFound):
        await store.plaintext(ns="default", name="kc", max_age=60)


async def test_a_read_that_a_change_overtakes_is_not_kept(
    squeue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A value read for calls whose answer comes back after this replica changed the secret is
    not kept: the next call uses the new value, not the one read before the change."""
    from nymph.queue.direct.wiring import SECRETS

    store = squeue.app[SECRETS]
    await store.put(ns="default", name="kc", value="old-value")
    real = store.db.read_one
    hold = asyncio.Event()

    async def slow_read(fn: Any) -> Any:
        got = await real(fn)  # read before the change...
        await hold.wait()  # ...answered after it
        return got

    monkeypatch.setattr(store.db, "read_one", slow_read)
    reading = asyncio.create_task(store.plaintext(ns="default", name="kc", max_age=60))
    await asyncio.sleep(0.05)
    monkeypatch.setattr(store.db, "read_one", real)
    await store.put(ns="default", name="kc", value="new-value")
    hold.set()
    assert await reading == "old-value"
    assert await store.plaintext(ns="default", name="kc", max_age=60) == "new-value"
