"""The list verbs' paging against a real server: ``--limit N`` shows one page and prints on
stderr the command that shows the next (which works, page after page, to the end); ``--all``
shows everything; the default of ``nymph instances`` is the first page, saying when more
follow; bad flags and a bad token are errors that say what to do."""

from __future__ import annotations

import shlex

import pytest

import nymph.cli.paging as cli_paging
import nymph.queue.paging as queue_paging
from nymph.cli.paging import next_command
from tests.support.queue_helpers import Served
from tests.support.queue_helpers import run_cli as run

pytestmark = pytest.mark.usefixtures("cli_isolated")


def _seed(served: Served, *, launches: int, secrets: int = 0) -> list[str]:
    async def go() -> list[str]:
        async with served.client(served.user_token) as c:
            await c.create_provider(name="kind", kwargs={"namespace": "jobs"}, dispatch="daemon")
            await c.create_mode(name="small", provider="kind", fields={"image": "python:3.12-slim"})
            for i in range(secrets):
                await c.set_secret(name=f"s{i}", value="v")
            return [
                (await c.launch(provider="kind", mode="small", script="print(1)"))["instanceId"]
                for _ in range(launches)
            ]

    return served.run(go())


def _ids(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines()[1:] if line.strip()]


def _next(err: str) -> list[str]:
    """The command the hint on stderr says to run next (without the leading ``nymph``)."""
    [line] = [ln.strip() for ln in err.splitlines() if ln.strip().startswith("nymph ")]
    words = shlex.split(line)
    assert words[0] == "nymph"
    return words[1:]


def test_limit_pages_through_with_the_printed_command(
    env: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = _seed(env, launches=7)
    code, out, err = run(capsys, "instances", "kind", "--limit", "3")
    assert code == 0 and _ids(out) == ids[:3]
    assert "more follow" in err and "--all" in err
    again = _next(err)
    assert again[:4] == ["instances", "kind", "--limit", "3"] and again[4] == "--continue"
    seen = _ids(out)
    while again:
        code, out, err = run(capsys, *again)
        assert code == 0, err
        seen += _ids(out)
        again = _next(err) if "more follow" in err else []
    assert seen == ids
    assert err == ""  # the last page says nothing more
    # the same through `providers instances`, with a state filter carried into the next command
    code, out, err = run(capsys, "providers", "instances", "kind", "--state", "queued", "--limit", "5")
    assert code == 0 and _ids(out) == ids[:5]
    assert _next(err)[:5] == ["instances", "kind", "--state", "queued", "--limit"]


def test_all_and_the_default_first_page(
    env: Served, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _seed(env, launches=6)
    code, out, err = run(capsys, "instances", "kind")
    assert code == 0 and _ids(out) == ids and err == ""  # under one page: all, no hint
    code, out, err = run(capsys, "instances", "kind", "--all")
    assert code == 0 and _ids(out) == ids and err == ""
    # a default page smaller than the list: the first page, and a hint that more follow
    monkeypatch.setattr(queue_paging, "DEFAULT_LIMIT", 4)
    monkeypatch.setattr(cli_paging, "DEFAULT_LIMIT", 4)
    monkeypatch.setattr(cli_paging, "FOLLOW_LIMIT", 4)
    code, out, err = run(capsys, "instances", "kind")
    assert code == 0 and _ids(out) == ids[:4]
    assert "more follow" in err and "a page of at most 4" in err
    assert _next(err)[:3] == ["instances", "kind", "--continue"]
    code, out, err = run(capsys, "instances", "kind", "--all")  # follows pages of 4
    assert code == 0 and _ids(out) == ids and err == ""


def test_other_list_verbs_page_too(env: Served, capsys: pytest.CaptureFixture[str]) -> None:
    _seed(env, launches=0, secrets=5)
    code, out, err = run(capsys, "secrets", "list")
    assert code == 0 and _ids(out) == [f"s{i}" for i in range(5)] and err == ""
    code, out, err = run(capsys, "secrets", "list", "--limit", "2")
    assert code == 0 and _ids(out) == ["s0", "s1"]
    assert _next(err)[:4] == ["secrets", "list", "--limit", "2"]
    code, out, _ = run(capsys, *_next(err))
    assert _ids(out) == ["s2", "s3"]
    for verb in (("providers", "list"), ("modes", "list")):
        code, out, err = run(capsys, *verb, "--limit", "1")
        assert code == 0 and len(_ids(out)) == 1 and err == "", verb  # one of one: nothing more


def test_bad_paging_flags_say_what_to_do(env: Served, capsys: pytest.CaptureFixture[str]) -> None:
    _seed(env, launches=2)
    for bad in ("0", "5001", "x"):
        with pytest.raises(SystemExit) as exited:  # argparse refuses it before any call
            run(capsys, "instances", "kind", "--limit", bad)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and "--limit" in err and "5000" in err, err
    code, _, err = run(capsys, "instances", "kind", "--all", "--limit", "2")
    assert code == 2 and "--all" in err and "--limit" in err
    code, _, err = run(capsys, "instances", "kind", "--continue", "not-a-token")
    assert code == 2 and "start the listing again without continue" in err


def test_the_next_command_never_carries_credentials() -> None:
    line = next_command(["instances", "my kind"], namespace="team-a", limit=50, token="abc.def")
    assert line == "nymph instances 'my kind' -n team-a --limit 50 --continue abc.def"
    assert next_command(["secrets", "list"], namespace="default", limit=None, token="t") == (
        "nymph secrets list --continue t"
    )
