"""Launch, list, stop and probe on the direct path.

A launch is recorded first, then its Pod is created with the provider's connection; the 202
carries the state read from the created Pod. When the API server refuses, the record is removed
again and the error names the server's message. Listing merges the live Pods (the three reserved
labels) with the queue's history; a stop deletes the Pod (204 also when it is gone).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import structlog

from nymph.kube import pods
from nymph.kube.pods import Connection
from nymph.launch.config import connection_kwargs
from nymph.launch.names import label_selector, selector_labels
from nymph.launch.render import render_pod
from nymph.launch.state import InstanceState, pod_state
from nymph.protocol import InstanceJSON, LaunchAccepted, iso, now
from nymph.queue.direct.connect import Connector
from nymph.queue.direct.errors import service_error
from nymph.queue.direct.watches import WatchManager
from nymph.queue.errors import ServiceError
from nymph.queue.models import Principal
from nymph.queue.paging import Page, PageRequest
from nymph.queue.sql import catalog, launches
from nymph.queue.sql.direct import DirectLaunch
from nymph.queue.store import Store

log = structlog.get_logger(__name__, component="queue.direct")


def selector(*, ns: str, provider: str) -> str:
    """The three reserved labels of ``provider``'s Pods launched from namespace ``ns``."""
    return label_selector(selector_labels(owner_namespace=ns, provider=provider))


class DirectDispatch:
    def __init__(self, *, store: Store, connector: Connector, watches: WatchManager) -> None:
        self.store = store
        self.connector = connector
        self.watches = watches

    async def launch(
        self,
        *,
        ns: str,
        provider: str,
        body: Mapping[str, Any],
        idempotency_key: str | None,
        principal: Principal,
    ) -> LaunchAccepted:
        rec = await self.store.direct.record_launch(
            ns=ns,
            provider=provider,
            body=body,
            idempotency_key=idempotency_key,
            requester=principal.requester,
            guard=self.store.guard(principal),
            image_pull_timeout=self.store.settings.launch.image_pull_timeout,
        )
        iid = rec.accepted["instanceId"]
        if rec.state != InstanceState.QUEUED.value:
            return {**rec.accepted, "state": rec.state}  # a replay of a launch already created
        if rec.held is not None:
            # Its namespace's quota holds it: recorded queued; release_held creates its Pod.
            log.info(
                "direct launch held by its quota", instance=iid, namespace=ns, provider=provider, why=rec.held
            )
            return {**rec.accepted, "state": InstanceState.QUEUED.value}
        conn = Connection.from_json(rec.connection)
        try:
            pod, created = await self._create_pod(ns=ns, rec=rec)
        except BaseException:
            await self.store.direct.forget(instance_id=iid)
            log.info("direct launch refused; nothing kept", instance=iid, namespace=ns, provider=provider)
            raise
        accepted: LaunchAccepted = {**rec.accepted, "state": pod_state(pod).value}
        changed = await self.store.direct.created(
            ns=ns, pod=pod, ts=now(), accepted=accepted, keyed=idempotency_key is not None
        )
        if changed:
            self.store.instance_changed.notify(iid)
        self.watches.ensure(ns=ns, connection=rec.connection)
        log.info(
            "direct launch created" if created else "direct launch adopted its Pod",
            instance=iid,
            namespace=ns,
            provider=provider,
            connection=conn.describe(),
            requester=principal.requester,
        )
        return accepted

    async def _create_pod(self, *, ns: str, rec: DirectLaunch) -> tuple[dict[str, Any], bool]:
        """Create (or adopt) the recorded launch's Pod with its connection; (Pod, created)."""
        conn = Connection.from_json(rec.connection)
        what = f"creating Pod {rec.accepted['instanceId']} in namespace {conn.namespace}"
        async with self.connector.api(ns=ns, conn=conn, what=what) as api:
            try:
                return await pods.create_pod(api, rec.pod)
            except Exception as exc:
                raise service_error(exc, what=what) from None

    async def release_held(self) -> int:
        """Create the Pods of held launches whose turn has come (their quota has room now);
        one the API server refuses ends LaunchFailed with the server's message. Returns how
        many were taken."""
        taken = await self.store.direct.take_held()
        for rec in taken:
            iid = rec.accepted["instanceId"]
            ns = rec.namespace
            try:
                pod, _ = await self._create_pod(ns=ns, rec=rec)
            except ServiceError as exc:
                if await self.store.direct.fail_held(instance_id=iid, message=exc.detail, ts=now()):
                    self.store.instance_changed.notify(iid)
                log.info("held direct launch refused", instance=iid, detail=exc.detail)
                continue
            if await self.store.direct.apply_pod(ns=ns, pod=pod, deleted=False, ts=now()):
                self.store.instance_changed.notify(iid)
            self.watches.ensure(ns=ns, connection=rec.connection)
            log.info("held direct launch created", instance=iid, namespace=ns)
            row = await self.store.direct.instance(
                ns=ns, provider=rec.accepted["providerName"], instance_id=iid
            )
            if row["stop_requested_at"] is not None:
                # Its stop (or its group's) came while the Pod was being created: the stop found
                # no Pod to delete, so it is deleted now, never left behind.
                await self._delete_created(ns=ns, rec=rec)
        return len(taken)

    async def _delete_created(self, *, ns: str, rec: DirectLaunch) -> None:
        """Delete the Pod just created for a launch whose stop came meanwhile."""
        conn = Connection.from_json(rec.connection)
        iid = rec.accepted["instanceId"]
        what = f"deleting Pod {iid} in namespace {conn.namespace}"
        async with self.connector.api(ns=ns, conn=conn, what=what) as api:
            try:
                await pods.delete_pod(api, namespace=conn.namespace, name=iid, grace_seconds=0)
            except Exception as exc:
                log.warning(
                    "deleting a stopped launch's Pod failed",
                    instance=iid,
                    detail=str(service_error(exc, what=what)),
                )
                return
        log.info("deleted the Pod of a launch stopped while it was created", instance=iid, namespace=ns)

    async def run_held(self, *, interval: float = 1.0) -> None:
        """Release held launches as their quotas free up (a background task)."""
        while True:
            if not await self.release_held():
                await asyncio.sleep(interval)

    async def _live(
        self, *, ns: str, provider: str, connections: list[dict[str, Any]]
    ) -> dict[str, dict[str, Any]]:
        live: dict[str, dict[str, Any]] = {}
        seen: set[str] = set()
        for data in connections:
            conn = Connection.from_json(data)
            if conn.key() in seen:
                continue
            seen.add(conn.key())
            what = f"listing the Pods of provider {provider} in namespace {conn.namespace}"
            async with self.connector.api(ns=ns, conn=conn, what=what) as api:
                try:
                    found = await pods.list_pods(
                        api, namespace=conn.namespace, selector=selector(ns=ns, provider=provider)
                    )
                except Exception as exc:
                    raise service_error(exc, what=what) from None
            live.update({p["metadata"]["name"]: p for p in found})
        return live

    async def list_instances(
        self, *, ns: str, provider: str, state: str | None, page: PageRequest
    ) -> Page[InstanceJSON]:
        """A page of the queue's history merged with the live Pods of the provider's
        connections; the last page also has the live Pods the queue has no record of. The
        state filter applies to the merged state, so a page may hold fewer than its limit."""
        p, stored, history = await self.store.direct.listing(ns=ns, provider=provider, page=page)
        own = {k: v for k, v in p.kwargs.items() if k in ("kubeconfig", "context")}
        own["namespace"] = catalog.kube_namespace(p)
        live = await self._live(ns=ns, provider=provider, connections=[own, *(json.loads(s) for s in stored)])
        items: list[InstanceJSON] = []
        for inst in history.items:
            pod = live.pop(inst["instanceId"], None)
            if pod is not None and inst["state"] != InstanceState.STOPPED.value:
                inst = {
                    **inst,
                    "state": pod_state(pod).value,
                    "node": (pod.get("spec") or {}).get("nodeName") or inst["node"],
                }
            items.append(inst)
        if history.next_key is None:
            known = await self.store.direct.recorded(instance_ids=list(live))
            for name, pod in sorted(live.items()):
                if name not in known:
                    items.append(_unrecorded(pod, ns=ns, provider=provider, name=name))
        kept = [i for i in items if state is None or i["state"] == state]
        return Page(items=kept, next_key=history.next_key)

    async def stop(
        self, *, ns: str, provider: str, instance_id: str, grace: int | None, principal: Principal
    ) -> None:
        row = await self.store.direct.instance(ns=ns, provider=provider, instance_id=instance_id)
        if row["state"] == InstanceState.STOPPED.value:
            await self._remove_finished(ns=ns, instance_id=instance_id, principal=principal)
            return
        ts = now()
        if await self.store.direct.request_stop(instance_id=instance_id, ts=ts):
            self.store.instance_changed.notify(instance_id)
        data = await self.store.direct.connection(instance_id=instance_id)
        conn = Connection.from_json(data)
        what = f"deleting Pod {instance_id} in namespace {conn.namespace}"
        async with self.connector.api(ns=ns, conn=conn, what=what) as api:
            try:
                logs = await pods.pod_logs(
                    api,
                    namespace=conn.namespace,
                    name=instance_id,
                    limit_bytes=self.store.settings.limits.max_log_bytes,
                )
            except Exception:
                logs = None
            try:
                existed = await pods.delete_pod(
                    api, namespace=conn.namespace, name=instance_id, grace_seconds=grace
                )
            except Exception as exc:
                raise service_error(exc, what=what) from None
        if logs is not None:
            await self.store.keep_log_tail(instance_id=instance_id, logs=logs)
        if not existed and await self.store.direct.gone(instance_id=instance_id, ts=now()):
            self.store.instance_changed.notify(instance_id)
        log.info("direct stop", instance=instance_id, pod_existed=existed, requester=principal.requester)

    async def _remove_finished(self, *, ns: str, instance_id: str, principal: Principal) -> None:
        """A stop of a finished instance deletes its Pod now (the contract of the route), its log
        tail kept first, instead of leaving it to the reaper."""
        if await self.store.direct.is_reaped(instance_id=instance_id):
            return
        data = await self.store.direct.connection(instance_id=instance_id)
        if not data:
            return
        conn = Connection.from_json(data)
        what = f"deleting finished Pod {instance_id} in namespace {conn.namespace}"
        async with self.connector.api(ns=ns, conn=conn, what=what) as api:
            try:
                logs: str | None = await pods.pod_logs(
                    api,
                    namespace=conn.namespace,
                    name=instance_id,
                    limit_bytes=self.store.settings.limits.max_log_bytes,
                )
            except Exception:
                logs = None
            if logs is not None:
                await self.store.keep_log_tail(instance_id=instance_id, logs=logs)
            try:
                existed = await pods.delete_pod(
                    api, namespace=conn.namespace, name=instance_id, grace_seconds=0
                )
            except Exception as exc:
                raise service_error(exc, what=what) from None
        ts = now()
        await self.store.direct.mark_reaped(instance_id=instance_id, ts=ts)
        log.info(
            "direct stop of a finished instance",
            instance=instance_id,
            pod_existed=existed,
            kept_log_bytes=len(logs or ""),
            requester=principal.requester,
        )

    async def probe(self, *, ns: str, provider: str, mode: str | None, principal: Principal) -> str:
        """RBAC and a server-side dry run with the provider's connection, as a finished task."""
        p, m = await self.store.direct.probe_inputs(ns=ns, provider=provider, mode=mode)
        spec = launches.build_spec(
            provider=p,
            mode=m,
            body={"script": launches.PROBE_SCRIPT, "tags": {"nymph-probe": "true"}},
            ns=ns,
            guard=self.store.guard(principal),
        )
        conn = Connection.from_json({**connection_kwargs(p, m), "namespace": spec.namespace})
        checks: list[dict[str, Any]] = []
        try:
            async with self.connector.api(ns=ns, conn=conn, what="the probe") as api:
                checks.append({"name": "connection", "ok": True, "detail": conn.describe()})
                for a in await pods.check_access(api, namespace=conn.namespace):
                    checks.append({"name": f"rbac: {a.name}", "ok": a.allowed, "detail": a.reason})
                try:
                    await pods.dry_run_pod(api, render_pod(spec))
                    checks.append(
                        {
                            "name": "dry-run create",
                            "ok": True,
                            "detail": f"server accepted Pod {spec.instance_id}",
                        }
                    )
                except Exception as exc:
                    checks.append(
                        {"name": "dry-run create", "ok": False, "detail": getattr(exc, "message", str(exc))}
                    )
        except Exception as exc:
            checks.append(
                {
                    "name": "connection",
                    "ok": False,
                    "detail": getattr(exc, "detail", None)
                    or getattr(exc, "message", None)
                    or exc.__class__.__name__,
                }
            )
        result = {"ok": all(c["ok"] for c in checks), "dispatch": "direct", "checks": checks}
        return await self.store.direct.record_probe(
            ns=ns, kube_ns=spec.namespace, provider=p.name, requester=principal.requester, result=result
        )


def _unrecorded(pod: Mapping[str, Any], *, ns: str, provider: str, name: str) -> InstanceJSON:
    meta = pod.get("metadata") or {}
    created = str(meta.get("creationTimestamp") or iso(now()))
    return InstanceJSON(
        instanceId=name,
        providerName=provider,
        namespace=ns,
        kubeNamespace=str(meta.get("namespace") or ""),
        state=pod_state(pod).value,
        reason=None,
        message="a live Pod with this provider's labels that the queue has no record of",
        node=(pod.get("spec") or {}).get("nodeName"),
        launchedAt=created,
        updatedAt=created,
        version=0,
        requester="",
        history=[],
    )
