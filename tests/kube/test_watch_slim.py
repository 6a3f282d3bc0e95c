"""The Pod watch's cache holds no ``managedFields``: the API server sends them with every Pod,
nobody here reads them, and a cache of a thousand Pods would carry them all."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from nymph.kube.api import make_api_client
from nymph.kube.watch import PodWatcher
from nymph.localcluster import LocalCluster
from tests.localcluster.test_control_plane import bare_pod
from tests.support.harness import running_watch

pytestmark = [pytest.mark.e2e]


async def test_the_watch_cache_and_its_events_carry_no_managed_fields(
    kube: LocalCluster, namespace: str
) -> None:
    api = await make_api_client(kubeconfig=str(kube.kubeconfig))
    events: list[tuple[str, dict[str, Any]]] = []

    async def on_event(kind: str, pod: dict[str, Any]) -> None:
        events.append((kind, pod))

    kube.api("POST", f"/api/v1/namespaces/{namespace}/pods", bare_pod("listed", {"lakeshore": "true"}))
    watcher = PodWatcher(api=api, namespace=namespace, label_selector="lakeshore=true", on_event=on_event)
    async with running_watch(watcher, api):
        await asyncio.wait_for(watcher.synced.wait(), 30)
        kube.api("POST", f"/api/v1/namespaces/{namespace}/pods", bare_pod("watched", {"lakeshore": "true"}))
        t0 = time.monotonic()
        while "watched" not in watcher.cache:
            assert time.monotonic() - t0 < 30, f"the watched Pod never arrived: {[e[0] for e in events]}"
            await asyncio.sleep(0.1)
    # The API server does send them (so this test would see them if the watch kept them).
    served = kube.api("GET", f"/api/v1/namespaces/{namespace}/pods/watched")
    assert served["metadata"].get("managedFields"), "the API server sent no managedFields to compare with"
    names = {pod["metadata"]["name"] for _, pod in events}
    assert {"listed", "watched"} <= names
    assert all("managedFields" not in pod["metadata"] for _, pod in events)
    assert all("managedFields" not in pod["metadata"] for pod in watcher.cache.values())
    assert watcher.cache["watched"]["metadata"]["uid"] == served["metadata"]["uid"]
