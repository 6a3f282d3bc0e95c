"""Bad input and authorization over every route of the real queue (a subprocess, SQLite file).

A schema-driven fuzz (schemathesis, from nymph/queue/openapi.yaml) with every kind of token,
then hand-written cases: broken and unknown encodings, bodies at and over the limits, absurd
nesting, NUL bytes, a script that exhausts the heredoc delimiter rule, hostile ids in paths, and
dispatch calls across namespaces and across daemons (another daemon's forged reports, logs
and results for an instance it does not run included). Never a 5xx; every error a documented 4xx
with a ``{error, detail}`` body; what is accepted must be renderable by the daemon.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import string
import time
import zlib
from collections.abc import Iterator
from importlib import resources
from typing import Any

import hypothesis
import pytest
import schemathesis
import yaml
from hypothesis import strategies as st

from nymph.launch.render import render_pod, to_yaml
from nymph.launch.spec import LaunchSpec
from tests.support.queue_peers import Checked, Tenants, start_tenants
from tests.support.tally import TALLY

pytestmark = [pytest.mark.faults]

SPEC: dict[str, Any] = yaml.safe_load(resources.files("nymph.queue").joinpath("openapi.yaml").read_text())
SCHEMA = schemathesis.openapi.from_dict(SPEC)
FUZZ = int(os.environ.get("NYMPH_FAULT_FUZZ", "300"))
A, B = "/v1/namespaces/team-a", "/v1/namespaces/team-b"


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    """One queue for the module (making its tokens takes a while); the fuzz runs last."""
    t = start_tenants(tmp_path_factory.mktemp("tenants"))
    try:
        yield t
    finally:
        t.queue.kill()


@pytest.fixture
def http(tenants: Tenants) -> Checked:
    return Checked(tenants.url)


def launch_body(**extra: Any) -> dict[str, Any]:
    return {"mode": "py", "script": "print(1)\n", **extra}


def session(http: Checked, token: str, *, daemon_id: str, namespaces: list[str], node: str = "n1") -> str:
    """Register a daemon with the bootstrap ``token``: its own session credential."""
    resp = http.send(
        "POST",
        "/v1/dispatch/register",
        token=token,
        bad=False,
        json_body={"daemonId": daemon_id, "node": node, "namespaces": namespaces},
    )
    assert resp.status_code == 201, resp.text
    return str(resp.json()["sessionToken"])


def claim(http: Checked, token: str, *, daemon_id: str, namespaces: list[str]) -> list[dict[str, Any]]:
    resp = http.send(
        "POST",
        "/v1/dispatch/claim",
        token=session(http, token, daemon_id=daemon_id, namespaces=namespaces),
        bad=False,
        json_body={"daemonId": daemon_id, "node": "n1", "namespaces": namespaces, "capacity": 50, "wait": 0},
    )
    assert resp.status_code == 200, resp.text
    return list(resp.json()["tasks"])


def test_encodings_methods_and_sizes(tenants: Tenants, http: Checked) -> None:
    path = f"{A}/providers/local/launch"
    tok = tenants.user["team-a"]
    good = json.dumps(launch_body()).encode()
    bomb = gzip.compress(b'{"mode":"py","script":"' + b"a" * (64 * 1024 * 1024) + b'"}')
    cases: list[tuple[str, bytes, dict[str, str]]] = [
        ("gzip corrupt", b"\x1f\x8b\x08\x00garbage" + good, {"Content-Encoding": "gzip"}),
        ("gzip truncated", gzip.compress(good)[:-9], {"Content-Encoding": "gzip"}),
        ("deflate corrupt", b"\x78\x9c" + b"\xff" * 40, {"Content-Encoding": "deflate"}),
        ("deflate raw garbage", zlib.compress(good)[3:], {"Content-Encoding": "deflate"}),
        ("unknown encoding", good, {"Content-Encoding": "x-nymph-unknown"}),
        ("br not supported", good, {"Content-Encoding": "br"}),
        ("gzip bomb", bomb, {"Content-Encoding": "gzip"}),
        ("over the size cap", json.dumps(launch_body(script="a" * (2 * 1024 * 1024))).encode(), {}),
        ("script over 120 KiB", json.dumps(launch_body(script="a" * (121 * 1024))).encode(), {}),
        ("not JSON", b"{mode: py", {}),
        ("JSON nested 100000 deep", b"[" * 100_000 + b"]" * 100_000, {}),
        ("object nested 100000 deep", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, {}),
        ("NaN", b'{"mode":"py","script":"x","tags":{"a":NaN}}', {}),
        ("a number past a float", b'{"mode":"py","script":"x","tags":{"a":1e400}}', {}),
        ("lone surrogate", b'{"mode":"py","script":"\\ud800"}', {}),
        ("invalid UTF-8", b'{"mode":"py","script":"\xff\xfe"}', {}),
        ("NUL in script", json.dumps(launch_body(script="print(1)\x00\n")).encode(), {}),
        ("NUL in mode", json.dumps(launch_body(mode="p\x00y")).encode(), {}),
        ("NUL in tag", json.dumps(launch_body(tags={"a\x00": "b\x00"})).encode(), {}),
        ("a list", b"[]", {}),
        ("empty", b"", {}),
    ]
    for what, body, headers in cases:
        resp = http.send(
            "POST", path, token=tok, data=body, headers={"Content-Type": "application/json", **headers}
        )
        if resp.status_code == 202:
            http.failures.append(f"{what}: accepted")
    for method in ("PATCH", "PUT", "FOO", "PROPFIND"):
        http.send(method, path, token=tok, data=good)
        http.send(method, "/v1/dispatch/claim", token=tenants.daemon["team-a"], data=b"{}")
    http.send("POST", path, token=tok, data=good, headers={"Content-Type": "text/plain"})
    assert not http.failures, http.failures


def nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


def test_what_is_accepted_renders_and_the_rest_is_a_400_naming_the_field(
    tenants: Tenants, http: Checked
) -> None:
    path = f"{A}/providers/local/launch"
    tok = tenants.user["team-a"]
    every_first_byte = "".join(f"{c}\n" for c in string.printable if c not in "\r\n\x0b\x0c") + "".join(
        f"{chr(c)}x\n" for c in range(1, 32) if chr(c) not in "\r\n"
    )
    cases: dict[str, dict[str, Any]] = {
        "delimiter exhaustion": launch_body(script=every_first_byte),
        "delimiter exhaustion, every delimiter word": launch_body(
            script="\n".join(
                f"{p}{s}" for p in ("NYMPH", "EOF", "END", "SCRIPT", "LAKESHORE") for s in ("", "_EOF", "0")
            )
            + "\n"
            + every_first_byte
        ),
        "tolerations 900 deep": launch_body(fields={"tolerations": [nested(900)]}),
        "resources 900 deep": launch_body(fields={"resources": nested(900)}),
        "tolerations 40 deep": launch_body(fields={"tolerations": [nested(40)]}),
        "env 5000 keys": launch_body(env={f"K{i}": "v" for i in range(5000)}),
        "tags 2000": launch_body(tags={f"k{i}": "v" for i in range(2000)}),
        "a huge tag": launch_body(tags={"k": "v" * 70_000}),
        "a huge env value": launch_body(env={"K": "v" * 200_000}),
    }
    accepted: dict[str, str] = {}
    for what, body in cases.items():
        resp = http.send("POST", path, token=tok, json_body=body)
        if resp.status_code == 202:
            accepted[resp.json()["instanceId"]] = what
        elif resp.status_code == 400:
            detail = resp.json().get("detail", "")
            field = next((k for k in ("script", "tolerations", "resources", "env", "tags") if k in what), "")
            if field and field not in detail:
                http.failures.append(f"{what}: a 400 that does not name {field!r}: {detail[:200]!r}")
        elif resp.status_code < 500 and "delimiter" in what:
            http.failures.append(f"{what}: a valid script refused with {resp.status_code}: {resp.text[:200]}")
    tasks = claim(http, tenants.daemon["team-a"], daemon_id="render-check", namespaces=["jobs-team-a"])
    for task in tasks:
        what = accepted.get(task["instanceId"] or "", "?")
        try:
            spec = LaunchSpec.from_json(task["spec"] or {})
            to_yaml(render_pod(spec, node="n1", workdir_root="/var/lib/nymph"))
        except Exception as exc:
            http.failures.append(
                f"{what}: accepted (202) but the daemon cannot render it: {type(exc).__name__}: {str(exc)[:200]}"
            )
    assert {t["instanceId"] for t in tasks} >= set(accepted)
    assert not http.failures, http.failures


def test_hostile_ids_in_paths(tenants: Tenants, http: Checked) -> None:
    tok = tenants.user["team-a"]
    ids = [
        "--all",
        "..%2Fx",
        "../x",
        "%00",
        "a%00b",
        "-n",
        "lakeshore-zzzzzzzz",
        "x" * 5000,
        "%2e%2e",
        "*",
        "%ff",
    ]
    for iid in ids:
        for method in ("GET", "DELETE"):
            resp = http.send(method, f"{A}/providers/local/instances/{iid}", token=tok)
            if resp.status_code < 400:
                http.failures.append(f"{method} instance {iid[:40]!r}: {resp.status_code}")
        http.send("GET", f"{A}/providers/local/instances/{iid}/logs", token=tok)
        http.send("GET", f"{A}/tasks/{iid}", token=tok)
        http.send("GET", f"/v1/namespaces/{iid}/providers", token=tok)
        http.send(
            "PUT",
            f"{A}/providers/{iid}",
            token=tok,
            json_body={"launcher": "Kube", "kwargs": {"namespace": iid}},
        )
        http.send(
            "PUT", f"{A}/modes/{iid}", token=tok, json_body={"provider": "local", "fields": {"image": iid}}
        )
    for iid in ("--all", "../x", "a\x00b", "x" * 100_000):
        for route, body in (
            ("complete", {"daemonId": "d", "taskId": iid, "ok": True}),
            ("renew", {"daemonId": "d", "taskIds": [iid]}),
            ("release", {"daemonId": iid, "taskIds": [iid]}),
            ("logs", {"daemonId": "d", "instanceId": iid, "logs": "x"}),
            (
                "report",
                {
                    "daemonId": "d",
                    "stream": iid,
                    "reports": [{"seq": 1, "instanceId": iid, "state": "running"}],
                },
            ),
        ):
            http.send("POST", f"/v1/dispatch/{route}", token=tenants.daemon["team-a"], json_body=body)
    assert not http.failures, http.failures


def test_cross_namespace_and_cross_daemon_calls_are_refused(tenants: Tenants, http: Checked) -> None:
    """Each daemon acts through a session of its own (registered with its tenant's bootstrap
    token, bound to its daemon id, node and namespaces): no daemon can act on another's leases,
    on another tenant's instances or namespaces, or take over another's session."""
    ua, ub = tenants.user["team-a"], tenants.user["team-b"]
    boot_a, boot_b = tenants.daemon["team-a"], tenants.daemon["team-b"]
    victim = http.send("POST", f"{B}/providers/local/launch", token=ub, bad=False, json_body=launch_body())
    assert victim.status_code == 202, victim.text
    vid = victim.json()["instanceId"]

    def must_refuse(what: str, resp: Any) -> None:
        if resp.status_code < 400:
            http.failures.append(f"{what}: answered {resp.status_code} {resp.text[:160]!r}")

    def dispatch(route: str, token: str, body: dict[str, Any], *, bad: bool = True) -> Any:
        return http.send("POST", f"/v1/dispatch/{route}", token=token, bad=bad, json_body=body)

    # A tenant's user token on another tenant's routes.
    for method, path, body in (
        ("GET", f"{B}/providers", None),
        ("GET", f"{B}/providers/local", None),
        ("PUT", f"{B}/providers/local", {"launcher": "Kube", "kwargs": {"namespace": "jobs-team-a"}}),
        ("DELETE", f"{B}/modes/py", None),
        ("POST", f"{B}/providers/local/launch", launch_body()),
        ("GET", f"{B}/providers/local/instances", None),
        ("GET", f"{B}/providers/local/instances/{vid}", None),
        ("DELETE", f"{B}/providers/local/instances/{vid}", None),
        ("GET", f"{B}/providers/local/instances/{vid}/logs", None),
        ("GET", f"{B}/daemons", None),
        ("GET", f"{A}/providers/local/instances/{vid}", None),  # the victim's id through A's provider
    ):
        must_refuse(f"team-a user: {method} {path}", http.send(method, path, token=ua, json_body=body))

    # The sessions: team-a's daemon, a team-a daemon registered for team-b's kube namespace (its
    # token's scope still confines it to team-a), the victim (team-b) and another team-b daemon.
    sa = session(http, boot_a, daemon_id="da-1", namespaces=["jobs-team-a"])
    sa_wide = session(http, boot_a, daemon_id="da-2", namespaces=["jobs-team-b"])
    other_b = session(http, make_other_daemon_token(tenants), daemon_id="db-2", namespaces=["jobs-team-b"])
    # Daemon credentials, bootstrap or session, may not read user routes at all.
    for tok in (boot_b, sa, other_b):
        for path in (
            f"{B}/providers",
            f"{B}/modes",
            f"{B}/providers/local/instances/{vid}",
            f"{A}/providers",
        ):
            must_refuse(f"daemon credential: GET {path}", http.send("GET", path, token=tok))
    # A bootstrap token alone does nothing but register.
    for route, body in (
        ("claim", {"capacity": 5, "wait": 0}),
        ("renew", {"taskIds": ["task-0"]}),
        ("complete", {"taskId": "task-0", "ok": True}),
        ("report", {"stream": "s", "reports": [{"seq": 1, "instanceId": vid, "state": "stopped"}]}),
    ):
        must_refuse(f"bootstrap token: {route}", dispatch(route, boot_b, body))
    # team-a's daemon cannot claim team-b's work.
    must_refuse(
        "team-a session claiming in jobs-team-b",
        dispatch("claim", sa, {"namespaces": ["jobs-team-b"], "capacity": 50, "wait": 0}),
    )
    for who, tok in (("team-a session", sa), ("team-a session for jobs-team-b", sa_wide)):
        got = dispatch("claim", tok, {"capacity": 50, "wait": 0}, bad=False)
        if any(t["instanceId"] == vid for t in got.json().get("tasks", [])):
            http.failures.append(f"{who} claimed a team-b task")
    # The victim claims its task and says its Pod is starting.
    sb = session(http, boot_b, daemon_id="db-1", namespaces=["jobs-team-b"])
    got = dispatch("claim", sb, {"capacity": 50, "wait": 0}, bad=False)
    assert got.status_code == 200, got.text
    (task,) = [t for t in got.json()["tasks"] if t["instanceId"] == vid]
    tid = task["taskId"]
    starting = [{"seq": 1, "instanceId": vid, "state": "starting", "node": "n1"}]
    dispatch("report", sb, {"stream": "db-1-stream", "reports": starting}, bad=False)

    # No other session may act on the victim's lease, under its own id or the victim's.
    for who, tok, own in (
        ("team-a daemon", sa, "da-1"),
        ("team-a daemon for jobs-team-b", sa_wide, "da-2"),
        ("another team-b daemon", other_b, "db-2"),
    ):
        for did in (own, "db-1"):
            resp = dispatch("renew", tok, {"daemonId": did, "taskIds": [tid], "leaseSeconds": 3600})
            if resp.status_code == 200 and tid in resp.json().get("renewed", []):
                http.failures.append(f"{who} as {did}: renewed another daemon's lease")
            resp = dispatch("complete", tok, {"daemonId": did, "taskId": tid, "ok": True})
            must_refuse(f"{who} as {did}: complete another daemon's task", resp)
            resp = dispatch("release", tok, {"daemonId": did, "taskIds": [tid]})
            if resp.status_code == 200 and tid in resp.json().get("released", []):
                http.failures.append(f"{who} as {did}: released another daemon's lease")
    # No team-a session may report on or upload logs for a team-b instance.
    for who, tok in (("team-a daemon", sa), ("team-a daemon for jobs-team-b", sa_wide)):
        forged = [{"seq": 1, "instanceId": vid, "state": "stopped", "reason": "Completed"}]
        dispatch("report", tok, {"stream": f"{who}-s", "reports": forged})
        must_refuse(
            f"{who}: logs of a team-b instance", dispatch("logs", tok, {"instanceId": vid, "logs": "x"})
        )
    # Nor take the victim's session over: a daemon id live with a team-b token cannot be
    # registered with a team-a token.
    resp = http.send(
        "POST",
        "/v1/dispatch/register",
        token=boot_a,
        json_body={"daemonId": "db-1", "node": "n1", "namespaces": ["jobs-team-b"]},
    )
    must_refuse("team-a token registering the victim's daemon id", resp)
    status = http.send("GET", f"{B}/tasks/{tid}", token=ub, bad=False)
    assert status.status_code == 200, status.text
    if status.json()["status"] != "leased":
        http.failures.append(f"the victim's task is {status.json()['status']} after the foreign calls")
    inst = http.send("GET", f"{B}/providers/local/instances/{vid}", token=ub, bad=False).json()
    if inst["state"] != "starting":
        http.failures.append(f"foreign calls moved the victim's instance to {inst['state']}")

    # Report stream marks are the session's: another daemon's huge mark on the victim's stream
    # name does not drop the victim's next report.
    big = [{"seq": 2**62, "instanceId": "lakeshore-00000000", "state": "running"}]
    dispatch("report", sa, {"stream": "db-1-stream", "reports": big})
    running = [{"seq": 2, "instanceId": vid, "state": "running"}]
    resp = dispatch("report", sb, {"stream": "db-1-stream", "reports": running}, bad=False)
    after = http.send("GET", f"{B}/providers/local/instances/{vid}", token=ub, bad=False).json()
    if after["state"] != "running":
        http.failures.append(
            f"the victim daemon's report was dropped after a foreign stream mark (state {after['state']}, ack {resp.text[:120]})"
        )

    # The same tenant's bootstrap token may register the victim's id again (a restarted daemon
    # must get back in), but gets none of its leases: they go back to the queue.
    resp = http.send(
        "POST",
        "/v1/dispatch/register",
        token=make_other_daemon_token(tenants),
        bad=False,
        json_body={"daemonId": "db-1", "node": "n1", "namespaces": ["jobs-team-b"]},
    )
    assert resp.status_code == 201, resp.text
    usurper = resp.json()["sessionToken"]
    must_refuse(
        "a re-registered daemon id: complete the replaced session's task",
        dispatch("complete", usurper, {"taskId": tid, "ok": True}),
    )
    resp = dispatch("renew", usurper, {"taskIds": [tid]})
    if resp.status_code == 200 and tid in resp.json().get("renewed", []):
        http.failures.append("a re-registered daemon id renewed the replaced session's lease")
    must_refuse("the replaced session", dispatch("renew", sb, {"taskIds": [tid]}))
    status = http.send("GET", f"{B}/tasks/{tid}", token=ub, bad=False).json()
    if status["status"] != "pending":
        http.failures.append(f"the replaced session's task is {status['status']}, not handed back")

    # A namespace-scoped user sees only its own namespace's daemons.
    listing = http.send("GET", f"{A}/daemons", token=ua, bad=False)
    if listing.status_code == 200:
        foreign = [d for d in listing.json()["items"] if "jobs-team-a" not in d["namespaces"]]
        if foreign:
            http.failures.append(
                f"team-a user sees other tenants' daemons: {[d['daemonId'] for d in foreign]}"
            )
    assert not http.failures, http.failures


def test_forged_writes_from_another_daemon_are_refused(tenants: Tenants, http: Checked) -> None:
    """A daemon writes only the instances it runs (it holds a lease of their tasks, or applied
    them). Another team-b daemon on another node, and a daemon registered for every namespace,
    have a forged final report (stopped, Completed, exit code 0, another node), log chunks, a
    log tail and a result file refused with 403 ``not_instance_daemon``; the instance's state,
    node, logs and results stay as its own daemon left them, and that daemon is still heard."""
    ub, boot_b = tenants.user["team-b"], tenants.daemon["team-b"]
    inst_path = f"{B}/providers/local/instances"
    launched = http.send("POST", f"{B}/providers/local/launch", token=ub, bad=False, json_body=launch_body())
    assert launched.status_code == 202, launched.text
    vid = launched.json()["instanceId"]

    def dispatch(route: str, token: str, body: dict[str, Any], *, bad: bool = True) -> Any:
        return http.send("POST", f"/v1/dispatch/{route}", token=token, bad=bad, json_body=body)

    # Its daemon claims it (handing back whatever else it got), applies it, reports and logs.
    owner = session(http, boot_b, daemon_id="db-runs", namespaces=["jobs-team-b"], node="n1")
    got = dispatch("claim", owner, {"capacity": 50, "wait": 0}, bad=False).json()["tasks"]
    (task,) = [t for t in got if t["instanceId"] == vid]
    others = [t["taskId"] for t in got if t["instanceId"] != vid]
    if others:
        dispatch("release", owner, {"taskIds": others}, bad=False)
    done = dispatch("complete", owner, {"taskId": task["taskId"], "ok": True}, bad=False)
    assert done.status_code == 200, done.text
    running = [{"seq": 1, "instanceId": vid, "state": "running", "node": "n1"}]
    assert dispatch("report", owner, {"stream": "db-runs", "reports": running}, bad=False).status_code == 200
    real = b"real line\n"
    chunk = {"instanceId": vid, "offset": 0, "data": _b64(real)}
    assert dispatch("logchunks", owner, chunk, bad=False).status_code == 200
    before = http.send("GET", f"{inst_path}/{vid}", token=ub, bad=False).json()

    forged_line = b"FORGED LOG LINE\n"
    forgers = (
        ("a team-b daemon on another node", make_other_daemon_token(tenants), "db-forges", ["jobs-team-b"]),
        ("a daemon registered for every namespace", tenants.queue.daemon_token, "d-everywhere", []),
    )
    for n, (who, boot, did, namespaces) in enumerate(forgers, 2):
        forger = session(http, boot, daemon_id=did, namespaces=namespaces, node=f"n{n}")
        final = {
            "seq": 1,
            "instanceId": vid,
            "state": "stopped",
            "reason": "Completed",
            "exitCode": 0,
            "node": f"n{n}",
        }
        for what, route, body in (
            ("a final report", "report", {"stream": f"{did}-s", "reports": [final]}),
            ("a log chunk", "logchunks", {"instanceId": vid, "offset": len(real), "data": _b64(forged_line)}),
            ("a log from offset 0", "logchunks", {"instanceId": vid, "offset": 0, "data": _b64(forged_line)}),
            ("a final log chunk", "logchunks", {"instanceId": vid, "offset": len(real), "final": True}),
            ("a log tail", "logs", {"instanceId": vid, "logs": forged_line.decode()}),
            (
                "a result file",
                "results",
                {"instanceId": vid, "path": "out.txt", "data": _b64(b"x"), "eof": True},
            ),
            ("a results error", "results", {"instanceId": vid, "error": "FORGED"}),
        ):
            resp = dispatch(route, forger, body)
            code = resp.json().get("error") if resp.status_code < 500 else None
            if resp.status_code != 403 or code != "not_instance_daemon":
                http.failures.append(f"{who}: {what} answered {resp.status_code} {resp.text[:160]!r}")

    after = http.send("GET", f"{inst_path}/{vid}", token=ub, bad=False).json()
    for key in ("state", "reason", "node", "version", "exitCode", "resultsError"):
        if after.get(key) != before.get(key):
            http.failures.append(
                f"forged writes changed the instance's {key}: {before.get(key)!r} -> {after.get(key)!r}"
            )
    logs = http.send("GET", f"{inst_path}/{vid}/logs", token=ub, bad=False).json()
    if logs.get("logs") != real.decode():
        http.failures.append(f"forged writes changed the instance's log: {logs.get('logs')!r}")
    results = http.send("GET", f"{inst_path}/{vid}/results", token=ub, bad=False).json()
    if results.get("items") or results.get("error"):
        http.failures.append(f"forged writes left results: {results}")
    # Its own daemon is still heard.
    ended = [{"seq": 2, "instanceId": vid, "state": "stopped", "reason": "Completed", "exitCode": 0}]
    assert dispatch("report", owner, {"stream": "db-runs", "reports": ended}, bad=False).status_code == 200
    final_state = http.send("GET", f"{inst_path}/{vid}", token=ub, bad=False).json()
    if (final_state["state"], final_state.get("exitCode"), final_state["node"]) != ("stopped", 0, "n1"):
        http.failures.append(f"its own daemon's report was not applied: {final_state}")
    assert not http.failures, http.failures


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def test_fuzzed_requests_on_every_route(tenants: Tenants, http: Checked) -> None:
    tokens = {
        "user": tenants.queue.user_token,
        "user-a": tenants.user["team-a"],
        "daemon": tenants.queue.daemon_token,
        "daemon-a": tenants.daemon["team-a"],
        "none": "",
        "forged": "nyq_" + "x" * 43,
    }
    ops = [op.ok() for op in SCHEMA.get_all_operations()]
    seen: set[tuple[str, str]] = set()
    slow: list[tuple[float, str]] = []

    @hypothesis.settings(
        max_examples=FUZZ,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(data=st.data())
    def run(data: st.DataObject) -> None:
        op = data.draw(st.sampled_from(ops))
        negative = data.draw(st.booleans())
        mode = schemathesis.GenerationMode.NEGATIVE if negative else schemathesis.GenerationMode.POSITIVE
        case = data.draw(op.as_strategy(generation_mode=mode))
        who = data.draw(st.sampled_from(sorted(tokens)))
        if isinstance(case.body, dict) and ("wait" in case.body or op.path == "/v1/dispatch/claim"):
            case.body["wait"] = 0
        if "wait" in (case.query or {}):
            case.query["wait"] = 0
        headers = {"Authorization": f"Bearer {tokens[who]}"} if tokens[who] else {}
        t0 = time.monotonic()
        resp = case.call(base_url=tenants.url, session=http.session, headers=headers, timeout=30)
        slow.append((time.monotonic() - t0, f"{case.method} {case.formatted_path}"))
        if negative or who in ("none", "forged"):
            TALLY.bad_inputs += 1
        http.check(resp, f"{case.method} {case.formatted_path} as {who}")
        documented = SPEC["paths"][op.path][op.method.lower()]["responses"]
        if str(resp.status_code) not in documented:
            http.failures.append(f"{case.method} {case.formatted_path}: undocumented {resp.status_code}")
        seen.add((op.method.upper(), op.path))

    run()
    print("slowest calls", sorted(slow, reverse=True)[:5], "total", sum(t for t, _ in slow))
    assert not http.failures, http.failures[:20]
    assert len(seen) >= 15, f"the fuzz reached only {len(seen)} operations"


def make_other_daemon_token(tenants: Tenants) -> str:
    from tests.support.queue_peers import make_token

    return make_token(tenants.queue.db, role="daemon", namespace="team-b")
