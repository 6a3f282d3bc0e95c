"""Fleet roles of the GPU worker groups and the ``dockyard_fleet_<role>`` Ray resource tag.

Trainer and inference are two worker groups of one RayCluster. A group's role comes from
(in agreement, or it is an error) ``DOCKYARD_FLEET_ROLE`` in its containers, a
``dockyard_fleet_<role>`` key in ``rayStartParams.resources``, or failing both its
``groupName`` (``trainer``, ``inference``, or ``trainer-...`` / ``inference-...``). A group
that says none of these is a plain Ray worker group when it is the only worker group or is
named ``workers`` (as dockyard-k8s renders any cluster): it gets no tag and no role env, and
the cluster then needs no trainer + inference pair. Anywhere else it is an error.

``rayStartParams`` values are strings (the CRD says so); ``resources`` is a JSON object that
KubeRay pastes into the ``ray start`` shell command. It is written single-quoted,
``'{"dockyard_fleet_trainer": 1}'`` — the form the KubeRay operator itself writes, which the
shell passes as one argument and the operator's own parser reads back. Authored values in
any of the usual forms (bare JSON, ``'...'``, or ``"..."`` with escaped quotes) are read and
rewritten in that form with the tag added.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.render import k8s

ROLE_ENV = "DOCKYARD_FLEET_ROLE"
ROLES = ("trainer", "inference")
TAG_PREFIX = "dockyard_fleet_"
#: the name of a plain Ray worker group (no fleet role) beside others
PLAIN_GROUP = "workers"
_TAG = re.compile(r"^dockyard_fleet_([A-Za-z0-9_-]+)$")


def tag(role: str) -> str:
    return f"{TAG_PREFIX}{role}"


def parse_resources(value: Any, *, where: str) -> dict[str, int | float]:
    """Read a ``rayStartParams.resources`` value into a mapping of custom resources."""
    if not isinstance(value, str):
        raise DockyardConfigError("must be a string holding a JSON object ('{\"name\": 1}')", path=where)
    text = value.strip()
    if len(text) >= 2 and text[0] == text[-1] == "'":
        text = text[1:-1]
    elif len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        raise DockyardConfigError(f"{value!r} is not a JSON object of resource amounts", path=where) from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) for k, v in data.items()
    ):
        raise DockyardConfigError(f"{value!r} is not a JSON object of resource amounts", path=where)
    return data


def format_resources(resources: Mapping[str, int | float], *, where: str) -> str:
    for name in resources:
        if "'" in name:
            raise DockyardConfigError(f"resource name {name!r} must not contain a quote", path=where)
    return "'" + json.dumps(dict(resources)) + "'"


def _containers(group: Mapping[str, Any]) -> list[Any]:
    template = group.get("template")
    spec = template.get("spec") if isinstance(template, Mapping) else None
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    return containers if isinstance(containers, list) else []


@dataclass(frozen=True)
class GroupRole:
    """The fleet role of one authored worker group, and what it was inferred from.

    ``role`` is None for a plain Ray worker group (the only worker group, or one named
    ``workers``, that says nothing of a fleet): it is rendered as authored, with no fleet tag.
    """

    group: str
    role: str | None
    source: str


def _explicit_role(group: Mapping[str, Any], *, where: str) -> tuple[str, str] | None:
    found: dict[str, str] = {}
    for container in _containers(group):
        if isinstance(container, Mapping):
            value = k8s.env_value(container, ROLE_ENV)
            if value:
                found.setdefault(value, f"{ROLE_ENV}={value}")
    params = group.get("rayStartParams")
    if isinstance(params, Mapping) and "resources" in params:
        for key in parse_resources(params["resources"], where=f"{where}.rayStartParams.resources"):
            match = _TAG.match(key)
            if match:
                found.setdefault(match.group(1), f"resource tag {key}")
    if len(found) > 1:
        raise DockyardConfigError(f"conflicting fleet roles: {', '.join(sorted(found.values()))}", path=where)
    return next(iter(found.items()), None)


def role_of(group: Mapping[str, Any], *, where: str, plain: str | None = None) -> GroupRole:
    """The fleet role of one worker group (see the module docstring). With ``plain`` (why the
    group may be one) a group that says nothing of its role is a plain Ray worker group."""
    name = str(group.get("groupName", ""))
    explicit = _explicit_role(group, where=where)
    if explicit is not None:
        role, source = explicit
    else:
        role = next((r for r in ROLES if name == r or name.startswith(f"{r}-")), "")
        source = "its groupName"
        if not role:
            if plain is not None:
                return GroupRole(group=name, role=None, source=plain)
            raise DockyardConfigError(
                f"cannot tell the fleet role of worker group {name!r}: name it trainer or "
                f"inference (or trainer-*, inference-*), set {ROLE_ENV}, or tag "
                f"rayStartParams.resources with {TAG_PREFIX}<role> (a plain Ray worker group "
                f"without a fleet is the only worker group, or is named {PLAIN_GROUP})",
                path=where,
            )
    if role not in ROLES:
        raise DockyardConfigError(
            f"fleet role {role!r} is not allowed in the GPU cluster (allowed: {', '.join(ROLES)})",
            path=where,
        )
    return GroupRole(group=name, role=role, source=source)


def group_roles(groups: Sequence[Mapping[str, Any]], *, path: str) -> list[GroupRole]:
    """The role of every authored worker group (``path``: the key path of the list).

    The only worker group, and a group named ``workers``, may be plain Ray worker groups
    (nothing says their role); then the cluster is rendered as authored and needs no trainer
    and inference pair. Otherwise every group has a role and both fleets are present."""
    single = len(groups) == 1
    out: list[GroupRole] = []
    for i, group in enumerate(groups):
        plain = (
            "the only worker group"
            if single
            else (f"named {PLAIN_GROUP}" if group.get("groupName") == PLAIN_GROUP else None)
        )
        out.append(role_of(group, where=f"{path}[{i}]", plain=plain))
    if single or any(r.role is None for r in out):
        return out
    missing = [role for role in ROLES if all(r.role != role for r in out)]
    if missing:
        raise DockyardConfigError(
            f"no {' and no '.join(missing)} worker group (trainer and inference are two "
            "worker groups of the one cluster)",
            path=path,
        )
    return out


def tag_group(group: dict[str, Any], role: str, *, where: str) -> None:
    """Add the role's resource tag and ``DOCKYARD_FLEET_ROLE`` to a worker group in place."""
    params = group.setdefault("rayStartParams", {})
    current = (
        parse_resources(params["resources"], where=f"{where}.rayStartParams.resources")
        if ("resources" in params)
        else {}
    )
    current.setdefault(tag(role), 1)
    params["resources"] = format_resources(current, where=f"{where}.rayStartParams.resources")
    for container in _containers(group):
        if isinstance(container, dict):
            k8s.env_set(container, ROLE_ENV, role)
