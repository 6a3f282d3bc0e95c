"""The direct path's records: every read and write the launcher, the watches, the reaper and
the log followers make, as methods of one object the store holds (they never hold the database
or the SQL modules themselves)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nymph.launch.config import Mode, Provider
from nymph.protocol import InstanceJSON, LaunchAccepted
from nymph.queue.db import Backend
from nymph.queue.paging import Page, PageRequest
from nymph.queue.sql import catalog, instances, launches, pages, pulls
from nymph.queue.sql import direct as sql
from nymph.queue.sql.dialect import Row

#: Pods whose last applied version is remembered, and direct launches known as such (live
#: direct Pods of one replica; past that the memory starts again, which costs only writes that
#: change nothing and reads).
MAX_APPLIED = 100_000


def _name_and_version(pod: Mapping[str, Any]) -> tuple[str, str | None]:
    meta = pod.get("metadata") or {}
    return str(meta.get("name") or ""), meta.get("resourceVersion") or None


class DirectRecords:
    def __init__(self, *, db: Backend) -> None:
        self.db = db
        #: The resourceVersion of each Pod last applied here (its name is its instance id). A
        #: version is one state of one object: applied again, it changes nothing, so the watch's
        #: ADDED that repeats a create's answer, and every unchanged Pod a relist delivers after
        #: a watch reconnects, cost no write transaction.
        self._applied: dict[str, str] = {}
        #: The direct launches recorded here (and not forgotten since). An instance's dispatch
        #: never changes, so the log followers' question (:meth:`is_direct`), asked at every Pod
        #: that starts, is answered without a read for the launches this replica made.
        self._direct: set[str] = set()

    def _known_direct(self, instance_id: str) -> None:
        if len(self._direct) >= MAX_APPLIED:
            self._direct.clear()
        self._direct.add(instance_id)

    def _remember(self, pod: Mapping[str, Any]) -> None:
        name, version = _name_and_version(pod)
        if not name or version is None:
            return
        if len(self._applied) >= MAX_APPLIED:
            self._applied.clear()
        self._applied[name] = version

    def applied(self, pod: Mapping[str, Any]) -> bool:
        """Whether this very version of the Pod was applied here already."""
        name, version = _name_and_version(pod)
        return version is not None and bool(name) and self._applied.get(name) == version

    # --- launches ------------------------------------------------------------------------

    async def record_launch(
        self,
        *,
        ns: str,
        provider: str,
        body: Mapping[str, Any],
        idempotency_key: str | None,
        requester: str,
        guard: launches.Guard | None,
        image_pull_timeout: int | None = None,
    ) -> sql.DirectLaunch:
        rec = await self.db.write(
            lambda c: sql.record_launch(
                c,
                ns=ns,
                provider_name=provider,
                body=body,
                idempotency_key=idempotency_key,
                requester=requester,
                guard=guard,
                image_pull_timeout=image_pull_timeout,
            )
        )
        self._known_direct(rec.accepted["instanceId"])
        return rec

    async def take_held(self) -> list[sql.DirectLaunch]:
        """Held launches whose turn has come, now counted towards their quota."""
        return await self.db.write(lambda c: sql.take_held(c))

    async def fail_held(self, *, instance_id: str, message: str, ts: float) -> bool:
        return await self.db.write(
            lambda c: sql.fail_held(c, instance_id=instance_id, message=message, ts=ts)
        )

    async def forget(self, *, instance_id: str) -> None:
        """The Pod could not be created: no trace of the launch is kept."""
        self._direct.discard(instance_id)
        await self.db.write(lambda c: sql.forget(c, instance_id=instance_id))

    async def created(
        self, *, ns: str, pod: Mapping[str, Any], ts: float, accepted: LaunchAccepted, keyed: bool
    ) -> str | None:
        """A launch's Pod, just created, in one transaction: its instance moved along (the
        instance id when it changed) and, for a launch sent with an Idempotency-Key
        (``keyed``), the 202 it is answered with kept for replays."""

        def write(c: Any) -> str | None:
            changed = sql.apply_pod(c, ns=ns, pod=pod, deleted=False, ts=ts)
            if keyed:
                sql.answered(c, instance_id=accepted["instanceId"], accepted=accepted)
            return changed

        changed = await self.db.write(write)
        self._remember(pod)
        return changed

    # --- Pods and instances ----------------------------------------------------------------

    async def apply_pod(self, *, ns: str, pod: Mapping[str, Any], deleted: bool, ts: float) -> str | None:
        """Move the Pod's instance along its history; the instance id when it changed. A version
        of the Pod applied here already is not applied again (:meth:`applied`)."""
        changed = await self.apply_pods(ns=ns, changes=[("DELETED" if deleted else "MODIFIED", pod)], ts=ts)
        return changed[0] if changed else None

    async def apply_pods(
        self, *, ns: str, changes: Sequence[tuple[str, Mapping[str, Any]]], ts: float
    ) -> list[str]:
        """:meth:`apply_pod` for a watch's batch of changes, in order and in one transaction
        (one commit for them all); the ids of the instances that changed. When the write
        fails, none of them is applied (nor remembered as applied)."""
        todo = [
            (pod, kind == "DELETED") for kind, pod in changes if kind == "DELETED" or not self.applied(pod)
        ]
        if not todo:
            return []

        def write(c: Any) -> list[str]:
            out: list[str] = []
            for pod, deleted in todo:
                changed = sql.apply_pod(c, ns=ns, pod=pod, deleted=deleted, ts=ts)
                if changed is not None and changed not in out:
                    out.append(changed)
            return out

        changed = await self.db.write(write)
        for pod, deleted in todo:
            if deleted:
                self._applied.pop(_name_and_version(pod)[0], None)
            else:
                self._remember(pod)
        return changed

    async def gone(self, *, instance_id: str, ts: float) -> bool:
        self._applied.pop(instance_id, None)
        return await self.db.write(lambda c: sql.gone(c, instance_id=instance_id, ts=ts))

    async def request_stop(self, *, instance_id: str, ts: float) -> bool:
        return await self.db.write(lambda c: sql.request_stop(c, instance_id=instance_id, ts=ts))

    async def is_direct(self, *, instance_id: str) -> bool:
        """Whether the instance is a direct launch (a Pod with the same labels may be a daemon's)."""
        if instance_id in self._direct:
            return True
        return await self.db.read_one(lambda c: sql.is_direct(c, instance_id=instance_id))

    async def is_reaped(self, *, instance_id: str) -> bool:
        return await self.db.read_one(lambda c: sql.is_reaped(c, instance_id=instance_id))

    async def mark_reaped(self, *, instance_id: str, ts: float) -> None:
        self._applied.pop(instance_id, None)
        self._direct.discard(instance_id)
        await self.db.write(lambda c: sql.mark_reaped(c, instance_id=instance_id, ts=ts))

    async def failing_pulls(self) -> list[pulls.FailingPull]:
        """Live direct instances whose image cannot be pulled, with since when."""
        return await self.db.read(lambda c: pulls.failing_pulls(c))

    async def end_pull(self, *, instance_id: str, message: str, ts: float) -> bool:
        """End an instance ``stopped`` / ``ImagePull``; True if it changed."""
        return await self.db.write(
            lambda c: pulls.end_pull(c, instance_id=instance_id, message=message, ts=ts)
        )

    async def instance(self, *, ns: str, provider: str, instance_id: str) -> Row:
        return await self.db.read(
            lambda c: instances.instance_row(c, ns=ns, provider=provider, instance_id=instance_id)
        )

    async def connection(self, *, instance_id: str) -> dict[str, Any]:
        """The connection an instance's Pod was created with (empty when none was recorded)."""
        return await self.db.read_one(lambda c: sql.instance_connection(c, instance_id=instance_id))

    async def listing(
        self, *, ns: str, provider: str, page: PageRequest
    ) -> tuple[Provider, list[str], Page[InstanceJSON]]:
        """The provider, the connections its instances were created with, and one page of their
        history (in creation order)."""

        def read(c: Any) -> tuple[Provider, list[str], Page[InstanceJSON]]:
            return (
                catalog.get_provider(c, ns=ns, name=provider),
                sql.connections_of(c, ns=ns, provider=provider),
                pages.instances(c, ns=ns, provider=provider, state=None, page=page),
            )

        return await self.db.read(read)

    async def recorded(self, *, instance_ids: list[str]) -> set[str]:
        """Which of these instance ids the queue has a record of (expired ones included)."""

        def read(c: Any) -> set[str]:
            found: set[str] = set()
            for start in range(0, len(instance_ids), 500):
                chunk = instance_ids[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for table in ("instances", "expired_instances"):
                    sql_text = f"SELECT instance_id FROM {table} WHERE instance_id IN ({marks})"  # noqa: S608
                    found.update(str(r[0]) for r in c.execute(sql_text, chunk))
            return found

        return await self.db.read(read)

    # --- the watch set and the reaper ------------------------------------------------------

    async def watched(self) -> set[tuple[str, str]]:
        return await self.db.read(sql.watched)

    async def unreaped(self) -> list[Row]:
        return await self.db.read(sql.unreaped)

    async def reapable(self, *, before: float) -> list[Row]:
        return await self.db.read(lambda c: sql.reapable(c, before=before))

    # --- probes ----------------------------------------------------------------------------

    async def probe_inputs(self, *, ns: str, provider: str, mode: str | None) -> tuple[Provider, Mode]:
        """The provider and the mode a probe renders with (a stand-in mode when none is named)."""

        def read(c: Any) -> tuple[Provider, Mode]:
            p = catalog.get_provider(c, ns=ns, name=provider)
            if mode is not None:
                return p, catalog.mode_for(c, ns=ns, provider=p, mode_name=mode)
            return p, Mode(name="probe", provider=p.name, fields={"image": launches.PROBE_IMAGE})

        return await self.db.read(read)

    async def record_probe(
        self, *, ns: str, kube_ns: str, provider: str, requester: str, result: dict[str, Any]
    ) -> str:
        return await self.db.write(
            lambda c: sql.record_probe(
                c, ns=ns, kube_ns=kube_ns, provider=provider, requester=requester, result=result
            )
        )
