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
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nymph.errors import NymphError
from nymph.localcluster import host, nodeimages
from nymph.localcluster.certs import PKI
from nymph.localcluster.nodeconfig import NodeLayout, cni_conflist, containerd_toml, kubelet_yaml
from nymph.localcluster.procs import Proc, ProcessesSurvived, spawn, stop_all
from nymph.localcluster.slotreaper import start_reaper

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
    kubelet_settings: Mapping[str, object] = field(default_factory=dict)
    layout: NodeLayout | None = None
    procs: list[Proc] = field(default_factory=list)
    image_names: list[str] = field(default_factory=list)
    reaper: subprocess.Popen[bytes] | None = None
    _loader: threading.Thread | None = None
    _load_error: RealNodeError | None = None

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
        self.reaper = start_reaper(layout)
        self._say(
            f"real node slot {layout.slot}: bridge {layout.bridge} {layout.node_ip}, state {layout.state_dir}"
        )
        host.delete_bridge(layout.bridge)  # a free slot's bridge can only be a leftover
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
        self._seed_root()
        self._start_containerd()
        # The images load while the control plane starts; start() waits for them.
        self._loader = threading.Thread(target=self._load_images, name="node-images", daemon=True)
        self._loader.start()
        return layout

    def _seed_root(self) -> None:
        """Start containerd's root as a hard-linked copy of the seed root holding the images
        (built here the first time; see :mod:`nymph.localcluster.nodeimages`)."""
        layout, images = self.layout, self.images
        assert layout is not None and images is not None
        seeds = nodeimages.seeds_dir()
        seeds.mkdir(parents=True, exist_ok=True)
        if os.environ.get("NYMPH_NODE_SEED") == "0" or not nodeimages.same_filesystem(
            seeds, layout.state_dir
        ):
            return
        wanted = [nodeimages.SeedImage(name=i.name, archive=i.archive) for i in images]
        key = nodeimages.seed_key(wanted, containerd=self.assets / "containerd")

        def build(tmp: Path) -> None:
            self._say("importing the images into a seed root, once per machine")
            seed_layout = NodeLayout(slot=layout.slot, state_dir=tmp)
            proc = self._start_containerd(seed_layout, name="containerd-seed")
            try:
                self._wait_containerd(time.monotonic() + 120, socket=seed_layout.containerd_socket)
                for image in wanted:
                    self._ctr(
                        "images",
                        "import",
                        "--snapshotter=overlayfs",
                        str(image.archive),
                        socket=seed_layout.containerd_socket,
                    )
            finally:
                self.procs.remove(proc)
                stop_all([proc], grace=10.0)

        try:
            with nodeimages.seed_root(key, build) as seed:
                nodeimages.link_copy(seed, layout.state_dir / "containerd-root")
        except OSError as exc:
            self._say(f"no seed root ({exc}): importing the images into this node")
            host.remove_tree(layout.state_dir / "containerd-root")

    def _start_containerd(self, layout: NodeLayout | None = None, *, name: str = "containerd") -> Proc:
        layout = layout or self.layout
        images = self.images
        assert layout is not None and images is not None
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
        self._say(f"starting {name}")
        proc = spawn(
            name,
            [str(self.assets / "containerd"), f"--config={layout.containerd_config}"],
            logdir=self.logdir,
            env=self._env(),
        )
        self.procs.append(proc)
        return proc

    def _env(self) -> dict[str, str]:
        return {**os.environ, "PATH": f"{self.assets}:{os.environ.get('PATH', '/usr/sbin:/usr/bin')}"}

    def _load_images(self) -> None:
        images = self.images
        assert images is not None
        try:
            self._wait_containerd(time.monotonic() + 60)
            listed = self._ctr("images", "list", "--quiet").split()
            missing = [i for i in images if i.name not in listed]
            if missing:
                self._say(f"importing {len(missing)} images")
            for image in missing:
                self._ctr("images", "import", "--snapshotter=overlayfs", str(image.archive))
            listed = self._ctr("images", "list", "--quiet").split()
        except RealNodeError as exc:
            self._load_error = exc
            return
        self.image_names = [i.name for i in images if i.name in listed]
        lost = [i.name for i in images if i.name not in listed]
        if lost:
            self._load_error = RealNodeError(
                f"images not found in containerd after import: {', '.join(lost)}"
            )

    def start(self, *, server: str, pki: PKI, deadline: float) -> None:
        """Wait for containerd and the images, then start kubelet (registering with ``server``)."""
        layout = self.layout
        assert layout is not None and pki.node is not None and self._loader is not None
        while self._loader.is_alive() and time.monotonic() < deadline:
            self.check_alive()
            self._loader.join(0.2)
        if self._loader.is_alive():
            raise RealNodeError("the images did not load in time")
        if self._load_error is not None:
            raise self._load_error
        layout.kubelet_config.write_text(
            kubelet_yaml(
                layout,
                ca_cert=pki.ca_cert,
                serving_cert=pki.node.kubelet_serving.cert,
                serving_key=pki.node.kubelet_serving.key,
                extra=self.kubelet_settings,
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
                env=self._env(),
            )
        )

    def check_alive(self) -> None:
        for p in self.procs:
            code = p.popen.poll()
            if code is not None:
                raise RealNodeError(f"{p.name} exited with code {code}; last log lines:\n{p.tail()}")

    def stop_processes(self) -> None:
        """Stop kubelet, then containerd (the shims and containers stay until :meth:`stop`)."""
        procs, self.procs = self.procs, []
        stop_all(procs, grace=5.0)

    def stop(self) -> list[str]:
        """Stop kubelet and containerd and sweep the slot; returns what could not be removed
        (a process that outlived its SIGKILL among them: the sweep still runs)."""
        problems: list[str] = []
        try:
            self.stop_processes()
        except ProcessesSurvived as exc:
            problems.append(str(exc))
        layout, self.layout = self.layout, None
        if layout is not None:
            problems += host.release_slot(layout)
        watcher, self.reaper = self.reaper, None
        if watcher is not None:
            assert watcher.stdin is not None
            watcher.stdin.close()
            try:
                watcher.wait(timeout=30)
            except subprocess.TimeoutExpired:
                watcher.kill()
                watcher.wait()
        return problems

    # -- helpers ---------------------------------------------------------------------------

    def _ctr(self, *args: str, socket: Path | None = None) -> str:
        assert self.layout is not None
        address = socket or self.layout.containerd_socket
        res = subprocess.run(
            [str(self.assets / "ctr"), f"--address={address}", "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if res.returncode != 0:
            raise RealNodeError(f"ctr {' '.join(args[:2])} failed: {res.stderr.strip()[-500:]}")
        return res.stdout

    def _wait_containerd(self, deadline: float, *, socket: Path | None = None) -> None:
        assert self.layout is not None
        socket = socket or self.layout.containerd_socket
        last = ""
        while time.monotonic() < deadline:
            self.check_alive()
            if socket.exists():
                try:
                    self._ctr("version", socket=socket)
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
