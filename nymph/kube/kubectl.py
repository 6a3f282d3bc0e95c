"""kubectl as the apply path: ``kubectl apply --server-side --field-manager=nymph -f -``.

Several manifests, of any kinds, go in one invocation. kubectl keeps going past a bad object
and reports it on stderr; objects missing from its output are re-applied alone, so each gets its
own error (the cost is paid only on failure). Output objects are matched to manifests by kind,
namespace and name (a Deployment and its Service often share a name). Errors are classified into
:mod:`nymph.kube.errors`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nymph import fastjson
from nymph.errors import ValidationError
from nymph.kube.applier import ApplyOutcome, object_key
from nymph.kube.binaries import kubectl_path
from nymph.kube.errors import Invalid, KubeError, NotFound, Unavailable, classify_kubectl
from nymph.launch.names import LABEL_MANAGED, check_dns_subdomain, check_namespace
from nymph.launch.render import to_json_list

FIELD_MANAGER = "nymph"
#: Go's garbage collector for kubectl, which runs for a moment and exits: collecting costs a
#: run about a quarter of its CPU to reclaim memory the exit frees anyway. Off, under a soft
#: memory limit (the collector still runs should a very large batch grow near it). An
#: operator's own ``GOGC`` or ``GOMEMLIMIT`` in the daemon's environment wins.
GO_RUNTIME_ENV = {"GOGC": "off", "GOMEMLIMIT": "256MiB"}


def _kind_key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    return (str(obj.get("kind") or ""), *object_key(obj))


@dataclass(frozen=True)
class KubectlResult:
    code: int
    stdout: str
    stderr: str


def in_cluster_fallback(k: Kubectl) -> bool:
    """Whether kubectl will use the Pod's ServiceAccount: no kubeconfig or context given, none
    in the environment or at ~/.kube/config, and the in-cluster Service variables set."""
    if k.kubeconfig or k.context or os.environ.get("KUBECONFIG"):
        return False
    if os.path.exists(os.path.expanduser("~/.kube/config")):
        return False
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST") and os.environ.get("KUBERNETES_SERVICE_PORT"))


@dataclass
class Kubectl:
    """Runs kubectl with fixed connection flags; never passes secrets on the command line."""

    kubeconfig: str | None = None
    context: str | None = None
    binary: str = field(default_factory=kubectl_path)
    timeout: float = 60.0
    name: str = "kubectl"
    #: kubectl's discovery and HTTP cache (``KUBECACHEDIR``) when the environment names none.
    #: Its default, ``~/.kube/cache``, cannot be written in a Pod with a read-only root
    #: filesystem: every run would then ask the API server for discovery again.
    cache_dir: str | None = None

    def _argv(self, args: Sequence[str]) -> list[str]:
        argv = [self.binary]
        if self.kubeconfig:
            argv.append(f"--kubeconfig={self.kubeconfig}")
        if self.context:
            argv.append(f"--context={self.context}")
        if not in_cluster_fallback(self):
            # kubectl (client-go) falls back to the in-cluster ServiceAccount only when its
            # config equals the default: any flag such as --request-timeout sends it to
            # localhost:8080 instead. In a Pod the subprocess deadline in run() bounds it.
            argv.append(f"--request-timeout={int(self.timeout)}s")
        return argv + list(args)

    async def run(self, args: Sequence[str], *, stdin: str | None = None) -> KubectlResult:
        env = dict(os.environ)
        env.pop("KUBECTL_EXTERNAL_DIFF", None)
        if self.cache_dir and not env.get("KUBECACHEDIR"):
            env["KUBECACHEDIR"] = self.cache_dir
        if not env.get("GOGC") and not env.get("GOMEMLIMIT"):
            env.update(GO_RUNTIME_ENV)
        proc = await asyncio.create_subprocess_exec(
            *self._argv(args),
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(stdin.encode() if stdin is not None else None), self.timeout + 15
            )
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise Unavailable(f"kubectl {args[0]} timed out after {self.timeout + 15:.0f}s") from None
        except asyncio.CancelledError:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        return KubectlResult(
            code=proc.returncode or 0,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
        )

    # -- Applier -----------------------------------------------------------------------------

    async def apply(
        self, manifests: Sequence[Mapping[str, Any]], *, dry_run: bool = False
    ) -> list[ApplyOutcome]:
        if not manifests:
            return []
        outcomes = await self._apply_batch(manifests, dry_run=dry_run)
        if len(manifests) > 1:
            # Objects kubectl did not return failed: apply them alone to get their own error.
            retry = [i for i, o in enumerate(outcomes) if not o.ok]
            for i in retry:
                (outcomes[i],) = await self._apply_batch([manifests[i]], dry_run=dry_run)
        return outcomes

    async def _apply_batch(
        self, manifests: Sequence[Mapping[str, Any]], *, dry_run: bool
    ) -> list[ApplyOutcome]:
        args = ["apply", "--server-side", f"--field-manager={FIELD_MANAGER}", "-o", "json", "-f", "-"]
        if dry_run:
            args.insert(1, "--dry-run=server")
        res = await self.run(args, stdin=to_json_list(manifests))
        applied: dict[tuple[str, str, str], Mapping[str, Any]] = {}
        if res.stdout.strip():
            try:
                doc = fastjson.loads(res.stdout)
            except ValueError:
                doc = {}
            items = doc.get("items") if doc.get("kind") == "List" else [doc]
            for item in items or []:
                if isinstance(item, dict):
                    applied[_kind_key(item)] = item
        outcomes: list[ApplyOutcome] = []
        for m in manifests:
            key = _kind_key(m)
            _, ns, name = key
            if key in applied:
                outcomes.append(ApplyOutcome(namespace=ns, name=name, obj=applied[key]))
            else:
                err: KubeError = (
                    classify_kubectl(res.stderr) if res.code else KubeError("kubectl returned no object")
                )
                outcomes.append(ApplyOutcome(namespace=ns, name=name, error=err))
        return outcomes

    async def delete_pod(
        self, *, namespace: str, name: str, grace_seconds: int | None, uid: str | None = None
    ) -> bool:
        """Delete the nymph Pod ``name``: selected by name *and* nymph's label, so a name that
        is not a Pod name, or a Pod nymph did not create, is never deleted. kubectl deletes by
        selector and takes no uid precondition: ``uid`` is not used."""
        try:
            check_namespace(namespace)
            check_dns_subdomain(name, field="name")
        except ValidationError as exc:
            raise Invalid(f"refusing to delete a Pod: {exc}") from None
        args = [
            "delete",
            "pod",
            f"--namespace={namespace}",
            f"--selector={LABEL_MANAGED}=true",
            f"--field-selector=metadata.name={name}",
            "--wait=false",
            "--ignore-not-found",
            "-o",
            "name",
        ]
        if grace_seconds is not None:
            args.append(f"--grace-period={int(grace_seconds)}")
        res = await self.run(args)
        if res.code != 0:
            err = classify_kubectl(res.stderr)
            if isinstance(err, NotFound):
                return False
            raise err
        return f"pod/{name}" in res.stdout.split()

    async def pod_logs(self, *, namespace: str, name: str, limit_bytes: int) -> str:
        res = await self.run(["logs", name, "-n", namespace, "-c", "user", "--tail=5000"])
        if res.code != 0:
            raise classify_kubectl(res.stderr)
        return res.stdout[-limit_bytes:]

    async def can_i(self, *, verb: str, resource: str, namespace: str) -> bool:
        res = await self.run(["auth", "can-i", verb, resource, "-n", namespace])
        return res.stdout.strip() == "yes"
