"""How long a Pod may fail to pull its image before nymph stops it (pure).

The kubelet retries a pull that fails (``ErrImagePull``, ``ImagePullBackOff``,
``InvalidImageName``... see :func:`nymph.launch.state.pod_reason`) for ever, so a launch with an
image that cannot be pulled would wait in ``starting`` for ever. nymph gives it the **image-pull
timeout** (a queue setting, ``nymph queue serve --image-pull-timeout``, default
:data:`DEFAULT_IMAGE_PULL_TIMEOUT`; a mode's ``image_pull_timeout`` wins): a Pod whose pull has
failed without a break for longer than that is deleted and its instance ends ``stopped`` /
``ImagePull`` with :func:`pull_timeout_message`.

The timeout travels in the launch spec (``imagePullTimeout``) and on the Pod as the annotation
:data:`ANNOTATION_PULL_TIMEOUT`, so whoever watches the Pod (a daemon, adopting it after a
restart, or the queue on the direct path) reads it there. "Since when" is the first time the
watcher saw the pull fail (:func:`pull_since`); a Pod whose pull works again (or that starts, or
ends) has its clock cleared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nymph.launch.durations import format_duration
from nymph.launch.state import InstanceState, Reason, pod_reason, pod_state

#: The image-pull timeout when neither the queue nor the mode names one: 2 minutes.
DEFAULT_IMAGE_PULL_TIMEOUT = 120
#: The Pod annotation carrying its image-pull timeout (whole seconds).
ANNOTATION_PULL_TIMEOUT = "nymph.io/image-pull-timeout"


def pull_failing(pod: Mapping[str, Any]) -> bool:
    """Whether a Pod is waiting on an image pull that failed (and is not going away)."""
    if pod_state(pod) is not InstanceState.STARTING:
        return False
    reason, _ = pod_reason(pod)
    return reason is Reason.IMAGE_PULL


def pull_since(pod: Mapping[str, Any], *, previous: float | None, now: float) -> float | None:
    """Since when ``pod`` has been failing its pull, as a watcher that last knew ``previous``
    (None: not failing) sees it at ``now``: ``previous`` kept while it still fails, ``now`` when
    it just started failing, None once it does not."""
    if not pull_failing(pod):
        return None
    return now if previous is None else previous


def pod_pull_timeout(pod: Mapping[str, Any], *, default: int = DEFAULT_IMAGE_PULL_TIMEOUT) -> int:
    """The image-pull timeout of ``pod`` (seconds): its :data:`ANNOTATION_PULL_TIMEOUT`, else
    ``default`` (a Pod made before the annotation existed, or one it is not valid on)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(ANNOTATION_PULL_TIMEOUT) if isinstance(annotations, Mapping) else None
    if isinstance(raw, str) and raw.isdigit() and 0 < int(raw) <= 365 * 86_400:
        return int(raw)
    return default


def pull_expired(*, since: float | None, timeout: float, now: float) -> bool:
    """Whether a pull failing ``since`` has failed for longer than ``timeout`` at ``now``."""
    return since is not None and now - since >= timeout


def since_from_history(events: Sequence[tuple[float, str, str | None]]) -> float | None:
    """When the current run of ``starting`` / ``ImagePull`` began in an instance's history
    (``(at, state, reason)`` oldest first), or None when its last entry is not that."""
    since: float | None = None
    for at, state, reason in events:
        if state == InstanceState.STARTING.value and reason == Reason.IMAGE_PULL.value:
            since = at if since is None else since
        else:
            since = None
    return since


def pod_image(pod: Mapping[str, Any], *, container: str = "user") -> str:
    """The image of ``container`` of a Pod ('' when it has none)."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        if isinstance(c, Mapping) and c.get("name") == container:
            return str(c.get("image") or "")
    return ""


def pull_timeout_message(pod: Mapping[str, Any], *, timeout: int) -> str:
    """What a user is told when ``pod`` is stopped because its image could not be pulled for
    ``timeout`` seconds: the image, how long, the kubelet's last word and what to check."""
    image = pod_image(pod)
    _, detail = pod_reason(pod)
    what = f"the image {image!r}" if image else "the image"
    last = f" (last error: {detail[:500]})" if detail else ""
    return (
        f"{what} could not be pulled for {format_duration(timeout)}{last}; the launch was stopped. "
        "Check the image name and tag, that its registry is reachable from the node, and the "
        "mode's image_pull_secrets for a private registry (a mode's image_pull_timeout gives a "
        "slow registry longer)"
    )
