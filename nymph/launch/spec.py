"""LaunchSpec: a provider, a mode and a launch body merged and validated (pure).

Precedence, low to high:

1. the **provider** usually gives the connection (``kubeconfig``, ``context``, ``namespace``,
   default ``default``), the **mode** usually the Pod shape (``image``, ``resources``, ``env``,
   ``node_selector``, ``tolerations``, ``service_account``, ``image_pull_secrets``); either may
   carry the other's keys, and they merge provider first, then mode (the mode wins per key);
2. a launch can never change the connection;
3. the **launch body** gives ``script`` (required) and ``tags``; its ``fields`` replace mode fields
   of the same name for this launch only, and its ``env`` is merged over the mode's env name by
   name; its top-level ``priority`` wins over a ``priority`` in ``fields`` and on the mode.

``priority`` (an integer, -1000..1000, default 0) and ``max_runtime`` (a duration: seconds, or
``90s`` / ``30m`` / ``2h`` / ``1d``; the Pod's ``activeDeadlineSeconds``) are checked by
:mod:`nymph.launch.runlimits` and :mod:`nymph.launch.durations`; so is ``image_pull_timeout``
(a duration: how long the image may fail to pull, :mod:`nymph.launch.pullwait`).

Every error names the field (``mode.image``, ``tags.team``) and says what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nymph.errors import ValidationError
from nymph.launch import names
from nymph.launch.config import MODE_FIELDS, Mode, Provider, merged_kwargs
from nymph.launch.durations import parse_duration
from nymph.launch.runlimits import check_priority
from nymph.launch.specids import (
    check_depth,
    check_group_id,
    check_group_index,
    check_launch_uid,
    check_retry,
)

#: Env vars nymph sets itself; a mode or launch may not set any name of this prefix.
RESERVED_ENV_PREFIX = "NYMPH_"
RESERVED_ENV = frozenset({"NYMPH_INSTANCE_ID", "NYMPH_WORKDIR", "NYMPH_GROUP_ID", "NYMPH_GROUP_INDEX"})
#: A script travels as one argv string of ``/bin/sh -c``; Linux caps a single argument at
#: 128 KiB (MAX_ARG_STRLEN), so scripts are capped below that with room for the wrapper.
MAX_SCRIPT_BYTES = 120 * 1024
_BODY_KEYS = frozenset({"script", "tags", "env", "fields", "mode", "priority"})
_RESOURCE_KEYS = frozenset({"requests", "limits", "claims"})


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to render one Pod. Plain data; JSON round-trips via to_json/from_json."""

    instance_id: str
    provider: str
    owner_namespace: str
    namespace: str
    image: str
    script: str
    resources: Mapping[str, Any] | None = None
    env: tuple[tuple[str, str], ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()
    service_account: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    #: A random id of this launch, given by the queue when it accepts it (see
    #: :data:`nymph.launch.render.ANNOTATION_LAUNCH`); None for specs made before it existed.
    launch_uid: str | None = None
    #: Higher runs first within a namespace (-1000..1000).
    priority: int = 0
    #: Seconds the Pod may be active (its ``activeDeadlineSeconds``); None for no limit.
    max_runtime: int | None = None
    #: Seconds the Pod's image may fail to pull before the launch is stopped (``ImagePull``);
    #: None: the queue's ``--image-pull-timeout`` (it fills it in when it accepts the launch).
    image_pull_timeout: int | None = None
    #: The launch group it is a member of (``NYMPH_GROUP_ID`` and the ``nymph.io/group`` label),
    #: and its 0-based place in it (``NYMPH_GROUP_INDEX``); None outside a group.
    group_id: str | None = None
    group_index: int | None = None
    #: The retry policy (:mod:`nymph.launch.retry`, checked), as given; None for no retries.
    retry: Mapping[str, Any] | None = None
    warnings: tuple[str, ...] = field(default=(), compare=False)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "instanceId": self.instance_id,
            "provider": self.provider,
            "ownerNamespace": self.owner_namespace,
            "namespace": self.namespace,
            "image": self.image,
            "script": self.script,
            "resources": self.resources,
            "env": [[k, v] for k, v in self.env],
            "nodeSelector": [[k, v] for k, v in self.node_selector],
            "tolerations": [dict(t) for t in self.tolerations],
            "serviceAccount": self.service_account,
            "imagePullSecrets": list(self.image_pull_secrets),
            "labels": [[k, v] for k, v in self.labels],
        }
        if self.launch_uid is not None:
            data["launchUid"] = self.launch_uid
        # Left out at their defaults, so a spec without them is the JSON it always was.
        if self.priority:
            data["priority"] = self.priority
        if self.max_runtime is not None:
            data["maxRuntime"] = self.max_runtime
        if self.image_pull_timeout is not None:
            data["imagePullTimeout"] = self.image_pull_timeout
        if self.group_id is not None:
            data["groupId"] = self.group_id
            data["groupIndex"] = self.group_index or 0
        if self.retry is not None:
            data["retry"] = dict(self.retry)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaunchSpec:
        for key in ("resources", "tolerations", "env", "nodeSelector", "labels", "imagePullSecrets"):
            check_depth(data.get(key), f"spec.{key}")
        try:
            spec = cls(
                instance_id=names.check_instance_id(data["instanceId"]),
                provider=str(data["provider"]),
                owner_namespace=names.check_namespace(data["ownerNamespace"]),
                namespace=names.check_namespace(data["namespace"]),
                image=_check_image(data["image"], "image"),
                script=_check_script(data["script"]),
                resources=data.get("resources"),
                env=tuple((str(k), str(v)) for k, v in data.get("env") or ()),
                node_selector=tuple((str(k), str(v)) for k, v in data.get("nodeSelector") or ()),
                tolerations=tuple(data.get("tolerations") or ()),
                service_account=data.get("serviceAccount"),
                image_pull_secrets=tuple(data.get("imagePullSecrets") or ()),
                labels=tuple((str(k), str(v)) for k, v in data.get("labels") or ()),
                launch_uid=check_launch_uid(data.get("launchUid")),
                priority=check_priority(data.get("priority", 0), "spec.priority"),
                max_runtime=_check_max_runtime(data.get("maxRuntime"), "spec.maxRuntime"),
                image_pull_timeout=_check_max_runtime(data.get("imagePullTimeout"), "spec.imagePullTimeout"),
                group_id=check_group_id(data.get("groupId")),
                group_index=check_group_index(data.get("groupIndex")),
                retry=check_retry(data.get("retry"), "spec.retry"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValidationError(
                "spec", f"malformed launch spec ({exc.__class__.__name__}: {exc})"
            ) from None
        return spec


def _check_max_runtime(value: object, fld: str) -> int | None:
    """A duration field (``max_runtime``, ``image_pull_timeout``): None when unset."""
    return None if value is None else parse_duration(value, fld)


def _check_image(value: object, fld: str) -> str:
    if value is None or value == "":
        raise ValidationError(
            fld, "is required: set 'image' on the mode, e.g. --field image=python:3.12-slim"
        )
    if not isinstance(value, str) or value != value.strip() or any(c.isspace() for c in value):
        raise ValidationError(fld, f"{value!r} is not an image reference (no spaces allowed)")
    return value


def _check_script(value: object, fld: str = "script") -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(fld, "is required: the Python code to run (e.g. --script job.py)")
    if "\x00" in value:
        raise ValidationError(fld, "contains a NUL byte, which cannot be passed to a container")
    size = len(value.encode("utf-8", errors="surrogatepass"))
    if size > MAX_SCRIPT_BYTES:
        raise ValidationError(
            fld,
            f"is {size} bytes; the limit is {MAX_SCRIPT_BYTES} (it travels as one argument to "
            "/bin/sh). Put large code in the image or the workdir and keep a small entry script",
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(fld, "is not valid UTF-8 text") from None
    return value


def env_value(value: object) -> str | None:
    """Env values: strings as-is; numbers and booleans stringified (``true``/``false``); else None."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    return None


def _check_env(raw: object, fld: str) -> tuple[list[tuple[str, str]], list[str]]:
    if raw is None:
        return [], []
    if not isinstance(raw, Mapping):
        raise ValidationError(fld, "must be a mapping of NAME: value")
    out: list[tuple[str, str]] = []
    notes: list[str] = []
    for k, v in raw.items():
        if not isinstance(k, str) or not k or "=" in k or not k.isprintable():
            raise ValidationError(f"{fld}.{k}", "is not a valid environment variable name")
        if k.startswith(RESERVED_ENV_PREFIX):
            raise ValidationError(
                f"{fld}.{k}",
                f"names starting {RESERVED_ENV_PREFIX} are reserved: nymph sets "
                f"{', '.join(sorted(RESERVED_ENV))} itself; rename the variable",
            )
        s = env_value(v)
        if s is None:
            notes.append(f"{fld}.{k} skipped: only strings, numbers and booleans are passed")
            continue
        out.append((k, s))
    return out, notes


def _check_resources(raw: object, fld: str) -> Mapping[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ValidationError(fld, "must be a mapping like {requests: {cpu: '1'}, limits: {...}}")
    unknown = sorted(set(raw) - _RESOURCE_KEYS)
    if unknown:
        raise ValidationError(f"{fld}.{unknown[0]}", "unknown key; use requests and/or limits")
    for key in ("requests", "limits"):
        section = raw.get(key)
        if section is None:
            continue
        if not isinstance(section, Mapping):
            raise ValidationError(f"{fld}.{key}", "must be a mapping of resource name to quantity")
        for rk, rv in section.items():
            if not isinstance(rk, str) or not names.is_label_key(rk):
                raise ValidationError(f"{fld}.{key}.{rk}", "is not a valid resource name")
            if isinstance(rv, bool) or not isinstance(rv, (str, int, float)):
                raise ValidationError(f"{fld}.{key}.{rk}", f"{rv!r} is not a quantity, e.g. '500m', '4Gi', 2")
    return raw


def _check_node_selector(raw: object, fld: str) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise ValidationError(fld, "must be a mapping of node label key to value")
    out = []
    for k, v in raw.items():
        if not isinstance(k, str) or not names.is_label_key(k):
            raise ValidationError(f"{fld}.{k}", "is not a valid node label key")
        sv = names.tag_value_to_str(v)
        if sv is None or not names.is_label_value(sv):
            raise ValidationError(f"{fld}.{k}", f"{v!r} is not a valid node label value")
        out.append((k, sv))
    return tuple(out)


def _check_tolerations(raw: object, fld: str) -> tuple[Mapping[str, Any], ...]:
    if raw is None:
        return ()
    if isinstance(raw, Mapping):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(t, Mapping) for t in raw):
        raise ValidationError(fld, "must be a list of toleration mappings (key, operator, effect, ...)")
    return tuple(raw)


def _check_pull_secrets(raw: object, fld: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        raw = [s.strip() for s in raw.split(",") if s.strip()]
    if not isinstance(raw, list):
        raise ValidationError(fld, "must be a list of Secret names")
    out = []
    for i, item in enumerate(raw):
        name = item.get("name") if isinstance(item, Mapping) else item
        out.append(names.check_dns_subdomain(name, field=f"{fld}[{i}]"))
    return tuple(out)


def build_launch_spec(
    *,
    provider: Provider,
    mode: Mode,
    body: Mapping[str, Any],
    instance_id: str,
    owner_namespace: str = "default",
    launch_uid: str | None = None,
) -> LaunchSpec:
    """Merge provider + mode + launch body into a validated :class:`LaunchSpec`."""
    if not isinstance(body, Mapping):
        raise ValidationError("launch", "the launch body must be a JSON object")
    unknown = sorted(set(body) - _BODY_KEYS)
    if unknown:
        raise ValidationError(
            f"launch.{unknown[0]}", f"unknown key; a launch takes {', '.join(sorted(_BODY_KEYS))}"
        )
    overrides = body.get("fields") or {}
    if not isinstance(overrides, Mapping):
        raise ValidationError("launch.fields", "must be a mapping of mode fields")
    bad = sorted(set(overrides) - MODE_FIELDS)
    if bad:
        raise ValidationError(
            f"launch.fields.{bad[0]}", f"unknown field; use {', '.join(sorted(MODE_FIELDS))}"
        )

    merged = merged_kwargs(provider, mode)

    def pick(name: str) -> tuple[Any, str]:
        if name in overrides:
            value, fld = overrides[name], f"launch.fields.{name}"
        elif name in mode.fields or name not in provider.kwargs:
            value, fld = mode.fields.get(name), f"mode.{name}"
        else:
            value, fld = provider.kwargs[name], f"provider.{name}"
        check_depth(value, fld)
        return value, fld

    for key in ("tags", "env"):
        check_depth(body.get(key), f"launch.{key}")

    image, image_fld = pick("image")
    env_raw, env_fld = pick("env")
    env, notes = _check_env(env_raw, env_fld)
    launch_env, launch_notes = _check_env(body.get("env"), "launch.env")
    env_merged = dict(env)
    env_merged.update(launch_env)
    labels, dropped = names.tags_to_labels(body.get("tags"), field="tags")
    notes += launch_notes + [f"tags.{k} dropped: reserved label key" for k in dropped]

    ns_raw = merged.get("namespace")
    namespace = names.check_namespace(
        ns_raw if ns_raw not in (None, "") else "default",
        field="mode.namespace" if "namespace" in mode.fields else "provider.namespace",
    )
    sa, sa_fld = pick("service_account")
    if body.get("priority") is not None:
        priority_raw, priority_fld = body["priority"], "launch.priority"
    else:
        priority_raw, priority_fld = pick("priority")
    return LaunchSpec(
        instance_id=names.check_instance_id(instance_id),
        provider=provider.name,
        owner_namespace=names.check_namespace(owner_namespace, field="namespace"),
        namespace=namespace,
        image=_check_image(image, image_fld),
        script=_check_script(body.get("script"), "launch.script"),
        resources=_check_resources(*pick("resources")),
        env=tuple(env_merged.items()),
        node_selector=_check_node_selector(*pick("node_selector")),
        tolerations=_check_tolerations(*pick("tolerations")),
        service_account=None if sa in (None, "") else names.check_dns_subdomain(sa, field=sa_fld),
        image_pull_secrets=_check_pull_secrets(*pick("image_pull_secrets")),
        labels=tuple(sorted(labels.items())),
        launch_uid=check_launch_uid(launch_uid),
        priority=0 if priority_raw is None else check_priority(priority_raw, priority_fld),
        max_runtime=_check_max_runtime(*pick("max_runtime")),
        image_pull_timeout=_check_max_runtime(*pick("image_pull_timeout")),
        retry=check_retry(*pick("retry")),
        warnings=tuple(notes),
    )
