"""A watch whose connection goes silent (half-open TCP: no data, no close) is given up and
relisted, so no Pod change waits behind a dead stream."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from nymph.kube.api import make_api_client
from nymph.kube.watch import PodWatcher
from nymph.localcluster import LocalCluster
from tests.localcluster.test_control_plane import bare_pod
from tests.support.harness import running_watch
from tests.support.kube_fixtures import SaKubeconfig
from tests.support.throttle import ThrottlingProxy

pytestmark = [pytest.mark.faults, pytest.mark.e2e]


async def test_a_silent_watch_is_given_up_and_the_change_still_arrives(
    kube: LocalCluster, namespace: str, sa_kubeconfig: SaKubeconfig, tmp_path: Path
) -> None:
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    direct = sa_kubeconfig(namespace=namespace, rules=rules)
    with ThrottlingProxy(kube) as proxy:
        kubeconfig = proxy.kubeconfig(direct, tmp_path / "proxied.kubeconfig")
        api = await make_api_client(kubeconfig=str(kubeconfig))
        events: list[tuple[str, str]] = []
        restarts: list[str] = []

        async def on_event(kind: str, pod: dict[str, Any]) -> None:
            events.append((kind, pod["metadata"]["name"]))

        watcher = PodWatcher(
            api=api,
            namespace=namespace,
            label_selector="lakeshore=true",
            on_event=on_event,
            on_restart=restarts.append,
            watch_timeout=2,
            stall_margin=1.0,
        )
        proxy.stalling = True
        async with running_watch(watcher, api):
            await asyncio.wait_for(watcher.synced.wait(), 30)
            kube.api("POST", f"/api/v1/namespaces/{namespace}/pods", bare_pod("seen", {"lakeshore": "true"}))
            t0 = time.monotonic()
            while "error" not in restarts:
                assert time.monotonic() - t0 < 30, "a silent watch was never given up"
                await asyncio.sleep(0.1)
            # Given up after about watch_timeout + stall_margin; the relist delivers the Pod.
            proxy.stalling = False
            while ("ADDED", "seen") not in events:
                assert time.monotonic() - t0 < 60, f"the Pod never arrived: {events}"
                await asyncio.sleep(0.1)
