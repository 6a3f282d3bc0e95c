"""The Kubernetes edge of the live dockyard commands, over kubectl.

:class:`Kube` wraps :class:`nymph.kube.kubectl.Kubectl` with what the commands need (apply,
get, list, delete, discovery, access reviews, streamed logs) and turns every kubectl failure
into one :class:`DockyardLiveError` line that says what to do.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nymph.dockyard.errors import DockyardLiveError
from nymph.dockyard.render.plan import ref
from nymph.kube.errors import (
    Forbidden,
    KubeError,
    NotFound,
    Unauthorized,
    Unavailable,
    classify_kubectl,
)
from nymph.kube.kubectl import Kubectl
from nymph.launch.render import to_yaml_stream

Say = Callable[[str], None]


def say(line: str) -> None:
    """Progress output: one line to stdout, flushed."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


_KLOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+\] ")


def _first_line(text: str) -> str:
    """kubectl's reason, without klog noise (``E1129 12:00:00.000 123 file.go:1] ...``)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    plain = [ln for ln in lines if not _KLOG.match(ln)]
    line = plain[0] if plain else (_KLOG.sub("", lines[-1]) if lines else "kubectl failed without output")
    return line.removeprefix("error: ").removeprefix("Error from server ")[:400]


def explain(err: KubeError | str, *, doing: str, namespace: str | None = None) -> DockyardLiveError:
    """One line: what failed, kubectl's reason, and what to do about it."""
    text = err.message if isinstance(err, KubeError) else err
    kind = err if isinstance(err, KubeError) else classify_kubectl(text)
    low = text.lower()
    reason = _first_line(text)
    if ("no matches for kind" in low or "doesn't have a resource type" in low) and "ray" in low:
        hint = (
            "the KubeRay CRDs are not installed: install the KubeRay operator (check: nymph dockyard doctor)"
        )
    elif isinstance(kind, NotFound) and "namespaces" in low and namespace:
        hint = f"create the namespace first (kubectl create namespace {namespace}) or set infra.namespace"
    elif isinstance(kind, Forbidden):
        hint = "ask an administrator for the RBAC this needs (nymph dockyard doctor lists what is missing)"
    elif isinstance(kind, Unauthorized):
        hint = "the credentials were rejected: refresh them or pick another --context / --kubeconfig"
    elif isinstance(kind, Unavailable) or "was refused" in low or "no such host" in low:
        hint = "cannot reach the API server: check --kubeconfig / --context and that the cluster is up"
    elif "no configuration has been provided" in low or ("stat " in low and "no such file" in low):
        hint = "no usable kubeconfig: pass --kubeconfig FILE or set KUBECONFIG"
    else:
        hint = ""
    return DockyardLiveError(f"{doing}: {reason}" + (f" ({hint})" if hint else ""))


def in_cluster(kubeconfig: str | None, env: Mapping[str, str] | None = None) -> bool:
    """Running in a Pod with its own ServiceAccount (no kubeconfig named anywhere)."""
    env = os.environ if env is None else env
    return bool(env.get("KUBERNETES_SERVICE_HOST")) and not kubeconfig and not env.get("KUBECONFIG")


@dataclass
class Kube:
    kubectl: Kubectl

    @classmethod
    def connect(cls, *, kubeconfig: str | None, context: str | None, timeout: float = 60.0) -> Kube:
        return cls(Kubectl(kubeconfig=kubeconfig, context=context, timeout=timeout))

    async def _run(
        self, args: Sequence[str], *, doing: str, namespace: str | None = None, stdin: str | None = None
    ) -> str:
        res = await self.kubectl.run(args, stdin=stdin)
        if res.code != 0:
            raise explain(res.stderr or res.stdout, doing=doing, namespace=namespace)
        return res.stdout

    async def _json(self, args: Sequence[str], *, doing: str, namespace: str | None = None) -> Any:
        out = await self._run([*args, "-o", "json"], doing=doing, namespace=namespace)
        try:
            return json.loads(out) if out.strip() else None
        except ValueError:
            raise DockyardLiveError(f"{doing}: kubectl did not print JSON") from None

    # -- reads -----------------------------------------------------------------------------

    async def server_version(self) -> str:
        doc = await self._json(["version"], doing="reach the API server")
        server = (doc or {}).get("serverVersion") or {}
        return str(server.get("gitVersion") or "unknown")

    async def get(self, resource: str, name: str, *, namespace: str | None) -> dict[str, Any] | None:
        """One object, or ``None`` when it does not exist."""
        args = ["get", resource, name, "--ignore-not-found"]
        if namespace:
            args += ["-n", namespace]
        doc = await self._json(args, doing=f"get {resource}/{name}", namespace=namespace)
        return doc if isinstance(doc, dict) and doc else None

    async def probe(
        self, resource: str, name: str, *, namespace: str | None
    ) -> tuple[str, dict[str, Any] | None]:
        """``("present", obj)``, ``("absent", None)`` or ``(reason, None)`` when it cannot be
        told (forbidden, ...), never raising for those."""
        args = ["get", resource, name, "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        res = await self.kubectl.run(args)
        if res.code == 0:
            return "present", json.loads(res.stdout)
        err = classify_kubectl(res.stderr)
        if isinstance(err, NotFound) and "doesn't have a resource type" not in res.stderr:
            return "absent", None
        if isinstance(err, Forbidden):
            return "forbidden", None
        return _first_line(res.stderr), None

    async def get_many(self, manifests: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
        """The live objects of ``manifests`` that exist, keyed by ``Kind/name``."""
        if not manifests:
            return {}
        out = await self._run(
            ["get", "-f", "-", "--ignore-not-found", "-o", "json"],
            stdin=to_yaml_stream([dict(m) for m in manifests]),
            doing="read the live objects",
        )
        return {ref(i): i for i in json_items(out)}

    async def list_objects(
        self, resource: str, *, namespace: str | None, selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Objects of a resource in a namespace (``None``: all namespaces)."""
        args = ["get", resource]
        args += ["-n", namespace] if namespace else ["--all-namespaces"]
        if selector:
            args += ["-l", selector]
        doc = await self._json(args, doing=f"list {resource}", namespace=namespace)
        return [i for i in (doc or {}).get("items") or [] if isinstance(i, dict)]

    async def raw(self, path: str) -> Any | None:
        """``kubectl get --raw PATH`` as JSON, ``None`` on 404."""
        res = await self.kubectl.run(["get", "--raw", path])
        if res.code != 0:
            if isinstance(classify_kubectl(res.stderr), NotFound) or "not found" in res.stderr.lower():
                return None
            raise explain(res.stderr, doing=f"read {path}")
        try:
            return json.loads(res.stdout)
        except ValueError:
            raise DockyardLiveError(f"read {path}: not JSON") from None

    async def access_reviews(self, checks: Sequence[tuple[str, str, str]], *, namespace: str) -> list[bool]:
        """SelfSubjectAccessReviews for ``(verb, group, resource)`` in ``namespace``, in one call."""
        reviews = [
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "spec": {
                    "resourceAttributes": {
                        "namespace": namespace,
                        "verb": verb,
                        "group": group,
                        **_resource_parts(resource),
                    }
                },
            }
            for verb, group, resource in checks
        ]
        out = await self._run(
            ["create", "--validate=false", "-f", "-", "-o", "json"],
            stdin=to_yaml_stream(reviews),
            doing="review access (SelfSubjectAccessReview)",
        )
        items = json_items(out)
        if len(items) != len(reviews):
            raise DockyardLiveError(f"review access: {len(items)} answers to {len(reviews)} reviews")
        return [bool((i.get("status") or {}).get("allowed")) for i in items]

    # -- writes ----------------------------------------------------------------------------

    async def apply(
        self, manifests: Sequence[Mapping[str, Any]], *, dry_run: bool = False, namespace: str | None = None
    ) -> list[dict[str, Any]]:
        """Server-side apply (field manager ``nymph``) in one call; every rejected object is
        reported, then one error is raised."""
        if not manifests:
            return []
        outcomes = await self.kubectl.apply(manifests, dry_run=dry_run)
        failed = [(m, o.error) for m, o in zip(manifests, outcomes, strict=True) if o.error is not None]
        if failed:
            first_manifest, first_error = failed[0]
            assert first_error is not None
            doing = "server dry run of" if dry_run else "apply"
            err = explain(first_error, doing=f"{doing} {ref(first_manifest)}", namespace=namespace)
            others = f" and {len(failed) - 1} more rejected" if len(failed) > 1 else ""
            raise DockyardLiveError(f"{err}{others}")
        return [dict(o.live() or {}) for o in outcomes]

    async def create(self, manifest: Mapping[str, Any], *, namespace: str | None = None) -> None:
        """``kubectl create -f -`` of one object (its content on stdin only)."""
        await self._run(
            ["create", "-f", "-", "-o", "name"],
            stdin=to_yaml_stream([dict(manifest)]),
            doing=f"create {ref(manifest)}",
            namespace=namespace,
        )

    async def patch_stdin(self, resource: str, name: str, patch: str, *, namespace: str) -> None:
        """A JSON merge patch read from stdin (so its content is never on a command line)."""
        await self._run(
            [
                "patch",
                resource,
                name,
                "-n",
                namespace,
                "--type=merge",
                "--patch-file=/dev/stdin",
                "-o",
                "name",
            ],
            stdin=patch,
            doing=f"patch {resource}/{name}",
            namespace=namespace,
        )

    async def differs(self, manifest: Mapping[str, Any], *, namespace: str | None = None) -> bool:
        """Whether applying ``manifest`` would change the live object (``kubectl diff
        --server-side``: exit 0 same, 1 different)."""
        res = await self.kubectl.run(
            ["diff", "--server-side", "--field-manager=nymph", "--force-conflicts", "-f", "-"],
            stdin=to_yaml_stream([dict(manifest)]),
        )
        if res.code in (0, 1):
            return res.code == 1
        raise explain(res.stderr or res.stdout, doing=f"diff {ref(manifest)}", namespace=namespace)

    async def delete(
        self, manifests: Sequence[Mapping[str, Any]], *, wait: bool, timeout: float = 120.0
    ) -> list[str]:
        """Delete the objects of ``manifests`` in the given order (absent ones are skipped);
        returns ``kind/name`` of those deleted. ``wait``: until they are gone (what they own,
        such as a Deployment's Pods, is then being deleted by the garbage collector)."""
        if not manifests:
            return []
        args = ["delete", "-f", "-", "--ignore-not-found", "-o", "name", f"--wait={str(wait).lower()}"]
        if wait:
            args.append(f"--timeout={int(timeout)}s")
        out = await self._run(args, stdin=to_yaml_stream([dict(m) for m in manifests]), doing="delete")
        return [line.strip() for line in out.splitlines() if line.strip()]

    # -- streams ---------------------------------------------------------------------------

    def argv(self, args: Sequence[str]) -> list[str]:
        """kubectl argv for long-lived calls (no request timeout)."""
        argv = [self.kubectl.binary]
        if self.kubectl.kubeconfig:
            argv.append(f"--kubeconfig={self.kubectl.kubeconfig}")
        if self.kubectl.context:
            argv.append(f"--context={self.kubectl.context}")
        return argv + list(args)

    async def stream(self, args: Sequence[str], *, doing: str, namespace: str | None = None) -> None:
        """Run kubectl copying its stdout line by line to ours (``logs -f``)."""
        proc = await asyncio.create_subprocess_exec(
            *self.argv(args),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        err_task = asyncio.ensure_future(proc.stderr.read())
        try:
            async for line in proc.stdout:
                sys.stdout.write(line.decode(errors="replace"))
                sys.stdout.flush()
            code = await proc.wait()
        except asyncio.CancelledError:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        finally:
            stderr = (await err_task).decode(errors="replace")
        if code != 0:
            raise explain(stderr, doing=doing, namespace=namespace)


def json_items(text: str) -> list[dict[str, Any]]:
    """Objects in kubectl's JSON output: one object, a ``List``, or several objects in a row
    (``kubectl create -o json`` with many documents)."""
    decoder = json.JSONDecoder()
    out: list[dict[str, Any]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        try:
            doc, end = decoder.raw_decode(text, pos)
        except ValueError:
            raise DockyardLiveError("kubectl printed something that is not JSON") from None
        if isinstance(doc, dict) and doc.get("kind") == "List":
            out.extend(i for i in doc.get("items") or [] if isinstance(i, dict))
        elif isinstance(doc, dict) and doc:
            out.append(doc)
        pos = end
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


def _resource_parts(resource: str) -> dict[str, str]:
    name, _, sub = resource.partition("/")
    return {"resource": name, "subresource": sub} if sub else {"resource": name}
