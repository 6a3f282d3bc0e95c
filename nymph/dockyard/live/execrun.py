"""The ``exec`` submitter: the entrypoint runs on the head pod under ``nohup``, no dashboard.

A run owns ``<submit.execTmpDir>/dockyard-<run id>`` on the head pod: ``out.log`` (stdout and
stderr), ``pid`` (the process group, started with ``setsid``) and ``exit`` (the exit code,
written when the entrypoint ends). Following polls the log from the last offset and stops at
``exit``; stopping signals the process group (TERM, or KILL with ``--force``).
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
from collections.abc import Mapping

from nymph.dockyard.errors import DockyardLiveError
from nymph.dockyard.live.kubectl import Kube, Say
from nymph.dockyard.render import plan


def run_dir(tmp: str, run_id: str) -> str:
    return f"{tmp.rstrip('/') or '/tmp'}/dockyard-{run_id}"


def start_script(*, directory: str, entrypoint: str, env: Mapping[str, str], code_path: str | None) -> str:
    """The ``sh -c`` script that starts the entrypoint detached and returns at once."""
    q = shlex.quote
    exports = "".join(f"export {k}={q(v)}; " for k, v in env.items())
    cd = f"cd {q(code_path)} && " if code_path else ""
    inner = f"{exports}({cd}bash -c {q(entrypoint)}); echo $? > {q(directory)}/exit"
    return (
        f"mkdir -p {q(directory)} && rm -f {q(directory)}/exit && "
        f"(setsid nohup bash -c {q(inner)} > {q(directory)}/out.log 2>&1 < /dev/null & "
        f"echo $! > {q(directory)}/pid)"
    )


async def head_pod(kube: Kube, *, namespace: str, cluster: str) -> str:
    """The Running head pod of ``cluster`` (exec needs one)."""
    selector = plan.ray_pod_selector(cluster, source=plan.LogSource.HEAD)
    pods = await kube.list_objects("pods", namespace=namespace, selector=selector)
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    if not running:
        raise DockyardLiveError(
            f"no running head pod for RayCluster {cluster} in {namespace} ({selector}): the exec "
            "submitter runs the entrypoint there (check: nymph dockyard status)"
        )
    return str(running[0]["metadata"]["name"])


async def _exec(kube: Kube, *, namespace: str, pod: str, script: str, doing: str) -> tuple[int, str, str]:
    res = await kube.kubectl.run(["exec", "-n", namespace, pod, "--", "sh", "-c", script])
    if res.code != 0 and not res.stdout and res.stderr:
        low = res.stderr.lower()
        if "error" in low or "unable" in low or "not found" in low or "does not" in low:
            reason = res.stderr.strip().splitlines()[-1][:300]
            raise DockyardLiveError(f"{doing}: kubectl exec into {pod} failed: {reason}")
    return res.code, res.stdout, res.stderr


async def start(
    kube: Kube,
    *,
    namespace: str,
    pod: str,
    directory: str,
    entrypoint: str,
    env: Mapping[str, str],
    code_path: str | None,
) -> None:
    script = start_script(directory=directory, entrypoint=entrypoint, env=env, code_path=code_path)
    code, _, err = await _exec(kube, namespace=namespace, pod=pod, script=script, doing="start the run")
    if code != 0:
        raise DockyardLiveError(f"start the run on {pod}: {err.strip()[:300] or f'exit {code}'}")


async def exit_code(kube: Kube, *, namespace: str, pod: str, directory: str) -> int | None:
    """The run's exit code, ``None`` while it runs."""
    _, out, _ = await _exec(
        kube,
        namespace=namespace,
        pod=pod,
        script=f"cat {shlex.quote(directory)}/exit 2>/dev/null",
        doing="read",
    )
    text = out.strip()
    return int(text) if text.lstrip("-").isdigit() else None


async def follow(
    kube: Kube, *, namespace: str, pod: str, directory: str, poll: float, deadline: float | None, say: Say
) -> int:
    """Print the log as it grows until the run ends; its exit code."""
    offset = 0
    log = f"{shlex.quote(directory)}/out.log"
    while True:
        done = await exit_code(kube, namespace=namespace, pod=pod, directory=directory)
        _, out, _ = await _exec(
            kube,
            namespace=namespace,
            pod=pod,
            script=f"tail -c +{offset + 1} {log} 2>/dev/null",
            doing="read the log",
        )
        if out:
            sys.stdout.write(out)
            sys.stdout.flush()
            offset += len(out.encode())
        if done is not None:
            return done
        if deadline is not None and time.monotonic() >= deadline:
            say(f"still running at the --timeout; it keeps running on {pod} ({directory})")
            return 1
        await asyncio.sleep(poll)


async def stop(kube: Kube, *, namespace: str, pod: str, directory: str, force: bool) -> bool:
    """Signal the run's process group; False when it had already ended."""
    d = shlex.quote(directory)
    signal = "KILL" if force else "TERM"
    script = f"test -e {d}/exit && exit 3; kill -{signal} -- -$(cat {d}/pid)"
    code, _, err = await _exec(kube, namespace=namespace, pod=pod, script=script, doing="stop the run")
    if code == 3:
        return False
    if code != 0:
        raise DockyardLiveError(f"stop the run on {pod}: {err.strip()[:300] or f'exit {code}'}")
    return True
