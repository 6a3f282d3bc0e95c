"""The image-pull timeout decision on plain Pod dicts: when a Pod counts as failing its pull,
since when, for how long it may, and what the user is told when it is stopped."""

from __future__ import annotations

from typing import Any

import pytest

from nymph.errors import ConfigError, ValidationError
from nymph.launch.config import Mode, Provider
from nymph.launch.pullwait import (
    ANNOTATION_PULL_TIMEOUT,
    DEFAULT_IMAGE_PULL_TIMEOUT,
    pod_pull_timeout,
    pull_expired,
    pull_failing,
    pull_since,
    pull_timeout_message,
    since_from_history,
)
from nymph.launch.render import render_pod
from nymph.launch.spec import LaunchSpec, build_launch_spec


def pod(
    waiting: str | None = None,
    *,
    phase: str = "Pending",
    deleting: bool = False,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if waiting:
        status["containerStatuses"] = [
            {"name": "user", "state": {"waiting": {"reason": waiting, "message": f"{waiting}: no such host"}}}
        ]
    meta: dict[str, Any] = {"name": "lakeshore-00000001", "annotations": dict(annotations or {})}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "user", "image": "localhost:1/nope:latest"}]},
        "status": status,
    }


@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff", "InvalidImageName"])
def test_a_pending_pod_whose_pull_fails_is_failing(reason: str) -> None:
    """Each kubelet reason that maps to ImagePull counts as a failing pull."""
    assert pull_failing(pod(reason))


@pytest.mark.parametrize(
    "p",
    [
        pod(None),
        pod("ContainerCreating"),
        pod("CreateContainerConfigError"),
        pod("ErrImagePull", deleting=True),
        pod(None, phase="Running"),
        pod(None, phase="Failed"),
    ],
)
def test_other_pods_are_not_failing(p: dict[str, Any]) -> None:
    """A Pod still creating its container, running, ended or going away has no pull clock."""
    assert not pull_failing(p)


def test_the_clock_starts_when_first_seen_and_is_kept_across_backoff() -> None:
    """Since when is the first time the watcher saw the failure; ErrImagePull and
    ImagePullBackOff alternating keep it; a pull that works clears it."""
    since = pull_since(pod("ErrImagePull"), previous=None, now=100.0)
    assert since == 100.0
    since = pull_since(pod("ImagePullBackOff"), previous=since, now=130.0)
    assert since == 100.0
    since = pull_since(pod("ErrImagePull"), previous=since, now=170.0)
    assert since == 100.0
    assert pull_since(pod(None, phase="Running"), previous=since, now=180.0) is None
    assert pull_since(pod("ErrImagePull"), previous=None, now=200.0) == 200.0


def test_expired_only_after_the_timeout() -> None:
    """A pull failing for less than the timeout is left alone; at the timeout it is expired."""
    assert not pull_expired(since=None, timeout=10, now=1e9)
    assert not pull_expired(since=100.0, timeout=10, now=109.9)
    assert pull_expired(since=100.0, timeout=10, now=110.0)


def test_the_timeout_is_read_from_the_pod_annotation() -> None:
    """The Pod's annotation says its timeout; a missing or malformed one means the default."""
    assert pod_pull_timeout(pod("ErrImagePull", annotations={ANNOTATION_PULL_TIMEOUT: "10"})) == 10
    assert pod_pull_timeout(pod("ErrImagePull")) == DEFAULT_IMAGE_PULL_TIMEOUT
    assert pod_pull_timeout(pod("ErrImagePull"), default=300) == 300
    for bad in ("", "0", "-5", "ten", "1.5", "99999999999"):
        assert pod_pull_timeout(pod("ErrImagePull", annotations={ANNOTATION_PULL_TIMEOUT: bad})) == 120


def test_since_from_history_is_the_start_of_the_current_run() -> None:
    """The queue's history gives since when: the entry that entered starting / ImagePull last."""
    assert since_from_history([]) is None
    assert since_from_history([(1.0, "queued", None), (2.0, "starting", None)]) is None
    h = [(1.0, "queued", None), (2.0, "starting", None), (3.0, "starting", "ImagePull")]
    assert since_from_history(h) == 3.0
    h += [(4.0, "starting", None), (5.0, "starting", "ImagePull")]
    assert since_from_history(h) == 5.0
    assert since_from_history([*h, (6.0, "running", None)]) is None


def test_the_message_says_the_image_how_long_and_what_to_check() -> None:
    """The user learns which image, for how long, the kubelet's word, and what to check."""
    text = pull_timeout_message(pod("ImagePullBackOff"), timeout=120)
    assert "'localhost:1/nope:latest' could not be pulled for 2m" in text
    assert "no such host" in text
    assert "image_pull_secrets" in text and "registry" in text


def _spec(**fields: Any) -> LaunchSpec:
    return build_launch_spec(
        provider=Provider(name="p"),
        mode=Mode(name="m", fields={"image": "python:3.12-slim", **fields}),
        body={"script": "print(1)"},
        instance_id="lakeshore-00000001",
    )


def test_a_mode_field_sets_the_timeout_and_the_pod_carries_it() -> None:
    """image_pull_timeout on a mode becomes the spec's imagePullTimeout and the Pod annotation."""
    spec = _spec(image_pull_timeout="10s")
    assert spec.image_pull_timeout == 10
    assert spec.to_json()["imagePullTimeout"] == 10
    assert LaunchSpec.from_json(spec.to_json()) == spec
    assert render_pod(spec)["metadata"]["annotations"][ANNOTATION_PULL_TIMEOUT] == "10"


def test_without_the_field_the_spec_and_pod_are_as_before() -> None:
    """A spec with no timeout has no imagePullTimeout key and its Pod no annotation."""
    spec = _spec()
    assert spec.image_pull_timeout is None
    assert "imagePullTimeout" not in spec.to_json()
    assert ANNOTATION_PULL_TIMEOUT not in render_pod(spec)["metadata"]["annotations"]


def test_a_malformed_timeout_names_the_field() -> None:
    """A timeout that is not a duration is refused when the mode is made, and in a launch's
    fields, naming the field."""
    with pytest.raises(ConfigError, match="mode.image_pull_timeout"):
        _spec(image_pull_timeout="soon")
    with pytest.raises(ValidationError, match="launch.fields.image_pull_timeout"):
        build_launch_spec(
            provider=Provider(name="p"),
            mode=Mode(name="m", fields={"image": "python:3.12-slim"}),
            body={"script": "print(1)", "fields": {"image_pull_timeout": 0}},
            instance_id="lakeshore-00000001",
        )
