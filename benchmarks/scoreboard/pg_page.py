"""The PostgreSQL writes section of docs/performance.md (``benchmarks/pg_bench.py``, under
``pg_concurrency``, ``pg_replicas`` and ``pg_relay``)."""

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
    ]
    client, durable = c.get("queue_client"), c.get("durable")
    if isinstance(client, dict):
        out.append(
            f"| the same, sent by nymph's own client (`QueueClient`) | {client.get('one_post_ms')} "
            f"| {client.get('burst_16_ms')} | {client.get('ratio_16_to_1')} |"
        )
    if isinstance(durable, dict):
        out.append(
            f"| the same, the server flushing each commit to disk | {durable.get('one_post_ms')} "
            f"| {durable.get('burst_16_ms')} | {durable.get('ratio_16_to_1')} |"
        )
    if isinstance(client, dict):
        out += [
            "",
            _fill(
                "The POSTs come from a lean load generator (`benchmarks/rawpost.py`: a request written "
                "and its answer read by its length), which takes about a third of the CPU per POST that "
                "nymph's own client takes from the cores it shares with what is timed; the second row is "
                "the same run with nymph's client as the load."
            ),
        ]
    if isinstance(durable, dict):
        out += [
            "",
            _fill(
                "The tests' PostgreSQL server does not flush commits to disk; the last row is a server "
                "that does (`fsync` and `synchronous_commit` on, as in production), where a lock a write "
                "held until its commit would be held for the flush too: there a share of "
                f"{durable.get('lock_wait_share')} of the busy backends sampled ({durable.get('lock_samples')} "
                "samples) waited for a lock."
            ),
        ]
    if c.get("replica_cpu_ms_per_burst") is not None:
        out += [
            "",
            _fill(
                f"What bounds a burst: the replica's own CPU for one was {c['replica_cpu_ms_per_burst']} ms "
                "(one Python process runs on one core at a time, so 16 POSTs take at least that), and of "
                f"the database's busy backends sampled during as many untimed bursts ({c.get('lock_samples')} samples) "
                f"a share of {c.get('lock_wait_share')} waited for a lock"
                + (
                    " (the statement that waited most: `" + max(by, key=lambda k: by[k]) + "...`)"
                    if (by := c.get("lock_waits_by_statement"))
                    else ""
                )
                + "."
                + (
                    f" Every process's CPU for a burst: replica {by_proc.get('replica')}, load generator "
                    f"{by_proc.get('load')}, proxy {by_proc.get('proxy')}, PostgreSQL {by_proc.get('postgres')} "
                    f"ms; spread over the {c.get('cpus')} CPUs that is {c.get('cpu_floor_ms')} ms, the least "
                    "a burst can take here whatever waits for what."
                    if isinstance(by_proc := c.get("cpu_ms_per_burst"), dict)
                    else ""
                )
                + (
                    f" POSTs that reach the replica together are written together (`nymph/queue/launchbatch.py`): "
                    f"{c['launches_per_batch']} launches per write, on average over the timed POSTs (each "
                    "single POST a write of its own)."
                    if c.get("launches_per_batch") is not None
                    else ""
                )
                + (
                    f" The replica switched threads {c['replica_context_switches_per_post']} times per POST "
                    "(its transactions run on its event loop's thread, so no thread hands the "
                    "interpreter's lock to another at each wait for the server)."
                    if c.get("replica_context_switches_per_post") is not None
                    else ""
                )
            ),
        ]
    limit = rep.get("replica_cpu_limit")
    out += [
        "",
        _fill(
            "POST + claim (capacity 1) + complete, in loops spread over the replicas, each a daemon "
            f"of one of {rep.get('teams')} teams (namespaces, each with its own kube namespace: claims "
            "of one namespace take that namespace's lock). Launches completed per second, and the "
            "CPU of each process meanwhile (% of one core)"
            + (
                f", each replica held to {limit} of a core (a cgroup CPU quota, as a replica Pod's "
                f"`resources.limits.cpu: {int(limit * 1000)}m` holds it, or a replica on a node of its "
                f"own) and serving {rep.get('loops_per_replica')} loops: a second and third replica "
                "add a replica's worth of CPU and of load, so the ratio shows whether their writes run "
                "side by side (with one global write lock it would stay near 1):"
                if limit
                else f", {rep.get('workers')} loops:"
            )
        ),
        "",
    ]
    out += _rows(rows)
    out += ["", f"`pg_replicas.ratio_3_to_1` (target >= 1.5): {rep.get('ratio_3_to_1')}."]
    free = rep.get("unlimited") or {}
    if free.get("replicas"):
        out += [
            "",
            _fill(
                f"The same without CPU limits, {rep.get('workers')} loops whatever the count: one replica "
                "does not fill a core, and the replicas, PostgreSQL, the proxy and the load generator "
                "share this machine's cores, so more replicas cannot add much here (ratio "
                f"{free.get('ratio_3_to_1')}):"
            ),
            "",
            *_rows(free["replicas"]),
        ]
    out += _relay(r.get("pg_relay"))
    return "\n".join(out)


def _relay(relay: Any) -> list[str]:
    """What a replica spends on launches POSTed to another that none of its claims may take."""
    if not isinstance(relay, dict):
        return []
    return [
        "",
        _fill(
            f"Launches posted to one replica, heard of by another (`pg_relay`, run of {relay.get('when')}): "
            f"{relay.get('daemons')} daemons, each node offering 8 CPUs, park their claims on the second "
            f"replica; {relay.get('launches')} launches that each request 64 CPUs are POSTed to the first, "
            f"{relay.get('rate_per_s')} a second. The wake each launch sends through the database says "
            "what the launch needs, so the second replica wakes none of its claims for them: it spent "
            f"{relay.get('receiver_cpu_ms_per_launch')} ms of CPU per launch ({relay.get('receiver_cpu_pct')}% "
            f"of a core while they came, {relay.get('receiver_idle_cpu_pct')}% over as long without them); "
            f"the first spent {relay.get('sender_cpu_ms_per_launch')} ms per launch it took. "
            f"{relay.get('claims_waiting_after')} claims were still waiting after the last launch."
        ),
    ]


def _rows(rows: dict[str, Any]) -> list[str]:
    out = [
        "| replicas | loops | launches/s | each replica | PostgreSQL | proxy | load generator "
        "| machine load (1 min) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for count, row in sorted(rows.items(), key=lambda kv: int(kv[0])):
        out.append(
            f"| {count} | {row.get('loops', '')} | {row['launches_per_s']} | {_pcts(row['replica_cpu_pct'])} | "
            f"{row.get('postgres_cpu_pct')}% | {row['proxy_cpu_pct']}% | {row.get('load_cpu_pct')}% | "
            f"{row.get('machine_load_1m')} |"
        )
    return out
