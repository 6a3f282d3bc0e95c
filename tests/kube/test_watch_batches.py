"""A watch with a batch handler (the direct path's, which writes each batch in one transaction):
the changes that arrive while the handler works come next as one batch, in order, and reach
the cache only once the handler took them; a batch the handler fails on is delivered again by
the relist that follows, so no change is lost."""

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

Batch = list[tuple[str, str]]


async def _until(check: Any, what: str, timeout: float = 30) -> None:
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < timeout, what
        await asyncio.sleep(0.05)


def test_a_watcher_takes_one_handler_kind() -> None:
    async def one(_kind: str, _pod: dict[str, Any]) -> None: ...

    async def many(_changes: list[tuple[str, dict[str, Any]]]) -> None: ...

    with pytest.raises(ValueError, match="one of them"):
        PodWatcher(api=object(), namespace="n", label_selector="a=b")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one of them"):
        PodWatcher(api=object(), namespace="n", label_selector="a=b", on_event=one, on_events=many)  # type: ignore[arg-type]


async def test_changes_that_come_while_the_handler_works_are_the_next_batch_in_order(
    kube: LocalCluster, namespace: str
) -> None:
    api = await make_api_client(kubeconfig=str(kube.kubeconfig))
    batches: list[Batch] = []
    cached_while_handled: list[bool] = []
    release = asyncio.Event()

    async def on_events(changes: list[tuple[str, dict[str, Any]]]) -> None:
        names = [(kind, pod["metadata"]["name"]) for kind, pod in changes]
        cached_while_handled.append(
            any(
                (watcher.cache.get(pod["metadata"]["name"]) or {}).get("metadata", {}).get("resourceVersion")
                == pod["metadata"]["resourceVersion"]
                for _, pod in changes
            )
        )
        batches.append(names)
        if any(name == "first" for _, name in names):
            await release.wait()  # busy: what comes meanwhile waits for the next batch

    watcher = PodWatcher(api=api, namespace=namespace, label_selector="batched=true", on_events=on_events)
    async with running_watch(watcher, api):
        await asyncio.wait_for(watcher.synced.wait(), 30)
        kube.api("POST", f"/api/v1/namespaces/{namespace}/pods", bare_pod("first", {"batched": "true"}))
        await _until(lambda: batches, "the first Pod never arrived")
        later = [f"later-{i}" for i in range(5)]
        for name in later:
            kube.api("POST", f"/api/v1/namespaces/{namespace}/pods", bare_pod(name, {"batched": "true"}))
        await asyncio.sleep(1.0)  # the reader takes them in while the handler is busy
        assert len(batches) == 1, f"a change was handled while the handler was busy: {batches}"
        assert "later-0" not in watcher.cache
        release.set()
        await _until(lambda: all(n in watcher.cache for n in later), f"not all arrived: {batches}")
    added = [name for kind, name in batches[1] if kind == "ADDED"]
    assert added == later, f"the changes read meanwhile were not one batch in order: {batches}"
    assert not any(cached_while_handled), "the cache took a change before its handler returned"


async def test_a_batch_the_handler_fails_on_is_delivered_again(kube: LocalCluster, namespace: str) -> None:
    api = await make_api_client(kubeconfig=str(kube.kubeconfig))
    handled: list[Batch] = []
    restarts: list[str] = []
    failed: list[Batch] = []

    async def on_events(changes: list[tuple[str, dict[str, Any]]]) -> None:
        names = [(kind, pod["metadata"]["name"]) for kind, pod in changes]
        if not failed and any(name == "unlucky" for _, name in names):
            failed.append(names)
            raise RuntimeError("the database is locked")
        handled.append(names)

    watcher = PodWatcher(
        api=api,
        namespace=namespace,
        label_selector="batched=true",
        on_events=on_events,
        on_restart=restarts.append,
    )
    async with running_watch(watcher, api):
        await asyncio.wait_for(watcher.synced.wait(), 30)
        kube.api("POST", f"/api/v1/namespaces/{namespace}/pods", bare_pod("unlucky", {"batched": "true"}))
        await _until(lambda: failed, "the Pod never arrived")
        assert "unlucky" not in watcher.cache
        await _until(lambda: "unlucky" in watcher.cache, f"never delivered again: {handled}")
    assert restarts and restarts[0] == "error"
    assert ("ADDED", "unlucky") in [c for batch in handled for c in batch]
