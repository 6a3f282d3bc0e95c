"""The Kube launch contract, as pure code: config, validation, Pod render, state mapping."""

from nymph.launch.config import LAUNCHER, Mode, Provider, check_launcher
from nymph.launch.dreamrc import DreamConfig, load_dreamrc, mode_from_cli, parse_dreamrc, provider_from_cli
from nymph.launch.names import (
    RESERVED_LABEL_KEYS,
    label_selector,
    new_instance_id,
    selector_labels,
    slugify,
    tags_to_labels,
)
from nymph.launch.render import PodManifest, heredoc_command, manifest_sha256, render_pod
from nymph.launch.spec import LaunchSpec, build_launch_spec
from nymph.launch.state import InstanceState, Reason, pod_reason, pod_state

__all__ = [
    "LAUNCHER",
    "RESERVED_LABEL_KEYS",
    "DreamConfig",
    "InstanceState",
    "LaunchSpec",
    "Mode",
    "PodManifest",
    "Provider",
    "Reason",
    "build_launch_spec",
    "check_launcher",
    "heredoc_command",
    "label_selector",
    "load_dreamrc",
    "manifest_sha256",
    "mode_from_cli",
    "new_instance_id",
    "parse_dreamrc",
    "pod_reason",
    "pod_state",
    "provider_from_cli",
    "render_pod",
    "selector_labels",
    "slugify",
    "tags_to_labels",
]
