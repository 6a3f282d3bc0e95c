"""``-o json|yaml`` on every list and show verb, ``nymph instance show``, the exit-code rule and
what ``nymph logs`` says of a Pod that cannot start, against a real queue (and a fake daemon)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.cli import build_parser
from nymph.cli.exitcodes import EXIT_CODES, each_parser
from nymph.cli.user import USER_COMMANDS
from tests.support.queue_helpers import Served
from tests.support.queue_helpers import run_cli as run

pytestmark = pytest.mark.usefixtures("cli_isolated")

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://10.0.0.1:6443"}}]
users: [{name: u, user: {token: s3cr3t-token-value}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


async def _catalog(served: Served) -> None:
    async with served.client(served.user_token) as u:
        await u.set_secret(name="prod-kube", value=KUBECONFIG)
        await u.create_provider(name="kind", kwargs={"namespace": "jobs"}, dispatch="daemon")
        await u.create_provider(
            name="prod",
            kwargs={"namespace": "jobs", "kubeconfig": {"$secret": "prod-kube"}},
            dispatch="direct",
        )
        await u.create_mode(name="small", provider="kind", fields={"image": "python:3.12-slim"})


def _launch(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str:
    (tmp_path / "job.py").write_text("print(1)\n")
    code, out, err = run(capsys, "launch", "kind", "--mode", "small", "--script", str(tmp_path / "job.py"))
    assert code == 0, err
    return out.strip()


def _as(fmt: str, text: str) -> Any:
    assert text.endswith("\n")
    return json.loads(text) if fmt == "json" else yaml.safe_load(text)


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_every_list_and_show_verb_prints_the_apis_objects(
    env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env.run(_catalog(env))
    iid = _launch(capsys, tmp_path)

    def got(*argv: str) -> Any:
        code, out, err = run(capsys, *argv, "-o", fmt)
        assert code == 0, err
        return _as(fmt, out)

    providers = got("providers", "list")
    assert [p["name"] for p in providers] == ["kind", "prod"] and providers[0]["dispatch"] == "daemon"
    modes = got("modes", "list")
    assert [(m["name"], m["provider"], m["fields"]["image"]) for m in modes] == [
        ("small", "kind", "python:3.12-slim")
    ]
    assert got("modes", "show", "small")["fields"] == {"image": "python:3.12-slim"}
    assert [s["name"] for s in got("secrets", "list")] == ["prod-kube"]
    for argv in (("instances", "kind"), ("providers", "instances", "kind")):
        [inst] = got(*argv)
        assert inst["instanceId"] == iid and inst["state"] == "queued" and inst["providerName"] == "kind"
    assert got("results", "list", "kind", iid) == []
    shown = got("instance", "show", "kind", iid)
    assert shown["instanceId"] == iid and shown["history"][0]["state"] == "queued"
    assert got("show", "kind", iid)["instanceId"] == iid
    quota = got("quota", "show", "default")
    assert quota["namespace"] == "default" and "usage" in quota
    monkeypatch.setenv("NYMPH_TOKEN", env.admin_token)
    assert isinstance(got("quota", "show"), list)
    monkeypatch.setenv("NYMPH_TOKEN", env.user_token)

    # a secret stays a secret: the kubeconfig is named, in every format, as the table shows it
    prod = got("providers", "show", "prod")
    assert prod["kwargs"] == {"namespace": "jobs", "kubeconfig": "<secret prod-kube>"}
    code, table, _ = run(capsys, "providers", "show", "prod")
    assert code == 0 and "kubeconfig: <secret prod-kube>" in table
    for text in (json.dumps(prod), table):
        assert "s3cr3t" not in text and "10.0.0.1" not in text
    assert got("providers", "show", "kind")["kwargs"] == {"namespace": "jobs"}


def test_an_empty_list_is_an_empty_array_and_a_page_is_its_items(
    env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run(capsys, "providers", "list", "-o", "json")
    assert (code, out, err) == (0, "[]\n", "")
    code, out, _ = run(capsys, "secrets", "list", "-o", "yaml")
    assert code == 0 and yaml.safe_load(out) == []
    env.run(_catalog(env))
    first, second = _launch(capsys, tmp_path), _launch(capsys, tmp_path)
    code, out, err = run(capsys, "instances", "kind", "--limit", "1", "-o", "json")
    assert code == 0 and [i["instanceId"] for i in json.loads(out)] == [first]
    assert "more follow" in err and "--continue" in err  # the hint stays on stderr
    code, out, _ = run(capsys, "instances", "kind", "--all", "-o", "json")
    assert [i["instanceId"] for i in json.loads(out)] == [first, second]
    # the table is what it was
    code, out, _ = run(capsys, "instances", "kind")
    assert out.splitlines()[0].split() == ["INSTANCE", "STATE", "REASON", "NODE", "LAUNCHED", "MESSAGE"]


async def _report(served: Served, iid: str, *reports: dict[str, Any]) -> None:
    async with served.client(served.daemon_token) as d:
        [task] = await d.claim(daemon_id="fd", node="n1", capacity=1, wait=10)
        assert task["instanceId"] == iid
        await d.complete(daemon_id="fd", task_id=task["taskId"], ok=True)
        for seq, report in enumerate(reports, 1):
            await d.report(daemon_id="fd", stream="fd", reports=[{"seq": seq, "instanceId": iid, **report}])


def test_instance_show_of_a_queued_and_of_a_stopped_instance(
    env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    env.run(_catalog(env))
    first = _launch(capsys, tmp_path)
    code, out, err = run(capsys, "instance", "show", "kind", first)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["instance:", first]
    assert lines[2].split() == ["state:", "queued"]
    assert lines[3].split() == ["reason:", "-"] and lines[5].split() == ["node:", "-"]
    assert any(line.startswith("waiting:") for line in lines), out  # why it is still queued
    assert "history:" in lines and lines[-1].split()[2:] == ["queued"]

    second = _launch(capsys, tmp_path)
    env.run(
        _report(
            env,
            first,
            {"state": "starting", "node": "n1"},
            {"state": "running", "node": "n1"},
            {
                "state": "stopped",
                "reason": "Error",
                "message": "the job failed",
                "node": "n1",
                "exitCode": 3,
                "terminationReason": "Error",
                "terminationMessage": "Traceback: boom",
            },
        )
    )
    code, out, _ = run(capsys, "show", "kind", first)
    assert code == 0
    fields = dict(
        line.split(": ", 1) for line in out.splitlines() if ": " in line and not line.startswith(" ")
    )
    assert {k: v.strip() for k, v in fields.items()}.items() >= {
        "state": "stopped",
        "reason": "Error",
        "message": "the job failed",
        "node": "n1",
        "exit code": "3",
        "termination reason": "Error",
        "termination message": "Traceback: boom",
    }.items()
    history = out.split("history:\n", 1)[1].splitlines()
    assert [h.split()[2] for h in history] == ["queued", "starting", "running", "stopped"]
    assert history[-1].endswith("stopped (Error): the job failed")
    code, out, _ = run(capsys, "instance", "show", "kind", first, "-o", "json")
    got = json.loads(out)
    assert (got["exitCode"], got["terminationMessage"], len(got["history"])) == (3, "Traceback: boom", 4)
    # the other one is still queued
    code, out, _ = run(capsys, "instance", "show", "kind", second, "-o", "yaml")
    assert yaml.safe_load(out)["state"] == "queued"

    code, out, err = run(capsys, "instance", "show", "kind", "lakeshore-00000000")
    assert code == 2 and out == "" and "no instance 'lakeshore-00000000'" in err


def test_empty_is_not_an_error(env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    env.run(_catalog(env))
    iid = _launch(capsys, tmp_path)
    code, out, err = run(capsys, "logs", "kind", iid)
    assert (code, out) == (0, "") and f"no logs for {iid} yet: it is still queued" in err
    code, out, _ = run(capsys, "results", "list", "kind", iid)
    assert code == 0 and out == f"no results for {iid}\n"
    code, out, err = run(capsys, "results", "get", "kind", iid)
    assert (code, out) == (0, "") and "no results" in err
    assert run(capsys, "modes", "rm", "small")[0] == 0
    code, out, _ = run(capsys, "modes", "list")
    assert (code, out) == (0, "no modes in namespace default\n")
    # a usage or queue error is 2
    assert run(capsys, "logs", "kind", "lakeshore-00000000")[0] == 2


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("ImagePull", 'Back-off pulling image "nosuch:1": ErrImagePull'),
        ("CreateContainerError", 'CreateContainerConfigError: secret "db" not found'),
    ],
)
def test_logs_of_a_pod_that_cannot_start_says_why(
    env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path, reason: str, message: str
) -> None:
    env.run(_catalog(env))
    iid = _launch(capsys, tmp_path)
    env.run(_report(env, iid, {"state": "starting", "reason": reason, "message": message, "node": "n1"}))
    code, out, err = run(capsys, "logs", "kind", iid)
    assert (code, out) == (0, "")
    assert f"its Pod cannot start ({reason}: {message})" in err
    assert "use -f" not in err


def test_every_user_command_documents_the_exit_codes() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert sub.choices is not None
    for name in USER_COMMANDS:
        for each in each_parser(sub.choices[name]):
            assert each.epilog == EXIT_CODES, each.prog
            assert "exit codes: 0 done" in each.format_help()
