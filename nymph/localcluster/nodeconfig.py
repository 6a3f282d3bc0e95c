"""The real node's configuration files, rendered from a :class:`NodeLayout` (pure).

One layout per node slot: the slot number picks the bridge, its /24, the cgroup root and the
CNI network name, so several real nodes (one per local cluster) can run side by side on a
machine; every path lives under the slot's state directory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

#: The first two octets of every slot's /24: slot N owns 10.213.N.0/24.
SUBNET_PREFIX = "10.213"
MAX_SLOTS = 64
#: Pods get addresses from the upper half of the /24; Services (ClusterIPs) from the lower one,
#: whose first address, the ``kubernetes`` Service, is the bridge IP the API server listens on.
POD_RANGE = (128, 254)
#: Host sysctls kubelet rewrites at start (saved before and restored after).
KUBELET_SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)


@dataclass(frozen=True)
class NodeLayout:
    slot: int
    state_dir: Path

    @property
    def bridge(self) -> str:
        return f"nymphbr{self.slot}"

    @property
    def network(self) -> str:
        return f"nymph-{self.slot}"

    @property
    def subnet(self) -> str:
        return f"{SUBNET_PREFIX}.{self.slot}.0/24"

    @property
    def service_range(self) -> str:
        return f"{SUBNET_PREFIX}.{self.slot}.0/25"

    @property
    def node_ip(self) -> str:
        return f"{SUBNET_PREFIX}.{self.slot}.1"

    @property
    def cgroup_root(self) -> str:
        return f"/nymph-node-{self.slot}"

    @property
    def containerd_socket(self) -> Path:
        return self.state_dir / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.state_dir / "containerd.toml"

    @property
    def kubelet_root(self) -> Path:
        return self.state_dir / "kubelet"

    @property
    def pod_logs(self) -> Path:
        return self.state_dir / "pod-logs"

    @property
    def cni_conf_dir(self) -> Path:
        return self.state_dir / "cni"

    @property
    def kubelet_config(self) -> Path:
        return self.state_dir / "kubelet.yaml"

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.state_dir / "kubelet.kubeconfig"


def containerd_toml(layout: NodeLayout, *, sandbox_image: str, runc: str, cni_bin_dir: str) -> str:
    """containerd 2.x config (version 3): everything under the state dir, the local pause image
    as sandbox image, cgroupfs, and ``restrict_oom_score_adj`` (root may lack
    CAP_SYS_RESOURCE, with which runc could not raise a sandbox's oom_score_adj)."""
    d = layout.state_dir
    cri_rt = "plugins.'io.containerd.cri.v1.runtime'"
    q = json.dumps  # TOML basic strings take JSON escapes
    return "\n".join(
        [
            "version = 3",
            f"root = {q(str(d / 'containerd-root'))}",
            f"state = {q(str(d / 'containerd-state'))}",
            "disabled_plugins = ['io.containerd.nri.v1.nri', 'io.containerd.tracing.processor.v1.otlp']",
            "",
            "[grpc]",
            f"  address = {q(str(layout.containerd_socket))}",
            "[ttrpc]",
            f"  address = {q(str(layout.containerd_socket) + '.ttrpc')}",
            "[debug]",
            "  address = ''",
            "[metrics]",
            "  address = ''",
            "",
            "[plugins.'io.containerd.internal.v1.opt']",
            f"  path = {q(str(d / 'opt'))}",
            "",
            "[plugins.'io.containerd.cri.v1.images']",
            "  snapshotter = 'overlayfs'",
            "  [plugins.'io.containerd.cri.v1.images'.pinned_images]",
            f"    sandbox = {q(sandbox_image)}",
            "",
            f"[{cri_rt}]",
            "  restrict_oom_score_adj = true",
            "  netns_mounts_under_state_dir = true",
            "  enable_selinux = false",
            f"  [{cri_rt}.containerd]",
            "    default_runtime_name = 'runc'",
            f"    [{cri_rt}.containerd.runtimes.runc]",
            "      runtime_type = 'io.containerd.runc.v2'",
            f"      [{cri_rt}.containerd.runtimes.runc.options]",
            f"        BinaryName = {q(runc)}",
            f"        Root = {q(str(d / 'runc'))}",
            "        SystemdCgroup = false",
            f"  [{cri_rt}.cni]",
            f"    bin_dirs = [{q(cni_bin_dir)}]",
            f"    conf_dir = {q(str(layout.cni_conf_dir))}",
            "    max_conf_num = 1",
            "",
            "[plugins.'io.containerd.grpc.v1.cri']",
            "  stream_server_address = '127.0.0.1'",
            "  stream_server_port = '0'",
            "",
        ]
    )


def cni_conflist(layout: NodeLayout) -> str:
    """A bridge network on the slot's bridge, host-local addresses kept under the state dir,
    no masquerading (Pods talk to the host, not the outside world)."""
    lo, hi = POD_RANGE
    base = f"{SUBNET_PREFIX}.{layout.slot}"
    conf = {
        "cniVersion": "1.0.0",
        "name": layout.network,
        "plugins": [
            {
                "type": "bridge",
                "bridge": layout.bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [
                        [
                            {
                                "subnet": layout.subnet,
                                "rangeStart": f"{base}.{lo}",
                                "rangeEnd": f"{base}.{hi}",
                                "gateway": layout.node_ip,
                            }
                        ]
                    ],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(layout.state_dir / "cni-ipam"),
                },
            }
        ],
    }
    return json.dumps(conf, indent=2) + "\n"


def kubelet_yaml(
    layout: NodeLayout,
    *,
    ca_cert: Path,
    serving_cert: Path,
    serving_key: Path,
    extra: Mapping[str, object] | None = None,
) -> str:
    """KubeletConfiguration: listens on the node IP only, trusts client certificates of the
    local CA (the API server's), cgroupfs under the slot's own cgroup root, cgroup v1 allowed,
    no eviction or image GC surprises on a busy developer disk."""
    cfg = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": layout.node_ip,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": layout.node_ip,
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(ca_cert)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "tlsCertFile": str(serving_cert),
        "tlsPrivateKeyFile": str(serving_key),
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": layout.cgroup_root,
        "failCgroupV1": False,
        "failSwapOn": False,
        "podLogsDir": str(layout.pod_logs),
        "registerNode": True,
        "serializeImagePulls": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "maxPods": 110,
        "resolvConf": "/etc/resolv.conf",
        "fileCheckFrequency": "5s",
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "10s",
        "shutdownGracePeriod": "0s",
        "logging": {"verbosity": 1},
    }
    cfg.update(extra or {})
    return yaml.safe_dump(cfg, sort_keys=False)
