"""Pods rendered before nymph labelled each Pod with its node (:data:`~nymph.launch.names.LABEL_NODE`).

A daemon watches only its own node's Pods, by that label (:func:`~nymph.launch.names.node_selector`),
so that each Pod's changes reach one daemon instead of every daemon of the cluster. A Pod an
older daemon rendered has no such label, and the watch would never see it: before its watch
starts, the daemon gives the label to those rendered for its node (:func:`rendered_for`; a patch
of their labels). Once every Pod of an older version is gone, the list that finds them is empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from nymph.daemon.tracker import pinned_node
from nymph.kube.api import raw_json
from nymph.kube.errors import Forbidden, NotFound
from nymph.launch.names import LABEL_MANAGED, LABEL_NODE, node_label
from nymph.launch.render import ANNOTATION_LAUNCH
from nymph.logsetup import get_logger

log = get_logger("daemon.nodelabels")

#: The nymph Pods without a node label.
UNLABELLED = f"{LABEL_MANAGED}=true,!{LABEL_NODE}"


def rendered_for(pod: Mapping[str, Any], node: str) -> bool:
    """Whether a daemon rendered ``pod`` for ``node``: pinned there by its hostname affinity, with
    the launch annotation nymph writes. A Pod that merely carries nymph's label (or was only
    scheduled to the node) is someone else's, and is never changed."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return pinned_node(pod) == node and ANNOTATION_LAUNCH in annotations


async def label_node_pods(api: client.ApiClient, *, namespace: str, node: str) -> int:
    """Give the nymph Pods of ``namespace`` rendered for ``node`` and without a node label that
    label; how many were given it. A Pod gone meanwhile is skipped, a patch refused by the
    daemon's role ends it with a warning; anything else raises (the caller runs it again)."""
    v1 = client.CoreV1Api(api)
    patch = {"metadata": {"labels": {LABEL_NODE: node_label(node)}}}
    data = await raw_json(
        v1.list_namespaced_pod(namespace, label_selector=UNLABELLED, _preload_content=False)
    )
    count = 0
    for pod in data.get("items") or []:
        if not rendered_for(pod, node):
            continue
        try:
            await raw_json(
                v1.patch_namespaced_pod(pod["metadata"]["name"], namespace, patch, _preload_content=False)
            )
        except NotFound:
            continue
        except Forbidden as exc:
            # a role without "patch" on pods (nymph's own roles have it): the watch runs
            # without them rather than not at all
            log.warning(
                "cannot label the node's Pods rendered before node labels; they are not "
                "followed: give the daemon's role the patch verb on pods",
                namespace=namespace,
                error=str(exc)[:300],
            )
            break
        count += 1
    if count:
        log.info("labelled the node's Pods rendered before node labels", node=node, pods=count)
    return count
