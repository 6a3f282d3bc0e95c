"""Hostile kubeconfigs through the real queue (a subprocess, SQLite file): a user-supplied
kubeconfig (inline, or a ``$secret``) that would run a command, read a file or make the queue
connect where it must not is refused before any of that happens, and what a server a user
names answers is never echoed.

Each case goes through every door a kubeconfig has: ``providers add`` with it inline, ``PUT
.../secrets/NAME`` of a secret a provider already names, a launch and ``providers test``. The
proof that nothing ran, was read or was contacted: the exec plugin's marker file never
appears, a loopback listener that every hostile server, proxy and issuer URL points at sees no
connection, and the planted texts (in files the kubeconfig points at, in the planted server's
answers) are in no answer and not in the queue's log. A second queue that explicitly allows
the planted server (``--kube-server-allow``) reaches it, and still relays only "the server
answered HTTP N". Last, path kubeconfigs per team: a scoped token reads only its team's
directory.
"""

from __future__ import annotations

import base64
import http.server
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.harness import QueueProc
from tests.support.queue_peers import Checked, make_token
from tests.support.tally import TALLY

pytestmark = [pytest.mark.faults]

NS = "/v1/namespaces/default"
PLANTED = "PLANTED-HOSTILE-KUBECONFIG-4c1e"


@dataclass
class Listener:
    """A loopback TCP listener that records every connection made to it (and answers none)."""

    sock: socket.socket = field(default_factory=lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    connections: list[str] = field(default_factory=list)

    def start(self) -> Listener:
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def _accept(self) -> None:
        while self.sock.fileno() >= 0:
            try:
                conn, addr = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections.append(f"{addr[0]}:{addr[1]}")
            conn.close()

    def close(self) -> None:
        self.sock.close()


class PlantedHandler(http.server.BaseHTTPRequestHandler):
    """Answers every request with a non-Kubernetes body that carries the planted text."""

    seen: list[str] = []

    def _answer(self) -> None:
        PlantedHandler.seen.append(self.path)
        if "selfsubjectaccessreviews" in self.path:
            status, body = 403, json.dumps({"message": f"denied {PLANTED}", "reason": PLANTED})
        else:
            status, body = 422, f"<html>unprocessable {PLANTED}</html>"
        data = body.encode()
        self.send_response(status, f"Broken {PLANTED}")
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class World:
    tmp: Path
    listener: Listener
    queue: QueueProc  # default rules
    allowing: QueueProc  # --kube-server-allow 127.0.0.1 (the planted server)
    planted_port: int
    marker: Path
    planted_file: Path


def _start(tmp: Path, *extra: str) -> QueueProc:
    tmp.mkdir(parents=True, exist_ok=True)
    q = QueueProc(tmp / "queue.db", extra=extra)
    q.tokens()
    return q.start()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("hostile-kubeconfigs")
    listener = Listener().start()
    planted = http.server.ThreadingHTTPServer(("127.0.0.1", 0), PlantedHandler)
    threading.Thread(target=planted.serve_forever, daemon=True).start()
    planted_file = tmp / "planted-token"
    planted_file.write_text(PLANTED)  # no trailing newline: a header would carry it as is
    q = _start(tmp / "default")
    allowing = _start(tmp / "allowing", "--kube-server-allow", "127.0.0.1")
    try:
        yield World(
            tmp=tmp,
            listener=listener,
            queue=q,
            allowing=allowing,
            planted_port=int(planted.server_address[1]),
            marker=tmp / "exec-ran",
            planted_file=planted_file,
        )
    finally:
        q.kill()
        allowing.kill()
        planted.shutdown()
        listener.close()


def kubeconfig(
    *, server: str, cluster: dict[str, Any] | None = None, user: dict[str, Any] | None = None
) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "c",
            "clusters": [{"name": "k", "cluster": {"server": server, **(cluster or {})}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            "users": [{"name": "u", "user": user if user is not None else {"token": "t0ken-x"}}],
        }
    )


def corpus(w: World) -> list[tuple[str, str, str]]:
    """``(case, kubeconfig, what the refusal names)``."""
    port = w.listener.port
    here = f"https://127.0.0.1:{port}"
    ok = "https://kube.example.test:6443"  # never contacted: every case is refused first
    pem = base64.b64encode(PLANTED.encode()).decode()
    cmd = {
        "command": "/bin/sh",
        "args": ["-c", f"touch {w.marker}"],
        "apiVersion": "client.authentication.k8s.io/v1",
    }
    oidc = {
        "name": "oidc",
        "config": {
            "idp-issuer-url": f"http://127.0.0.1:{port}/issuer",
            "client-id": "nymph",
            "client-secret": PLANTED,
            "refresh-token": PLANTED,
        },
    }
    return [
        ("exec", kubeconfig(server=ok, user={"exec": cmd}), "users[0].user.exec"),
        ("auth-provider", kubeconfig(server=ok, user={"auth-provider": oidc}), "users[0].user.auth-provider"),
        (
            "tokenFile",
            kubeconfig(server=here, user={"tokenFile": str(w.planted_file)}),
            "users[0].user.tokenFile",
        ),
        (
            "client-certificate",
            kubeconfig(server=ok, user={"client-certificate": str(w.planted_file), "client-key-data": pem}),
            "users[0].user.client-certificate",
        ),
        (
            "client-key",
            kubeconfig(server=ok, user={"client-certificate-data": pem, "client-key": str(w.planted_file)}),
            "users[0].user.client-key",
        ),
        (
            "certificate-authority",
            kubeconfig(server=ok, cluster={"certificate-authority": str(w.planted_file)}),
            "clusters[0].cluster.certificate-authority",
        ),
        ("proxy-url", kubeconfig(server=ok, cluster={"proxy-url": f"http://127.0.0.1:{port}"}), "proxy-url"),
        (
            "insecure",
            kubeconfig(server=ok, cluster={"insecure-skip-tls-verify": True}),
            "--allow-insecure-tls",
        ),
        ("loopback", kubeconfig(server=here), "--kube-server-allow"),
        ("loopback-v6", kubeconfig(server=f"https://[::1]:{port}"), "--kube-server-allow"),
        ("loopback-mapped", kubeconfig(server=f"https://[::ffff:127.0.0.1]:{port}"), "--kube-server-allow"),
        ("unspecified", kubeconfig(server=f"https://0.0.0.0:{port}"), "--kube-server-allow"),
        ("metadata", kubeconfig(server="http://169.254.169.254"), "--kube-server-allow"),
        ("link-local-v6", kubeconfig(server=f"https://[fe80::1]:{port}"), "--kube-server-allow"),
    ]


#: Names resolve when the queue connects: saved, then refused at every connection.
def named_loopback(w: World) -> str:
    return kubeconfig(server=f"https://localhost:{w.listener.port}")


def _provider(kubeconfig_ref: object) -> dict[str, Any]:
    return {
        "launcher": "Kube",
        "dispatch": "direct",
        "kwargs": {"kubeconfig": kubeconfig_ref, "namespace": "jobs"},
    }


def _use(http: Checked, q: QueueProc, name: str, answers: dict[str, str]) -> None:
    """Launch on provider ``name`` and test it, keeping every answer (and the probe's result)."""
    mode = {"provider": name, "fields": {"image": "busybox"}}
    r = http.send("PUT", f"{NS}/modes/{name}-m", token=q.user_token, json_body=mode, bad=False)
    assert r.status_code in (200, 201), r.text
    r = http.send(
        "POST",
        f"{NS}/providers/{name}/launch",
        token=q.user_token,
        json_body={"mode": f"{name}-m", "script": "x"},
    )
    answers[f"launch {name}"] = r.text
    assert r.status_code in (400, 403, 422), (name, r.status_code, r.text)
    r = http.send("POST", f"{NS}/providers/{name}/test", token=q.user_token, json_body={})
    answers[f"test {name}"] = r.text
    if r.status_code == 202:
        task = http.send("GET", f"{NS}/tasks/{r.json()['taskId']}", token=q.user_token, bad=False)
        answers[f"test result {name}"] = task.text
        assert task.json().get("status") == "failed", task.text


def test_hostile_kubeconfigs_are_refused_before_anything_runs_is_read_or_is_contacted(world: World) -> None:
    w, q = world, world.queue
    http = Checked(q.url)
    answers: dict[str, str] = {}
    cases = corpus(w)
    tried = TALLY.bad_inputs
    for case, text, names in cases:
        # inline: refused when saved, naming the field (or the flag that would allow it)
        r = http.send("PUT", f"{NS}/providers/inline-{case}", token=q.user_token, json_body=_provider(text))
        answers[f"inline {case}"] = r.text
        assert r.status_code in (400, 403), (case, r.status_code, r.text)
        assert names in r.json()["detail"], (case, r.text)
        # a secret a provider already names: refused when it is set
        r = http.send(
            "PUT",
            f"{NS}/providers/secret-{case}",
            token=q.user_token,
            json_body=_provider({"$secret": f"kc-{case}"}),
        )
        assert r.status_code == 200, r.text
        r = http.send("PUT", f"{NS}/secrets/kc-{case}", token=q.user_token, json_body={"value": text})
        answers[f"secret {case}"] = r.text
        assert r.status_code in (400, 403), (case, r.status_code, r.text)
        assert names in r.json()["detail"], (case, r.text)
        # the provider whose secret was never set: every use is refused, nothing is contacted
        _use(http, q, f"secret-{case}", answers)
    # A name that resolves to loopback passes the save (names are checked when connecting) and
    # is refused at every connection.
    r = http.send("PUT", f"{NS}/providers/named", token=q.user_token, json_body=_provider(named_loopback(w)))
    assert r.status_code == 200, r.text
    _use(http, q, "named", answers)
    assert "--kube-server-allow" in answers["launch named"] and "loopback" in answers["launch named"]
    # each case counts among the fault suite's bad inputs (save, secret, launch, test)
    assert TALLY.bad_inputs - tried >= 4 * len(cases)
    assert not w.marker.exists(), "an exec plugin ran on the queue's host"
    assert w.listener.connections == [], (
        f"the queue connected where a kubeconfig said: {w.listener.connections}"
    )
    log = (q.db.parent / "queue.log").read_text(errors="replace")
    for where, text in {**answers, "queue log": log}.items():
        assert PLANTED not in text, f"planted text in {where}"
    assert not http.failures, http.failures


def test_an_allowed_server_answering_anything_but_a_status_is_relayed_only_as_its_http_code(
    world: World,
) -> None:
    w, q = world, world.allowing
    http = Checked(q.url)
    answers: dict[str, str] = {}
    text = kubeconfig(server=f"http://127.0.0.1:{w.planted_port}")
    r = http.send("PUT", f"{NS}/secrets/planted", token=q.user_token, json_body={"value": text}, bad=False)
    assert r.status_code == 200, r.text
    r = http.send(
        "PUT", f"{NS}/providers/planted", token=q.user_token, json_body=_provider({"$secret": "planted"})
    )
    assert r.status_code in (200, 201), r.text
    before = len(PlantedHandler.seen)
    _use(http, q, "planted", answers)
    assert len(PlantedHandler.seen) > before, "the explicitly allowed server was not reached"
    assert "the server answered HTTP 422" in answers["launch planted"], answers
    assert "the server answered HTTP" in answers["test result planted"], answers
    log = (q.db.parent / "queue.log").read_text(errors="replace")
    for where, body in {**answers, "queue log": log}.items():
        assert PLANTED not in body, f"planted text in {where}"
    # with an allow-list, only it counts: the metadata address it does not list is refused
    metadata = kubeconfig(server="http://169.254.169.254")
    r = http.send("PUT", f"{NS}/providers/metadata", token=q.user_token, json_body=_provider(metadata))
    assert r.status_code == 403 and "--kube-server-allow 169.254.169.254" in r.json()["detail"], r.text
    assert w.listener.connections == []
    assert not http.failures, http.failures


def test_a_team_reads_only_its_own_kubeconfig_directory(tmp_path: Path) -> None:
    dirs = {name: tmp_path / name for name in ("team-a", "team-b", "bare")}
    for d in dirs.values():
        d.mkdir()
        (d / "kc.yaml").write_text(kubeconfig(server="https://kube.example.test:6443"))
    q = _start(
        tmp_path / "q",
        "--kubeconfig-dir",
        f"team-a={dirs['team-a']}",
        "--kubeconfig-dir",
        f"team-b={dirs['team-b']}",
        "--kubeconfig-dir",
        str(dirs["bare"]),
    )
    try:
        a_token = make_token(q.db, role="user", namespace="team-a", name="user-team-a")
        http = Checked(q.url)
        a = "/v1/namespaces/team-a"

        def put(token: str, name: str, path: Path) -> Any:
            body = {
                "launcher": "Kube",
                "dispatch": "direct",
                "kwargs": {"kubeconfig": str(path), "namespace": "team-a"},
            }
            return http.send("PUT", f"{a}/providers/{name}", token=token, json_body=body)

        for name, path in (("b", dirs["team-b"]), ("bare", dirs["bare"])):
            r = put(a_token, name, path / "kc.yaml")
            assert r.status_code == 400 and r.json()["error"] == "kubeconfig_path_refused", r.text
            assert "--kubeconfig-dir team-a=DIR" in r.json()["detail"], r.text
        assert put(a_token, "own", dirs["team-a"] / "kc.yaml").status_code in (200, 201)
        # an unscoped token may use the bare directory, still not another team's
        assert put(q.user_token, "bare", dirs["bare"] / "kc.yaml").status_code in (200, 201)
        r = put(q.user_token, "b", dirs["team-b"] / "kc.yaml")
        assert r.status_code == 400, r.text
        r = put(a_token, "nul", Path(str(dirs["team-a"]) + "/kc\0.yaml"))
        assert r.status_code == 400, r.text
        assert not http.failures, http.failures
    finally:
        q.kill()
