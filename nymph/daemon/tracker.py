"""Pod events -> instance reports. The tracker is the daemon's only report writer.

Its decisions are pure functions on plain Pod dicts and a :class:`Track` (what was last said
about an instance): :func:`decide_event` says what a watch event means, :func:`should_report`
drops repeats and anything after ``stopped`` (which is final). :class:`Tracker` applies them:
it keeps the tracks, writes reports to the outbox and answers the watch caches' questions.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from nymph.daemon.diskhealth import DiskHealth
from nymph.daemon.metrics import Metrics
from nymph.daemon.outbox import Outbox
from nymph.daemon.workdirs import Workdirs
from nymph.launch.render import HOSTNAME_LABEL
from nymph.launch.state import (
    InstanceState,
    Reason,
    container_termination,
    deleted_reason,
    pod_reason,
    pod_state,
)
from nymph.logsetup import get_logger


@dataclass
class Track:
    """What the daemon knows of one of its instances."""

    namespace: str
    last: tuple[str, str | None] | None = None  # (state, reason) last reported
    stop_requested: bool = False
    finished_at: float | None = None
    reaping: bool = False
    gone: bool = False

    @property
    def stopped(self) -> bool:
        return self.last is not None and self.last[0] == InstanceState.STOPPED.value


@dataclass(frozen=True)
class Report:
    """One state change of an instance, as the queue receives it."""

    state: InstanceState
    reason: Reason | None = None
    message: str | None = None
    #: How the ``user`` container ended, on a ``stopped`` report (not part of :attr:`key`).
    termination: tuple[int, str, str] | None = field(default=None, compare=False)

    @property
    def key(self) -> tuple[str, str | None]:
        return self.state.value, self.reason.value if self.reason else None


@dataclass(frozen=True)
class EventDecision:
    """What one watch event means for an instance."""

    report: Report | None = None
    forget: bool = False  # drop the track: the Pod is gone
    remove_workdir: bool = False
    finished: bool = False  # the Pod just ended: the reaper's clock starts


# --- pure ----------------------------------------------------------------------------------------


def pinned_node(pod: Mapping[str, Any]) -> str | None:
    """The node a nymph Pod is pinned to (the hostname affinity a daemon renders), if any."""
    spec = pod.get("spec") or {}
    try:
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        for term in terms:
            for expr in term.get("matchExpressions") or []:
                if expr.get("key") == HOSTNAME_LABEL and expr.get("operator") == "In" and expr.get("values"):
                    return str(expr["values"][0])
    except (KeyError, TypeError):
        pass
    return None


def pod_node(pod: Mapping[str, Any]) -> str | None:
    """The node a nymph Pod is pinned to (its hostname affinity), else where it was bound."""
    pinned = pinned_node(pod)
    if pinned is not None:
        return pinned
    node = (pod.get("spec") or {}).get("nodeName")
    return str(node) if node else None


def owned(pod: Mapping[str, Any], *, node: str | None) -> bool:
    """Whether a daemon on ``node`` follows this Pod (a daemon without a node follows all)."""
    return node is None or pod_node(pod) in (None, node)


def should_report(track: Track, report: Report) -> bool:
    """Say nothing twice in a row, and nothing after ``stopped``."""
    return track.last != report.key and not track.stopped


def ended_report(pod: Mapping[str, Any]) -> Report | None:
    """The ``stopped`` report of a Pod whose phase says it ended (Succeeded or Failed), whatever
    its ``deletionTimestamp``; None while it has not ended."""
    if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
        return None
    reason, message = pod_reason(pod)
    return Report(InstanceState.STOPPED, reason, message, termination=container_termination(pod))


def deleted_message(pod: Mapping[str, Any]) -> str:
    """Why a Pod nymph did not delete went: the cluster's own word when it gave one (the
    ``DisruptionTarget`` condition a controller sets before it deletes: an eviction, a node
    gone, a preemption)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (
            isinstance(cond, Mapping)
            and cond.get("type") == "DisruptionTarget"
            and cond.get("status") == "True"
        ):
            why = ": ".join(str(x) for x in (cond.get("reason"), cond.get("message")) if x)
            return f"the cluster deleted the Pod ({why[:500]})" if why else "the cluster deleted the Pod"
    return "the Pod was deleted outside nymph"


def decide_event(kind: str, pod: Mapping[str, Any], track: Track) -> EventDecision:
    """The report (if any) for a watch event (``ADDED``, ``MODIFIED``, ``DELETED``) of a Pod."""
    if kind == "DELETED":
        if track.reaping:
            return EventDecision(forget=True)
        if track.stopped:
            report: Report | None = None
        elif track.stop_requested:
            report = Report(InstanceState.STOPPED, Reason.STOPPED, "stopped on request")
        elif (end := ended_report(pod)) is not None:
            # It ran to its end before it went (whoever deleted it, and whether or not this
            # daemon saw it end): that end is the instance's.
            report = end
        else:
            report = Report(InstanceState.STOPPED, deleted_reason(pod), deleted_message(pod))
        return EventDecision(report=report, forget=True, remove_workdir=True)
    state = pod_state(pod)
    reason, message = pod_reason(pod)
    finished = state is InstanceState.STOPPED and track.finished_at is None
    if state is InstanceState.STOPPING and track.stopped:
        return EventDecision(finished=finished)  # reaping or a late stop of a finished Pod
    ended = container_termination(pod) if state is InstanceState.STOPPED else None
    return EventDecision(report=Report(state, reason, message, termination=ended), finished=finished)


# --- the tracker ---------------------------------------------------------------------------------


class PodCache(Protocol):
    """What the tracker reads of a namespace's Pod watch."""

    namespace: str
    cache: dict[str, dict[str, Any]]
    connected: bool


class Tracker:
    def __init__(
        self,
        *,
        node: str | None,
        outbox: Outbox,
        metrics: Metrics,
        workdirs: Workdirs,
        disk: DiskHealth | None = None,
    ) -> None:
        self.node = node
        self.outbox = outbox
        self.metrics = metrics
        self.workdirs = workdirs
        self.disk = disk or DiskHealth()
        self.tracks: dict[str, Track] = {}
        self.caches: dict[str, PodCache] = {}
        # Reports the outbox could not save (the root cannot be written), in order; written
        # before any newer report once it can.
        self.unsaved: list[tuple[str, Report, str | None]] = []
        self.disk.on_writable.append(self.write_unsaved)

    def follow(self, cache: PodCache) -> None:
        """Read the Pods of ``cache.namespace`` from this watch cache."""
        self.caches[cache.namespace] = cache

    # -- queries ------------------------------------------------------------------------------

    def mine(self, pod: Mapping[str, Any]) -> bool:
        return owned(pod, node=self.node)

    def pod_in_cache(self, namespace: str, name: str) -> dict[str, Any] | None:
        c = self.caches.get(namespace)
        return c.cache.get(name) if c else None

    def connected(self) -> bool:
        return bool(self.caches) and all(c.connected for c in self.caches.values())

    def track(self, name: str, *, namespace: str) -> Track:
        return self.tracks.setdefault(name, Track(namespace=namespace))

    def forget(self, name: str) -> None:
        self.tracks.pop(name, None)

    # -- reports ------------------------------------------------------------------------------

    def report(self, name: str, track: Track, report: Report) -> None:
        """Report a Pod instance's state change (once; never after ``stopped``)."""
        if not should_report(track, report):
            return
        track.last = report.key
        self._write(name, report, node=self.node)

    def report_unpinned(self, name: str, report: Report) -> None:
        """Report for an instance that is not pinned to a node and has no Pod to watch (dockyard)."""
        self._write(name, report, node=None)

    def unsent(self, name: str) -> bool:
        """Whether a report on ``name`` is not even in the outbox yet (the root cannot be written)."""
        return any(n == name for n, _, _ in self.unsaved)

    def _write(self, name: str, report: Report, *, node: str | None) -> None:
        self.unsaved.append((name, report, node))
        self.write_unsaved()

    def write_unsaved(self) -> None:
        """Hand the reports not yet saved to the outbox, oldest first; keep them on a failure."""
        while self.unsaved:
            name, report, node = self.unsaved[0]
            state, reason = report.key
            try:
                self.outbox.report(
                    instance_id=name,
                    state=state,
                    reason=reason,
                    message=report.message,
                    node=node,
                    termination=report.termination,
                )
            except OSError as exc:
                self.disk.failed("outbox", exc)
                break
            self.unsaved.pop(0)
        self.metrics.reports_buffered.set(self.outbox.pending + len(self.unsaved))

    async def on_pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        """The watch's callback."""
        if not self.mine(pod):
            return
        name = pod["metadata"]["name"]
        track = self.track(name, namespace=pod["metadata"].get("namespace") or "default")
        decision = decide_event(kind, pod, track)
        if kind == "DELETED":
            track.gone = True
        if decision.finished:
            track.finished_at = time.monotonic()
        if decision.report is not None:
            if decision.report.reason is Reason.DELETED:
                get_logger("tracker").warning(
                    "a Pod of ours was deleted outside nymph before it ended",
                    instance=name,
                    phase=(pod.get("status") or {}).get("phase"),
                    last_reported=track.last,
                )
            self.report(name, track, decision.report)
        if decision.remove_workdir:
            with contextlib.suppress(Exception):
                self.workdirs.remove(name)
        if decision.forget:
            self.forget(name)
