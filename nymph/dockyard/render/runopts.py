"""How a ``run`` goes, from the infra and the command line (pure).

``--mode interactive|batch`` (else ``launch.runMode``) is a macro, as in dockyard-k8s:

=================  =====================  ==================  =================
run mode           submitter              code source         waits
=================  =====================  ==================  =================
interactive        portForward (REST)     upload              yes (follows)
batch              exec (on the head)     image               no
=================  =====================  ==================  =================

Precedence, per setting: the explicit flag (``--submitter``, ``--code-source``,
``--code-path``, ``--wait/--no-wait``); then ``--mode``'s default when ``--mode`` is given;
then the infra (``submit.submitter``, ``launch.codeSource``) where it differs from the schema
default; then the default of ``launch.runMode``.

For rayjob mode the RayJob itself takes ``--rayjob-name``, ``--shutdown/--no-shutdown`` and
``--ttl`` (:func:`rayjob_options`).

``submit.kind`` picks the submission path to a RayCluster (bringup and attach): ``sdk`` is the
Ray Jobs API (the submitter above); ``rayjob`` hands the entrypoint to KubeRay as a RayJob
that selects the existing cluster (:func:`cluster_rayjob`), so nothing is uploaded and the
exec submitter does not apply (:func:`check_rayjob_kind`).
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from nymph.dockyard.errors import DockyardLiveError
from nymph.dockyard.render import k8s
from nymph.dockyard.spec import names
from nymph.dockyard.spec.enums import CodeSource, RunMode, SubmitterMode
from nymph.dockyard.spec.schema import InfraConfig, LaunchSpec, SubmitSpec

#: ``run`` follows a RayJob this long at most unless ``--timeout`` says otherwise
RAYJOB_TIMEOUT_S = 86400.0
MODE_DEFAULTS: dict[RunMode, tuple[SubmitterMode, CodeSource, bool]] = {
    RunMode.INTERACTIVE: (SubmitterMode.PORT_FORWARD, CodeSource.UPLOAD, False),
    RunMode.BATCH: (SubmitterMode.EXEC, CodeSource.IMAGE, True),
}
_NOT_ID = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True, kw_only=True)
class RunFlags:
    """What the command line said (``None``: not given)."""

    mode: RunMode | None = None
    submitter: SubmitterMode | None = None
    code_source: CodeSource | None = None
    code_path: str | None = None
    wait: bool | None = None
    run_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class RunChoice:
    run_mode: RunMode
    submitter: SubmitterMode
    code_source: CodeSource
    code_path: str | None
    wait: bool

    def line(self) -> str:
        return (
            f"run-mode={self.run_mode.value} submitter={self.submitter.value} "
            f"code-source={self.code_source.value} wait={'yes' if self.wait else 'no'}"
        )


def resolve(infra: InfraConfig, flags: RunFlags) -> RunChoice:
    """The effective run settings (see the module docstring); refuses impossible pairs."""
    mode = flags.mode or infra.launch.runMode
    macro_submitter, macro_code, macro_no_wait = MODE_DEFAULTS[mode]
    infra_submitter = infra.submit.submitter
    infra_code = infra.launch.codeSource
    if flags.mode is None:
        # the infra's own setting wins over its runMode's default
        if infra_submitter != SubmitSpec().submitter:
            macro_submitter = infra_submitter
        if infra_code != LaunchSpec().codeSource:
            macro_code = infra_code
    submitter = flags.submitter or macro_submitter
    code = flags.code_source or macro_code
    code_path = flags.code_path or infra.launch.codePath
    if code in (CodeSource.IMAGE, CodeSource.LUSTRE) and not code_path:
        raise DockyardLiveError(
            f"--code-source {code.value} needs --code-path (or infra.launch.codePath): where the code is "
            "inside the head pod"
        )
    if submitter is SubmitterMode.EXEC and code is CodeSource.UPLOAD:
        raise DockyardLiveError(
            "--submitter exec cannot upload the working dir: use --code-source image or lustre "
            "(with --code-path), or --submitter portForward"
        )
    wait = (not macro_no_wait) if flags.wait is None else flags.wait
    return RunChoice(run_mode=mode, submitter=submitter, code_source=code, code_path=code_path, wait=wait)


def default_run_id(*, user: str, recipe: str, now: float | None = None, salt: str = "") -> str:
    """``<user>-<recipe stem>-<YYYYmmdd-HHMMSS>[-salt]``, fit for a Ray submission id and a path."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    stem = _NOT_ID.sub("-", recipe.lower()).strip("-")[:40] or "run"
    return f"{user}-{stem}-{stamp}" + (f"-{salt}" if salt else "")


def check_run_id(run_id: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", run_id):
        raise DockyardLiveError(
            f"--run-id {run_id!r}: letters, digits, '_', '.', '-' (at most 100, starting alphanumeric)"
        )
    return run_id


def rayjob_options(
    manifests: Sequence[dict[str, Any]],
    *,
    name: str | None = None,
    shutdown: bool = True,
    ttl: int | None = None,
) -> list[dict[str, Any]]:
    """The manifests with the RayJob renamed / its shutdown and TTL set (copies)."""
    out = [copy.deepcopy(m) for m in manifests]
    for m in out:
        if m.get("kind") != "RayJob":
            continue
        if name:
            for _key, problem in names.dns1035_label(name, key="--rayjob-name"):
                raise DockyardLiveError(f"--rayjob-name: {problem}")
            m["metadata"]["name"] = name
        m["spec"]["shutdownAfterJobFinishes"] = shutdown
        if ttl is not None:
            if ttl < 0:
                raise DockyardLiveError("--ttl must be 0 or more seconds")
            m["spec"]["ttlSecondsAfterFinished"] = ttl
    return out


#: KubeRay derives names from a RayJob's; it refuses longer ones
RAYJOB_NAME_MAX = 47
CLUSTER_LABEL = "ray.io/cluster"


def check_rayjob_kind(choice: RunChoice, *, replace: bool) -> None:
    """``submit.kind: rayjob`` goes through KubeRay, not the Jobs API: no upload, no exec, no
    --replace."""
    if choice.submitter is SubmitterMode.EXEC:
        raise DockyardLiveError(
            "submit.kind: rayjob hands the job to KubeRay and does not combine with the exec submitter "
            "(--submitter portForward, or submit.kind: sdk)"
        )
    if choice.code_source is CodeSource.UPLOAD:
        raise DockyardLiveError(
            "submit.kind: rayjob cannot upload the working dir: use --code-source image|lustre "
            "(launch.codeSource), or submit.kind: sdk"
        )
    if replace:
        raise DockyardLiveError("--replace stops jobs through the Ray Jobs API: it needs submit.kind: sdk")


def rayjob_name(run_id: str) -> str:
    """A RayJob name from a run id: lower case, DNS-1123, at most :data:`RAYJOB_NAME_MAX`."""
    name = _NOT_ID.sub("-", run_id.lower())[:RAYJOB_NAME_MAX].strip("-")
    return name if name and name[0].isalpha() else f"r{name}"[:RAYJOB_NAME_MAX].rstrip("-")


def cluster_rayjob(
    *, run_id: str, cluster: str, namespace: str, entrypoint: str, env: Mapping[str, str]
) -> dict[str, Any]:
    """The RayJob of ``submit.kind: rayjob``: KubeRay submits ``entrypoint`` to the existing
    RayCluster ``cluster`` (``clusterSelector``) and neither creates nor deletes a cluster."""
    spec: dict[str, Any] = {
        "entrypoint": entrypoint,
        "submissionMode": "HTTPMode",
        "clusterSelector": {CLUSTER_LABEL: cluster},
    }
    if env:
        spec["runtimeEnvYAML"] = yaml.safe_dump({"env_vars": dict(env)}, sort_keys=False)
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": rayjob_name(run_id), "namespace": namespace, "labels": k8s.labels({})},
        "spec": spec,
    }
