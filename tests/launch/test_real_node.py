"""Pods rendered by the launch contract really run on the real local node.

The Pods come from :func:`nymph.launch.render.render_pod` exactly as the daemon renders them
(heredoc under the image's own ``/bin/sh``, dash in the local Debian python image; hostPath
workdir; node affinity to the real node), and run in containerd via kubelet.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from nymph.launch import names
from nymph.launch.config import Mode, Provider
from nymph.launch.render import render_pod
from nymph.launch.spec import build_launch_spec
from nymph.launch.state import Reason, pod_reason
from nymph.localcluster import LocalCluster, host
from nymph.localcluster.nodeconfig import KUBELET_SYSCTLS, NodeLayout

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]


def python_image(cluster: LocalCluster) -> str:
    image = next((i for i in cluster.node_image_names if "/python:" in i), None)
    assert image, f"no local python image on the node: {cluster.node_image_names}"
    return image


def run_script(
    cluster: LocalCluster,
    namespace: str,
    script: str,
    *,
    image: str | None = None,
    resources: dict[str, Any] | None = None,
    workdir_root: Path | None = None,
    until: str = "done",
    timeout: float = 120,
) -> tuple[dict[str, Any], dict[str, float]]:
    """Render a launch into a Pod on the real node, create it, wait until it ends (or, with
    ``until="reason"`` / ``"running"``, until it has a failure reason / runs); returns the last
    Pod and timings."""
    fields: dict[str, Any] = {"image": image or python_image(cluster)}
    if resources:
        fields["resources"] = resources
    iid = names.new_instance_id()
    spec = build_launch_spec(
        provider=Provider(name="t", kwargs={"namespace": namespace}),
        mode=Mode(name="m", fields=fields),
        body={"script": script},
        instance_id=iid,
    )
    root = None
    if workdir_root is not None:
        (workdir_root / "work" / iid).mkdir(parents=True)
        root = str(workdir_root)
    pod = render_pod(spec, node=cluster.real_node, workdir_root=root)
    t0 = time.monotonic()
    cluster.api("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    timings: dict[str, float] = {}
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        got = cluster.api("GET", f"/api/v1/namespaces/{namespace}/pods/{iid}")
        phase = got["status"].get("phase")
        if phase == "Running":
            timings.setdefault("running", time.monotonic() - t0)
            if until == "running":
                return got, timings
        if phase in ("Succeeded", "Failed") or (until == "reason" and pod_reason(got)[0] is not None):
            timings["done"] = time.monotonic() - t0
            return got, timings
        time.sleep(0.1)
    raise AssertionError(f"pod {iid} did not finish in {timeout}s: {got.get('status')}")


def logs(cluster: LocalCluster, namespace: str, pod: dict[str, Any]) -> str:
    res = cluster.kubectl("logs", pod["metadata"]["name"], "-n", namespace, "-c", "user")
    return res.stdout


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = pod["status"]["containerStatuses"]
    return dict(status["state"]["terminated"])


def host_links(names: Iterable[str]) -> set[str]:
    return {n for n in names if not n.startswith(("nymphbr", "veth"))}


def test_stop_leaves_the_machine_as_it_was(tmp_path: Path, real_node_assets: Path) -> None:
    # First in the module, so usually no other real node runs and the sysctls are the host's.
    alone = not any(o.alive() for o in host.records(host.state_root()).values())
    before_sysctls = host.read_sysctls()
    before_links = set(os.listdir("/sys/class/net"))
    cluster = LocalCluster(tmp_path / "c", assets=real_node_assets, node="real", node_names=())
    cluster.start()
    try:
        assert cluster.node_kind == "real"
        assert cluster.real is not None and cluster.real.layout is not None
        layout = cluster.real.layout
        ns = "default"
        run_script(cluster, ns, "import time; print('up'); time.sleep(60)", until="running", timeout=60)
        # A running container: a shim, a mount, cgroups and a bridge with a veth exist now.
        deadline = time.monotonic() + 30
        while not host._pids_in_cgroups(layout.cgroup_root) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert host._pids_in_cgroups(layout.cgroup_root), "no process in the node's cgroups"
        assert host.mounts_under(layout.state_dir)
        assert Path(f"/sys/class/net/{layout.bridge}").exists()
        during = host.read_sysctls()
        pids = host._pids_naming(layout.state_dir) | host._pids_in_cgroups(layout.cgroup_root)
    finally:
        cluster.stop()
    assert cluster.leftovers == []
    assert all(host._start_time(pid) == "" for pid in pids), "a process outlived the node"
    assert host.mounts_under(layout.state_dir) == []
    assert not layout.state_dir.exists()
    assert not Path(f"/sys/class/net/{layout.bridge}").exists()
    # Other real nodes (other clusters on this machine) may have come or gone meanwhile.
    assert host_links(os.listdir("/sys/class/net")) == host_links(before_links)
    for mnt in host.cgroup_mounts():
        assert not Path(mnt + layout.cgroup_root).exists(), f"cgroup left in {mnt}"
    # The sysctls are the host's again once no real node runs (others may run on this machine).
    if alone and not any(o.alive() for o in host.records(host.state_root()).values()):
        assert host.read_sysctls() == before_sysctls
        assert not (host.state_root() / "sysctls.json").exists()
        # kubelet did rewrite them while it ran (when the host's values differ from its own)
        assert during != before_sysctls or before_sysctls.get("kernel.panic") == "10"
    assert set(KUBELET_SYSCTLS) >= set(before_sysctls)


def test_script_output_exit_zero_and_workdir(
    real_kube: LocalCluster, real_namespace: str, tmp_path: Path
) -> None:
    script = (
        "import os\n"
        "print('hello from', os.environ['NYMPH_INSTANCE_ID'])\n"
        "print('workdir', os.environ['NYMPH_WORKDIR'], os.getcwd())\n"
        "open(os.path.join(os.environ['NYMPH_WORKDIR'], 'out.txt'), 'w').write('written in the pod')\n"
    )
    root = tmp_path / "root"
    pod, timings = run_script(real_kube, real_namespace, script, workdir_root=root)
    iid = pod["metadata"]["name"]
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    assert pod_reason(pod)[0] is Reason.COMPLETED
    assert terminated(pod)["exitCode"] == 0
    assert pod["spec"]["nodeName"] == real_kube.real_node
    assert logs(real_kube, real_namespace, pod) == f"hello from {iid}\nworkdir /workdir /workdir\n"
    assert (root / "work" / iid / "out.txt").read_text() == "written in the pod"
    print(f"create->Running {timings.get('running', 0):.2f}s, create->Succeeded {timings['done']:.2f}s")


def test_exit_code_three_is_error(real_kube: LocalCluster, real_namespace: str) -> None:
    pod, _ = run_script(real_kube, real_namespace, "import sys\nprint('bye')\nsys.exit(3)\n")
    assert pod["status"]["phase"] == "Failed"
    reason, _ = pod_reason(pod)
    assert reason is Reason.ERROR
    assert terminated(pod)["exitCode"] == 3
    assert logs(real_kube, real_namespace, pod) == "bye\n"


def test_memory_limit_exceeded_is_oomkilled(real_kube: LocalCluster, real_namespace: str) -> None:
    limits = {"limits": {"memory": "32Mi"}, "requests": {"memory": "32Mi"}}
    pod, _ = run_script(real_kube, real_namespace, "x = 'x' * (256 << 20)\nprint(len(x))\n", resources=limits)
    assert pod["status"]["phase"] == "Failed"
    assert pod_reason(pod)[0] is Reason.OOM_KILLED
    assert terminated(pod)["reason"] == "OOMKilled"


def test_nonexistent_image_is_image_pull(real_kube: LocalCluster, real_namespace: str) -> None:
    pod, _ = run_script(
        real_kube,
        real_namespace,
        "print(1)\n",
        image="nymph.local/no-such-image:1",
        until="reason",
        timeout=90,
    )
    assert pod_reason(pod)[0] is Reason.IMAGE_PULL, pod["status"]


def tricky_script() -> str:
    lines = [
        "# -*- coding: utf-8 -*-",
        "import hashlib, sys",
        "EOF = 'EOF'",
        "s = '''",
        "EOF",
        "'EOF'",
        "NYMPH_0123456789ABCDEF",
        "ANYMPH_0123456789ABCDEF",
        "Né à Paris, naïve façade, ünïcødé ✓ 日本語 🐍",
        '$HOME `id` $(id) \\\\ \\n " \' """ + -- EOF',
        "'''",
        "print(s)",
        "print('quotes: \\' \" ` $PATH ${X} \\\\')",
        "print('Ωmega — done')",
    ]
    body = "\n".join(lines) + "\n"
    filler = [f"v{i} = {i!r}  # filler line {i} with some text to grow the script" for i in range(1000)]
    code = body + "\n".join(filler) + "\n"
    pad = 100 * 1024 - len(code.encode())
    assert pad > 0
    code += "# " + "p" * (pad - 3) + "\n"
    return code + "print(hashlib.sha256(open(sys.argv[0], 'rb').read()).hexdigest())\n"


def test_heredoc_under_dash_runs_tricky_scripts_unchanged(
    real_kube: LocalCluster, real_namespace: str
) -> None:
    script = tricky_script()
    assert len(script.encode()) > 100 * 1024
    pod, _ = run_script(real_kube, real_namespace, script)
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    out = logs(real_kube, real_namespace, pod).splitlines()
    assert out[-1] == hashlib.sha256(script.encode()).hexdigest(), "the script file differs from the launch"
    assert "Né à Paris, naïve façade, ünïcødé ✓ 日本語 🐍" in out
    assert "EOF" in out and "'EOF'" in out and "NYMPH_0123456789ABCDEF" in out
    assert "quotes: ' \" ` $PATH ${X} \\" in out
    assert out[-2] == "Ωmega — done"


def test_the_image_shell_is_dash(real_kube: LocalCluster, real_namespace: str) -> None:
    script = "import os\nprint(os.path.realpath('/bin/sh'))\n"
    pod, _ = run_script(real_kube, real_namespace, script)
    assert logs(real_kube, real_namespace, pod).strip().endswith("dash")


def test_in_cluster_clients_reach_the_api_server(real_kube: LocalCluster, real_namespace: str) -> None:
    script = (
        "import os, ssl, urllib.request\n"
        "h, p = os.environ['KUBERNETES_SERVICE_HOST'], os.environ['KUBERNETES_SERVICE_PORT']\n"
        "sa = '/var/run/secrets/kubernetes.io/serviceaccount'\n"
        "ctx = ssl.create_default_context(cafile=sa + '/ca.crt')\n"
        "req = urllib.request.Request(f'https://{h}:{p}/version')\n"
        "req.add_header('Authorization', 'Bearer ' + open(sa + '/token').read())\n"
        "print(urllib.request.urlopen(req, context=ctx, timeout=10).status)\n"
    )
    env = real_kube.in_cluster_env
    pod, _ = run_script(real_kube, real_namespace, script)
    assert pod["status"]["phase"] == "Succeeded", logs(real_kube, real_namespace, pod)
    assert logs(real_kube, real_namespace, pod) == "200\n"
    assert env["KUBERNETES_SERVICE_HOST"] == real_kube.api_host


def test_a_killed_launcher_leaves_nothing_behind(tmp_path: Path, real_node_assets: Path) -> None:
    """SIGKILL of the process running a real node (no cleanup code runs there): kubelet and
    containerd die with it, and its reaper sweeps the shims, containers, mounts, bridge and
    cgroups it left."""
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from nymph.localcluster import LocalCluster\n"
        "c = LocalCluster(Path(sys.argv[1]), node='real', node_names=())\n"
        "c.start()\n"
        "py = next(i for i in c.node_image_names if '/python:' in i)\n"
        "c.kubectl('run', 'sleeper', '--image', py, '--restart=Never', '--',\n"
        "          'python3', '-c', 'import time; time.sleep(600)')\n"
        "c.kubectl('wait', '--for=condition=Ready', 'pod/sleeper', '--timeout=60s')\n"
        "print(c.real.layout.slot, flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "k")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip().isdigit(), f"the launcher did not start a node: {line!r}"
        layout = NodeLayout(slot=int(line), state_dir=host.state_root() / line.strip())
        shims = host._pids_naming(layout.state_dir) | host._pids_in_cgroups(layout.cgroup_root)
        assert host.mounts_under(layout.state_dir) and shims
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 60
    while (host.state_root() / f"{layout.slot}.json").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not (host.state_root() / f"{layout.slot}.json").exists(), "the slot was not swept"
    assert host.mounts_under(layout.state_dir) == []
    assert not Path(f"/sys/class/net/{layout.bridge}").exists()
    assert all(host._start_time(pid) == "" for pid in shims), "a process outlived the launcher"
    for mnt in host.cgroup_mounts():
        assert not Path(mnt + layout.cgroup_root).exists()


def test_a_stop_while_running_honours_the_grace_period(
    real_kube: LocalCluster, real_namespace: str, tmp_path: Path
) -> None:
    """Deleting the Pod (what a stop does) sends SIGTERM and waits: the script's handler runs
    and its last words reach the hostPath workdir before the Pod is gone."""
    script = (
        "import os, signal, sys, time\n"
        "def term(*_):\n"
        "    time.sleep(1)\n"
        "    open(os.path.join(os.environ['NYMPH_WORKDIR'], 'term.txt'), 'w').write('terminated cleanly')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    root = tmp_path / "root"
    pod, _ = run_script(real_kube, real_namespace, script, workdir_root=root, until="running", timeout=60)
    name = pod["metadata"]["name"]
    deadline = time.monotonic() + 30
    while "ready" not in logs(real_kube, real_namespace, pod) and time.monotonic() < deadline:
        time.sleep(0.2)
    real_kube.kubectl("delete", "pod", name, "-n", real_namespace, "--grace-period=20", "--wait=true")
    assert (root / "work" / name / "term.txt").read_text() == "terminated cleanly"
