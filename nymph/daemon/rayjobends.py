"""The end of a dockyard RayJob, reported: a ``launch.mode: rayjob`` instance is ``running`` once
its objects are applied, and ``stopped`` once KubeRay says its RayJob has ended.

Every ``interval`` seconds one ``kubectl get rayjobs -l nymph.io/launch`` per served namespace
reads the RayJobs of dockyard launches (the ``list`` verb of the dockyard Role). For one whose
``jobDeploymentStatus`` is terminal (:func:`rayjob_end`, pure), the launch's other objects
(its sandbox pool: named on the RayJob by the daemon when it applied it,
:data:`nymph.dockyard.ownership.POOL_ANNOTATION`, read back by name and deleted only if they
carry the launch's label, as a stop does) are deleted, and the instance is reported
``stopped``: reason ``Completed`` for SUCCEEDED, ``DeadlineExceeded`` when KubeRay says so,
``Error`` with KubeRay's message otherwise. The RayJob itself stays: its status and the
head's logs remain readable until KubeRay's ``ttlSecondsAfterFinished`` takes the cluster down,
and a later ``nymph stop`` has nothing left to do. Each launch is reported once per daemon run;
after a restart an ended one is reported again, which the queue takes as the same end.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nymph.daemon.audit import AuditLog
from nymph.daemon.tasks.dockyard_objects import Deleted, DockyardObject, delete_owned
from nymph.daemon.tracker import Report, Tracker
from nymph.dockyard.ownership import LAUNCH_LABEL, companions
from nymph.kube.errors import KubeError, classify_kubectl
from nymph.kube.kubectl import Kubectl
from nymph.launch.names import is_instance_id
from nymph.launch.state import InstanceState, Reason
from nymph.logsetup import get_logger

INTERVAL_SECONDS = 5.0
IDLE_SECONDS = 60.0
_TERMINAL = frozenset({"Complete", "Failed"})
_RESULTS = {Deleted.DELETED: "rayjob-ended", Deleted.ABSENT: "already-gone", Deleted.NOT_OWNED: "not-owned"}

log = get_logger("rayjob-ends")


# --- pure --------------------------------------------------------------------------------------


def rayjob_end(rayjob: Mapping[str, Any]) -> Report | None:
    """The instance's final report for a RayJob that has ended, or ``None`` while it has not."""
    status = rayjob.get("status")
    if not isinstance(status, Mapping):
        return None
    deployment = status.get("jobDeploymentStatus")
    if deployment not in _TERMINAL:
        return None
    name = str((rayjob.get("metadata") or {}).get("name") or "?")
    job = status.get("jobStatus") or "-"
    if deployment == "Complete" and job == "SUCCEEDED":
        return Report(InstanceState.STOPPED, Reason.COMPLETED, f"RayJob {name} succeeded")
    why = str(status.get("message") or status.get("reason") or f"job {job}")
    reason = Reason.DEADLINE_EXCEEDED if status.get("reason") == "DeadlineExceeded" else Reason.ERROR
    return Report(InstanceState.STOPPED, reason, f"RayJob {name} failed (job {job}): {why}"[:2000])


def launch_of(obj: Mapping[str, Any]) -> str | None:
    """The instance id an object's ``nymph.io/launch`` label names, if it is one."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    value = labels.get(LAUNCH_LABEL) if isinstance(labels, Mapping) else None
    return value if isinstance(value, str) and is_instance_id(value) else None


def items_of(stdout: str) -> list[dict[str, Any]]:
    """The objects of a ``kubectl get -o json`` answer (a List or one object)."""
    if not stdout.strip():
        return []
    doc = json.loads(stdout)
    items = doc.get("items") if doc.get("kind") == "List" else [doc]
    return [i for i in items or [] if isinstance(i, dict)]


# --- I/O ---------------------------------------------------------------------------------------


@dataclass
class RayJobEnds:
    kubectl: Kubectl
    tracker: Tracker
    audit: AuditLog
    namespaces: Sequence[str]
    node: str | None
    interval: float = INTERVAL_SECONDS
    reported: set[str] = field(default_factory=set)

    async def run(self) -> None:
        """Sweep every served namespace each ``interval``; one where RayJobs are not served (no
        KubeRay CRDs) or not readable (no dockyard Role) is tried again only after
        :data:`IDLE_SECONDS`, so a daemon without dockyard costs one kubectl run a minute."""
        idle_until: dict[str, float] = {}
        loop = asyncio.get_running_loop()
        while True:
            for ns in self.namespaces:
                if idle_until.get(ns, 0.0) > loop.time():
                    continue
                try:
                    await self.sweep(ns)
                except (KubeError, ValueError) as exc:
                    idle_until[ns] = loop.time() + IDLE_SECONDS
                    log.debug("rayjob sweep failed", namespace=ns, error=str(exc))
            await asyncio.sleep(self.interval)

    async def _get(self, namespace: str, kinds: str, selector: str) -> list[dict[str, Any]]:
        res = await self.kubectl.run(["get", kinds, f"--namespace={namespace}", "-l", selector, "-o", "json"])
        if res.code != 0:
            raise classify_kubectl(res.stderr)
        return items_of(res.stdout)

    async def sweep(self, namespace: str) -> list[str]:
        """Report every ended RayJob of a launch in ``namespace`` not reported yet; returns the
        instance ids reported."""
        done: list[str] = []
        for rayjob in await self._get(namespace, "rayjobs.ray.io", LAUNCH_LABEL):
            iid = launch_of(rayjob)
            report = rayjob_end(rayjob)
            if iid is None or report is None or iid in self.reported:
                continue
            left = await self._delete_pool(rayjob, iid)
            if left is not None:
                report = Report(report.state, report.reason, f"{report.message}; {left}")
            self.tracker.report_unpinned(iid, report)
            self.reported.add(iid)
            done.append(iid)
            log.info("dockyard rayjob ended", instance=iid, reason=report.reason, message=report.message)
        return done

    async def _delete_pool(self, rayjob: Mapping[str, Any], iid: str) -> str | None:
        """Delete the launch's other objects (named on its RayJob, deleted only if they carry the
        launch's label); a note for the report when some of them stay."""
        objs = companions(rayjob)
        if not objs:
            return None
        results = await delete_owned(self.kubectl, objs, launch=iid)
        failed: list[str] = []
        for obj, result in zip(objs, results, strict=True):
            ref = DockyardObject.of(obj)
            error = result if isinstance(result, KubeError) else None
            outcome = "failed" if isinstance(result, KubeError) else _RESULTS[result]
            if error is not None:
                failed.append(f"{ref.ref}: {error.message}")
            self.audit.append(
                "delete",
                instance=iid,
                namespace=ref.namespace,
                node=self.node,
                kind=ref.kind,
                name=ref.name,
                result=outcome,
                error=None if error is None else error.message[:500],
            )
        return f"not deleted: {'; '.join(failed)}"[:500] if failed else None
