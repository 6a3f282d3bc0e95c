"""A refused relist is an error to retry, never an empty list: after an API server restart its
authorizer can answer 403 for a moment, and an empty list would report every cached Pod as
deleted outside nymph."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nymph.kube import watch as watch_module
from nymph.kube.errors import KubeError
from nymph.kube.watch import PodWatcher


class FakeResponse:
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.reason = "Forbidden" if status == 403 else "OK"
        self._body = json.dumps(body).encode()

    async def read(self) -> bytes:
        return self._body

    def release(self) -> None:
        pass


def _pod(name: str, rv: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "jobs", "resourceVersion": rv},
        "status": {"phase": "Running"},
    }


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (403, {"kind": "Status", "status": "Failure", "message": "pods is forbidden", "code": 403}),
        (500, {"kind": "Status", "status": "Failure", "message": "etcd not ready", "code": 500}),
        (200, {"kind": "Status", "status": "Success"}),  # not a list at all
    ],
)
async def test_a_refused_relist_reports_no_pod_deleted(
    status: int, body: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    answers = [
        FakeResponse(status, body),
        FakeResponse(
            200, {"kind": "PodList", "metadata": {"resourceVersion": "9"}, "items": [_pod("a", "5")]}
        ),
    ]

    class FakeCoreV1:
        def __init__(self, _api: object) -> None:
            pass

        async def list_namespaced_pod(self, *_a: object, **_k: object) -> FakeResponse:
            return answers.pop(0)

    monkeypatch.setattr(watch_module.client, "CoreV1Api", FakeCoreV1)
    events: list[tuple[str, str]] = []

    async def on_event(kind: str, pod: dict[str, Any]) -> None:
        events.append((kind, pod["metadata"]["name"]))

    w = PodWatcher(api=object(), namespace="jobs", label_selector="x=y", on_event=on_event)  # type: ignore[arg-type]
    w.cache = {"a": _pod("a", "5"), "b": _pod("b", "6")}
    with pytest.raises(KubeError):
        await w._relist()
    assert events == [] and set(w.cache) == {"a", "b"}
    # The next relist that is answered delivers what really changed: b is gone, a unchanged.
    assert await w._relist() == "9"
    assert events == [("DELETED", "b")]
