"""Submitting ``launch.entrypoint`` to a RayCluster (bringup and attach modes) and following it.

The transport is the run's submitter (:mod:`nymph.dockyard.render.runopts`):

* ``portForward``: a Ray job through the head dashboard's Jobs REST API (``--ray-address``,
  else as ``submit.portForward`` says: with ``auto`` the head Service inside the cluster, else
  ``kubectl port-forward``; the explicit modes always forward). ``codeSource: upload``
  packages the working dir (:mod:`nymph.dockyard.live.workdir`) and uploads it first; with
  ``image`` / ``lustre`` the job starts in ``codePath``.
* ``exec``: the entrypoint runs on the head pod (:mod:`nymph.dockyard.live.execrun`).

With ``submit.kind: rayjob`` neither: :func:`submit_rayjob` applies a RayJob that KubeRay
submits to the cluster.

``--replace`` stops the cluster's unfinished jobs first. ``--run-id`` is the Ray submission id
and is exported as ``DOCKYARD_K8S_RUN_ID`` (without it Ray names the job); an exec run always
has one (``<user>-<recipe>-<time>``, exported too). The run id names the run handle cached for
the ``job`` verbs.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nymph.dockyard.errors import DockyardLiveError
from nymph.dockyard.live import execrun, handles, workdir
from nymph.dockyard.live.endpoint import HeadTarget, dashboard
from nymph.dockyard.live.kubectl import Kube, Say
from nymph.dockyard.live.rayapi import JobInfo, RayJobsClient
from nymph.dockyard.render import runopts
from nymph.dockyard.render.runopts import RunChoice
from nymph.dockyard.spec.enums import CodeSource, SubmitterMode
from nymph.dockyard.spec.load import LoadedConfig

HEAD_TIMEOUT_S = 1800.0
LOG_TAIL_LINES = 20
RUN_ID_ENV = "DOCKYARD_K8S_RUN_ID"


@dataclass(frozen=True, kw_only=True)
class Submission:
    cluster: str
    run_id: str
    #: the run id came from --run-id: the Ray submission id, exported as DOCKYARD_K8S_RUN_ID
    #: (otherwise Ray names the job, and an exec run uses ``run_id``)
    explicit_id: bool
    choice: RunChoice
    ray_address: str | None
    kubeconfig: str | None
    timeout: float | None
    poll: float
    replace: bool
    repo_root: Path


def job_metadata(cluster: str, loaded: LoadedConfig) -> dict[str, str]:
    return {"submitted-by": "nymph-dockyard", "dockyard-cluster": cluster, "recipe": loaded.recipe_path.name}


def _env(loaded: LoadedConfig, run_id: str | None) -> dict[str, str]:
    env = dict(loaded.infra.launch.env)
    if run_id:
        env.setdefault(RUN_ID_ENV, run_id)
    return env


def entrypoint_in(code_path: str | None, entrypoint: str) -> str:
    """The entrypoint started in ``code_path`` (image / lustre code)."""
    return f"cd {shlex.quote(code_path)} && {entrypoint}" if code_path else entrypoint


async def submit(kube: Kube, loaded: LoadedConfig, sub: Submission, *, say: Say) -> int:
    if sub.choice.submitter is SubmitterMode.EXEC:
        return await _submit_exec(kube, loaded, sub, say=say)
    return await _submit_rest(kube, loaded, sub, say=say)


async def submit_rayjob(kube: Kube, loaded: LoadedConfig, sub: Submission, *, say: Say) -> str:
    """``submit.kind: rayjob``: apply the run's RayJob on ``sub.cluster``; its name."""
    infra = loaded.infra
    manifest = runopts.cluster_rayjob(
        run_id=sub.run_id,
        cluster=sub.cluster,
        namespace=infra.namespace,
        entrypoint=entrypoint_in(sub.choice.code_path, str(infra.launch.entrypoint)),
        env=_env(loaded, sub.run_id),
    )
    name = str(manifest["metadata"]["name"])
    if await kube.get("rayjobs.ray.io", name, namespace=infra.namespace) is not None:
        raise DockyardLiveError(f"RayJob {name} exists already in {infra.namespace}: pass another --run-id")
    await kube.apply([manifest], namespace=infra.namespace)
    say(f"submitted RayJob {name} to RayCluster {sub.cluster} (submit.kind: rayjob)")
    return name


async def _stop_running(ray: RayJobsClient, *, poll: float, say: Say) -> None:
    running = await ray.running()
    for job in running:
        job_id = str(job.get("submission_id") or job.get("job_id"))
        await ray.stop(job_id)
        say(f"--replace: stop requested for Ray job {job_id} ({job.get('status')})")
    for job in running:
        job_id = str(job.get("submission_id") or job.get("job_id"))
        info = await ray.follow(
            job_id, on_change=lambda _i: None, interval=min(poll, 1.0), deadline=time.monotonic() + 120
        )
        say(f"--replace: Ray job {job_id} {info.get('status')}")
    if not running:
        say("--replace: no unfinished Ray job on the cluster")


async def _runtime_env(
    ray: RayJobsClient, loaded: LoadedConfig, sub: Submission, *, say: Say
) -> dict[str, Any]:
    env: dict[str, Any] = {"env_vars": _env(loaded, sub.run_id if sub.explicit_id else None)}
    if sub.choice.code_source is not CodeSource.UPLOAD:
        return env
    recipe = yaml.safe_dump(dict(loaded.recipe), sort_keys=False)
    include = loaded.infra.launch.rayUploadPaths
    pkg = workdir.package(
        sub.repo_root,
        include=list(include) if include is not None else None,
        extra={workdir.STAGED_RECIPE: recipe},
    )
    uploaded = await ray.upload_package(pkg.uri, pkg.data)
    size = f"{len(pkg.data) / 1024:.0f} KiB"
    say(
        f"working dir {sub.repo_root}: {pkg.files} files, {size} ({'uploaded' if uploaded else 'already on the head'})"
    )
    env["working_dir"] = pkg.uri
    return env


async def _submit_rest(kube: Kube, loaded: LoadedConfig, sub: Submission, *, say: Say) -> int:
    infra = loaded.infra
    entrypoint = str(infra.launch.entrypoint)
    if sub.choice.code_source is not CodeSource.UPLOAD:
        entrypoint = entrypoint_in(sub.choice.code_path, entrypoint)
    limit = sub.timeout if sub.timeout is not None else HEAD_TIMEOUT_S
    target = HeadTarget(
        namespace=infra.namespace, cluster=sub.cluster, deadline=time.monotonic() + limit, interval=sub.poll
    )
    async with (
        dashboard(
            kube,
            target,
            ray_address=sub.ray_address,
            kubeconfig=sub.kubeconfig,
            say=say,
            local_port=infra.submit.localDashboardPort,
            forward=infra.submit.portForward,
        ) as url,
        RayJobsClient(url) as ray,
    ):
        version = await ray.wait_ready(deadline=target.deadline, interval=min(sub.poll, 1.0))
        say(f"Ray {version.get('ray_version', '?')} dashboard at {url} is up")
        if sub.replace:
            await _stop_running(ray, poll=sub.poll, say=say)
        job_id = await ray.submit(
            entrypoint=entrypoint,
            submission_id=sub.run_id if sub.explicit_id else None,
            runtime_env=await _runtime_env(ray, loaded, sub, say=say),
            metadata=job_metadata(sub.cluster, loaded),
        )
        handles.save(
            handles.new(
                run_id=job_id,
                kind="rest",
                cluster=sub.cluster,
                namespace=infra.namespace,
                recipe=loaded.recipe_path,
                ray_address=sub.ray_address,
            )
        )
        say(f"submitted Ray job {job_id} to {sub.cluster}")
        if not sub.choice.wait:
            say(f"not following (--no-wait): nymph dockyard job logs {job_id} {loaded.recipe_path} -f")
            return 0

        def changed(info: JobInfo) -> None:
            message = f" ({info['message']})" if info.get("message") else ""
            say(f"Ray job {job_id}: {info.get('status')}{message}")

        deadline = time.monotonic() + sub.timeout if sub.timeout is not None else None
        info = await ray.follow(job_id, on_change=changed, interval=sub.poll, deadline=deadline)
        if info.get("status") == "SUCCEEDED":
            return 0
        tail = (await ray.logs(job_id)).rstrip().splitlines()[-LOG_TAIL_LINES:]
        if tail:
            say(f"last {len(tail)} log lines of {job_id}:")
            for line in tail:
                say(f"  {line}")
        return 1


async def _submit_exec(kube: Kube, loaded: LoadedConfig, sub: Submission, *, say: Say) -> int:
    infra = loaded.infra
    ns = infra.namespace
    pod = await execrun.head_pod(kube, namespace=ns, cluster=sub.cluster)
    if sub.replace:
        await stop_exec_runs(kube, cluster=sub.cluster, namespace=ns, say=say)
    directory = execrun.run_dir(infra.submit.execTmpDir, sub.run_id)
    await execrun.start(
        kube,
        namespace=ns,
        pod=pod,
        directory=directory,
        entrypoint=str(infra.launch.entrypoint),
        env=_env(loaded, sub.run_id),
        code_path=sub.choice.code_path,
    )
    handles.save(
        handles.new(
            run_id=sub.run_id,
            kind="exec",
            cluster=sub.cluster,
            namespace=ns,
            recipe=loaded.recipe_path,
            pod=pod,
            run_dir=directory,
        )
    )
    say(f"started run {sub.run_id} on {pod} ({directory})")
    if not sub.choice.wait:
        say(f"not following (--no-wait): nymph dockyard job logs {sub.run_id} -f")
        return 0
    deadline = time.monotonic() + sub.timeout if sub.timeout is not None else None
    code = await execrun.follow(
        kube, namespace=ns, pod=pod, directory=directory, poll=sub.poll, deadline=deadline, say=say
    )
    say(f"run {sub.run_id} exited {code}")
    return 0 if code == 0 else 1


async def stop_exec_runs(kube: Kube, *, cluster: str, namespace: str, say: Say) -> None:
    """``--replace`` with exec: stop this cluster's cached exec runs that still run."""
    for path in sorted(handles.runs_dir().glob("*.json")):
        handle = handles.load(path.stem)
        if (
            handle is None
            or handle.kind != "exec"
            or handle.cluster != cluster
            or handle.namespace != namespace
        ):
            continue
        assert handle.pod is not None and handle.run_dir is not None
        try:
            stopped = await execrun.stop(
                kube, namespace=namespace, pod=handle.pod, directory=handle.run_dir, force=False
            )
        except DockyardLiveError:
            continue  # its pod is gone
        if stopped:
            say(f"--replace: stopped run {handle.run_id} on {handle.pod}")
