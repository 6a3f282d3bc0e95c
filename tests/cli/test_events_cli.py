"""``nymph events`` against a real server: the table, ``-o json`` (the queue's event objects),
``--after`` from the cursor it prints, filters, and a bad cursor as a usage error."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_user_verbs import _setup
from tests.support.queue_helpers import Served
from tests.support.queue_helpers import run_cli as run

pytestmark = pytest.mark.usefixtures("cli_isolated")


async def _two_launches(served: Served) -> list[str]:
    async with served.client(served.daemon_token) as d:  # a live daemon: no launch waits for one
        assert await d.claim(daemon_id="d1", node="n1", capacity=1, wait=0) == []
    async with served.client(served.user_token) as u:
        ids = [
            (await u.launch(provider="kind", mode="small", script="print(1)"))["instanceId"] for _ in range(2)
        ]
        await u.stop(provider="kind", instance_id=ids[0])
        return ids


@pytest.mark.sqlite_only
def test_events_lists_reads_on_and_filters(env: Served, capsys: pytest.CaptureFixture[str]) -> None:
    env.run(_setup(env))
    a, b = env.run(_two_launches(env))
    code, out, err = run(capsys, "events", "-o", "json")
    assert code == 0, err
    events = json.loads(out)
    assert [(e["instanceId"], e["state"]) for e in events] == [(a, "queued"), (b, "queued"), (a, "stopped")]
    assert err.strip() == f"read on with: --after {events[-1]['cursor']}"
    code, out, err = run(capsys, "events", "kind", "--limit", "1")
    rows = out.splitlines()
    assert code == 0 and rows[0].split()[:4] == ["CURSOR", "AT", "INSTANCE", "STATE"]
    assert len(rows) == 2 and rows[1].split()[2:4] == [a, "queued"]
    after = err.split()[-1]
    code, out, _ = run(capsys, "events", "--after", after, "--instance", a, "-o", "json")
    assert [e["state"] for e in json.loads(out)] == ["stopped"]
    code, out, _ = run(capsys, "events", "nope", "-o", "json")
    assert code == 0 and json.loads(out) == []
    code, _, err = run(capsys, "events", "--after", "x")
    assert code == 2 and "not an event cursor" in err
