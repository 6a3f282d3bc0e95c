"""The PostgreSQL writes section of docs/performance.md (``benchmarks/pg_bench.py``, under
``pg_concurrency`` and ``pg_replicas``)."""

from __future__ import annotations

import textwrap
from typing import Any


def _fill(text: str) -> str:
    return textwrap.fill(text, width=96, break_on_hyphens=False, break_long_words=False)


def _pcts(values: list[float]) -> str:
    return " + ".join(f"{v}%" for v in values)


def pg_writes(r: dict[str, Any]) -> str:
    """Writes to different launches at once, and 3 replicas against 1, one round trip away."""
    c, rep = r.get("pg_concurrency"), r.get("pg_replicas")
    if not isinstance(c, dict) or not isinstance(rep, dict):
        return ""
    rows = rep.get("replicas") or {}
    out = [
        "## PostgreSQL one round trip away",
        "",
        _fill(
            "`benchmarks/pg_bench.py` (run by `make bench`): the queue's replicas reach a real "
            "PostgreSQL server through a TCP proxy on loopback that delays every byte "
            f"{c.get('delay_ms_each_way')} ms each way, as a database on another machine of the zone "
            "would. Writes run at once on every replica (row locks, conditional updates, unique keys "
            "and per-namespace locks, no global write lock: see operating.md). Run of "
            f"{c.get('when')}, {c.get('cpus')} CPUs, shared by the replicas, PostgreSQL, the proxy and "
            "the load generator."
        ),
        "",
        "| launch POSTs, one replica | one at a time (median ms) | 16 at once, different launches (median ms) "
        "| `pg_concurrency.ratio_16_to_1` (target <= 2.0) |",
        "|---|---:|---:|---:|",
        f"| {c.get('rounds')} rounds | {c.get('one_post_ms')} | {c.get('burst_16_ms')} | {c.get('ratio_16_to_1')} |",
        "",
        _fill(
            f"POST + claim (capacity 1) + complete, in {rep.get('workers')} loops spread over the "
            f"replicas, each a daemon of one of {rep.get('teams')} teams (namespaces, each with its "
            "own kube namespace: claims of one namespace take that namespace's lock). Launches "
            "completed per second, and the CPU of each process meanwhile (% of one core):"
        ),
        "",
        "| replicas | launches/s | each replica | PostgreSQL | proxy | load generator "
        "| machine load (1 min) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for count, row in sorted(rows.items(), key=lambda kv: int(kv[0])):
        out.append(
            f"| {count} | {row['launches_per_s']} | {_pcts(row['replica_cpu_pct'])} | "
            f"{row.get('postgres_cpu_pct')}% | {row['proxy_cpu_pct']}% | {row.get('load_cpu_pct')}% | "
            f"{row.get('machine_load_1m')} |"
        )
    out += ["", f"`pg_replicas.ratio_3_to_1` (target >= 1.5): {rep.get('ratio_3_to_1')}."]
    return "\n".join(out)
