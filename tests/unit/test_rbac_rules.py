from pathlib import Path

import yaml

from nymph.daemon.rbac import DAEMON_ROLE_RULES

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
    assert all(set(rule["verbs"]) <= {"get", "create", "patch", "delete"} for rule in DOCKYARD_ROLE_RULES)
