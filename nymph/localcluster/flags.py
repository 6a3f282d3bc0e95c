"""Command lines of the control-plane processes (pure)."""

from __future__ import annotations

from pathlib import Path

from nymph.localcluster.certs import PKI

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
#: Controllers that would fight the local set-up: no node IPAM or lifecycle (kwok and the real
#: node heartbeat on their own; evictions would only surprise), no cloud, no volume binding.
DISABLED_CONTROLLERS = (
    "nodeipam",
    "nodelifecycle",
    "cloud-node-lifecycle",
    "service",
    "route",
    "persistentvolume-binder",
    "attachdetach",
    "persistentvolume-expander",
    "ttl",
)


def etcd(assets: Path, *, data_dir: Path, port: int, peer_port: int) -> list[str]:
    return [
        str(assets / "etcd"),
        f"--data-dir={data_dir}",
        f"--listen-client-urls=http://127.0.0.1:{port}",
        f"--advertise-client-urls=http://127.0.0.1:{port}",
        f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def apiserver(
    assets: Path, *, pki: PKI, etcd_port: int, host: str, port: int, cert_dir: Path, service_range: str
) -> list[str]:
    """RBAC (plus the Node authorizer and NodeRestriction, and the client certificate towards
    kubelets, when the PKI has a real node's credentials)."""
    node_args = ["--authorization-mode=RBAC"]
    if pki.node is not None:
        node_args = [
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--kubelet-client-certificate={pki.node.apiserver_kubelet_client.cert}",
            f"--kubelet-client-key={pki.node.apiserver_kubelet_client.key}",
            f"--kubelet-certificate-authority={pki.ca_cert}",
            "--kubelet-preferred-address-types=InternalIP",
        ]
    return [
        str(assets / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        f"--bind-address={host}",
        f"--advertise-address={host}",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        *node_args,
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        "--api-audiences=https://kubernetes.default.svc.cluster.local",
        f"--service-cluster-ip-range={service_range}",
        "--allow-privileged=true",
        "--enable-priority-and-fairness=false",
        "--v=1",
    ]


def controller_manager(assets: Path, *, pki: PKI, kubeconfig: Path, port: int) -> list[str]:
    return [
        str(assets / "kube-controller-manager"),
        f"--kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--service-account-private-key-file={pki.sa_key}",
        f"--root-ca-file={pki.ca_cert}",
        "--controllers=*," + ",".join(f"-{c}" for c in DISABLED_CONTROLLERS),
        "--use-service-account-credentials=false",
        "--v=1",
    ]


def scheduler(assets: Path, *, kubeconfig: Path, port: int) -> list[str]:
    return [
        str(assets / "kube-scheduler"),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--v=1",
    ]


def kwok(assets: Path, *, kubeconfig: Path, stages: Path, port: int) -> list[str]:
    return [
        str(assets / "kwok"),
        f"--kubeconfig={kubeconfig}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
        f"--config={stages}",
        f"--server-address=127.0.0.1:{port}",
        "--node-lease-duration-seconds=40",
    ]
