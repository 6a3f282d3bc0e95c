"""The real node's configuration (pure parts): layout, containerd / kubelet / CNI files, PKI."""

from __future__ import annotations

import ipaddress
import json
import tomllib
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from nymph.localcluster.certs import make_pki
from nymph.localcluster.cluster import ClusterStartError, choose_node_kind
from nymph.localcluster.nodeconfig import NodeLayout, cni_conflist, containerd_toml, kubelet_yaml


def test_slots_do_not_share_a_bridge_subnet_cgroup_or_path() -> None:
    a, b = NodeLayout(slot=0, state_dir=Path("/s/0")), NodeLayout(slot=7, state_dir=Path("/s/7"))
    for attr in ("bridge", "network", "subnet", "node_ip", "cgroup_root", "containerd_socket"):
        assert getattr(a, attr) != getattr(b, attr), attr
    # The Service range's first address (the kubernetes Service) is the node IP.
    assert next(ipaddress.ip_network(b.service_range).hosts()) == ipaddress.ip_address(b.node_ip)
    assert ipaddress.ip_address(b.node_ip) in ipaddress.ip_network(b.subnet)


def test_containerd_config_keeps_everything_under_the_state_dir() -> None:
    layout = NodeLayout(slot=3, state_dir=Path("/var/lib/nymph-node/3"))
    text = containerd_toml(
        layout, sandbox_image="nymph.local/pause:3.10", runc="/usr/sbin/runc", cni_bin_dir="/usr/lib/cni"
    )
    cfg = tomllib.loads(text)
    assert cfg["version"] == 3
    assert cfg["root"].startswith("/var/lib/nymph-node/3/") and cfg["state"].startswith(
        "/var/lib/nymph-node/3/"
    )
    rt = cfg["plugins"]["io.containerd.cri.v1.runtime"]
    assert rt["restrict_oom_score_adj"] is True
    assert rt["netns_mounts_under_state_dir"] is True
    runc = rt["containerd"]["runtimes"]["runc"]["options"]
    assert runc["SystemdCgroup"] is False and runc["Root"].startswith("/var/lib/nymph-node/3/")
    assert (
        cfg["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == "nymph.local/pause:3.10"
    )
    assert "io.containerd.nri.v1.nri" in cfg["disabled_plugins"]


def test_kubelet_and_cni_config() -> None:
    layout = NodeLayout(slot=2, state_dir=Path("/s/2"))
    kc = yaml.safe_load(
        kubelet_yaml(layout, ca_cert=Path("/ca"), serving_cert=Path("/c"), serving_key=Path("/k"))
    )
    assert kc["address"] == layout.node_ip and kc["cgroupRoot"] == "/nymph-node-2"
    assert kc["failCgroupV1"] is False and kc["cgroupDriver"] == "cgroupfs"
    assert kc["authentication"]["anonymous"]["enabled"] is False
    cni = json.loads(cni_conflist(layout))
    bridge = cni["plugins"][0]
    assert bridge["bridge"] == layout.bridge and bridge["ipMasq"] is False
    assert bridge["ipam"]["dataDir"].startswith("/s/2/")


def test_node_pki_identity_and_sans(tmp_path: Path) -> None:
    pki = make_pki(tmp_path, extra_ips=("10.213.4.1",), node="nymph-real")
    assert pki.node is not None
    node = x509.load_pem_x509_certificate(pki.node.node_client.cert.read_bytes())
    assert node.subject.rfc4514_string() == "O=system:nodes,CN=system:node:nymph-real"
    for cert in (pki.serving_cert, pki.node.kubelet_serving.cert):
        sans = x509.load_pem_x509_certificate(cert.read_bytes()).extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        )
        assert ipaddress.ip_address("10.213.4.1") in sans.value.get_values_for_type(x509.IPAddress)
    assert make_pki(tmp_path / "plain").node is None


def test_choose_node_kind(tmp_path: Path) -> None:
    assert choose_node_kind("kwok", tmp_path)[0] == "kwok"
    kind, note = choose_node_kind("auto", tmp_path)  # no kubelet in an empty assets dir
    assert kind == "kwok" and "simulated" in note
    with pytest.raises(ClusterStartError, match="real node was requested"):
        choose_node_kind("real", tmp_path)
    with pytest.raises(ClusterStartError):
        choose_node_kind("virtual", tmp_path)
