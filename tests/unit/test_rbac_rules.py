from pathlib import Path

import yaml

from nymph.daemon.rbac import DAEMON_ROLE_RULES

REPO = Path(__file__).resolve().parents[2]


def test_packaged_rules_equal_the_manifest_role() -> None:
    role = yaml.safe_load((REPO / "manifests" / "base" / "daemon-role.yaml").read_text())
    assert role["kind"] == "Role"
    assert role["rules"] == DAEMON_ROLE_RULES
