"""Names and labels: instance ids, provider slugs, label keys and values (pure)."""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Iterable

from nymph.errors import ConfigError, NymphError, ValidationError

INSTANCE_PREFIX = "lakeshore-"
_INSTANCE_RE = re.compile(r"^lakeshore-[0-9a-f]{8}$")

# Reserved label keys: always set by nymph, never taken from tags.
LABEL_MANAGED = "lakeshore"
LABEL_NAMESPACE = "lakeshore.namespace"
LABEL_PROVIDER = "lakeshore.provider"
RESERVED_LABEL_KEYS = frozenset({LABEL_MANAGED, LABEL_NAMESPACE, LABEL_PROVIDER})
#: The launch group a Pod belongs to (set by the queue on every member of a group).
LABEL_GROUP = "nymph.io/group"
#: The node a daemon renders a Pod for (:func:`node_label`): each daemon watches its own node's
#: Pods only, so a Pod's changes go to one daemon, not to one per node.
LABEL_NODE = "nymph.io/node"
#: Label keys only nymph sets: a launch tag on one of them is dropped.
NYMPH_LABEL_KEYS = RESERVED_LABEL_KEYS | {LABEL_GROUP, LABEL_NODE}

_LABEL_NAME_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SLUG_BAD = re.compile(r"[^a-z0-9._-]+")


def new_instance_id() -> str:
    """A fresh Pod name, ``lakeshore-<8 hex>``; assigned once per launch."""
    return f"{INSTANCE_PREFIX}{secrets.token_hex(4)}"


def is_instance_id(value: str) -> bool:
    return bool(_INSTANCE_RE.match(value))


def check_instance_id(value: str, *, field: str = "instance_id") -> str:
    if not isinstance(value, str) or not is_instance_id(value):
        raise ValidationError(
            field, f"{value!r} is not an instance id; expected 'lakeshore-' and 8 lowercase hex digits"
        )
    return value


def check_namespace(value: object, *, field: str = "namespace") -> str:
    """A Kubernetes namespace name: a DNS-1123 label of at most 63 characters."""
    if not isinstance(value, str) or not value:
        raise ValidationError(field, "must be a non-empty string, e.g. 'default'")
    if len(value) > 63 or not _DNS_LABEL_RE.match(value):
        raise ValidationError(
            field,
            f"{value!r} is not a valid namespace: use at most 63 lowercase letters, digits "
            "and '-', starting and ending with a letter or digit",
        )
    return value


def check_dns_subdomain(value: object, *, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValidationError(field, "must be a non-empty string")
    if len(value) > 253 or not _DNS_SUBDOMAIN_RE.match(value):
        raise ValidationError(
            field,
            f"{value!r} is not a valid Kubernetes name: use lowercase letters, digits, '-' and "
            "'.', at most 253 characters, starting and ending with a letter or digit",
        )
    return value


def slugify(name: str) -> str:
    """Turn a provider name into a valid label value (lowercase, ``[a-z0-9._-]``, <= 63).

    ``My Cluster!`` -> ``my-cluster``. A name with no usable character slugs to ``provider``.
    """
    slug = _SLUG_BAD.sub("-", name.lower())
    slug = slug[:63]
    slug = re.sub(r"^[^a-z0-9]+|[^a-z0-9]+$", "", slug)
    return slug or "provider"


def is_label_key(key: str) -> bool:
    """Kubernetes label key rules: ``[prefix/]name``; prefix a DNS subdomain <= 253 chars."""
    if not isinstance(key, str) or not key:
        return False
    prefix, sep, name = key.rpartition("/")
    if sep and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_NAME_RE.match(name))


def is_label_value(value: str) -> bool:
    return isinstance(value, str) and (
        value == "" or (len(value) <= 63 and bool(_LABEL_NAME_RE.match(value)))
    )


def tag_value_to_str(value: object) -> str | None:
    """Stringify a tag value: strings as-is, bools as ``true``/``false``, numbers via str()."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    return None


def parse_labels(
    items: Iterable[str], *, flag: str = "--tag", error: type[NymphError] = ConfigError
) -> dict[str, str]:
    """``KEY=VALUE`` items (``--tag``, ``--label``) as ``{KEY: VALUE}``, each value kept as text
    (a repeated key: the last wins); a malformed item is a one-line ``error`` naming ``flag``.
    :func:`tags_to_labels` checks the labels launch tags become."""
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise error(f"{flag} {item!r}: expected KEY=VALUE")
        labels[key] = value
    return labels


def tags_to_labels(tags: object, *, field: str = "tags") -> tuple[dict[str, str], list[str]]:
    """Validate launch tags as extra labels.

    Returns ``(labels, dropped)``: tags whose key is one of the three reserved keys (or the
    group label, :data:`LABEL_GROUP`) are dropped (and listed in ``dropped``); an invalid key or value is rejected with a
    :class:`ValidationError` naming the tag, so nothing invalid reaches the API server.
    """
    if tags is None:
        return {}, []
    if not isinstance(tags, dict):
        raise ValidationError(field, "must be a mapping of label key to value, e.g. {team: ml}")
    labels: dict[str, str] = {}
    dropped: list[str] = []
    for raw_key, raw_value in tags.items():
        key = str(raw_key) if isinstance(raw_key, (int, float)) else raw_key
        if not isinstance(key, str) or not is_label_key(key):
            raise ValidationError(
                f"{field}.{raw_key}",
                "is not a valid label key: use [prefix/]name, where name is at most 63 "
                "characters of letters, digits, '-', '_' and '.', starting and ending with a "
                "letter or digit",
            )
        if key in NYMPH_LABEL_KEYS:
            dropped.append(key)
            continue
        value = tag_value_to_str(raw_value)
        if value is None or not is_label_value(value):
            raise ValidationError(
                f"{field}.{key}",
                f"value {raw_value!r} is not a valid label value: use at most 63 characters of "
                "letters, digits, '-', '_' and '.', starting and ending with a letter or digit "
                "(or an empty string)",
            )
        labels[key] = value
    return labels, dropped


def selector_labels(*, owner_namespace: str, provider: str) -> dict[str, str]:
    """The three reserved labels: what every nymph Pod carries and what listing selects on."""
    return {
        LABEL_MANAGED: "true",
        LABEL_NAMESPACE: owner_namespace,
        LABEL_PROVIDER: slugify(provider),
    }


def node_label(node: str) -> str:
    """The :data:`LABEL_NODE` value of ``node`` (a DNS subdomain): the name itself when it is a
    label value (at most 63 characters), else ``sha256-`` and 48 hex digits of its digest."""
    if len(node) <= 63 and _LABEL_NAME_RE.match(node):
        return node
    return "sha256-" + hashlib.sha256(node.encode()).hexdigest()[:48]


def node_selector(node: str | None) -> str:
    """The label selector of the nymph Pods a daemon on ``node`` follows (all, without a node)."""
    managed = f"{LABEL_MANAGED}=true"
    return managed if node is None else f"{managed},{LABEL_NODE}={node_label(node)}"


def label_selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
