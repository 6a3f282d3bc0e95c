"""The sections of docs/performance.md about the queue under load: the scheduler with a backlog
(``scheduling``), the CLI's start (``cli_startup_ratio``) and many daemons (``daemons_1000``)."""

from __future__ import annotations

import textwrap
from typing import Any


def _n(x: int) -> str:
    return f"{x:,}"


def scheduling(r: dict[str, Any]) -> str:
    """The scheduler with a backlog (``benchmarks/schedule_bench.py``, under ``scheduling``)."""
    s = r.get("scheduling") or {}
    runs = {b: s[b] for b in ("sqlite", "postgresql") if isinstance(s.get(b), dict) and "backlog" in s[b]}
    if not runs:
        return ""
    out = [
        "## Scheduling with a backlog",
        "",
        textwrap.fill(
            "`benchmarks/schedule_bench.py` (run by `make bench`) on each backend: queued launches "
            "seeded in bulk into a fresh database, then launch POSTs through the API and claims by one "
            "daemon with a CPU node offer (capacity 1, each claimed launch then completed and reported "
            "stopped), the time of one page of 500 of that namespace's instances (waiting reasons "
            "worked out when read), a runnable launch behind an unrunnable backlog (POST -> the claim "
            "that hands it out, the daemon holding a long-poll), and a small team's launches queued "
            "after a big team's (one daemon of capacity 1). Run of "
            f"{s.get('when')}, {s.get('seconds')} s, {s.get('cpus')} CPUs.",
            width=96,
            break_on_hyphens=False,
            break_long_words=False,
        ),
        "",
        "| backend | queued | claim p50 ms | claim p95 ms | POST p50 ms | POST p95 ms | page of 500 p50 ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for backend, b in runs.items():
        for size, row in sorted(b["backlog"].items(), key=lambda kv: int(kv[0])):
            out.append(
                f"| {backend} | {_n(int(size))} | {row['claim_ms']['p50']} | {row['claim_ms']['p95']} | "
                f"{row['post_ms']['p50']} | {row['post_ms']['p95']} | {row['list_page_500_ms']['p50']} |"
            )
    out += [
        "",
        "| backend | claim p50 ratio, largest to smallest backlog (target <= 1.5) | POST p50 ratio | "
        "runnable launch behind unrunnable backlog, POST -> claimed p50 / max ms |",
        "|---|---:|---:|---:|",
    ]
    for backend, b in runs.items():
        st = b.get("starvation_ms") or {}
        behind = f" ({_n(b['unrunnable_queued'])})" if b.get("unrunnable_queued") else ""
        out.append(
            f"| {backend} | {b.get('claim_p50_ratio_100k_to_1k')} | {b.get('post_p50_ratio_100k_to_1k')} | "
            f"{st.get('p50')} / {st.get('max')}{behind} |"
        )
    labels = {
        "pods_keep_running": "Pods keep running",
        "pods_end_before_next_claim": "each Pod ends before the next claim",
    }
    shares = [
        (backend, name, row)
        for backend, b in runs.items()
        for name, row in (b.get("share_10k_vs_10") or {}).items()
    ]
    if shares:
        out += [
            "",
            "| fair share, one daemon of capacity 1 | backend | big team queued | small team queued | "
            "small's started by (p50 / max ms) | claims until small's last | big's first started (p50 / max ms) |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for backend, name, row in shares:
            small = row.get("small_started_ms")
            started = (
                f"{small['p50']} / {small['max']}"
                if small
                else f"{row['small_started']} of {row['small_queued']} after {_n(row['claims'])} claims "
                f"({row['seconds']} s)"
            )
            out.append(
                f"| {labels.get(name, name)} | {backend} | {_n(row['big_queued'])} | {row['small_queued']} | "
                f"{started} | {row.get('claims_until_small_done') or '-'} | "
                f"{row['big_first_started_ms']['p50']} / {row['big_first_started_ms']['max']} |"
            )
    return "\n".join(out)


def cli_startup(r: dict[str, Any]) -> str:
    """The ``nymph`` command's start (``benchmarks/cli_startup.py``, under ``cli_startup_ratio``)."""
    c = r.get("cli_startup_ratio") or {}
    ms = c.get("median_ms") or {}
    base = ms.get("python -c pass")
    rows = [(name, t) for name, t in ms.items() if name != "python -c pass" and name in c]
    if not base or not rows:
        return ""
    out = [
        "## The CLI's start",
        "",
        textwrap.fill(
            "`benchmarks/cli_startup.py` (run by `make bench`): each command in a fresh interpreter, "
            f"the median of {c.get('repeat')} interleaved runs, against `python -c pass` in the same run "
            f"({base} ms); `instances` and `launch` are whole calls to a queue the benchmark starts. "
            f"Run of {c.get('when')}. Target: at most 8x.",
            width=96,
            break_on_hyphens=False,
            break_long_words=False,
        ),
        "",
        "| command | median ms | x `python -c pass` |",
        "|---|---:|---:|",
    ]
    out += [f"| `nymph {name}` | {t} | {c[name]}{'' if c[name] <= 8 else ' (over 8)'} |" for name, t in rows]
    return "\n".join(out)


def _rounds(row: dict[str, Any]) -> str:
    rounds = row.get("cpu_ms_per_launch_rounds")
    return f" ({', '.join(str(c) for c in rounds)})" if rounds else ""


def daemons(r: dict[str, Any]) -> str:
    """Many daemons long-polling one queue (``benchmarks/daemons_bench.py``, under ``daemons_1000``)."""
    d = r.get("daemons_1000") or {}
    runs = d.get("runs") or {}
    if not runs:
        return ""
    out = [
        "## Many daemons",
        "",
        textwrap.fill(
            "`benchmarks/daemons_bench.py` (run by `make bench`): a fresh SQLite queue, 1, 100 and "
            "1,000 daemons long-polling it from load-generator processes (each its own session and "
            "node offer, the same total capacity, each long-poll held as long as the daemon's "
            f"default, {d.get('poll_wait_s', 30)} s, their timeouts spread evenly), and a steady stream "
            f"of {d.get('rate_per_s')} launches/s for {d.get('seconds')} s"
            + (f", {d['rounds']} times on the same daemons" if d.get("rounds") else "")
            + (
                " (every count's queue and daemons up together, each round's streams at the same "
                "time, so a slow spell of the machine falls on each count alike)"
                if d.get("counts_together")
                else (
                    " (every count's queue and daemons up together, the counts taking turns, so a "
                    "slow spell of the machine falls on each count alike)"
                    if d.get("counts_take_turns")
                    else ""
                )
            )
            + ". POST -> claim is the queue's "
            "own histogram (`nymph_queue_launch_claim_seconds`), so the generator's delays do not count; "
            "CPU per launch is the queue's CPU over the stream (the long-polls timing out meanwhile "
            "included) over the launches"
            + (" (the median of the rounds; each round's in brackets)" if d.get("rounds") else "")
            + "; idle is read over one whole hold (each long-poll times out "
            "and is sent again once). "
            f"Run of {d.get('when')}, {d.get('cpus')} CPUs shared by the queue and the generators. "
            "Targets with 1,000 daemons: p95 at most 2x one daemon's, queue CPU per launch at most "
            "1.2x, idle queue CPU under 5% of a core.",
            width=96,
            break_on_hyphens=False,
            break_long_words=False,
        ),
        "",
    ]
    backlog = any(row.get("backlog_cpu_pct") is not None for row in runs.values())
    if backlog:
        out += [
            textwrap.fill(
                f"Last, {_n(int(d.get('backlog_launches') or 0))} launches that no daemon's node can "
                "run (each requests more CPU than any node offers) are POSTed to each count's queue "
                "at the same rate: its CPU per such launch (their wake-ups included), then its CPU "
                "while they wait (the sweeps, one every 5 s, give each its reason, judged against "
                "every live daemon's offer).",
                width=96,
                break_on_hyphens=False,
                break_long_words=False,
            ),
            "",
        ]
    out += [
        "| daemons | POST -> claim p50 ms | p95 ms | queue CPU ms / launch | idle queue CPU % |"
        + (" CPU ms / launch no node fits | queue CPU % while they wait |" if backlog else ""),
        "|---:|---:|---:|---:|---:|" + ("---:|---:|" if backlog else ""),
    ]
    for n, row in sorted(runs.items(), key=lambda kv: int(kv[0])):
        out.append(
            f"| {_n(int(n))} | {row['p50_ms']} | {row['p95_ms']} | {row['cpu_ms_per_launch']}{_rounds(row)} | "
            f"{row['idle_cpu_pct']} |"
            + (f" {row.get('backlog_cpu_ms_per_launch')} | {row.get('backlog_cpu_pct')} |" if backlog else "")
        )
    paired = round_ratios(d)
    of_medians = d.get("cpu_ms_per_launch_ratio_of_medians")
    how = " (the median of the rounds' ratios below)" if paired and of_medians is not None else ""
    out += [
        "",
        f"p95 ratio {d.get('p95_ratio')} (target <= 2.0), CPU per launch ratio "
        f"{d.get('cpu_ms_per_launch_ratio')}{how} (target <= 1.2), idle {d.get('idle_cpu_pct')}% (target < 5).",
    ]
    if paired:
        out += [
            "",
            textwrap.fill(
                f"Round by round (each pair from one {'round' if d.get('counts_together') else 'turn of the counts'}), "
                f"{_n(max(int(n) for n in runs))} "
                f"daemons' CPU per launch over one daemon's: {', '.join(f'{p:.2f}' for p in paired)}. "
                "How far these lie apart shows how much the ratio moves with the machine's pace"
                + (
                    f"; the ratio of the two counts' medians is {of_medians}."
                    if of_medians is not None
                    else "."
                ),
                width=96,
                break_on_hyphens=False,
                break_long_words=False,
            ),
        ]
    return "\n".join(out)


def round_ratios(d: dict[str, Any]) -> list[float]:
    """The largest count's CPU per launch over one daemon's, round by round: the counts' streams
    of one round ran at the same time (or took turns), so they met the same pace of the
    machine. Empty when the run did neither or its counts kept different numbers of rounds."""
    runs = d.get("runs") or {}
    if not (d.get("counts_take_turns") or d.get("counts_together")) or len(runs) < 2:
        return []
    one = runs[min(runs, key=int)].get("cpu_ms_per_launch_rounds")
    top = runs[max(runs, key=int)].get("cpu_ms_per_launch_rounds")
    return [round(p, 2) for p in paired_ratios(one, top)]


def paired_ratios(one: list[float] | None, top: list[float] | None) -> list[float]:
    """``top``'s CPU per launch over ``one``'s, round by round (to 4 places); empty unless both
    kept the same number of rounds, ``one``'s each above zero."""
    if not one or not top or len(one) != len(top) or not all(one):
        return []
    return [round(t / o, 4) for t, o in zip(top, one, strict=True)]
