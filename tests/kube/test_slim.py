"""The generated Kubernetes client loads one class at a time, and still offers every name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    import asyncio, json, sys
    from nymph.kube import slim
    slim.install()  # what nymph.cli.main does once the command is known
    import nymph.cli.daemon, nymph.daemon.daemon  # what the daemon process imports at start
    at_start = sum(m.startswith("kubernetes_asyncio") for m in sys.modules)
    import kubernetes_asyncio
    from kubernetes_asyncio import client, config, watch, dynamic
    from kubernetes_asyncio.client import ApiClient, V1Pod
    from kubernetes_asyncio.client.exceptions import ApiException

    async def deserialize():
        api = ApiClient()
        class R:
            data = json.dumps({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}})
        pod = api.deserialize(R(), "V1Pod")
        await api.close()
        return pod

    pod = asyncio.run(deserialize())
    try:
        client.NoSuchThing
        missing = False
    except AttributeError:
        missing = True
    print(json.dumps({
        "at_start": at_start,
        "pod": type(pod).__name__, "name": pod.metadata.name,
        "container": type(pod.spec.containers[0]).__name__,
        "same": client.models.V1Pod is V1Pod and kubernetes_asyncio.client is client,
        "core": client.CoreV1Api.__name__, "auth": client.V1SelfSubjectAccessReview.__name__,
        "version": kubernetes_asyncio.__version__ == client.__version__,
        "dynamic": dynamic.DynamicClient.__name__, "watch": watch.Watch.__name__,
        "exc": issubclass(ApiException, Exception), "missing": missing,
        "listed": "CoreV1Api" in dir(client),
    }))
    """
)


def test_daemon_start_loads_only_what_it_uses_and_every_name_resolves() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=dict(os.environ),
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # The full package is about 850 modules; the daemon needs a few dozen.
    assert got["at_start"] < 100, got
    assert got["pod"] == "V1Pod" and got["name"] == "p" and got["container"] == "V1Container"
    assert got["same"] and got["version"] and got["exc"] and got["missing"] and got["listed"]
    assert (got["core"], got["auth"], got["dynamic"], got["watch"]) == (
        "CoreV1Api",
        "V1SelfSubjectAccessReview",
        "DynamicClient",
        "Watch",
    )


def test_only_the_command_installs_them_and_installing_again_changes_nothing() -> None:
    probe = textwrap.dedent(
        """
        import json, sys
        import nymph.launch.render, nymph.dockyard.render  # a library user: no Kubernetes client
        library = [m for m in sys.modules if m.startswith("kubernetes_asyncio")]
        import nymph.cli
        nymph.cli.build_parser()  # building the parser installs nothing either
        library += [m for m in sys.modules if m.startswith("kubernetes_asyncio")]
        from nymph.kube import slim
        slim.install()  # what nymph.cli.main does once the command is known
        before = {name: sys.modules[name] for name in slim.PACKAGES}
        again = slim.install()
        print(json.dumps({
            "library": library, "again": again,
            "same": all(sys.modules[name] is before[name] for name in slim.PACKAGES),
        }))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"library": [], "again": True, "same": True}
