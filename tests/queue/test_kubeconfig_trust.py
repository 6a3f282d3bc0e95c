"""User-supplied kubeconfigs in the queue: checked when a provider or mode is saved, when a
secret one of them names is set, and again each time the kubeconfig is loaded (a secret that
reached the store some other way is refused at the launch, before anything runs); the operator's
flags widen exactly what they say."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.cli.queue import kubeconfig_dirs
from nymph.errors import ConfigError
from nymph.queue.direct.settings import DirectSettings
from nymph.queue.direct.wiring import SECRETS
from tests.support.queue_helpers import FAST, Queue, open_queue

NS = "/v1/namespaces/default"


def kubeconfig(*, server: str = "https://kube.example.test:6443", **user: Any) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "c",
            "clusters": [{"name": "k", "cluster": {"server": server}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            "users": [{"name": "u", "user": user or {"token": "t0ken-value"}}],
        }
    )


async def _open(tmp_path: Path, queue_db: Path | str, **direct: Any) -> tuple[Queue, Any]:
    (tmp_path / "stage").mkdir(exist_ok=True)
    settings = replace(FAST, direct=DirectSettings(tmp_root=str(tmp_path / "stage"), interval=0.2, **direct))
    return await open_queue(tmp_path, settings, db=queue_db)


@pytest.fixture
async def tq(tmp_path: Path, queue_db: Path | str) -> AsyncIterator[Queue]:
    q, runner = await _open(tmp_path, queue_db)
    try:
        yield q
    finally:
        await q.close()
        await runner.cleanup()


def provider(ref: object) -> dict[str, Any]:
    return {"launcher": "Kube", "dispatch": "direct", "kwargs": {"kubeconfig": ref, "namespace": "jobs"}}


async def test_a_hostile_secret_already_in_the_store_is_refused_at_every_load(
    tq: Queue, tmp_path: Path
) -> None:
    marker = tmp_path / "exec-ran"
    assert (await tq.call("PUT", NS + "/providers/p", json_body=provider({"$secret": "kc"}))).status == 200
    mode = {"provider": "p", "fields": {"image": "busybox"}}
    assert (await tq.call("PUT", NS + "/modes/m", json_body=mode)).status == 200
    # as if it had been stored before this check existed: straight into the store
    hostile = kubeconfig(exec={"command": "/bin/sh", "args": ["-c", f"touch {marker}"]})
    await tq.app[SECRETS].put(ns="default", name="kc", value=hostile)
    r = await tq.call("POST", NS + "/providers/p/launch", json_body={"mode": "m", "script": "x"})
    assert r.status == 400 and "users[0].user.exec" in r.body["detail"], r.body
    r = await tq.call("POST", NS + "/providers/p/test", json_body={})
    task = await tq.call("GET", f"{NS}/tasks/{r.body['taskId']}")
    assert task.body["status"] == "failed" and "users[0].user.exec" in str(task.body), task.body
    assert not marker.exists()


async def test_a_secret_a_mode_names_is_checked_when_set_and_others_are_not(tq: Queue) -> None:
    plain = {"launcher": "Kube", "dispatch": "direct", "kwargs": {"namespace": "jobs"}}
    assert (await tq.call("PUT", NS + "/providers/p", json_body=plain)).status == 200
    body = {"provider": "p", "fields": {"image": "busybox", "kubeconfig": {"$secret": "mode-kc"}}}
    assert (await tq.call("PUT", NS + "/modes/m", json_body=body)).status == 200
    r = await tq.call(
        "PUT", NS + "/secrets/mode-kc", json_body={"value": kubeconfig(tokenFile="/etc/shadow")}
    )
    assert r.status == 400 and "users[0].user.tokenFile" in r.body["detail"], r.body
    assert "/etc/shadow" not in r.body["detail"]
    ok = await tq.call("PUT", NS + "/secrets/mode-kc", json_body={"value": kubeconfig()})
    assert ok.status == 200, ok.body
    # a secret no provider or mode uses as a kubeconfig is only a value
    assert (await tq.call("PUT", NS + "/secrets/api-key", json_body={"value": "exec: x"})).status == 200
    # and naming a hostile secret that is already set is refused when the mode is saved
    await tq.call("PUT", NS + "/secrets/later", json_body={"value": kubeconfig(exec={"command": "x"})})
    body["fields"]["kubeconfig"] = {"$secret": "later"}
    r = await tq.call("PUT", NS + "/modes/m2", json_body=body)
    assert r.status == 400 and "users[0].user.exec" in r.body["detail"], r.body


async def test_a_literal_loopback_server_is_refused_when_saved_naming_the_flag(tq: Queue) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.5)
        server = f"https://127.0.0.1:{listener.getsockname()[1]}"
        r = await tq.call("PUT", NS + "/providers/lo", json_body=provider(kubeconfig(server=server)))
        assert r.status == 403 and r.body["error"] == "kube_server_refused", r.body
        assert "--kube-server-allow" in r.body["detail"]
        with pytest.raises(TimeoutError):
            listener.accept()


async def test_the_operator_flags_widen_exactly_what_they_say(tmp_path: Path, queue_db: Path | str) -> None:
    insecure = yaml.safe_load(kubeconfig(server="https://127.0.0.1:6443"))
    insecure["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = True
    text = yaml.safe_dump(insecure)
    q, runner = await _open(tmp_path, queue_db, allow_insecure_tls=True, kube_server_allow=("127.0.0.1",))
    try:
        assert (await q.call("PUT", NS + "/providers/ok", json_body=provider(text))).status == 200
        other = kubeconfig(server="https://10.9.8.7:6443")  # not on the allow-list
        r = await q.call("PUT", NS + "/providers/no", json_body=provider(other))
        assert r.status == 403 and "--kube-server-allow 10.9.8.7" in r.body["detail"], r.body
    finally:
        await q.close()
        await runner.cleanup()


def test_kubeconfig_dir_values_are_bare_or_per_namespace(tmp_path: Path) -> None:
    bare, team = kubeconfig_dirs([str(tmp_path), "team-a=/srv/a", "./rel=x", "~/kc"])
    assert bare == (tmp_path, Path("rel=x"), Path("~/kc").expanduser())
    assert team == (("team-a", Path("/srv/a")),)
    for bad in ("=/srv", "team-a="):
        with pytest.raises(ConfigError, match="NS=DIR"):
            kubeconfig_dirs([bad])
