"""Restart safety and clean-up on the direct path.

* :meth:`Janitor.reconcile` (at start): every recorded direct instance whose Pod may exist is
  matched with the Pods found by label; one never created is created now (its fixed name makes
  that an adoption if it exists after all), one whose Pod is gone is settled as stopped.
* :meth:`Janitor.reap`: finished direct Pods are deleted ``reap_after`` seconds after they end,
  their log tail kept as the instance's logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import structlog

from nymph.kube import pods
from nymph.kube.pods import Connection
from nymph.launch.names import LABEL_MANAGED, LABEL_NAMESPACE, label_selector
from nymph.launch.state import InstanceState
from nymph.protocol import now
from nymph.queue.direct.connect import Connector
from nymph.queue.direct.settings import DirectSettings
from nymph.queue.store import Store

log = structlog.get_logger(__name__, component="queue.direct.reaper")


class Janitor:
    def __init__(
        self,
        *,
        store: Store,
        connector: Connector,
        settings: DirectSettings,
        busy: Callable[[str], bool] | None = None,
        serves_no_log: Callable[[Connection, str], bool] | None = None,
    ) -> None:
        self.store = store
        self.connector = connector
        self.settings = settings
        #: Whether a Pod's log is still being followed (its reap waits for that).
        self.busy = busy or (lambda _iid: False)
        #: Whether a node of a cluster lately answered that it serves no log (no tail is read).
        self.serves_no_log = serves_no_log or (lambda _conn, _node: False)

    def _notify(self, instance_id: str | None) -> None:
        if instance_id:
            self.store.instance_changed.notify(instance_id)

    async def reconcile(self) -> None:
        rows = await self.store.direct.unreaped()
        groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
        for r in rows:
            if r["connection"]:
                groups[(r["namespace"], r["connection"])].append(r)
        for (ns, data), members in groups.items():
            conn = Connection.from_json(json.loads(data))
            try:
                await self._reconcile_one(ns, conn, members)
            except Exception as exc:
                detail = getattr(exc, "detail", None) or exc.__class__.__name__
                log.warning(
                    "reconcile failed for a connection; the watch will catch up",
                    namespace=ns,
                    connection=conn.describe(),
                    error=detail,
                )

    async def _reconcile_one(self, ns: str, conn: Connection, members: list[Any]) -> None:
        selector = label_selector({LABEL_MANAGED: "true", LABEL_NAMESPACE: ns})
        async with self.connector.api(ns=ns, conn=conn, what="reconciling Pods") as api:
            found = {
                p["metadata"]["name"]: p
                for p in await pods.list_pods(api, namespace=conn.namespace, selector=selector)
            }
            for r in members:
                iid = r["instance_id"]
                pod = found.get(iid)
                if (
                    pod is None
                    and r["state"] == InstanceState.QUEUED.value
                    and r["stop_requested_at"] is None
                ):
                    pod, _ = await pods.create_pod(api, json.loads(r["pod"]))
                    log.info("reconcile: created the Pod of a recorded launch", instance=iid)
                await self._settle(
                    ns=ns, instance_id=iid, pod=pod, stopped=r["state"] == InstanceState.STOPPED.value
                )

    async def _settle(self, *, ns: str, instance_id: str, pod: dict[str, Any] | None, stopped: bool) -> None:
        ts = now()
        if pod is not None:
            self._notify(await self.store.direct.apply_pod(ns=ns, pod=pod, deleted=False, ts=ts))
        elif not stopped and await self.store.direct.gone(instance_id=instance_id, ts=ts):
            self._notify(instance_id)

    async def reap(self) -> int:
        before = now() - self.settings.reap_after
        rows = await self.store.direct.reapable(before=before)
        done = 0
        for r in rows:
            iid, ns = r["instance_id"], r["namespace"]
            if self.busy(iid):
                continue
            conn = Connection.from_json(json.loads(r["connection"]))
            # The live follower stored the whole log: a tail read now would only repeat its end;
            # it followed the log to its end on a node that serves none: one would be refused.
            stored = await self.store.output.status(instance_id=iid)
            settled = stored is not None and (
                stored.whole or (stored.complete and self.serves_no_log(conn, str(r["node"] or "")))
            )
            try:
                async with self.connector.api(ns=ns, conn=conn, what=f"reaping Pod {iid}") as api:
                    logs: str | None = None
                    if not settled:
                        with contextlib.suppress(Exception):
                            logs = await pods.pod_logs(
                                api,
                                namespace=conn.namespace,
                                name=iid,
                                limit_bytes=self.settings.log_limit_bytes,
                            )
                    await pods.delete_pod(api, namespace=conn.namespace, name=iid, grace_seconds=0)
            except Exception as exc:
                detail = (
                    getattr(exc, "detail", None) or getattr(exc, "message", None) or exc.__class__.__name__
                )
                log.warning("reap failed; will retry", instance=iid, error=detail)
                continue
            if logs is not None:
                await self.store.keep_log_tail(instance_id=iid, logs=logs)
            await self._mark_reaped(iid)
            log.info("reaped", instance=iid, kept_log_bytes=len(logs or ""))
            done += 1
        return done

    async def _mark_reaped(self, instance_id: str) -> None:
        ts = now()
        await self.store.direct.mark_reaped(instance_id=instance_id, ts=ts)

    async def run(self) -> None:
        try:
            await self.reconcile()
        except Exception:
            log.exception("reconcile at start failed")
        while True:
            await asyncio.sleep(self.settings.interval)
            try:
                await self.reap()
            except Exception:
                log.exception("reap pass failed; retrying")
