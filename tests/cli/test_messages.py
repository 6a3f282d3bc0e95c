"""What the CLI tells a user, against a real queue: downloads that never clobber files, stops of
stopped instances, and connection mistakes that say what to set."""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import pytest

from tests.support.queue_helpers import Served
from tests.support.queue_helpers import run_cli as run

pytestmark = pytest.mark.usefixtures("cli_isolated")


def _launched(env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str:
    assert run(capsys, "providers", "add", "kind", "--launcher", "Kube", "--dispatch", "daemon")[0] == 0
    assert run(capsys, "modes", "add", "small", "--provider", "kind", "--field", "image=busybox")[0] == 0
    (tmp_path / "job.py").write_text("print('hello')\n")
    code, out, _ = run(capsys, "launch", "kind", "--mode", "small", "--script", "job.py")
    assert code == 0
    return out.strip()


def _ran_with_results(env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str:
    iid = _launched(env, capsys, tmp_path)

    async def daemon() -> None:
        async with env.client(env.daemon_token) as d:
            [task] = await d.claim(daemon_id="d1", node="n1", capacity=1, wait=5)
            await d.complete(daemon_id="d1", task_id=task["taskId"], ok=True)
            for path, data in (("a.txt", b"from the job\n"), ("sub/b.txt", b"nested\n")):
                await d.upload_result(daemon_id="d1", instance_id=iid, path=path, data=data, eof=True)

    env.run(daemon())
    return iid


def test_results_get_writes_under_the_instance_dir_and_never_replaces_a_file(
    env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    iid = _ran_with_results(env, capsys, tmp_path)
    (tmp_path / "a.txt").write_text("a file of the user's\n")

    code, out, _ = run(capsys, "results", "get", "kind", iid)
    assert code == 0, out
    assert (tmp_path / iid / "a.txt").read_text() == "from the job\n"
    assert (tmp_path / iid / "sub" / "b.txt").read_text() == "nested\n"
    assert (tmp_path / "a.txt").read_text() == "a file of the user's\n"

    # a second download replaces nothing, and says how to
    (tmp_path / iid / "a.txt").write_text("edited\n")
    code, _, err = run(capsys, "results", "get", "kind", iid)
    assert code == 2 and "already there, not replaced" in err and "--force" in err
    assert (tmp_path / iid / "a.txt").read_text() == "edited\n"
    code, _, err = run(capsys, "results", "get", "kind", iid, "a.txt", "-d", ".")
    assert code == 2 and "a.txt" in err
    assert (tmp_path / "a.txt").read_text() == "a file of the user's\n"

    code, _, _ = run(capsys, "results", "get", "kind", iid, "--force")
    assert code == 0 and (tmp_path / iid / "a.txt").read_text() == "from the job\n"
    # -d DIR and --dir DIR; -o is the list verbs' output format, refused here with what to write
    assert run(capsys, "results", "get", "kind", iid, "-d", "out")[0] == 0
    assert run(capsys, "results", "get", "kind", iid, "sub/b.txt", "--dir", "old")[0] == 0
    assert (tmp_path / "out" / "a.txt").is_file() and (tmp_path / "old" / "sub" / "b.txt").is_file()
    with pytest.raises(SystemExit) as exited:
        run(capsys, "results", "get", "kind", iid, "-o", "json")
    assert exited.value.code == 2 and "-d DIR" in capsys.readouterr().err


def test_stopping_a_stopped_instance_says_it_was_already_stopped(
    env: Served, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    iid = _launched(env, capsys, tmp_path)
    code, out, _ = run(capsys, "stop", "kind", iid)
    assert code == 0 and out.strip() == f"stop requested for {iid}"
    code, out, _ = run(capsys, "stop", "kind", iid)
    assert code == 0 and out.startswith(f"{iid} was already stopped") and "requested" not in out
    code, _, err = run(capsys, "stop", "kind", "lakeshore-00000000")
    assert code == 2 and "no instance 'lakeshore-00000000'" in err


def test_a_missing_or_refused_token_names_where_to_set_one(
    served: Served, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NYMPH_URL", served.url)
    code, _, err = run(capsys, "providers", "list")
    assert code == 2 and "needs a token (HTTP 401)" in err
    assert "NYMPH_TOKEN" in err and "--token" in err and ".dreamrc" in err and "Authorization" not in err
    code, _, err = run(capsys, "providers", "list", "--token", "not-a-token")
    assert code == 2 and "refused the token from --token" in err and "NYMPH_TOKEN" in err
    assert "not-a-token" not in err


def test_a_url_that_is_not_a_nymph_queue_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        code, _, err = run(capsys, "instances", "kind", "--url", url, "--token", "t")
    finally:
        server.shutdown()
        server.server_close()
    assert code == 2 and "answered HTTP 404 on the queue API: it is not a nymph queue" in err
    assert "nymph queue serve" in err and "(HTTP 404)" not in err


def test_a_url_naming_v1_or_without_a_scheme_says_what_to_set(
    served: Served, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NYMPH_TOKEN", served.user_token)
    monkeypatch.setenv("NYMPH_URL", served.url + "/v1/")
    code, _, err = run(capsys, "providers", "list")
    assert code == 2 and "(from NYMPH_URL) names the API path" in err and f"without /v1 ({served.url})" in err
    bare = served.url.removeprefix("http://")
    code, _, err = run(capsys, "providers", "list", "--url", bare)
    assert code == 2 and "(from --url) has no http://" in err and f"set it to http://{bare}" in err
    # the root URL itself works
    assert run(capsys, "providers", "list", "--url", served.url)[0] == 0
