"""The PostgreSQL benchmark's concurrency section, so `make bench` cannot rot: a short run
through the latency proxy times single POSTs and bursts of 16, accounts every process's CPU,
and finds the bursts' launches written several to a write."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks import pg_bench
from tests.support.latency_proxy import pg_url_through
from tests.support.pg_server import PgServer


async def test_a_short_concurrency_run_times_bursts_and_writes_their_launches_together(
    pg_server: PgServer,
) -> None:
    p = dataclasses.replace(pg_bench.QUICK, rounds=3, warmup_bursts=2)
    raw = pg_server.fresh_database()
    dbname = raw.split("/", 3)[3].split("?", 1)[0]
    assert pg_server.proc is not None
    try:
        with (
            pg_bench.proxy(pg_server, p) as (port, proxy_pid),
            pg_bench.LockSampler(pg_server.url(), dbname) as sampler,
        ):
            got = await pg_bench.concurrency(
                pg_url_through(raw, port), p, sampler, proxy_pid, pg_server.proc.pid
            )
    finally:
        pg_server.drop_database(raw)
    # a single POST is two round trips through the proxy (1 ms each way) at least
    assert got["one_post_ms"] >= 4.0 and got["burst_16_ms"] >= got["one_post_ms"]
    # (the ratio is of the unrounded medians)
    assert got["ratio_16_to_1"] == pytest.approx(got["burst_16_ms"] / got["one_post_ms"], abs=0.02)
    assert set(got["cpu_ms_per_burst"]) == {"replica", "load", "proxy", "postgres"}
    assert got["cpu_ms_per_burst"]["replica"] > 0
    # each round is one POST alone and 16 at once: more than one launch per write means the
    # bursts were batched
    assert got["launches_per_batch"] is not None and got["launches_per_batch"] > 1
