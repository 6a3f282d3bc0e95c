"""``dev connect|stop|setup-secrets`` and ``cluster dashboard``: the user's own dev Pod and
secrets (:mod:`nymph.dockyard.render.devpod`), and a long-lived forward to a head's dashboard.

Secret values travel to kubectl on stdin only and are never printed: the commands say which
keys were set.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
import webbrowser
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nymph.dockyard.errors import DockyardLiveError
from nymph.dockyard.live import status
from nymph.dockyard.live.endpoint import HeadTarget, port_forward, port_free, wait_head_pod, wait_head_service
from nymph.dockyard.live.kubectl import Kube, Say
from nymph.dockyard.render import devpod, plan

TERMINAL_POD = ("Succeeded", "Failed")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")


@dataclass(frozen=True, kw_only=True)
class DevOptions:
    user: str
    namespace: str
    image: str = devpod.DEFAULT_IMAGE
    pvc: str = devpod.WORKSPACE_PVC
    labels: Mapping[str, str] | None = None
    timeout: float = 240.0
    poll: float = 2.0
    shell: str = "bash"


async def ensure_dev_pod(kube: Kube, opts: DevOptions, *, say: Say) -> str:
    """Create the dev Pod unless it exists, then wait until it is Running; its name."""
    name = devpod.pod_name(opts.user)
    pod = await kube.get("pods", name, namespace=opts.namespace)
    if pod is None:
        say(f"creating dev pod {name} in {opts.namespace} (image {opts.image})")
        manifest = devpod.dev_pod(
            user=opts.user, namespace=opts.namespace, image=opts.image, pvc=opts.pvc, labels=opts.labels
        )
        await kube.apply([manifest], namespace=opts.namespace)
    else:
        running = [c.get("image") for c in (pod.get("spec") or {}).get("containers") or []]
        if running and running[0] != opts.image:
            say(
                f"warning: dev pod {name} runs image {running[0]}, not {opts.image}: "
                "'nymph dockyard dev stop' then connect again to switch"
            )
    deadline = time.monotonic() + opts.timeout
    last = ""
    while True:
        pod = await kube.get("pods", name, namespace=opts.namespace)
        if pod is None:
            raise DockyardLiveError(f"dev pod {name} disappeared while starting")
        phase = status.pod_phase(pod)
        if phase != last:
            say(f"dev pod {name}: {phase}")
            last = phase
        if phase.startswith("Running"):
            return name
        if phase.split()[0] in TERMINAL_POD:
            raise DockyardLiveError(
                f"dev pod {name} ended ({phase}): see kubectl describe pod {name} -n {opts.namespace}, "
                "then 'nymph dockyard dev stop' and connect again"
            )
        if time.monotonic() >= deadline:
            raise DockyardLiveError(
                f"dev pod {name} not Running after {opts.timeout:.0f}s ({phase}): is the workspace PVC "
                f"{opts.pvc} there? (kubectl describe pod {name} -n {opts.namespace})"
            )
        await asyncio.sleep(opts.poll)


def interactive_shell(kube: Kube, *, namespace: str, pod: str, shell: str) -> int:
    """``kubectl exec -it POD -- SHELL`` on this terminal; kubectl's exit code."""
    argv = kube.argv(["exec", "-it", "-n", namespace, pod, "--", shell])
    return subprocess.run(argv, check=False).returncode


async def dev_stop(kube: Kube, *, user: str, namespace: str, say: Say) -> int:
    name = devpod.pod_name(user)
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}}
    # Waits until the Pod is gone (as `kubectl delete` does): a `dev connect` right after then
    # creates a new Pod instead of finding the one still terminating.
    deleted = await kube.delete([manifest], wait=True)
    say(f"deleted dev pod {name} in {namespace}" if deleted else f"no dev pod {name} in {namespace}")
    return 0


def secret_data(pairs: list[str], *, ssh_key: Path | None, rclone: bool, home: Path) -> dict[str, str]:
    """``NAME=VAL`` arguments, the SSH key and the rclone config as Secret keys."""
    data: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise DockyardLiveError("expected NAME=VALUE arguments (one has no '=')")
        if not _SECRET_KEY.fullmatch(key):
            raise DockyardLiveError(f"secret key {key[:60]!r}: letters, digits, '-', '_' or '.' only")
        data[key] = value
    if ssh_key is not None:
        try:
            data["SSH_KEY_CONTENT"] = ssh_key.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DockyardLiveError(f"--ssh-key {ssh_key}: cannot read ({exc.__class__.__name__})") from None
        data["SSH_KEY_NAME"] = ssh_key.name
    if rclone:
        conf = home / ".config" / "rclone" / "rclone.conf"
        try:
            data["RCLONE_CONF"] = conf.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise DockyardLiveError(f"--add-rclone: no readable rclone config at {conf}") from None
    return data


async def setup_secrets(
    kube: Kube, *, user: str, namespace: str, data: Mapping[str, str], ssh_key: bool, say: Say
) -> int:
    """Create ``<user>-secrets`` (the first time: HF_TOKEN, WANDB_API_KEY and an SSH key
    required) or add / replace keys of the existing one."""
    name = devpod.secret_name(user)
    existing = await kube.get("secrets", name, namespace=namespace)
    if existing is None:
        missing = [k for k in devpod.FIRST_TIME_KEYS if k not in data]
        if missing or not ssh_key:
            need = [*missing, *([] if ssh_key else ["--ssh-key FILE"])]
            raise DockyardLiveError(f"the first setup of secret {name} needs: {', '.join(need)}")
        manifest = devpod.secret(user=user, namespace=namespace, data=data)
        await kube.create(manifest, namespace=namespace)
        action = "created"
    else:
        if not data:
            raise DockyardLiveError("nothing to set: give NAME=VALUE, --ssh-key or --add-rclone")
        patch = json.dumps({"stringData": dict(data)})
        await kube.patch_stdin("secrets", name, patch, namespace=namespace)
        action = "updated"
    say(f"{action} secret {name} in {namespace} (keys: {', '.join(sorted(data))})")
    return 0


async def dashboard_forward(
    kube: Kube, *, namespace: str, cluster: str, port: int, open_browser: bool, timeout: float, say: Say
) -> int:
    """Forward ``127.0.0.1:PORT`` to the head's dashboard until Ctrl-C."""
    if port and not port_free(port):
        raise DockyardLiveError(f"local port {port} is taken: pick another with --port")
    target = HeadTarget(
        namespace=namespace, cluster=cluster, deadline=time.monotonic() + timeout, interval=1.0
    )
    svc = await wait_head_service(kube, target, say=say)
    await wait_head_pod(kube, target, say=say)
    name = str((svc.get("metadata") or {}).get("name"))
    async with port_forward(
        kube, namespace=namespace, service=name, port=plan.dashboard_port(svc), local_port=port
    ) as url:
        say(f"the Ray dashboard of {cluster}: {url} (Ctrl-C stops)")
        if open_browser:
            webbrowser.open(url)
        await asyncio.Event().wait()
    return 0
