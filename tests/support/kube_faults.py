"""Faults of the API server, and the test's own record of every Pod ever created.

* :func:`stop_apiserver` / :func:`start_apiserver`: stop the LocalCluster's kube-apiserver (SIGTERM,
  so clients see refused connections, as in an outage) and start it again from the exact argv it
  was started with (same port, certificates and etcd: the cluster's state survives). Done here,
  from the recorded ``Popen.args``, so nymph/localcluster needs no change.
* :class:`PodWatch`: a watch of the namespace's nymph Pods in a thread, resumed from the last
  resourceVersion after every disconnect (an outage included), so each Pod ever created is seen
  once by its UID: two UIDs for one name is a launch that was applied twice.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from nymph.localcluster import LocalCluster


def _apiserver(kube: LocalCluster) -> Any:
    (proc,) = [p for p in kube.procs if p.name == "kube-apiserver"]
    return proc


def stop_apiserver(kube: LocalCluster) -> None:
    proc = _apiserver(kube)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.popen.pid, signal.SIGTERM)
    try:
        proc.popen.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.popen.pid, signal.SIGKILL)
        proc.popen.wait(5)


def start_apiserver(kube: LocalCluster, *, timeout: float = 90) -> float:
    """Start the stopped kube-apiserver again; return the seconds until it was ready."""
    proc = _apiserver(kube)
    t0 = time.monotonic()
    with proc.log.open("ab") as fh:
        proc.popen = subprocess.Popen(  # same argv, same port: clients reconnect to it
            proc.popen.args,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=kube.workdir,
            # Its own session, as LocalCluster starts it (killed by the group). No parent-death
            # signal: that fires when the starting *thread* ends, and callers use worker threads.
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while True:
        if proc.popen.poll() is not None:
            raise AssertionError(f"kube-apiserver exited on restart: {proc.log.read_text()[-2000:]}")
        try:
            if kube.api("GET", "/api/v1/namespaces/default")["metadata"]["name"] == "default":
                return time.monotonic() - t0
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("kube-apiserver not ready after restart")
        time.sleep(0.3)


@dataclass
class PodRecord:
    uids: set[str] = field(default_factory=set)
    phase: str = ""
    deleted: bool = False
    #: The last few events seen of it (kind, phase, node, deletion, conditions), to tell who
    #: ended a Pod a test did not expect to end.
    events: list[str] = field(default_factory=list)


class PodWatch:
    """Records every nymph Pod of ``namespace`` ever created (by UID) and its last phase."""

    def __init__(self, kube: LocalCluster, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.pods: dict[str, PodRecord] = {}
        self.relists = 0
        self.reconnects = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)

    def __enter__(self) -> PodWatch:
        self._rv = self._list()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(40)

    def snapshot(self) -> dict[str, PodRecord]:
        with self._lock:
            return {
                k: PodRecord(set(v.uids), v.phase, v.deleted, list(v.events)) for k, v in self.pods.items()
            }

    def _path(self, **params: str) -> str:
        q = urllib.parse.urlencode({"labelSelector": "lakeshore=true", **params})
        return f"/api/v1/namespaces/{self.namespace}/pods?{q}"

    def _list(self) -> str:
        body = self.kube.api("GET", self._path())
        for pod in body["items"]:
            self._seen("ADDED", pod)
        return str(body["metadata"]["resourceVersion"])

    def _seen(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        name = meta.get("name")
        if not name:
            return
        with self._lock:
            rec = self.pods.setdefault(name, PodRecord())
            rec.uids.add(meta["uid"])
            rec.phase = (pod.get("status") or {}).get("phase") or rec.phase
            status = pod.get("status") or {}
            conds = ",".join(
                f"{c.get('type')}={c.get('status')}:{c.get('reason') or ''}"
                for c in status.get("conditions") or []
            )
            rec.events = [
                *rec.events[-7:],
                f"{time.strftime('%H:%M:%S')} {kind} {status.get('phase')} node={(pod.get('spec') or {}).get('nodeName')}"
                f" deletion={meta.get('deletionTimestamp')} [{conds}]",
            ]
            if kind == "DELETED":
                rec.deleted = True
            elif kind == "ADDED" and len(rec.uids) > 1:
                rec.deleted = False

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch_once()
            except Exception:
                self.reconnects += 1
                self._stop.wait(0.5)

    def _watch_once(self) -> None:
        host, port = urllib.parse.urlsplit(self.kube.server).netloc.rsplit(":", 1)
        conn = http.client.HTTPSConnection(host, int(port), context=self.kube.ssl_context(), timeout=15)
        try:
            path = self._path(
                watch="1", resourceVersion=self._rv, allowWatchBookmarks="true", timeoutSeconds="10"
            )
            conn.request("GET", path)
            resp = conn.getresponse()
            if resp.status != 200:
                raise OSError(f"watch: HTTP {resp.status}")
            while not self._stop.is_set():
                line = resp.readline()
                if not line:
                    return
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:  # too old: list again (UIDs make this idempotent)
                        self.relists += 1
                        self._rv = self._list()
                    return
                self._rv = str((obj.get("metadata") or {}).get("resourceVersion") or self._rv)
                if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    self._seen(event["type"], obj)
        finally:
            conn.close()
