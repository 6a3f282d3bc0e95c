"""``run`` and ``cluster up|down``: apply a rendered deployment and follow it.

rayjob: server-side apply the sandbox pieces, wait for the pool (unless ``--no-wait``), apply
the RayJob and follow its status to a terminal state, printing each change. bringup: the
pool, then the RayCluster, wait for the head, submit the entrypoint through the Jobs REST
API and follow the job. attach: submit to the named RayCluster. ``--dry-run`` sends every
manifest through a server-side dry run and changes nothing. Render-only kinds (quota, limit
range) are never applied.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nymph.dockyard.errors import DockyardLiveError
from nymph.dockyard.live import status
from nymph.dockyard.live.kubectl import Kube, Say
from nymph.dockyard.live.submit import Submission, submit, submit_rayjob
from nymph.dockyard.render import plan as planning
from nymph.dockyard.render import runopts
from nymph.dockyard.render.plan import Plan, ref
from nymph.dockyard.render.runopts import RunFlags
from nymph.dockyard.spec.enums import LaunchMode, SubmitKind
from nymph.dockyard.spec.load import LoadedConfig
from nymph.dockyard.spec.schema import InfraConfig

#: how long ``cluster up`` waits for the cluster to be ready by default (as dockyard-k8s)
CLUSTER_UP_TIMEOUT_S = 900.0


@dataclass(frozen=True, kw_only=True)
class LiveOptions:
    kubeconfig: str | None = None
    context: str | None = None
    ray_address: str | None = None
    no_wait: bool = False
    dry_run: bool = False
    timeout: float | None = None  # seconds; None: per-step defaults
    poll: float = 2.0
    # run (see nymph.dockyard.render.runopts)
    flags: RunFlags = field(default_factory=RunFlags)
    replace: bool = False
    recreate: bool = False
    repo_root: Path = field(default_factory=Path.cwd)
    user: str = "unknown"
    rayjob_name: str | None = None
    shutdown: bool = True
    ttl: int | None = None


class Clock:
    """Elapsed-time prefixes for progress lines."""

    def __init__(self, say: Say) -> None:
        self._start = time.monotonic()
        self._say = say

    def __call__(self, line: str) -> None:
        self._say(f"[{time.monotonic() - self._start:5.0f}s] {line}")

    def deadline(self, seconds: float) -> float:
        return time.monotonic() + seconds


def _ns(infra: InfraConfig) -> str:
    return infra.namespace


def report_render_only(p: Plan, *, say: Say) -> None:
    for m in p.render_only:
        say(
            f"skipped {ref(m)}: render-only, never applied (an administrator applies it from 'nymph dockyard render')"
        )


async def dry_run(kube: Kube, p: Plan, *, namespace: str, say: Say) -> None:
    applied = p.applied
    if not applied:
        say("nothing to apply")
        return
    await kube.apply(applied, dry_run=True, namespace=namespace)
    for m in applied:
        say(f"{ref(m)}: accepted (server dry run)")
    say(
        f"dry run: {len(applied)} objects accepted by the API server in namespace {namespace}; nothing changed"
    )


async def dry_run_all(kube: Kube, manifests: list[Any], *, namespace: str, say: Say) -> int:
    """Every rendered object (render-only kinds too) through a server-side dry run."""
    if not manifests:
        say("nothing rendered")
        return 0
    await kube.apply(manifests, dry_run=True, namespace=namespace)
    for m in manifests:
        say(f"{ref(m)}: accepted (server dry run)")
    say(f"dry run: all {len(manifests)} rendered objects accepted in namespace {namespace}; nothing changed")
    return 0


async def apply_pieces(kube: Kube, pieces: list[dict[str, Any]], *, namespace: str, say: Say) -> None:
    if not pieces:
        return
    await kube.apply(pieces, namespace=namespace)
    for m in pieces:
        say(f"{ref(m)}: applied")


async def wait_sandbox(kube: Kube, p: Plan, infra: InfraConfig, *, opts: LiveOptions, clock: Clock) -> None:
    """Until the sandbox pool has all replicas ready (``sandbox.healthCheckTimeoutS``)."""
    deployment = p.sandbox_deployment()
    if deployment is None or infra.sandbox is None:
        return
    name = deployment["metadata"]["name"]
    limit = opts.timeout if opts.timeout is not None else float(infra.sandbox.healthCheckTimeoutS)
    deadline = clock.deadline(limit)
    last: tuple[int, int] | None = None
    while True:
        obj = await kube.get("deployments.apps", name, namespace=_ns(infra))
        if obj is None:
            raise DockyardLiveError(f"sandbox Deployment {name} disappeared while waiting for it")
        counts = status.deployment_ready(obj)
        if counts != last:
            clock(f"sandbox pool {name}: {counts[0]}/{counts[1]} ready")
            last = counts
        if counts[0] >= counts[1]:
            return
        if time.monotonic() >= deadline:
            raise DockyardLiveError(
                f"sandbox pool {name} not ready after {limit:.0f}s ({counts[0]}/{counts[1]} ready): "
                "see 'nymph dockyard logs --source sandbox', raise sandbox.healthCheckTimeoutS, or --no-wait"
            )
        await asyncio.sleep(opts.poll)


async def follow_rayjob(
    kube: Kube, *, name: str, namespace: str, opts: LiveOptions, clock: Clock
) -> status.RayJobPhase:
    limit = opts.timeout if opts.timeout is not None else runopts.RAYJOB_TIMEOUT_S
    deadline = clock.deadline(limit)
    last: tuple[str, str] | None = None
    clock(f"following RayJob {name} (Ctrl-C stops following; the job keeps running)")
    while True:
        obj = await kube.get("rayjobs.ray.io", name, namespace=namespace)
        if obj is None:
            raise DockyardLiveError(f"RayJob {name} was deleted while it was followed")
        phase = status.rayjob_phase(obj)
        if phase.key() != last:
            clock(f"RayJob {name}: {phase.line()}")
            last = phase.key()
        if phase.terminal:
            return phase
        if time.monotonic() >= deadline:
            raise DockyardLiveError(
                f"RayJob {name} not finished at the --timeout ({phase.line()}); it keeps running "
                "(see: nymph dockyard status)"
            )
        await asyncio.sleep(opts.poll)


async def run_rayjob(kube: Kube, p: Plan, loaded: LoadedConfig, *, opts: LiveOptions, clock: Clock) -> int:
    infra = loaded.infra
    assert p.ray is not None
    name = p.ray["metadata"]["name"]
    existing = await kube.get("rayjobs.ray.io", name, namespace=_ns(infra))
    if existing is not None and status.rayjob_phase(existing).terminal:
        raise DockyardLiveError(
            f"RayJob {name} already ran to the end ({status.rayjob_phase(existing).line()}); delete it "
            f"first (nymph dockyard cluster down ... or kubectl delete rayjob {name} -n {_ns(infra)}) "
            "or set another kuberay.name"
        )
    await apply_pieces(kube, list(p.first), namespace=_ns(infra), say=clock)
    if not opts.no_wait:
        await wait_sandbox(kube, p, infra, opts=opts, clock=clock)
    await apply_pieces(kube, [p.ray], namespace=_ns(infra), say=clock)
    if opts.no_wait:
        clock(
            f"submitted RayJob {name} in {_ns(infra)}; not following (--no-wait): see 'nymph dockyard status'"
        )
        return 0
    phase = await follow_rayjob(kube, name=name, namespace=_ns(infra), opts=opts, clock=clock)
    if phase.succeeded:
        clock(f"RayJob {name} succeeded")
        return 0
    clock(f"RayJob {name} did not succeed: {phase.line()}")
    return 1


def _need_entrypoint(loaded: LoadedConfig) -> None:
    infra = loaded.infra
    if not infra.launch.entrypoint:
        raise DockyardLiveError(
            f"{loaded.infra_source}: infra.launch.entrypoint: required to submit a job in "
            f"{infra.launch.mode.value} mode "
            "(set infra.launch.entrypoint=..., or use 'nymph dockyard cluster up' to only bring the cluster up)"
        )


async def run(kube: Kube, loaded: LoadedConfig, manifests: list[Any], *, opts: LiveOptions, say: Say) -> int:
    infra = loaded.infra
    mode = infra.launch.mode
    if mode is LaunchMode.RAYJOB:
        manifests = runopts.rayjob_options(
            manifests, name=opts.rayjob_name, shutdown=opts.shutdown, ttl=opts.ttl
        )
    p = planning.plan(manifests)
    clock = Clock(say)
    report_render_only(p, say=say)
    if mode is not LaunchMode.RAYJOB:
        _need_entrypoint(loaded)
    if opts.dry_run:
        await dry_run(kube, p, namespace=_ns(infra), say=say)
        if mode is LaunchMode.ATTACH:
            say(f"would submit the entrypoint to RayCluster {infra.launch.attach}")
        return 0
    if mode is LaunchMode.RAYJOB:
        wait = opts.flags.wait if opts.flags.wait is not None else not opts.no_wait
        return await run_rayjob(kube, p, loaded, opts=_with_wait(opts, wait), clock=clock)
    choice = runopts.resolve(infra, opts.flags)
    if opts.no_wait and opts.flags.wait is None:
        choice = dataclasses.replace(choice, wait=False)
    by_rayjob = infra.submit.kind is SubmitKind.RAYJOB
    if by_rayjob:
        runopts.check_rayjob_kind(choice, replace=opts.replace)
    clock(f"launch mode {mode.value}: {choice.line()}")
    if mode is LaunchMode.ATTACH:
        cluster = str(infra.launch.attach)
        if await kube.get("rayclusters.ray.io", cluster, namespace=_ns(infra)) is None:
            raise DockyardLiveError(
                f"RayCluster {cluster} (launch.attach) not found in namespace {_ns(infra)} "
                "(list them with: nymph dockyard cluster list)"
            )
        await apply_pieces(kube, list(p.first), namespace=_ns(infra), say=clock)
    else:
        assert p.ray is not None
        cluster = p.ray["metadata"]["name"]
        await apply_pieces(kube, list(p.first), namespace=_ns(infra), say=clock)
        if choice.wait:
            await wait_sandbox(kube, p, infra, opts=opts, clock=clock)
        await ensure_raycluster(kube, p.ray, namespace=_ns(infra), recreate=opts.recreate, clock=clock)
    run_id = opts.flags.run_id or runopts.default_run_id(
        user=opts.user, recipe=loaded.recipe_path.stem, salt=secrets.token_hex(2)
    )
    sub = Submission(
        cluster=cluster,
        run_id=runopts.check_run_id(run_id),
        explicit_id=opts.flags.run_id is not None,
        choice=choice,
        ray_address=opts.ray_address,
        kubeconfig=opts.kubeconfig,
        timeout=opts.timeout,
        poll=opts.poll,
        replace=opts.replace,
        repo_root=opts.repo_root,
    )
    if not by_rayjob:
        return await submit(kube, loaded, sub, say=clock)
    name = await submit_rayjob(kube, loaded, sub, say=clock)
    if not choice.wait:
        clock(f"not following (--no-wait): see 'nymph dockyard status' (RayJob {name})")
        return 0
    phase = await follow_rayjob(kube, name=name, namespace=_ns(infra), opts=opts, clock=clock)
    clock(f"RayJob {name} {'succeeded' if phase.succeeded else 'did not succeed: ' + phase.line()}")
    return 0 if phase.succeeded else 1


def _with_wait(opts: LiveOptions, wait: bool) -> LiveOptions:
    return dataclasses.replace(opts, no_wait=not wait)


async def ensure_raycluster(
    kube: Kube, cluster: dict[str, Any], *, namespace: str, recreate: bool, clock: Clock
) -> None:
    """Apply the RayCluster, unless one exists that differs from the render (``kubectl diff``):
    that one is reused as it is (a live cluster is never patched behind its back: KubeRay
    does not roll running pods for every change), or with ``--recreate`` deleted and created
    again."""
    name = cluster["metadata"]["name"]
    exists = await kube.get("rayclusters.ray.io", name, namespace=namespace) is not None
    if exists and await kube.differs(cluster, namespace=namespace):
        if not recreate:
            clock(
                f"warning: RayCluster {name} differs from the infra; reusing it as it is "
                "(pass --recreate to delete and re-create it)"
            )
            return
        clock(f"--recreate: RayCluster {name} differs from the infra; deleting it")
        await kube.delete([cluster], wait=True)
        clock(f"RayCluster/{name}: deleted")
    await apply_pieces(kube, [cluster], namespace=namespace, say=clock)


# -- cluster up / down -----------------------------------------------------------------------


async def wait_cluster_ready(
    kube: Kube, *, name: str, namespace: str, opts: LiveOptions, clock: Clock
) -> None:
    limit = opts.timeout if opts.timeout is not None else CLUSTER_UP_TIMEOUT_S
    deadline = clock.deadline(limit)
    last = ""
    while True:
        obj = await kube.get("rayclusters.ray.io", name, namespace=namespace)
        if obj is None:
            raise DockyardLiveError(f"RayCluster {name} disappeared while waiting for it")
        line = status.raycluster_line(obj)
        if line != last:
            clock(f"RayCluster {name}: {line}")
            last = line
        if (obj.get("status") or {}).get("state") == "ready":
            return
        if time.monotonic() >= deadline:
            raise DockyardLiveError(
                f"RayCluster {name} not ready after {limit:.0f}s ({line}); is the KubeRay operator "
                "running? (nymph dockyard doctor; nymph dockyard logs --source head)"
            )
        await asyncio.sleep(opts.poll)


async def cluster_up(
    kube: Kube, loaded: LoadedConfig, manifests: list[Any], *, opts: LiveOptions, say: Say
) -> int:
    """Pool + PDBs + RayCluster (``manifests`` rendered in bringup mode)."""
    infra = loaded.infra
    p = planning.plan(manifests)
    clock = Clock(say)
    report_render_only(p, say=say)
    if opts.dry_run:
        await dry_run(kube, p, namespace=_ns(infra), say=say)
        return 0
    assert p.ray is not None and p.ray["kind"] == "RayCluster"
    name = p.ray["metadata"]["name"]
    await apply_pieces(kube, list(p.first), namespace=_ns(infra), say=clock)
    await ensure_raycluster(kube, p.ray, namespace=_ns(infra), recreate=opts.recreate, clock=clock)
    if opts.no_wait:
        clock(
            f"RayCluster {name} applied in {_ns(infra)}; not waiting (--no-wait): see 'nymph dockyard cluster list'"
        )
        return 0
    await wait_sandbox(kube, p, infra, opts=opts, clock=clock)
    await wait_cluster_ready(kube, name=name, namespace=_ns(infra), opts=opts, clock=clock)
    clock(f"RayCluster {name} is ready in {_ns(infra)}")
    return 0


def teardown_order(manifests: list[Any]) -> list[dict[str, Any]]:
    """What ``cluster down`` deletes, last applied first: a RayJob of the cluster's name (it
    owns a cluster of its own), the RayCluster, the DRA objects, PDBs, then the sandbox pool."""
    p = planning.plan(manifests)
    out: list[dict[str, Any]] = []
    if p.ray is not None:
        meta: Mapping[str, Any] = p.ray["metadata"]
        out.append({"apiVersion": p.ray["apiVersion"], "kind": "RayJob", "metadata": dict(meta)})
        out.append(p.ray)
    out.extend(reversed(p.first))
    return out


async def cluster_down(
    kube: Kube, loaded: LoadedConfig, manifests: list[Any], *, opts: LiveOptions, say: Say
) -> int:
    infra = loaded.infra
    victims = teardown_order(manifests)
    if opts.dry_run:
        present = await kube.get_many(victims)
        for m in victims:
            say(f"{ref(m)}: {'would delete' if ref(m) in present else 'absent'}")
        return 0
    clock = Clock(say)
    deleted = await kube.delete(victims, wait=not opts.no_wait, timeout=opts.timeout or 120.0)
    for line in deleted:
        clock(f"{line}: deleted")
    if not deleted:
        clock(f"nothing to delete in {_ns(infra)}: none of {len(victims)} objects exists")
    else:
        clock(f"deleted {len(deleted)} objects in {_ns(infra)} (quota / limit range are never touched)")
    return 0
