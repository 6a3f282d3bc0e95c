"""Infra used by the live dockyard tests (real API server, real Ray head)."""

from __future__ import annotations

from typing import Any


def live_infra(*, launch: dict[str, Any], sandbox_replicas: int) -> dict[str, Any]:
    """A small GPU-free infra: a sandbox pool kwok keeps Running, one trainer and one
    inference worker."""

    def group(name: str) -> dict[str, Any]:
        return {"groupName": name, "replicas": 1, "template": {"spec": {"containers": [{"name": "w"}]}}}

    return {
        "image": "dockyard/img:1",
        "launch": launch,
        # kwok keeps these pods Running (default: they succeed after 1 s and get replaced).
        "sandbox": {"name": "sbx", "replicas": sandbox_replicas, "labels": {"sim.nymph.io/run": "1h"}},
        "kuberay": {
            "name": "grpo",
            "spec": {
                "headGroupSpec": {"template": {"spec": {"containers": [{"name": "ray-head"}]}}},
                "workerGroupSpecs": [group("trainer"), group("inference")],
            },
        },
    }
