"""Teams sharing a cluster: which Kubernetes namespaces a team's launches may go to and which
ServiceAccounts they may run as, over real HTTP, refused when saved and again at launch."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.cli.queue import _ns_map
from nymph.errors import ConfigError
from nymph.queue.models import Role, TenancySettings
from tests.support.queue_helpers import FAST, Queue, open_queue

A = "/v1/namespaces/team-a"
IMAGE = {"image": "python:3.12-slim"}
EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
EXAMPLE_RECIPE = yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.yaml").read_text())
EXAMPLE_INFRA = yaml.safe_load((EXAMPLES / "dockyard-grpo-vllm.infra.yaml").read_text())


@pytest.fixture
async def q(tmp_path: Path) -> AsyncIterator[Queue]:
    """A queue whose operator gave team-a one extra Kubernetes namespace and one ServiceAccount."""
    tenancy = TenancySettings(
        kube_namespaces={"team-a": ("team-a", "a-gpu")},
        service_accounts={"team-a": ("trainer",)},
    )
    queue, runner = await open_queue(tmp_path, dataclasses.replace(FAST, tenancy=tenancy))
    try:
        yield queue
    finally:
        await queue.close()
        await runner.cleanup()


def provider(kube_ns: str | None, **extra: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"namespace": kube_ns} if kube_ns else {}
    return {"name": "k", "launcher": "Kube", "dispatch": "daemon", "kwargs": kwargs, **extra}


async def instances(q: Queue, path: str = A) -> list[Any]:
    r = await q.call("GET", path + "/providers/k/instances")
    assert r.status == 200, r.body
    return list(r.body["items"])


async def test_a_scoped_token_targets_only_its_mapped_kubernetes_namespaces(q: Queue) -> None:
    """Another team's Kubernetes namespace is a 400 naming the flag that would allow it; the
    mapped ones and the one of the team's own name are accepted."""
    team_a = await q.token(Role.USER, namespace="team-a")
    r = await q.call("POST", A + "/providers", token=team_a, json_body=provider("team-b"))
    assert r.status == 400 and r.body["error"] == "kube_namespace_refused", r.body
    assert "--kube-namespaces team-a=" in r.body["detail"] and "'team-b'" in r.body["detail"]
    assert (await q.call("GET", A + "/providers/k", token=team_a)).status == 404  # nothing saved
    for ns in ("team-a", "a-gpu"):
        r = await q.call("PUT", A + "/providers/k", token=team_a, json_body=provider(ns))
        assert r.status in (200, 201), r.body
    # a mode may name the namespace too: held to the same rule
    r = await q.call(
        "POST",
        A + "/modes",
        token=team_a,
        json_body={"name": "m", "provider": "k", "fields": {**IMAGE, "namespace": "kube-system"}},
    )
    assert r.status == 400 and r.body["error"] == "kube_namespace_refused", r.body


async def test_a_launch_is_checked_on_the_namespace_it_would_really_use(q: Queue) -> None:
    """A provider an unscoped token saved for another namespace (or one without a namespace,
    which means ``default``) cannot be used by a scoped token to launch there; nothing is queued."""
    team_a = await q.token(Role.USER, namespace="team-a")
    r = await q.call("POST", A + "/providers", json_body=provider("team-b"))  # unscoped: allowed
    assert r.status == 201, r.body
    r = await q.call("POST", A + "/modes", json_body={"name": "m", "provider": "k", "fields": IMAGE})
    assert r.status == 201, r.body
    body = {"mode": "m", "script": "print(1)\n"}
    r = await q.call("POST", A + "/providers/k/launch", token=team_a, json_body=body)
    assert r.status == 400 and r.body["error"] == "kube_namespace_refused", r.body
    assert await instances(q) == []
    r = await q.call("PUT", A + "/providers/k", json_body=provider(None))
    assert r.status == 200, r.body
    r = await q.call("POST", A + "/providers/k/launch", token=team_a, json_body=body)
    assert r.status == 400 and "'default'" in r.body["detail"], r.body
    # the unscoped token may launch anywhere
    r = await q.call("POST", A + "/providers/k/launch", json_body=body)
    assert r.status == 202, r.body
    assert len(await instances(q)) == 1
    # and a probe of the provider is held to the same rule
    r = await q.call("POST", A + "/providers/k/test", token=team_a, json_body={})
    assert r.status == 400 and r.body["error"] == "kube_namespace_refused", r.body


async def test_service_accounts_come_only_from_the_operators_list(q: Queue) -> None:
    """A ServiceAccount not allowed for the team is refused in a mode and in a launch's own
    fields, for every token; the allowed one renders into the Pod's serviceAccountName."""
    r = await q.call("POST", A + "/providers", json_body=provider("team-a"))
    assert r.status == 201, r.body
    for token in ("user", await q.token(Role.USER, namespace="team-a")):
        r = await q.call(
            "POST",
            A + "/modes",
            token=token,
            json_body={"name": "m", "provider": "k", "fields": {**IMAGE, "service_account": "nymph-daemon"}},
        )
        assert r.status == 400 and r.body["error"] == "service_account_refused", r.body
        assert "--service-account team-a=nymph-daemon" in r.body["detail"]
    r = await q.call(
        "POST",
        A + "/modes",
        json_body={"name": "m", "provider": "k", "fields": {**IMAGE, "service_account": "trainer"}},
    )
    assert r.status == 201, r.body
    bad = {"mode": "m", "script": "print(1)\n", "fields": {"service_account": "cluster-admin"}}
    r = await q.call("POST", A + "/providers/k/launch", json_body=bad)
    assert r.status == 400 and r.body["error"] == "service_account_refused", r.body
    assert await instances(q) == []
    r = await q.call("POST", A + "/providers/k/launch", json_body={"mode": "m", "script": "print(1)\n"})
    assert r.status == 202, r.body
    task = await q.store.db.read(
        lambda conn: conn.execute("SELECT spec FROM tasks WHERE kind = 'launch'").fetchone()
    )
    assert json.loads(task["spec"])["serviceAccount"] == "trainer"
    # another team's allow-list is not this team's
    B = "/v1/namespaces/team-b"
    await q.call("POST", B + "/providers", json_body=provider("team-b"))
    r = await q.call(
        "POST",
        B + "/modes",
        json_body={"name": "m", "provider": "k", "fields": {**IMAGE, "service_account": "trainer"}},
    )
    assert r.status == 400 and r.body["error"] == "service_account_refused", r.body


async def test_a_daemon_providers_modes_may_not_carry_a_connection(q: Queue) -> None:
    """``context`` or ``kubeconfig`` on a mode of a ``dispatch: daemon`` provider is a 400 when
    the mode is saved, and a launch of such a mode saved while its provider was direct is refused."""
    r = await q.call("POST", A + "/providers", json_body=provider("team-a", dispatch="direct"))
    assert r.status == 201, r.body
    early = {"name": "early", "provider": "k", "fields": {**IMAGE, "context": "prod"}}
    r = await q.call("POST", A + "/modes", json_body=early)
    assert r.status == 201, r.body  # a connection kwarg means something on a direct provider
    r = await q.call("PUT", A + "/providers/k", json_body=provider("team-a"))
    assert r.status == 200, r.body
    r = await q.call("POST", A + "/modes", json_body={**early, "name": "m"})
    assert r.status == 400 and r.body["error"] == "invalid_mode", r.body
    assert "context" in r.body["detail"] and "dispatch: daemon" in r.body["detail"]
    r = await q.call("POST", A + "/providers/k/launch", json_body={"mode": "early", "script": "print(1)\n"})
    assert r.status == 400 and "context" in r.body["detail"], r.body
    assert await instances(q) == []


async def test_env_names_nymph_reserves_are_refused_by_name(q: Queue) -> None:
    """A launch setting an env var of nymph's own prefix is a 400 naming it (never dropped unsaid)."""
    await q.call("POST", A + "/providers", json_body=provider("team-a"))
    await q.call("POST", A + "/modes", json_body={"name": "m", "provider": "k", "fields": IMAGE})
    body = {"mode": "m", "script": "print(1)\n", "env": {"NYMPH_WORKDIR": "/etc"}}
    r = await q.call("POST", A + "/providers/k/launch", json_body=body)
    assert r.status == 400 and "launch.env.NYMPH_WORKDIR" in r.body["detail"], r.body
    assert await instances(q) == []


async def test_a_dockyard_launch_is_held_to_the_same_namespaces(q: Queue) -> None:
    """A scoped token's dockyard launch through a provider of another namespace is refused
    before anything is rendered or queued."""
    team_a = await q.token(Role.USER, namespace="team-a")
    await q.call("POST", A + "/providers", json_body=provider("team-b"))
    r = await q.call("POST", A + "/providers/k/dockyard", token=team_a, json_body={"recipe": {}})
    assert r.status == 400 and r.body["error"] == "kube_namespace_refused", r.body
    assert await instances(q) == []


def test_the_mapping_flags_say_what_they_expect() -> None:
    """``--kube-namespaces`` and ``--service-account`` take NS=LIST / NS=NAME, repeatable and merged."""
    assert _ns_map(["team-a=a,b", "team-a=c", "team-b=b"], "--kube-namespaces", many=True) == {
        "team-a": ("a", "b", "c"),
        "team-b": ("b",),
    }
    assert _ns_map(["team-a=trainer"], "--service-account", many=False) == {"team-a": ("trainer",)}
    for bad in ("team-a", "Team=x", "team-a=", "team-a=a,,b", "=x"):
        with pytest.raises(ConfigError, match="expected NS="):
            _ns_map([bad], "--kube-namespaces", many=True)


async def test_a_dockyard_launch_runs_only_as_an_allowed_service_account(q: Queue) -> None:
    """Every pod a dockyard launch renders (sandbox pool and Ray pods) is held to the team's
    ServiceAccount list: the example infra's account is refused for team-a, its own accepted."""
    recipe, infra = EXAMPLE_RECIPE, dict(EXAMPLE_INFRA)
    infra.pop("namespace", None)
    await q.call("POST", A + "/providers", json_body=provider("team-a"))
    r = await q.call("POST", A + "/providers/k/dockyard", json_body={"recipe": recipe, "infra": infra})
    assert r.status == 400 and r.body["error"] == "service_account_refused", r.body
    assert "serviceAccountName" in r.body["detail"] and "'dockyard-rl'" in r.body["detail"]
    assert await instances(q) == []
    infra["serviceAccount"] = "trainer"
    r = await q.call("POST", A + "/providers/k/dockyard", json_body={"recipe": recipe, "infra": infra})
    assert r.status == 202, r.body
