"""The direct path on kwok (the real API server; a kwok stage shows ErrImagePull for a Pod
tagged ``sim.nymph.io/outcome=image-pull``): a Pod whose image cannot be pulled for longer than
the queue's image-pull timeout is deleted by the queue and its instance ends stopped /
ImagePull saying why; a mode's ``image_pull_timeout`` gives its launches longer."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

from nymph.localcluster import LocalCluster
from nymph.queue.models import LaunchSettings
from tests.queue.test_direct import DIRECT_TEST_SETTINGS, NS, POD_RULES, _pods, _wait_state
from tests.support.kube_fixtures import SaKubeconfig
from tests.support.queue_helpers import FAST, Queue, open_queue


async def _mode(q: Queue, name: str, fields: dict[str, Any]) -> None:
    r = await q.call(
        "POST",
        NS + "/modes",
        json_body={"name": name, "provider": "pulls", "fields": {"image": "busybox", **fields}},
    )
    assert r.status == 201, r.body


async def _launch(q: Queue, mode: str) -> str:
    tags = {"sim.nymph.io/outcome": "image-pull"}
    r = await q.call(
        "POST", f"{NS}/providers/pulls/launch", json_body={"mode": mode, "script": "print(1)", "tags": tags}
    )
    assert r.status == 202, r.body
    return str(r.body["instanceId"])


async def test_a_direct_pod_that_cannot_pull_is_stopped_after_the_timeout(
    kube: LocalCluster, namespace: str, sa_kubeconfig: SaKubeconfig, tmp_path: Path, queue_db: Path | str
) -> None:
    """With a 2 s queue timeout the launch ends stopped / ImagePull and its Pod is deleted at
    once (the reaper would wait an hour); one whose mode says 1h still waits, ImagePull shown."""
    (tmp_path / "stage").mkdir()
    settings = replace(
        FAST,
        direct=replace(DIRECT_TEST_SETTINGS, tmp_root=str(tmp_path / "stage"), reap_after=3600.0),
        launch=LaunchSettings(image_pull_timeout=2),
    )
    q, runner = await open_queue(tmp_path, settings, db=queue_db)
    try:
        kc = sa_kubeconfig(namespace=namespace, rules=POD_RULES, name="puller")
        await q.call("PUT", NS + "/secrets/kc", json_body={"value": kc.read_text()})
        body = {
            "name": "pulls",
            "launcher": "Kube",
            "dispatch": "direct",
            "kwargs": {"kubeconfig": {"$secret": "kc"}, "namespace": namespace},
        }
        r = await q.call("POST", NS + "/providers", json_body=body)
        assert r.status == 201, r.body
        await _mode(q, "quick", {})
        await _mode(q, "patient", {"image_pull_timeout": "1h"})
        patient = await _launch(q, "patient")
        quick = await _launch(q, "quick")
        inst = await _wait_state(q, "pulls", quick, "stopped")
        assert inst["reason"] == "ImagePull", inst
        assert "'busybox' could not be pulled for 2s" in inst["message"], inst
        assert [h["reason"] for h in inst["history"]][-2:] == ["ImagePull", "ImagePull"]
        for _ in range(50):
            if quick not in _pods(kube, namespace):
                break
            await asyncio.sleep(0.1)
        assert quick not in _pods(kube, namespace)
        r = await q.call("GET", f"{NS}/providers/pulls/instances/{patient}")
        assert (r.body["state"], r.body["reason"]) == ("starting", "ImagePull"), r.body
        assert patient in _pods(kube, namespace)
        r = await q.call("DELETE", f"{NS}/providers/pulls/instances/{patient}")
        assert r.status == 204, r.body
    finally:
        await q.close()
        await runner.cleanup()
