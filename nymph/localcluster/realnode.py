"""A real node beside the local control plane: containerd + kubelet + a bridge, so Pods run.

:func:`real_node_support` says whether this machine can run one (root, runc, the CNI plugins,
kubelet and containerd in the assets dir). :class:`RealNode` claims a slot (see
:mod:`nymph.localcluster.host`), creates the slot's bridge, whose address is the node IP and
the address the API server listens on, then runs containerd (images imported from the local
OCI archives, the local pause image as sandbox image) and kubelet registering as
``system:node:<name>``. :meth:`RealNode.stop` stops both and sweeps the slot.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nymph.errors import NymphError
from nymph.localcluster import host
from nymph.localcluster.certs import PKI
from nymph.localcluster.nodeconfig import NodeLayout, cni_conflist, containerd_toml, kubelet_yaml
from nymph.localcluster.procs import Proc, spawn, stop_all

REAL_NODE = "nymph-real"
NODE_BINARIES = ("kubelet", "containerd", "ctr", "containerd-shim-runc-v2")
CNI_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
PAUSE_PREFIX = "nymph.local/pause:"


class RealNodeError(NymphError):
    pass


@dataclass(frozen=True)
class NodeImage:
    """An image to import into the node: its reference and its OCI archive."""

    name: str
    archive: Path


def find_runc() -> str | None:
    return shutil.which("runc") or next(
        (p for p in ("/usr/sbin/runc", "/usr/bin/runc") if os.access(p, os.X_OK)), None
    )


def find_cni_dir() -> str | None:
    return next(
        (d for d in CNI_DIRS if all(os.access(f"{d}/{p}", os.X_OK) for p in ("bridge", "host-local"))), None
    )


def real_node_support(assets: Path) -> str | None:
    """Why this machine cannot run a real node (one line), or None when it can."""
    if os.geteuid() != 0:
        return "a real node needs root (kubelet, containerd, mounts, a bridge)"
    if not Path("/proc/self/mountinfo").exists() or not host.cgroup_mounts():
        return "no cgroup filesystem mounted"
    if find_runc() is None:
        return "runc is not installed (tests/envtest/deps.sh installs it)"
    if find_cni_dir() is None:
        return "the CNI plugins (bridge, host-local) are not installed (tests/envtest/deps.sh)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is missing"
    missing = [b for b in NODE_BINARIES if not os.access(assets / b, os.X_OK)]
    if missing:
        return f"{', '.join(missing)} not built in {assets} (make envtest)"
    return None


def default_images() -> list[NodeImage]:
    """The local images (pause, python) built or taken from the per-user cache."""
    from nymph.localcluster.images import ensure_images

    return [NodeImage(name=i.name, archive=i.oci_archive) for i in ensure_images()]


@dataclass
class RealNode:
    assets: Path
    logdir: Path
    name: str = REAL_NODE
    images: Sequence[NodeImage] | None = None
    progress: Callable[[str], None] | None = None
    layout: NodeLayout | None = None
    procs: list[Proc] = field(default_factory=list)
    image_names: list[str] = field(default_factory=list)
    reaper: subprocess.Popen[bytes] | None = None

    def _say(self, msg: str) -> None:
        if self.progress:
            self.progress(msg)

    @property
    def node_ip(self) -> str:
        assert self.layout is not None
        return self.layout.node_ip

    def prepare(self) -> NodeLayout:
        """Claim a slot (sweeping dead runs first) and bring its bridge up with the node IP."""
        if self.images is None:
            self._say("building or reusing the local images")
            self.images = default_images()
        self.layout = layout = host.claim_slot()
        self.reaper = host.start_reaper(layout)
        self._say(
            f"real node slot {layout.slot}: bridge {layout.bridge} {layout.node_ip}, state {layout.state_dir}"
        )
        for cmd in (
            ["ip", "link", "add", layout.bridge, "type", "bridge"],
            ["ip", "addr", "add", f"{layout.node_ip}/24", "dev", layout.bridge],
            ["ip", "link", "set", layout.bridge, "up"],
        ):
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                raise RealNodeError(f"{' '.join(cmd)} failed: {res.stderr.strip()}")
        try:
            host.make_cgroups(layout.cgroup_root)
        except OSError as exc:
            raise RealNodeError(f"cannot create the node's cgroups ({layout.cgroup_root}): {exc}") from None
        return layout

    def start(self, *, server: str, pki: PKI, deadline: float) -> None:
        """containerd, the images, then kubelet (registering itself with ``server``)."""
        layout, images = self.layout, self.images
        assert layout is not None and images is not None and pki.node is not None
        runc, cni = find_runc(), find_cni_dir()
        assert runc is not None and cni is not None
        sandbox = next((i.name for i in images if i.name.startswith(PAUSE_PREFIX)), None)
        if sandbox is None:
            raise RealNodeError(f"no {PAUSE_PREFIX}* image among the local images")
        layout.cni_conf_dir.mkdir(parents=True, exist_ok=True)
        (layout.cni_conf_dir / "10-nymph.conflist").write_text(cni_conflist(layout))
        layout.containerd_config.write_text(
            containerd_toml(layout, sandbox_image=sandbox, runc=runc, cni_bin_dir=cni)
        )
        env = {**os.environ, "PATH": f"{self.assets}:{os.environ.get('PATH', '/usr/sbin:/usr/bin')}"}
        self._say("starting containerd")
        self.procs.append(
            spawn(
                "containerd",
                [str(self.assets / "containerd"), f"--config={layout.containerd_config}"],
                logdir=self.logdir,
                env=env,
            )
        )
        self._wait_containerd(deadline)
        self._say(f"importing {len(images)} images")
        for image in images:
            self._ctr("images", "import", "--snapshotter=overlayfs", str(image.archive))
        listed = self._ctr("images", "list", "--quiet").split()
        self.image_names = [i.name for i in images if i.name in listed]
        lost = [i.name for i in images if i.name not in listed]
        if lost:
            raise RealNodeError(f"images not found in containerd after import: {', '.join(lost)}")

        layout.kubelet_config.write_text(
            kubelet_yaml(
                layout,
                ca_cert=pki.ca_cert,
                serving_cert=pki.node.kubelet_serving.cert,
                serving_key=pki.node.kubelet_serving.key,
            )
        )
        self._write_kubeconfig(server, pki)
        self._say(f"starting kubelet as node {self.name}")
        self.procs.append(
            spawn(
                "kubelet",
                [
                    str(self.assets / "kubelet"),
                    f"--config={layout.kubelet_config}",
                    f"--kubeconfig={layout.kubelet_kubeconfig}",
                    f"--root-dir={layout.kubelet_root}",
                    f"--hostname-override={self.name}",
                    f"--node-ip={layout.node_ip}",
                    "--v=1",
                ],
                logdir=self.logdir,
                env=env,
            )
        )

    def check_alive(self) -> None:
        for p in self.procs:
            code = p.popen.poll()
            if code is not None:
                raise RealNodeError(f"{p.name} exited with code {code}; last log lines:\n{p.tail()}")

    def stop(self) -> list[str]:
        """Stop kubelet and containerd and sweep the slot; returns what could not be removed."""
        procs, self.procs = self.procs, []
        stop_all(procs, grace=5.0)
        layout, self.layout = self.layout, None
        problems = host.release_slot(layout) if layout is not None else []
        reaper, self.reaper = self.reaper, None
        if reaper is not None:
            assert reaper.stdin is not None
            reaper.stdin.close()
            try:
                reaper.wait(timeout=30)
            except subprocess.TimeoutExpired:
                reaper.kill()
                reaper.wait()
        return problems

    # -- helpers ---------------------------------------------------------------------------

    def _ctr(self, *args: str) -> str:
        assert self.layout is not None
        res = subprocess.run(
            [str(self.assets / "ctr"), f"--address={self.layout.containerd_socket}", "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if res.returncode != 0:
            raise RealNodeError(f"ctr {' '.join(args[:2])} failed: {res.stderr.strip()[-500:]}")
        return res.stdout

    def _wait_containerd(self, deadline: float) -> None:
        assert self.layout is not None
        last = ""
        while time.monotonic() < deadline:
            self.check_alive()
            if self.layout.containerd_socket.exists():
                try:
                    self._ctr("version")
                    return
                except RealNodeError as exc:
                    last = str(exc)
            time.sleep(0.1)
        raise RealNodeError(f"containerd not ready in time ({last})")

    def _write_kubeconfig(self, server: str, pki: PKI) -> None:
        from nymph.localcluster.kubeconfig import cert_kubeconfig

        assert self.layout is not None and pki.node is not None
        cert_kubeconfig(
            self.layout.kubelet_kubeconfig,
            server=server,
            ca_cert=pki.ca_cert,
            cert=pki.node.node_client.cert,
            key=pki.node.node_client.key,
            user=f"system:node:{self.name}",
        )
