from pathlib import Path

import yaml

from nymph.daemon.rbac import DAEMON_NODE_RULES, DAEMON_ROLE_RULES

REPO = Path(__file__).resolve().parents[2]


def test_packaged_rules_equal_the_manifest_role() -> None:
    role = yaml.safe_load((REPO / "manifests" / "base" / "daemon-role.yaml").read_text())
    assert role["kind"] == "Role"
    assert role["rules"] == DAEMON_ROLE_RULES


def test_dockyard_role_is_exactly_the_dockyard_rules() -> None:
    """The daemon's Role is extended only by the kinds a dockyard launch applies."""
    from nymph.dockyard.render.task import DOCKYARD_ROLE_RULES

    role = yaml.safe_load((REPO / "manifests" / "base" / "daemon-dockyard-role.yaml").read_text())
    assert role["kind"] == "Role" and role["metadata"]["name"] == "nymph-daemon-dockyard"
    assert role["rules"] == DOCKYARD_ROLE_RULES
    binding = yaml.safe_load((REPO / "manifests" / "base" / "daemon-dockyard-rolebinding.yaml").read_text())
    assert binding["roleRef"]["name"] == "nymph-daemon-dockyard"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "nymph-daemon", "namespace": "nymph-system"}
    ]
    granted = {(g, r) for rule in DOCKYARD_ROLE_RULES for g in rule["apiGroups"] for r in rule["resources"]}
    assert ("", "pods") not in granted and ("", "secrets") not in granted
    writes = [rule for rule in DOCKYARD_ROLE_RULES if rule["verbs"] != ["list"]]
    assert all(set(rule["verbs"]) <= {"get", "create", "patch", "delete"} for rule in writes)
    # the one read beyond a name: which RayJobs of launches have ended
    assert [rule for rule in DOCKYARD_ROLE_RULES if rule not in writes] == [
        {"apiGroups": ["ray.io"], "resources": ["rayjobs"], "verbs": ["list"]}
    ]


def test_node_reader_is_a_read_only_cluster_role_of_its_own() -> None:
    """The daemon's one cluster-scoped grant: get/list/watch on nodes, nothing else."""
    docs = list(yaml.safe_load_all((REPO / "manifests" / "base" / "daemon-node-reader.yaml").read_text()))
    role, binding = docs
    assert role["kind"] == "ClusterRole" and role["metadata"]["name"] == "nymph-daemon-nodes"
    assert role["rules"] == DAEMON_NODE_RULES
    assert all(set(rule["verbs"]) <= {"get", "list", "watch"} for rule in role["rules"])
    assert {r for rule in role["rules"] for r in rule["resources"]} == {"nodes"}
    assert binding["kind"] == "ClusterRoleBinding"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "nymph-daemon-nodes",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "nymph-daemon", "namespace": "nymph-system"}
    ]
    # Nodes stay out of the namespaced Role.
    assert all("nodes" not in rule["resources"] for rule in DAEMON_ROLE_RULES)


def test_daemonset_tolerates_every_taint() -> None:
    ds = yaml.safe_load((REPO / "manifests" / "base" / "daemonset.yaml").read_text())
    assert ds["spec"]["template"]["spec"]["tolerations"] == [{"operator": "Exists"}]
