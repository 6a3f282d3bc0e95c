"""The PostgreSQL benchmark's relay section, so `make bench` cannot rot: a short run parks its
daemons' claims on one replica, POSTs launches none of their nodes fits to the other, leaves
every claim waiting (none of them took one), and merges its section beside the file's others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import pg_bench


def test_a_short_relay_run_leaves_every_claim_waiting_and_merges_its_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench-results.json"
    out.write_text(json.dumps({"scheduling": {"kept": True}}))
    assert pg_bench.main(["--quick", "--only", "pg_relay", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["scheduling"] == {"kept": True} and "pg_concurrency" not in doc
    section = doc["pg_relay"]
    assert section["daemons"] == pg_bench.QUICK.relay_daemons
    assert section["launches"] == pg_bench.QUICK.relay_launches
    assert section["claims_waiting_after"] == section["daemons"]  # nobody could take them
    assert section["receiver_cpu_pct"] >= 0 and section["sender_cpu_ms_per_launch"] > 0
    assert "pg_relay.receiver_cpu_ms_per_launch" in capsys.readouterr().out


def test_only_refuses_a_section_it_does_not_have(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        pg_bench.main(["--quick", "--only", "pg_nothing"])
    assert (
        "--only takes some of pg_concurrency, pg_replicas, pg_relay, not pg_nothing"
        in capsys.readouterr().err
    )
