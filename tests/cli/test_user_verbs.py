"""The user verbs (``nymph providers|modes|launch|instances|stop|logs``) against a real server."""

from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path

import pytest

from nymph.client import QueueClient
from tests.support.queue_helpers import Served
from tests.support.queue_helpers import run_cli as run

pytestmark = pytest.mark.usefixtures("cli_isolated")


def test_verbs_round_trip(env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(
        capsys,
        "providers",
        "add",
        "kind",
        "--launcher",
        "Kube",
        "--dispatch",
        "daemon",
        "--kwarg",
        "namespace=jobs",
    )
    assert code == 0 and "provider kind saved in namespace default" in out
    code, _, err = run(capsys, "providers", "add", "bad", "--launcher", "k8s")
    assert code == 2 and "'Kube'" in err
    code, out, _ = run(capsys, "providers", "list")
    assert code == 0 and out.splitlines()[0].split()[:3] == ["NAME", "LAUNCHER", "DISPATCH"]
    assert out.splitlines()[1].split() == ["kind", "Kube", "daemon", "jobs"]
    code, out, _ = run(capsys, "providers", "show", "kind")
    assert code == 0 and "launcher: Kube" in out and "namespace: jobs" in out
    code, out, _ = run(
        capsys,
        "modes", "add", "small", "--provider", "kind",
        "--field", "image=python:3.12-slim", "--field", 'resources={"limits": {"cpu": "1"}}',
    )  # fmt: skip
    assert code == 0, out
    code, out, _ = run(capsys, "modes", "list")
    assert out.splitlines()[1].split() == ["small", "kind", "python:3.12-slim"]
    code, out, _ = run(capsys, "modes", "show", "small")
    assert "cpu: '1'" in out

    (tmp_path / "job.py").write_text("print('hello')\n")
    code, out, _ = run(
        capsys,
        "launch",
        "kind",
        "--mode",
        "small",
        "--script",
        "job.py",
        "--tag",
        "team=ml",
        "--env",
        "EPOCHS=3",
    )
    assert code == 0
    iid = out.strip()
    assert iid.startswith("lakeshore-") and len(out.splitlines()) == 1
    code, _, err = run(capsys, "launch", "kind", "--mode", "small", "--script", "missing.py")
    assert code == 2 and "missing.py: no such file" in err
    code, _, err = run(
        capsys, "launch", "kind", "--mode", "small", "--script", "job.py", "--tag", "bad key=x"
    )
    assert code == 2 and "tags.bad key" in err and "(HTTP 400)" in err

    code, out, _ = run(capsys, "instances", "kind")
    assert code == 0 and iid in out and "queued" in out
    code, out, _ = run(capsys, "providers", "instances", "kind", "--state", "running")
    assert out.strip() == "no instances"
    code, out, _ = run(capsys, "stop", "kind", iid)
    assert code == 0 and f"stop requested for {iid}" in out
    code, out, _ = run(capsys, "instances", "kind", "--state", "stopped")
    assert iid in out and "Stopped" in out

    code, out, err = run(capsys, "logs", "kind", iid)
    assert code == 0 and out == "" and f"no logs for {iid}: it never ran (Stopped" in err

    # A log tail comes from the daemon that runs the instance: one it claimed and applied.
    code, out, _ = run(capsys, "launch", "kind", "--mode", "small", "--script", "job.py")
    ran = out.strip()

    async def upload() -> None:
        async with env.client(env.daemon_token) as d:
            [task] = await d.claim(daemon_id="d1", node="n1", capacity=1, wait=5)
            assert task["instanceId"] == ran
            await d.complete(daemon_id="d1", task_id=task["taskId"], ok=True)
            await d.upload_logs(daemon_id="d1", instance_id=ran, logs="hello\n")

    env.run(upload())
    code, out, _ = run(capsys, "logs", "kind", ran)
    assert code == 0 and out == "hello\n"
    code, _, err = run(capsys, "stop", "kind", "lakeshore-00000000")
    assert code == 2 and "no instance 'lakeshore-00000000'" in err

    assert run(capsys, "modes", "rm", "small")[0] == 0
    assert run(capsys, "providers", "rm", "kind")[0] == 0
    code, _, err = run(capsys, "providers", "show", "kind")
    assert code == 2 and "no provider 'kind'" in err and "(HTTP 404)" in err


async def _fake_daemon(served: Served, final: list[tuple[str, str | None]]) -> None:
    async with served.client(served.daemon_token) as d:
        [task] = await d.claim(daemon_id="fd", node="n1", capacity=1, wait=20)
        await d.complete(daemon_id="fd", task_id=task["taskId"], ok=True)
        for seq, (state, reason) in enumerate(final, 1):
            await asyncio.sleep(0.1)
            report = {"seq": seq, "instanceId": task["instanceId"], "state": state, "reason": reason}
            await d.report(daemon_id="fd", stream="fd", reports=[report])


async def _setup(served: Served) -> None:
    async with served.client(served.user_token) as u:
        await u.create_provider(name="kind", kwargs={"namespace": "jobs"}, dispatch="daemon")
        await u.create_mode(name="small", provider="kind", fields={"image": "python:3.12-slim"})


@pytest.mark.parametrize(("reason", "code"), [("Error", 1), ("Completed", 0)])
def test_launch_wait_shows_each_state(
    env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path, reason: str, code: int
) -> None:
    env.run(_setup(env))
    daemon = env.spawn(_fake_daemon(env, [("starting", None), ("running", None), ("stopped", reason)]))
    (tmp_path / "job.py").write_text("print(1)\n")
    got, out, err = run(capsys, "launch", "kind", "--mode", "small", "--script", "job.py", "--wait")
    daemon.result(10)
    assert got == code
    assert out.strip().startswith("lakeshore-")
    states = [m[1] for m in re.finditer(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  (\w+)", err, re.M)]
    assert states == ["queued", "starting", "running", "stopped"]
    assert f"stopped ({reason})" in err
    assert ("failed: Error" in err) == (code == 1)


def test_providers_test_without_a_daemon_says_so(env: Served, capsys: pytest.CaptureFixture[str]) -> None:
    env.run(_setup(env))
    code, _, err = run(capsys, "providers", "test", "kind", "--timeout", "0.5")
    assert code == 2
    assert "no daemon picked up probe" in err and "within 0.5s" in err


@pytest.mark.parametrize("ok", [True, False])
def test_providers_test_prints_each_check(env: Served, capsys: pytest.CaptureFixture[str], ok: bool) -> None:
    env.run(_setup(env))

    async def prober() -> None:
        async with env.client(env.daemon_token) as d:
            [task] = await d.claim(daemon_id="fd", node="n1", capacity=1, wait=20)
            assert task["kind"] == "probe"
            checks = [
                {"name": "daemon reachable", "ok": True, "detail": "fd on n1"},
                {"name": "dry-run apply", "ok": ok, "detail": "accepted" if ok else "forbidden"},
            ]
            await d.complete(
                daemon_id="fd",
                task_id=task["taskId"],
                ok=ok,
                error=None if ok else "dry-run apply",
                result={"checks": checks},
            )

    fut = env.spawn(prober())
    code, out, _ = run(capsys, "providers", "test", "kind", "--mode", "small", "--timeout", "10")
    fut.result(10)
    assert code == (0 if ok else 1)
    assert "ok    daemon reachable: fd on n1" in out
    assert ("ok    dry-run apply: accepted" in out) == ok
    assert ("FAIL  dry-run apply: forbidden" in out) == (not ok)
    assert out.strip().endswith("ok" if ok else "FAILED")


def test_unreachable_queue_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = run(capsys, "providers", "list", "--url", f"http://127.0.0.1:{port}")
    assert code == 2 and out == ""
    assert err.strip() == (
        f"nymph: error: cannot reach the queue at http://127.0.0.1:{port}: is `nymph queue serve` running?"
    )


def test_url_and_token_from_dreamrc_and_flags(
    served: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".dreamrc").write_text(f"server:\n  url: {served.url}\n  token: {served.user_token}\n")
    code, out, _ = run(capsys, "providers", "list", "--namespace", "team-a")
    assert code == 0 and "no providers in namespace team-a" in out
    bad = "nyq_wrong-token-for-this-queue-000000"
    code, _, err = run(capsys, "providers", "list", "--token", bad)
    assert code == 2 and "token is not known" in err and bad not in err
    monkeypatch.setenv("NYMPH_TOKEN", bad)
    code, _, err = run(capsys, "providers", "list")
    assert code == 2 and "(HTTP 401)" in err
    code, _, _ = run(capsys, "providers", "list", "--token", served.user_token)
    assert code == 0


def test_a_bad_provider_entry_in_dreamrc_does_not_break_a_command_that_needs_only_its_server(
    served: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / ".dreamrc").write_text(
        f"server:\n  url: {served.url}\n  token: {served.user_token}\n"
        "providers:\n  broken: !providers.K8s {}\n"
    )
    code, out, err = run(capsys, "providers", "list", "--namespace", "team-a")
    assert code == 0, err
    assert "no providers in namespace team-a" in out


def test_client_repr_hides_the_token() -> None:
    c = QueueClient(base_url="http://user:pw@127.0.0.1:1", token="nyq_secret-value-123456")
    assert "secret" not in repr(c) and "pw" not in repr(c)


def test_serve_imports_a_token_from_a_file(tmp_path: Path) -> None:
    import subprocess
    import sys
    import urllib.request

    from nymph.localcluster.cluster import free_port

    token_file = tmp_path / "token"
    token_file.write_text("nyq_shared-secret-from-a-kubernetes-secret\n")
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "nymph.cli",
        "queue",
        "serve",
        "--db",
        str(tmp_path / "q.db"),
        "--listen",
        f"127.0.0.1:{port}",
    ]
    bad = subprocess.run(
        [*argv, "--import-token", "root:" + str(token_file)], capture_output=True, text=True, timeout=30
    )
    assert bad.returncode == 2 and "expected ROLE:FILE" in bad.stderr
    proc = subprocess.Popen(
        [*argv, "--import-token", f"daemon:{token_file}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        import time

        deadline = time.monotonic() + 20
        while True:
            try:
                # The imported token is a daemon (bootstrap) token: it may register a session.
                req = urllib.request.Request(
                    f"http://127.0.0.1:{port}/v1/dispatch/register",
                    data=b'{"daemonId": "d1", "node": "n1"}',
                    headers={
                        "Authorization": "Bearer nyq_shared-secret-from-a-kubernetes-secret",
                        "Content-Type": "application/json",
                    },
                )
                with urllib.request.urlopen(req, timeout=2) as resp:
                    assert resp.status == 201
                    break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert b"shared-secret" not in err


EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"


def test_launch_dockyard_verb(env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    env.run(_setup(env))
    recipe = str(EXAMPLES / "dockyard-grpo-vllm.yaml")
    infra = str(EXAMPLES / "dockyard-grpo-vllm.infra.yaml")
    code, out, err = run(
        capsys, "launch-dockyard", "kind", recipe, "--infra", infra, "--set", "infra.sandbox.replicas=2"
    )
    assert code == 0, err
    iid = out.strip()
    assert iid.startswith("lakeshore-")

    async def claim() -> dict[str, object]:
        async with env.client(env.daemon_token) as d:
            [task] = await d.claim(daemon_id="fd", node="n1", capacity=1, wait=5)
            return dict(task)

    task = env.run(claim())
    assert task["kind"] == "dockyard" and task["instanceId"] == iid
    spec = task["spec"]
    assert isinstance(spec, dict) and spec["overrides"] == ["infra.sandbox.replicas=2"]
    assert spec["infra"]["_anchors"]["gpu_nodes"] == {"nvidia.com/gpu.present": "true"}  # anchors expanded

    # Refused by the queue (it renders first), naming the key; refused locally for bad files.
    code, _, err = run(
        capsys, "launch-dockyard", "kind", recipe, "--infra", infra, "--set", "infra.colour=red"
    )
    assert code == 2 and "infra.colour" in err and "(HTTP 400)" in err
    code, _, err = run(capsys, "launch-dockyard", "kind", "missing.yaml")
    assert code == 2 and "missing.yaml" in err and "no such file" in err
    (tmp_path / "list.yaml").write_text("- a\n")
    code, _, err = run(capsys, "launch-dockyard", "kind", "list.yaml")
    assert code == 2 and "list.yaml: expected a mapping" in err
    (tmp_path / "child.yaml").write_text("defaults: [base.yaml]\n")
    code, _, err = run(capsys, "launch-dockyard", "kind", "child.yaml")
    assert code == 2 and "defaults:" in err
    (tmp_path / "dated.yaml").write_text("when: 2024-01-01\n")
    code, _, err = run(capsys, "launch-dockyard", "kind", "dated.yaml")
    assert code == 2 and "quote dates" in err


async def _fake_dockyard_daemon(served: Served, final: list[tuple[str, str | None]], *, ok: bool) -> None:
    async with served.client(served.daemon_token) as d:
        [task] = await d.claim(daemon_id="fd", node="n1", capacity=1, wait=20)
        for seq, (state, reason) in enumerate(final, 1):
            await asyncio.sleep(0.1)
            report = {"seq": seq, "instanceId": task["instanceId"], "state": state, "reason": reason}
            await d.report(daemon_id="fd", stream="fd", reports=[report])
        await d.complete(daemon_id="fd", task_id=task["taskId"], ok=ok, error=None if ok else "Forbidden")


@pytest.mark.parametrize("ok", [True, False])
def test_launch_dockyard_wait_returns_once_running(
    env: Served, capsys: pytest.CaptureFixture[str], ok: bool
) -> None:
    env.run(_setup(env))
    final: list[tuple[str, str | None]] = [("starting", None)] + ([("running", None)] if ok else [])
    daemon = env.spawn(_fake_dockyard_daemon(env, final, ok=ok))
    recipe = str(EXAMPLES / "dockyard-grpo-vllm.yaml")
    infra = str(EXAMPLES / "dockyard-grpo-vllm.infra.yaml")
    got, out, err = run(capsys, "launch-dockyard", "kind", recipe, "--infra", infra, "--wait")
    daemon.result(10)
    assert got == (0 if ok else 1), err
    assert out.strip().startswith("lakeshore-")
    states = [m[1] for m in re.finditer(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d  (\w+)", err, re.M)]
    assert states == (["queued", "starting", "running"] if ok else ["queued", "starting", "stopped"])


def test_providers_and_modes_that_cannot_launch_yet_are_saved_with_a_warning(
    env: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    """A direct provider without a kubeconfig and a mode without an image are saved (exit 0),
    and stderr says what is missing and what to do; a complete one prints no warning."""
    code, out, err = run(capsys, "providers", "add", "bare", "--launcher", "Kube")
    assert code == 0 and "provider bare saved" in out
    assert "without a kubeconfig" in err and "--kwarg kubeconfig=" in err and "--dispatch daemon" in err
    code, _, err = run(capsys, "providers", "add", "kind", "--launcher", "Kube", "--dispatch", "daemon")
    assert code == 0 and "warning" not in err
    code, out, err = run(capsys, "modes", "add", "noimage", "--provider", "kind")
    assert code == 0 and "mode noimage saved" in out
    assert "has no image" in err and "--field image=IMAGE" in err
    code, _, err = run(capsys, "modes", "add", "ok", "--provider", "kind", "--field", "image=busybox")
    assert code == 0 and "warning" not in err
