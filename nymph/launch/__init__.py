"""The Kube launch contract, as pure code: config, validation, Pod render, state mapping.

The names below are imported from their modules when first named (``from nymph.launch import
render_pod`` works), so a module that needs one part (the CLI reading a ``.dreamrc``) does not
load the others (the Pod render, the launch spec)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nymph.launch.config import LAUNCHER, Mode, Provider, check_launcher
    from nymph.launch.dreamrc import (
        DreamConfig,
        load_dreamrc,
        mode_from_cli,
        parse_dreamrc,
        provider_from_cli,
    )
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

_FROM = {
    **dict.fromkeys(("LAUNCHER", "Mode", "Provider", "check_launcher"), "config"),
    **dict.fromkeys(
        ("DreamConfig", "load_dreamrc", "mode_from_cli", "parse_dreamrc", "provider_from_cli"), "dreamrc"
    ),
    **dict.fromkeys(
        (
            "RESERVED_LABEL_KEYS",
            "label_selector",
            "new_instance_id",
            "selector_labels",
            "slugify",
            "tags_to_labels",
        ),
        "names",
    ),
    **dict.fromkeys(("PodManifest", "heredoc_command", "manifest_sha256", "render_pod"), "render"),
    **dict.fromkeys(("LaunchSpec", "build_launch_spec"), "spec"),
    **dict.fromkeys(("InstanceState", "Reason", "pod_reason", "pod_state"), "state"),
}

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


def __getattr__(name: str) -> Any:
    module = _FROM.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
