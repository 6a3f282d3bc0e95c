"""How a launch becomes a Pod (pure and deterministic).

The same :class:`LaunchSpec` (and node / workdir root) always renders byte-identical YAML/JSON.

The Pod:

* ``metadata.name`` is the instance id (``lakeshore-<8 hex>``), fixed per launch, so applying
  it twice is idempotent;
* labels: ``lakeshore=true``, ``lakeshore.namespace=<owner ns>``, ``lakeshore.provider=<slug>``
  plus the launch tags, and for a member of a launch group ``nymph.io/group=<groupId>`` (with
  ``NYMPH_GROUP_ID`` and ``NYMPH_GROUP_INDEX`` in its env);
* one container ``user`` running ``/bin/sh -c`` with a script that heredocs the Python launch
  script into ``/tmp/u.py`` and runs ``python3 /tmp/u.py`` (a script whose lines start with so
  many different bytes that no safe delimiter exists travels compressed and base64-encoded
  instead, decoded by ``python3``; see :func:`heredoc_command`);
* ``restartPolicy: Never``;
* ``activeDeadlineSeconds`` when the launch has a ``max_runtime`` (the kubelet then ends the Pod
  ``Failed`` with ``status.reason: DeadlineExceeded``), and nothing of it when it has none;
* on the daemon path, a hostPath volume ``<root>/work/<instanceId>`` (``type: Directory``,
  created by the daemon) mounted at :data:`WORKDIR_MOUNT`, and a required node affinity on
  ``kubernetes.io/hostname`` so the Pod lands on the node whose disk holds that directory.
"""

from __future__ import annotations

import base64
import hashlib
import json
import posixpath
import string
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, NotRequired, TypedDict

import yaml

from nymph import fastjson
from nymph.errors import ValidationError
from nymph.launch import names
from nymph.launch.pullwait import ANNOTATION_PULL_TIMEOUT
from nymph.launch.spec import LaunchSpec

SCRIPT_PATH = "/tmp/u.py"
WORKDIR_MOUNT = "/workdir"
WORKDIR_VOLUME = "workdir"
CONTAINER_NAME = "user"
HOSTNAME_LABEL = "kubernetes.io/hostname"
ANNOTATION_MANIFEST_SHA = "nymph.io/script-sha256"
#: Identifies the launch a Pod was rendered for: the spec's ``launch_uid`` (random, given by the
#: queue), or for a spec without one a digest of the whole spec. A Pod of the same name without
#: the matching value is not this launch's Pod.
ANNOTATION_LAUNCH = "nymph.io/launch"


class ObjectMeta(TypedDict):
    name: str
    namespace: str
    labels: dict[str, str]
    annotations: NotRequired[dict[str, str]]


class PodManifest(TypedDict):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: dict[str, Any]


# Delimiter lead characters, tried in order. dash (Debian's /bin/sh) and busybox ash lose the
# first byte of a non-ASCII character that directly follows a partial match of the delimiter
# at the start of a heredoc line ("N\u00e9" read against delimiter "NYMPH..." yields "N\xa9").
# A delimiter whose first byte starts no line of the script can never partly match, so the
# lead is chosen among bytes that start no line.
_LEADS = [c for c in string.ascii_uppercase + string.ascii_lowercase + string.digits + "_%@+=,.:^~-!#&*"] + [
    chr(b) for b in range(1, 32) if chr(b) not in "\t\n\r\x0b\x0c"
]


#: Linux's cap on one argv string (MAX_ARG_STRLEN), counting its terminating NUL: the whole
#: ``/bin/sh -c`` text must fit in it.
MAX_COMMAND_BYTES = 128 * 1024 - 1
#: The delimiter of an encoded script: ``_`` is not a base64 character, so it starts no line
#: of the encoded body and can never partly match one.
_ENCODED_DELIMITER = "_NYMPH_B64"
_DECODE = (
    "python3 -c 'import base64,sys,zlib;"
    "sys.stdout.buffer.write(zlib.decompress(base64.b64decode(sys.stdin.buffer.read())))'"
)


def heredoc_delimiter(script: str) -> str | None:
    """A heredoc delimiter that is not a line of ``script`` and whose first byte starts none
    of its lines (deterministic for a given script); None when every candidate byte starts
    some line (then the script is embedded encoded, see :func:`heredoc_command`)."""
    lines = script.split("\n")
    starts = {ln.encode("utf-8")[:1] for ln in lines}
    digest = hashlib.sha256(script.encode("utf-8")).hexdigest()[:16].upper()
    lead = next((c for c in _LEADS if c.encode() not in starts), None)
    if lead is None:  # every candidate byte starts a line: the script is hundreds of odd lines
        return None
    candidate = f"{lead}NYMPH_{digest}"
    n = 0
    while candidate in lines:  # cannot happen (no line starts with lead), kept as a guard
        n += 1
        candidate = f"{lead}NYMPH_{digest}_{n}"
    return candidate


def heredoc_command(script: str, *, path: str = SCRIPT_PATH) -> str:
    """The ``/bin/sh -c`` text that writes ``script`` to ``path`` verbatim and runs it.

    The delimiter is quoted (no expansion of ``$``, backticks or backslashes) and chosen so
    it is not a line of the script. The file gets a final newline if the script lacks one.
    When no safe delimiter exists (see :func:`heredoc_delimiter`) the heredoc carries the
    script zlib-compressed and base64-encoded (ASCII lines, none starting with the delimiter's
    first byte) and ``python3`` decodes it into ``path``. Raises :class:`ValidationError`
    (field ``script``) when the text would not fit in one argument (:data:`MAX_COMMAND_BYTES`).
    """
    delim = heredoc_delimiter(script)
    body = script if script.endswith("\n") else script + "\n"
    if delim is not None:
        command = f"cat > {path} <<'{delim}'\n{body}{delim}\nexec python3 {path}\n"
    else:
        packed = base64.encodebytes(zlib.compress(body.encode("utf-8"), 9)).decode("ascii")
        command = f"{_DECODE} > {path} <<'{_ENCODED_DELIMITER}'\n{packed}{_ENCODED_DELIMITER}\nexec python3 {path}\n"
    size = len(command.encode("utf-8"))
    if size > MAX_COMMAND_BYTES:
        raise ValidationError(
            "script",
            f"needs {size} bytes as the container's command; the limit is {MAX_COMMAND_BYTES} "
            "(one argument to /bin/sh). Put large code in the image or the workdir",
        )
    return command


def workdir_path(root: str, instance_id: str) -> str:
    """``<root>/work/<instanceId>``, refusing anything that could escape the root."""
    names.check_instance_id(instance_id)
    if not root.startswith("/"):
        raise ValidationError("workdir_root", f"{root!r} must be an absolute path")
    norm = posixpath.normpath(root)
    if norm == "/":
        raise ValidationError("workdir_root", "must not be '/'")
    return posixpath.join(norm, "work", instance_id)


def launch_annotation(spec: LaunchSpec) -> str:
    """The value of :data:`ANNOTATION_LAUNCH` for ``spec``'s Pod."""
    if spec.launch_uid is not None:
        return spec.launch_uid
    return "sha256-" + hashlib.sha256(fastjson.canonical(spec.to_json())).hexdigest()[:32]


def render_pod(spec: LaunchSpec, *, node: str | None = None, workdir_root: str | None = None) -> PodManifest:
    labels = names.selector_labels(owner_namespace=spec.owner_namespace, provider=spec.provider)
    for k, v in spec.labels:
        if k not in names.NYMPH_LABEL_KEYS:
            labels[k] = v
    if spec.group_id is not None:
        labels[names.LABEL_GROUP] = spec.group_id
    if node is not None:
        labels[names.LABEL_NODE] = names.node_label(node)
    labels = dict(sorted(labels.items()))

    env: list[dict[str, str]] = [{"name": k, "value": v} for k, v in spec.env]
    env.append({"name": "NYMPH_INSTANCE_ID", "value": spec.instance_id})
    if spec.group_id is not None:
        env.append({"name": "NYMPH_GROUP_ID", "value": spec.group_id})
        env.append({"name": "NYMPH_GROUP_INDEX", "value": str(spec.group_index or 0)})
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "command": ["/bin/sh", "-c"],
        "args": [heredoc_command(spec.script)],
        "env": env,
    }
    if spec.resources:
        container["resources"] = json.loads(json.dumps(spec.resources))
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
    }
    if workdir_root is not None:
        env.append({"name": "NYMPH_WORKDIR", "value": WORKDIR_MOUNT})
        container["volumeMounts"] = [{"name": WORKDIR_VOLUME, "mountPath": WORKDIR_MOUNT}]
        container["workingDir"] = WORKDIR_MOUNT
        pod_spec["volumes"] = [
            {
                "name": WORKDIR_VOLUME,
                "hostPath": {
                    "path": workdir_path(workdir_root, spec.instance_id),
                    "type": "Directory",
                },
            }
        ]
    if node is not None:
        names.check_dns_subdomain(node, field="node")
        pod_spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}]}
                    ]
                }
            }
        }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in spec.tolerations]
    if spec.service_account:
        pod_spec["serviceAccountName"] = spec.service_account
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in spec.image_pull_secrets]
    if spec.max_runtime is not None:
        pod_spec["activeDeadlineSeconds"] = spec.max_runtime

    script_sha = hashlib.sha256(spec.script.encode("utf-8")).hexdigest()
    annotations = {ANNOTATION_MANIFEST_SHA: script_sha, ANNOTATION_LAUNCH: launch_annotation(spec)}
    if spec.image_pull_timeout is not None:
        annotations[ANNOTATION_PULL_TIMEOUT] = str(spec.image_pull_timeout)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": spec.instance_id,
            "namespace": spec.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": pod_spec,
    }


class _Dumper(yaml.SafeDumper):
    """Block-style YAML with multi-line strings as literal blocks where YAML allows it."""


#: Characters YAML readers treat as line breaks: in a literal block or a plain / single-quoted
#: scalar they would come back as "\n", so a string holding one is double-quoted (escaped).
_YAML_BREAKS = ("\x85", "\u2028", "\u2029")


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if any(c in data for c in _YAML_BREAKS):
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style='"')
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str_representer)


def to_yaml(obj: Any) -> str:
    return yaml.dump(
        obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=4096
    )


def to_yaml_stream(objs: list[Any]) -> str:
    return yaml.dump_all(
        objs, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=4096
    )


def to_json_list(objs: Sequence[Mapping[str, Any]]) -> str:
    """Objects as one ``v1`` List in compact JSON, what kubectl reads on stdin: encoding it is
    a small part of the cost of YAML (a pure-Python dumper), and kubectl decodes it faster."""
    return json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": list(objs)}, ensure_ascii=False, separators=(",", ":")
    )


def to_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def manifest_sha256(obj: Any) -> str:
    """sha256 of the canonical JSON of a manifest (what the audit log records)."""
    return hashlib.sha256(fastjson.canonical(obj)).hexdigest()
