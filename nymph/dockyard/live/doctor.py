"""``nymph dockyard doctor``: can this kube context run dockyard?

Checks, each one line (``ok`` / ``FAIL`` / ``warn`` / ``note``): the API server answers
through kubectl; the caller may do what the live commands do in the namespace, and
separately what ``dev`` and the exec submitter do (pods, ``pods/exec``, the user's Secret),
in one batch of SelfSubjectAccessReviews; the KubeRay CRDs are served (API discovery, which every
authenticated user may read); with a recipe, the PriorityClass and ServiceAccount it names
exist. Then the NetworkPolicy caveat. Exit 0 when nothing failed, 1 otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nymph.dockyard.errors import DockyardLiveError
from nymph.dockyard.live.kubectl import Kube, Say
from nymph.dockyard.spec.schema import InfraConfig

KUBERAY_GROUP_VERSION = "ray.io/v1"
KUBERAY_RESOURCES = ("rayclusters", "rayjobs")

_MANAGED = (
    ("apps", "deployments"),
    ("", "services"),
    ("networking.k8s.io", "networkpolicies"),
    ("policy", "poddisruptionbudgets"),
    ("ray.io", "rayjobs"),
    ("ray.io", "rayclusters"),
)
#: (verb, group, resource) the live commands use in the namespace.
ACCESS_CHECKS: tuple[tuple[str, str, str], ...] = (
    *((verb, group, res) for group, res in _MANAGED for verb in ("get", "create", "patch", "delete")),
    ("list", "ray.io", "rayclusters"),
    ("list", "", "pods"),
    ("get", "", "pods/log"),
    ("create", "", "pods/portforward"),
)
#: (verb, group, resource) of ``dev connect|stop|setup-secrets`` and ``submit.submitter: exec``:
#: the dev Pod is server-side applied, exec'd into and deleted; the user's Secret is read,
#: created, then merge-patched.
DEV_ACCESS_CHECKS: tuple[tuple[str, str, str], ...] = (
    *(("get", "", "pods"), ("create", "", "pods"), ("patch", "", "pods"), ("delete", "", "pods")),
    ("create", "", "pods/exec"),
    *((verb, "", "secrets") for verb in ("get", "create", "patch")),
)

NETWORK_POLICY_NOTE = (
    "NetworkPolicy objects are accepted by every API server but enforced only by a network "
    "plugin that implements them (Calico, Cilium, ...); on one that does not, the sandbox pool "
    "is not isolated. nymph cannot see the plugin from the API: ask the cluster's operators."
)


@dataclass
class Report:
    say: Say
    failures: list[str] = field(default_factory=list)

    def ok(self, text: str) -> None:
        self.say(f"ok    {text}")

    def fail(self, text: str) -> None:
        self.failures.append(text)
        self.say(f"FAIL  {text}")

    def warn(self, text: str) -> None:
        self.say(f"warn  {text}")

    def note(self, text: str) -> None:
        self.say(f"note  {text}")


def _label(group: str, resource: str) -> str:
    return f"{resource}.{group}" if group else resource


def _access_line(
    report: Report,
    checks: tuple[tuple[str, str, str], ...],
    allowed: list[bool],
    *,
    namespace: str,
    what: str,
    scope: str,
) -> None:
    denied = [
        f"{verb} {_label(group, res)}"
        for (verb, group, res), ok in zip(checks, allowed, strict=True)
        if not ok
    ]
    if not denied:
        report.ok(f"authorised in namespace {namespace} for everything {what} ({len(checks)} checks)")
    else:
        report.fail(
            f"not authorised in namespace {namespace}{scope} to: {', '.join(denied)} "
            "(ask an administrator for a Role with these verbs)"
        )


async def check_access(kube: Kube, report: Report, *, namespace: str) -> None:
    allowed = await kube.access_reviews((*ACCESS_CHECKS, *DEV_ACCESS_CHECKS), namespace=namespace)
    live, dev = allowed[: len(ACCESS_CHECKS)], allowed[len(ACCESS_CHECKS) :]
    _access_line(report, ACCESS_CHECKS, live, namespace=namespace, what="the live commands do", scope="")
    _access_line(
        report,
        DEV_ACCESS_CHECKS,
        dev,
        namespace=namespace,
        what="dev and the exec submitter do",
        scope=" for dev and the exec submitter",
    )


async def check_crds(kube: Kube, report: Report) -> None:
    doc = await kube.raw(f"/apis/{KUBERAY_GROUP_VERSION}")
    served = {r.get("name") for r in (doc or {}).get("resources") or [] if isinstance(r, dict)}
    missing = [r for r in KUBERAY_RESOURCES if r not in served]
    if not missing:
        report.ok(
            f"KubeRay CRDs installed: {', '.join(f'{r}.ray.io' for r in KUBERAY_RESOURCES)} ({KUBERAY_GROUP_VERSION})"
        )
    else:
        report.fail(
            f"KubeRay CRDs missing: {', '.join(f'{r}.ray.io' for r in missing)} ({KUBERAY_GROUP_VERSION} not served); "
            "install the KubeRay operator (its Helm chart installs the CRDs)"
        )


async def check_object(
    kube: Kube, report: Report, *, resource: str, name: str, namespace: str | None, what: str, field_name: str
) -> None:
    state, _ = await kube.probe(resource, name, namespace=namespace)
    if state == "present":
        report.ok(f"{what} {name} exists")
    elif state == "absent":
        where = f" in namespace {namespace}" if namespace else ""
        report.fail(f"{what} {name} not found{where} (create it, or change {field_name})")
    else:
        report.warn(f"{what} {name}: cannot check ({state})")


async def doctor(kube: Kube, *, namespace: str, infra: InfraConfig | None, say: Say) -> int:
    report = Report(say)
    try:
        version = await kube.server_version()
    except DockyardLiveError as exc:
        report.fail(str(exc))
        return 1
    report.ok(f"kubectl reaches the API server (Kubernetes {version})")
    state, _ = await kube.probe("namespaces", namespace, namespace=None)
    if state == "absent":
        report.fail(f"namespace {namespace} does not exist (kubectl create namespace {namespace})")
    elif state == "present":
        report.ok(f"namespace {namespace} exists")
    else:
        report.warn(f"namespace {namespace}: cannot check ({state})")
    await check_access(kube, report, namespace=namespace)
    await check_crds(kube, report)
    checks: list[dict[str, Any]] = []
    if infra is not None and infra.priorityClassName:
        checks.append(
            {
                "resource": "priorityclasses.scheduling.k8s.io",
                "name": infra.priorityClassName,
                "namespace": None,
                "what": "PriorityClass",
                "field_name": "infra.priorityClassName",
            }
        )
    elif infra is not None:
        report.ok("no PriorityClass configured (infra.priorityClassName unset)")
    if infra is not None and infra.serviceAccount:
        checks.append(
            {
                "resource": "serviceaccounts",
                "name": infra.serviceAccount,
                "namespace": namespace,
                "what": "ServiceAccount",
                "field_name": "infra.serviceAccount",
            }
        )
    for c in checks:
        await check_object(kube, report, **c)
    report.note(NETWORK_POLICY_NOTE)
    if report.failures:
        say(f"{len(report.failures)} check(s) failed")
        return 1
    say("all checks passed")
    return 0
