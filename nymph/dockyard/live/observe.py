"""``status``, ``cluster list``, ``logs`` and ``job list|logs|stop``: read what is running."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

from nymph.dockyard.errors import DockyardLiveError
from nymph.dockyard.live import status
from nymph.dockyard.live.endpoint import HeadTarget, dashboard
from nymph.dockyard.live.kubectl import Kube, Say
from nymph.dockyard.live.rayapi import RayJobsClient
from nymph.dockyard.render import k8s
from nymph.dockyard.render import plan as planning
from nymph.dockyard.render.plan import LogSource, ref
from nymph.dockyard.spec.enums import LaunchMode
from nymph.dockyard.spec.load import LoadedConfig

# -- status --------------------------------------------------------------------------------


async def show_status(kube: Kube, loaded: LoadedConfig, manifests: list[Any], *, say: Say) -> int:
    """One line per object of the deployment: its live state, or ``absent``. Exit 0 when
    everything the live path applies exists, 1 otherwise."""
    infra = loaded.infra
    p = planning.plan(manifests)
    live = await kube.get_many(p.applied)
    say(f"namespace {infra.namespace}, launch mode {infra.launch.mode.value}")
    width = max((len(ref(m)) for m in p.applied), default=0)
    for m in p.applied:
        obj = live.get(ref(m))
        say(f"  {ref(m):<{width}}  {status.object_line(obj) if obj is not None else 'absent'}")
    for m in p.render_only:
        say(f"  {ref(m):<{width}}  render-only (never applied by nymph)")
    cluster: str | None = None
    if infra.launch.mode is LaunchMode.ATTACH and infra.launch.attach:
        rc = await kube.get("rayclusters.ray.io", infra.launch.attach, namespace=infra.namespace)
        line = status.raycluster_line(rc) if rc is not None else "absent"
        say(f"  attach RayCluster/{infra.launch.attach}  {line}")
        cluster = infra.launch.attach if rc is not None else None
    elif p.ray is not None and ref(p.ray) in live:
        obj = live[ref(p.ray)]
        cluster = (
            str(p.ray["metadata"]["name"])
            if p.ray["kind"] == "RayCluster"
            else status.rayjob_phase(obj).cluster
        )
    await _pod_phases(kube, infra.namespace, cluster=cluster or None, plan_=p, live=live, say=say)
    return 0 if all(ref(m) in live for m in p.applied) else 1


async def _pod_phases(
    kube: Kube,
    namespace: str,
    *,
    cluster: str | None,
    plan_: planning.Plan,
    live: dict[str, dict[str, Any]],
    say: Say,
) -> None:
    """The head and worker pods' phases, and the sandbox pool's pods (of what exists)."""
    if cluster:
        selector = planning.selector_text({planning.CLUSTER_LABEL: cluster})
        pods = await kube.list_objects("pods", namespace=namespace, selector=selector)
        for line in status.ray_pod_lines(cluster, pods):
            say(line)
    deployment = plan_.sandbox_deployment()
    if deployment is not None and ref(deployment) in live:
        pods = await kube.list_objects(
            "pods", namespace=namespace, selector=planning.sandbox_selector(deployment)
        )
        say(status.sandbox_pod_line(deployment["metadata"]["name"], pods))


# -- cluster list --------------------------------------------------------------------------


async def cluster_list(kube: Kube, *, namespace: str | None, say: Say) -> int:
    clusters = await kube.list_objects("rayclusters.ray.io", namespace=namespace)
    deployments = await kube.list_objects(
        "deployments.apps",
        namespace=namespace,
        selector=planning.selector_text({k8s.MANAGED_BY_KEY: k8s.MANAGED_BY}),
    )
    where = f"namespace {namespace}" if namespace else "any namespace"
    if clusters:
        sys.stdout.write(
            status.table(status.RAYCLUSTER_HEADERS, [status.raycluster_row(c) for c in clusters])
        )
    else:
        say(f"no RayClusters in {where}")
    pools = [d for d in deployments if planning.is_sandbox_deployment(d)]
    if pools:
        sys.stdout.write(status.table(status.SANDBOX_HEADERS, [status.sandbox_row(d) for d in pools]))
    else:
        say(f"no dockyard sandbox pools in {where}")
    return 0


# -- logs ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LogOptions:
    source: LogSource
    follow: bool = False
    tail: int = 200
    group: str | None = None
    container: str | None = None


async def ray_cluster_name(kube: Kube, loaded: LoadedConfig, manifests: list[Any]) -> str:
    """The RayCluster of a deployment: the RayJob's (KubeRay names it), the brought-up one
    (also for a rayjob-mode infra after 'cluster up'), or the attached one."""
    infra = loaded.infra
    if infra.launch.mode is LaunchMode.ATTACH:
        return str(infra.launch.attach)
    p = planning.plan(manifests)
    assert p.ray is not None
    name = str(p.ray["metadata"]["name"])
    if p.ray["kind"] == "RayCluster":
        return name
    job = await kube.get("rayjobs.ray.io", name, namespace=infra.namespace)
    if job is None:
        if await kube.get("rayclusters.ray.io", name, namespace=infra.namespace) is not None:
            return name  # brought up with 'cluster up'
        raise DockyardLiveError(
            f"neither RayJob {name} nor RayCluster {name} exists in {infra.namespace} "
            "(start one with: nymph dockyard run / nymph dockyard cluster up)"
        )
    cluster = status.rayjob_phase(job).cluster
    if not cluster:
        raise DockyardLiveError(
            f"RayJob {name} has no RayCluster yet ({status.rayjob_phase(job).line()}); retry in a moment"
        )
    return cluster


async def logs(kube: Kube, loaded: LoadedConfig, manifests: list[Any], *, opts: LogOptions, say: Say) -> int:
    infra = loaded.infra
    if opts.source is LogSource.SANDBOX:
        deployment = planning.plan(manifests).sandbox_deployment()
        if deployment is None:
            raise DockyardLiveError("this infra has no sandbox pool (infra.sandbox is unset)")
        selector = planning.sandbox_selector(deployment)
        what = f"sandbox pool {deployment['metadata']['name']}"
    else:
        cluster = await ray_cluster_name(kube, loaded, manifests)
        group = opts.group if opts.source is LogSource.WORKER else None
        selector = planning.ray_pod_selector(cluster, source=opts.source, group=group)
        what = f"{opts.source.value} of RayCluster {cluster}"
    pods = await kube.list_objects("pods", namespace=infra.namespace, selector=selector)
    if not pods:
        raise DockyardLiveError(
            f"no pods for the {what} in {infra.namespace} (selector {selector}); is it up? (nymph dockyard status)"
        )
    args = [
        "logs",
        "-n",
        infra.namespace,
        "-l",
        selector,
        "--prefix",
        f"--tail={opts.tail}",
        f"--max-log-requests={max(len(pods), 1)}",
    ]
    if opts.container:
        args += ["-c", opts.container]
    if opts.follow:
        args.append("--follow")
    say(f"logs of {len(pods)} pod(s) of the {what}")
    await kube.stream(args, doing=f"logs of the {what}", namespace=infra.namespace)
    return 0


# -- Ray jobs ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class JobTarget:
    namespace: str
    cluster: str | None
    ray_address: str | None
    kubeconfig: str | None
    timeout: float = 120.0
    poll: float = 2.0

    def head(self) -> HeadTarget | None:
        if self.cluster is None:
            return None
        return HeadTarget(
            namespace=self.namespace,
            cluster=self.cluster,
            deadline=time.monotonic() + self.timeout,
            interval=self.poll,
        )


def _require(target: JobTarget) -> None:
    if target.cluster is None and target.ray_address is None:
        raise DockyardLiveError("which Ray head? pass --cluster NAME (a RayCluster) or --ray-address URL")


async def job_list(kube: Kube, target: JobTarget, *, say: Say) -> int:
    _require(target)
    async with (
        dashboard(
            kube, target.head(), ray_address=target.ray_address, kubeconfig=target.kubeconfig, say=say
        ) as url,
        RayJobsClient(url) as ray,
    ):
        jobs = await ray.jobs()
    if not jobs:
        say(f"no Ray jobs on {target.cluster or url}")
        return 0
    jobs.sort(key=lambda j: j.get("start_time") or 0)
    sys.stdout.write(status.table(status.RAY_JOB_HEADERS, [status.ray_job_row(j) for j in jobs]))
    return 0


async def job_logs(kube: Kube, target: JobTarget, job_id: str, *, follow: bool, say: Say) -> int:
    _require(target)
    async with (
        dashboard(
            kube, target.head(), ray_address=target.ray_address, kubeconfig=target.kubeconfig, say=say
        ) as url,
        RayJobsClient(url) as ray,
    ):
        if not follow:
            sys.stdout.write(await ray.logs(job_id))
            sys.stdout.flush()
            return 0
        async for chunk in ray.tail(job_id):
            sys.stdout.write(chunk)
            sys.stdout.flush()
        info = await ray.info(job_id)
    return 0 if info.get("status") == "SUCCEEDED" else 1


async def job_stop(kube: Kube, target: JobTarget, job_id: str, *, wait: bool, say: Say) -> int:
    _require(target)
    async with (
        dashboard(
            kube, target.head(), ray_address=target.ray_address, kubeconfig=target.kubeconfig, say=say
        ) as url,
        RayJobsClient(url) as ray,
    ):
        stopped = await ray.stop(job_id)
        if not stopped:
            info = await ray.info(job_id)
            say(f"Ray job {job_id} was not running ({info.get('status')})")
            return 0
        say(f"stop requested for Ray job {job_id}")
        if wait:
            await ray.follow(
                job_id,
                on_change=lambda i: say(f"Ray job {job_id}: {i.get('status')}"),
                interval=min(target.poll, 1.0),
                deadline=time.monotonic() + target.timeout,
            )
    return 0
