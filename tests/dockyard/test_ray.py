"""Job submission against a real local Ray head (the ``ray`` wheel, started by ``ray_head``):
the Jobs REST client, the ``job`` verbs, and ``run`` in bringup / attach mode with
``--ray-address`` (the RayCluster and sandbox pool go to the real test API server)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.cli import main
from nymph.dockyard.errors import DockyardLiveError
from nymph.dockyard.live.rayapi import JobInfo, RayJobsClient
from nymph.localcluster import LocalCluster
from tests.support.live_helpers import live_infra

pytestmark = pytest.mark.slow
KUBE = pytest.mark.e2e  # these also use the local API server

OK_ENTRYPOINT = "python -c \"print('dockyard-ok')\""


async def finished(ray: RayJobsClient, job_id: str) -> JobInfo:
    seen: list[str] = []
    info = await ray.follow(
        job_id, on_change=lambda i: seen.append(str(i["status"])), interval=0.2, deadline=asyncio.get_running_loop().time() + 120
    )  # fmt: skip
    assert seen[-1] == info["status"]
    return info


# -- the REST client -----------------------------------------------------------------------------


async def test_submit_list_logs(ray_head: str) -> None:
    async with RayJobsClient(ray_head) as ray:
        version = await ray.version()
        assert version["ray_version"]
        job_id = await ray.submit(
            entrypoint=OK_ENTRYPOINT,
            runtime_env={"env_vars": {"DOCKYARD_X": "42"}},
            metadata={"submitted-by": "nymph-dockyard"},
        )
        info = await finished(ray, job_id)
        assert info["status"] == "SUCCEEDED"
        assert info["metadata"] == {"submitted-by": "nymph-dockyard"}
        assert info["runtime_env"]["env_vars"] == {"DOCKYARD_X": "42"}
        assert "dockyard-ok" in await ray.logs(job_id)
        listed = {j["submission_id"]: j for j in await ray.jobs()}
        assert listed[job_id]["status"] == "SUCCEEDED"
        assert listed[job_id]["entrypoint"] == OK_ENTRYPOINT


async def test_runtime_env_reaches_the_driver(ray_head: str) -> None:
    async with RayJobsClient(ray_head) as ray:
        job_id = await ray.submit(
            entrypoint="python -c \"import os; print('x=' + os.environ['DOCKYARD_X'])\"",
            runtime_env={"env_vars": {"DOCKYARD_X": "from-infra"}},
            submission_id="dockyard-env-check",
        )
        assert job_id == "dockyard-env-check"
        assert (await finished(ray, job_id))["status"] == "SUCCEEDED"
        assert "x=from-infra" in await ray.logs(job_id)


async def test_stop_and_tail(ray_head: str) -> None:
    async with RayJobsClient(ray_head) as ray:
        job_id = await ray.submit(
            entrypoint="python -u -c \"import time; print('started', flush=True); time.sleep(60)\""
        )
        chunks: list[str] = []

        async def tail() -> None:
            async for chunk in ray.tail(job_id):
                chunks.append(chunk)

        tailing = asyncio.ensure_future(tail())
        for _ in range(200):
            if "started" in "".join(chunks):
                break
            await asyncio.sleep(0.1)
        assert "started" in "".join(chunks)
        assert await ray.stop(job_id) is True
        assert (await finished(ray, job_id))["status"] == "STOPPED"
        await asyncio.wait_for(tailing, 30)  # the socket closes when the job ends
        assert await ray.stop(job_id) is False


async def test_errors_are_one_line(ray_head: str) -> None:
    async with RayJobsClient(ray_head) as ray:
        with pytest.raises(
            DockyardLiveError, match=r"^no Ray job 'nope' on http://127\.0\.0\.1:\d+ \(list them"
        ):
            await ray.logs("nope")
        with pytest.raises(DockyardLiveError, match="no Ray job 'nope'"):
            await ray.stop("nope")
        await ray.submit(entrypoint="true", submission_id="dockyard-dup")
        with pytest.raises(DockyardLiveError, match=r"^submit: .* answered HTTP 500: .*already exists"):
            await ray.submit(entrypoint="true", submission_id="dockyard-dup")
    async with RayJobsClient("127.0.0.1:1") as nowhere:
        with pytest.raises(
            DockyardLiveError, match=r"^list jobs: cannot reach the Ray dashboard at http://127\.0\.0\.1:1"
        ):
            await nowhere.jobs()


# -- the job verbs -------------------------------------------------------------------------------


Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], cli_env: None) -> Cli:
    def run(*argv: str) -> tuple[int, str, str]:
        code = main(["dockyard", *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_job_verbs(ray_head: str, cli: Cli) -> None:
    async def submit() -> tuple[str, str]:
        async with RayJobsClient(ray_head) as ray:
            ok = await ray.submit(entrypoint=OK_ENTRYPOINT)
            await finished(ray, ok)
            long = await ray.submit(entrypoint="sleep 60")
            return ok, long

    ok, long = asyncio.run(submit())
    code, out, err = cli("job", "list", "--ray-address", ray_head)
    assert (code, err) == (0, "")
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines()[1:]}
    assert out.splitlines()[0].split()[:2] == ["SUBMISSION", "ID"]
    assert rows[ok][1] == "SUCCEEDED"

    code, out, _ = cli("job", "logs", ok, "--ray-address", ray_head)
    assert code == 0 and "dockyard-ok" in out

    code, out, err = cli("job", "stop", long, "--ray-address", ray_head, "--poll", "0.2")
    assert (code, err) == (0, "")
    assert f"stop requested for Ray job {long}" in out
    assert out.splitlines()[-1] == f"Ray job {long}: STOPPED"

    code, out, _ = cli("job", "logs", ok, "-f", "--ray-address", ray_head)
    assert code == 0 and "dockyard-ok" in out

    code, _, err = cli("job", "logs", "nope", "--ray-address", ray_head)
    assert code == 2 and err.startswith("nymph: error: no Ray job 'nope'")


# -- run in bringup / attach mode ------------------------------------------------------------------


INFRA: dict[str, Any] = live_infra(
    launch={"mode": "bringup", "entrypoint": OK_ENTRYPOINT, "env": {"DOCKYARD_X": "1"}}, sandbox_replicas=1
)


@pytest.fixture
def live(
    kube: LocalCluster, kuberay_crds: Path, namespace: str, ray_head: str, tmp_path: Path, cli: Cli
) -> Callable[..., tuple[int, str, str]]:
    """``live(verb, *overrides)`` on a recipe + infra pair in the test namespace, with the
    kubeconfig of the test cluster and ``--ray-address`` of the local head (run only)."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("grpo: {max_num_steps: 1}\n")
    infra = tmp_path / "run.infra.yaml"
    infra.write_text(yaml.safe_dump(INFRA))

    def run(*verb: str, extra: tuple[str, ...] = ()) -> tuple[int, str, str]:
        args = [str(recipe), "--infra", str(infra), f"infra.namespace={namespace}", *extra]
        tail = ["--ray-address", ray_head, "--poll", "0.2"] if verb[0] == "run" else []
        return cli(*verb, *args, "--kubeconfig", str(kube.kubeconfig), *tail)

    return run


def head_service(kube: LocalCluster, namespace: str, cluster: str = "grpo") -> None:
    """What the KubeRay operator would create for the cluster: its head Service."""
    kube.api(
        "POST",
        f"/api/v1/namespaces/{namespace}/services",
        {
            "metadata": {"name": f"{cluster}-head-svc"},
            "spec": {
                "selector": {"ray.io/cluster": cluster, "ray.io/node-type": "head"},
                "ports": [{"name": "dashboard", "port": 8265}],
            },
        },
    )


def submitted(out: str) -> str:
    found = re.search(r"submitted Ray job (\S+) to grpo", out)
    assert found, out
    return found.group(1)


@KUBE
def test_bringup_ensures_pool_and_cluster_then_submits(
    live: Callable[..., tuple[int, str, str]], kube: LocalCluster, namespace: str, ray_head: str
) -> None:
    head_service(kube, namespace)
    code, out, err = live("run")
    assert (code, err) == (0, "")
    lines = [ln.split("] ", 1)[-1] for ln in out.splitlines()]
    assert lines.index("sandbox pool sbx: 1/1 ready") < lines.index("RayCluster/grpo: applied")
    assert "RayCluster/grpo: applied" in lines
    job_id = submitted(out)
    assert lines[-1] == f"Ray job {job_id}: SUCCEEDED (Job finished successfully.)"
    rc = kube.api("GET", f"/apis/ray.io/v1/namespaces/{namespace}/rayclusters/grpo")
    assert rc["spec"]["workerGroupSpecs"][0]["groupName"] == "trainer"

    async def check() -> JobInfo:
        async with RayJobsClient(ray_head) as ray:
            assert "dockyard-ok" in await ray.logs(job_id)
            return await ray.info(job_id)

    info = asyncio.run(check())
    assert info["metadata"]["dockyard-cluster"] == "grpo"
    assert info["runtime_env"]["env_vars"] == {"DOCKYARD_X": "1"}


@KUBE
def test_bringup_waits_for_the_head_service(
    live: Callable[..., tuple[int, str, str]], kube: LocalCluster, namespace: str
) -> None:
    code, _, err = live("run", "--no-wait", "--timeout", "1")
    assert code == 2
    assert "no head service grpo-head-svc for RayCluster grpo in time" in err


@KUBE
def test_failed_job_exits_1_with_its_last_log_lines(
    live: Callable[..., tuple[int, str, str]], kube: LocalCluster, namespace: str
) -> None:
    head_service(kube, namespace)
    failing = "infra.launch.entrypoint=python -c \"import sys; print('bad-input'); sys.exit(3)\""
    code, out, err = live("run", "--no-wait", extra=(failing,))
    assert (code, err) == (0, "")  # --no-wait: submitted, not followed
    assert "not following (--no-wait)" in out
    code, out, err = live("run", extra=(failing,))
    assert (code, err) == (1, "")
    assert re.search(r"Ray job \S+: FAILED", out)
    assert "bad-input" in out.split("log lines of", 1)[1]


@KUBE
def test_attach_submits_to_the_named_cluster(
    live: Callable[..., tuple[int, str, str]], kube: LocalCluster, namespace: str
) -> None:
    code, _, err = live("run", extra=("infra.launch.mode=attach", "infra.launch.attach=grpo"))
    assert code == 2 and "RayCluster grpo (launch.attach) not found" in err
    assert live("cluster", "up", "--no-wait")[0] == 0
    head_service(kube, namespace)
    code, out, err = live("run", extra=("infra.launch.mode=attach", "infra.launch.attach=grpo"))
    assert (code, err) == (0, "")
    assert "RayCluster/grpo: applied" not in out  # attach applies no cluster
    assert out.splitlines()[-1].endswith("SUCCEEDED (Job finished successfully.)")
