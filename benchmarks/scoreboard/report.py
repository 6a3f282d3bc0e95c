"""Ratios, targets and the printed table of a scoreboard run."""

from __future__ import annotations

from typing import Any

KUBECTL = ("kubectl_batched", "kubectl_single")


def ratios(results: dict[str, Any]) -> dict[str, float | None]:
    """Every ratio to raw, under keys ending in ``_ratio``: ``<config>_ratio`` at the largest N
    (against raw at the same concurrency), ``<config>_n<N>_ratio`` per N, and the same against
    a serial raw loop as ``<config>_vs_serial_ratio``."""
    raw = results["raw"]["concurrent"]["per_s"]
    serial = results["raw"]["serial"]["per_s"]
    out: dict[str, float | None] = {}
    for name, res in results["nymph"].items():
        sizes = sorted(res["throughput"], key=int)
        for n in sizes:
            out[f"{name}_n{n}_ratio"] = round(res["throughput"][n]["per_s"] / raw, 3) if raw else None
        top = res["throughput"][sizes[-1]]["per_s"]
        out[f"{name}_ratio"] = round(top / raw, 3) if raw else None
        out[f"{name}_vs_serial_ratio"] = round(top / serial, 3) if serial else None
    kc = results.get("kubectl_invocation", {}).get("cache_speedup_ratio")
    if kc is not None:
        out["kubectl_cache_speedup_ratio"] = kc
    return out


#: nymph's own processes: what a launch costs beyond what Kubernetes spends on its Pod.
OWN = ("queue", "daemon", "kubectl")
#: The most nymph's own CPU per launch may be, as a multiple of the API server's per Pod create.
CPU_VS_APISERVER_GOALS = {"api": 1.0, "direct": 1.0, "kubectl_batched": 3.0}


def _cpu_at_largest_n(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per dispatch path of :data:`CPU_VS_APISERVER_GOALS` that ran: each process's CPU per
    launch at its largest N."""
    out: dict[str, dict[str, float]] = {}
    for name in CPU_VS_APISERVER_GOALS:
        res = results["nymph"].get(name)
        if res:
            out[name] = res["throughput"][max(res["throughput"], key=int)].get("cpu_ms_per_launch") or {}
    return out


def _own(cpu: dict[str, float]) -> float:
    return sum(float(cpu.get(k) or 0) for k in OWN)


def cpu_vs_apiserver(results: dict[str, Any]) -> dict[str, float | None]:
    """Per dispatch path: nymph's own CPU per launch at the largest N (queue + daemon +
    kubectl) over the API server's CPU per Pod in the raw create run of the same bench."""
    base = (results["raw"]["concurrent"].get("cpu_ms_per_launch") or {}).get("kube-apiserver")
    return {
        name: round(_own(cpu) / base, 2) if base and cpu else None
        for name, cpu in _cpu_at_largest_n(results).items()
    }


def cpu_vs_apiserver_in_run(results: dict[str, Any]) -> dict[str, float | None]:
    """Per dispatch path: nymph's own CPU per launch at the largest N over the API server's CPU
    per launch in that same run: the same launches, the same window and the same machine state
    (the raw create run's figure moves with how fast its creates go, as its window ends at the
    last ADDED; this one, both sides measured together, moves little). For comparison beside
    :func:`cpu_vs_apiserver`, not a target."""
    out: dict[str, float | None] = {}
    for name, cpu in _cpu_at_largest_n(results).items():
        server = float(cpu.get("kube-apiserver") or 0)
        out[name] = round(_own(cpu) / server, 2) if server else None
    return out


def _applies(results: dict[str, Any]) -> list[tuple[str, int, float]]:
    """(path, apply calls, manifests per call) of each daemon path's largest run that says."""
    out: list[tuple[str, int, float]] = []
    for name, res in results["nymph"].items():
        top = res["throughput"][max(res["throughput"], key=int)]
        if top.get("apply_calls"):
            out.append((name, int(top["apply_calls"]), float(top["manifests_per_apply"])))
    return out


def lifecycle_limit(results: dict[str, Any]) -> float | None:
    """Launches/s the machine's cores could sustain if they did nothing but the control plane's
    share of each Pod's life (create, schedule, kwok's status updates, the watches), as the raw
    run measured it: the bound for a steady stream of launches on these cores, whatever
    dispatches them. A burst outruns it (every throughput figure stops its clock at the last
    ADDED, before most of the Pods' lives are paid for)."""
    life = results["raw"]["concurrent"].get("cpu_ms_per_pod_life") or {}
    cost = sum(life.values())
    cpus = results["machine"].get("cpus") or 0
    return round(cpus * 1000 / cost, 1) if cost and cpus else None


def targets(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The issue's targets, each with the measured value and whether it is met."""
    out: dict[str, dict[str, Any]] = {}

    def check(name: str, value: Any, ok: bool | None, goal: str) -> None:
        out[name] = {"value": value, "goal": goal, "met": ok}

    r = results
    check("api_ratio", r.get("api_ratio"), _ge(r.get("api_ratio"), 0.8), ">= 0.8")
    check(
        "kubectl_batched_ratio",
        r.get("kubectl_batched_ratio"),
        _ge(r.get("kubectl_batched_ratio"), 0.5),
        ">= 0.5",
    )
    raw_p50 = r["raw"]["latency"]["create"]["p50_ms"]
    for name, extra in (("api", 100), *((k, 300) for k in KUBECTL)):
        lat = r["nymph"].get(name, {}).get("latency", {}).get("post_returned_to_added", {}).get("p50_ms")
        goal = raw_p50 + extra if raw_p50 is not None else None
        check(
            f"{name}_latency_p50_ms", lat, None if lat is None or goal is None else lat <= goal, f"<= {goal}"
        )
    for name, value in cpu_vs_apiserver(r).items():
        goal_x = CPU_VS_APISERVER_GOALS[name]
        check(
            f"cpu_per_launch_vs_apiserver.{name}",
            value,
            None if value is None else value <= goal_x,
            f"<= {goal_x}",
        )
    idle = r.get("idle_daemon") or {}
    if idle:
        check(
            "idle_queue_requests_per_min",
            idle["queue_requests_per_min"],
            idle["queue_requests_per_min"] <= 3,
            "<= 3",
        )
        check("idle_cpu_pct_of_core", idle["cpu_pct_of_core"], idle["cpu_pct_of_core"] < 1, "< 1")
        check("idle_rss_mb", idle["rss_mb"], idle["rss_mb"] <= 80, "<= 80")
    soak = r.get("soak") or {}
    if soak.get("rss_growth_pct") is not None:
        check("soak_rss_growth_pct", soak["rss_growth_pct"], soak["rss_growth_pct"] < 10, "< 10")
    return out


def _ge(value: Any, goal: float) -> bool | None:
    return None if value is None else value >= goal


def table(results: dict[str, Any]) -> str:
    lines: list[str] = []
    m = results["machine"]
    lines.append(
        f"machine: {m['cpu_model']}, {m['cpus']} CPUs, {m['memory_gb']} GB, load {m['load_average']}"
    )
    lines.append(f"kube-apiserver {m['kube_apiserver']}, python {m['python']}")
    raw = results["raw"]
    lines.append("")
    lines.append(f"{'throughput':<26} {'n':>5} {'launch/s':>9} {'ratio':>6} {'p50 ms':>8} {'p95 ms':>8}")
    for label, key in (("raw concurrent", "concurrent"), ("raw serial", "serial")):
        x = raw[key]
        lines.append(
            f"{label:<26} {x['launches']:>5} {x['per_s']:>9} {'1.0' if key == 'concurrent' else '':>6} {x['create_p50_ms']!s:>8} {x['create_p95_ms']!s:>8}"
        )
    for name, res in results["nymph"].items():
        for n, t in sorted(res["throughput"].items(), key=lambda kv: int(kv[0])):
            ratio = results.get(f"{name}_n{n}_ratio")
            lat = t["posted_to_added"]
            lines.append(
                f"{name:<26} {n:>5} {t['per_s']:>9} {ratio!s:>6} {lat['p50_ms']!s:>8} {lat['p95_ms']!s:>8}"
            )
    lines.append("")
    lines.append(f"{'latency, one at a time':<26} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}")
    for label, lat in (
        ("raw create", raw["latency"]["create"]),
        ("raw create -> ADDED", raw["latency"]["to_added"]),
    ):
        lines.append(f"{label:<26} {lat['p50_ms']!s:>8} {lat['p95_ms']!s:>8} {lat['p99_ms']!s:>8}")
    for name, res in results["nymph"].items():
        lat = res.get("latency", {}).get("post_returned_to_added")
        if lat:
            lines.append(
                f"{name + ' POST -> ADDED':<26} {lat['p50_ms']!s:>8} {lat['p95_ms']!s:>8} {lat['p99_ms']!s:>8}"
            )
    lines.append("")
    procs = ["queue", "daemon", "kubectl", "kube-apiserver", "etcd", "kwok"]
    lines.append(f"{'CPU ms per launch (max n)':<26} " + " ".join(f"{p:>14}" for p in procs))
    for label, key in (
        ("raw, to the last ADDED", "cpu_ms_per_launch"),
        ("raw, the Pods' lives", "cpu_ms_per_pod_life"),
    ):
        row = raw["concurrent"].get(key)
        if row:
            lines.append(f"{label:<26} " + " ".join(f"{row.get(p, '-')!s:>14}" for p in procs))
    for name, res in results["nymph"].items():
        top = res["throughput"][max(res["throughput"], key=int)]["cpu_ms_per_launch"]
        lines.append(f"{name:<26} " + " ".join(f"{top.get(p, '-')!s:>14}" for p in procs))
    for name, calls, per in _applies(results):
        lines.append(f"{name:<26} {calls} apply calls, {per} manifests each")
    limit = lifecycle_limit(results)
    if limit:
        lines.append(
            f"a steady stream of launches is capped at {limit}/s on these cores by the control plane's"
            " share of each Pod's life alone (a burst outruns it: its clock stops at the last ADDED)"
        )
    kc = results.get("kubectl_invocation")
    if kc:
        lines.append("")
        for label in ("read_only_home", "cache_dir"):
            x = kc[label]
            lines.append(
                f"kubectl apply, {label:<15} p50 {x['wall']['p50_ms']} ms, cpu {x['cpu_ms_mean']} ms, {x['api_requests']} API requests"
            )
    idle = results.get("idle_daemon")
    if idle:
        lines.append("")
        lines.append(
            f"idle daemon over {idle['seconds']} s: RSS {idle['rss_mb']} MB, {idle['cpu_pct_of_core']}% of a core, "
            f"{idle['queue_requests_per_min']} queue requests/min"
        )
    q = results.get("queue") or {}
    if q:
        lines.append("")
        lines.append(
            f"{'queue, pollers':<26} {'claims/s':>9} {'POST p50':>9} {'POST p95':>9} {'cpu ms/launch':>14} {'cpu% @5/s':>10}"
        )
        for d, x in q.items():
            lines.append(
                f"{d:<26} {x['claims_per_s']:>9} {x['post']['p50_ms']!s:>9} {x['post']['p95_ms']!s:>9} "
                f"{x['queue_cpu_ms_per_launch']:>14} {x.get('queue_cpu_pct_at_5_launches_per_s', '-')!s:>10}"
            )
    soak = results.get("soak")
    if soak:
        lines.append("")
        lines.append(
            f"soak {soak['launches']} launches: daemon RSS {soak['rss_mb']} MB, growth {soak['rss_growth_pct']}%"
        )
    tg = results.get("targets")
    if tg:
        lines.append("")
        for name, t in tg.items():
            mark = {True: "met", False: "MISSED", None: "n/a"}[t["met"]]
            lines.append(f"target {name:<32} {t['value']!s:>10} {t['goal']:<12} {mark}")
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    """The tables of docs/performance.md, from one results document (see ``page.py``)."""
    m = results["machine"]
    raw = results["raw"]
    out = [
        f"Machine: {m['cpu_model']}, {m['cpus']} CPUs, {m['memory_gb']} GB RAM, Linux {m['kernel']}, "
        f"Python {m['python']}, kube-apiserver {m['kube_apiserver']} with kwok nodes; load average "
        f"{m['load_average']} at the start, {m.get('load_average_end')} at the end (shared machine: "
        f"compare ratios within the run). Run of {results['when']}, {results['seconds']} s.",
        "",
        "| launches/s (first POST to last Pod ADDED) | n | launches/s | ratio to raw | POST -> ADDED p50 ms |",
        "|---|---:|---:|---:|---:|",
        f"| raw create, concurrency {raw['concurrent']['concurrency']} | {raw['concurrent']['launches']} | "
        f"{raw['concurrent']['per_s']} | 1.0 | (create p50 {raw['concurrent']['create_p50_ms']}) |",
        f"| raw create, serial | {raw['serial']['launches']} | {raw['serial']['per_s']} | "
        f"{round(raw['serial']['per_s'] / raw['concurrent']['per_s'], 3)} | (create p50 {raw['serial']['create_p50_ms']}) |",
    ]
    for name, res in results["nymph"].items():
        for n, t in sorted(res["throughput"].items(), key=lambda kv: int(kv[0])):
            out.append(
                f"| {name} | {n} | {t['per_s']} | {results.get(f'{name}_n{n}_ratio')} | "
                f"{t['posted_to_added']['p50_ms']} |"
            )
    out += [
        "",
        "| latency, one launch at a time | p50 ms | p95 ms | p99 ms |",
        "|---|---:|---:|---:|",
        "| raw create (request -> answer) | {p50_ms} | {p95_ms} | {p99_ms} |".format(
            **raw["latency"]["create"]
        ),
    ]
    for name, res in results["nymph"].items():
        lat = res.get("latency", {}).get("post_returned_to_added")
        if lat:
            out.append(
                f"| {name}: POST returned -> Pod ADDED | {lat['p50_ms']} | {lat['p95_ms']} | {lat['p99_ms']} |"
            )
    procs = ["queue", "daemon", "kubectl", "kube-apiserver", "etcd", "kwok"]
    out += [
        "",
        "| CPU ms per launch (n = largest) | " + " | ".join(procs) + " |",
        "|---" + "|---:" * len(procs) + "|",
    ]
    for label, key in (
        ("raw, to the last ADDED", "cpu_ms_per_launch"),
        ("raw, the Pods' lives", "cpu_ms_per_pod_life"),
    ):
        row = results["raw"]["concurrent"].get(key)
        if row:
            out.append(f"| {label} | " + " | ".join(str(row.get(p, "-")) for p in procs) + " |")
    for name, res in results["nymph"].items():
        top = res["throughput"][max(res["throughput"], key=int)]["cpu_ms_per_launch"]
        out.append(f"| {name} | " + " | ".join(str(top.get(p, "-")) for p in procs) + " |")
    applies = _applies(results)
    if applies:
        out += [
            "",
            "| the daemon's apply calls (n = largest) | calls | manifests per call |",
            "|---|---:|---:|",
        ]
        out += [f"| {name} | {calls} | {per} |" for name, calls, per in applies]
    limit = lifecycle_limit(results)
    if limit:
        out += [
            "",
            f"The control plane's share of each Pod's life (raw, above) caps a steady stream of "
            f"launches at {limit}/s on these cores, whatever dispatches them; a burst outruns it "
            "because every throughput figure stops its clock at the last ADDED.",
        ]
    idle = results.get("idle_daemon") or {}
    kc = results.get("kubectl_invocation") or {}
    out += ["", "| footprint | value |", "|---|---:|"]
    if idle:
        out += [
            f"| idle daemon RSS (MB) | {idle['rss_mb']} |",
            f"| idle daemon CPU (% of a core, over {idle['seconds']} s) | {idle['cpu_pct_of_core']} |",
            f"| idle daemon queue requests per minute | {idle['queue_requests_per_min']} |",
        ]
    for name, res in results["nymph"].items():
        if "daemon_peak_rss_mb" in res:
            out.append(f"| daemon peak RSS after the {name} runs (MB) | {res['daemon_peak_rss_mb']} |")
    if kc:
        for label, what in (
            ("read_only_home", "read-only home (as deployed before)"),
            ("cache_dir", "with a cache dir"),
        ):
            x = kc[label]
            out.append(
                f"| one `kubectl apply`, {what}: p50 ms / CPU ms / API requests | "
                f"{x['wall']['p50_ms']} / {x['cpu_ms_mean']} / {x['api_requests']} |"
            )
    soak = results.get("soak")
    if soak:
        earlier = f", from the `make bench SOAK=1` run of {soak['from_run']}" if soak.get("from_run") else ""
        out.append(
            f"| daemon RSS growth over {soak['launches']:,} launches (%){earlier} | {soak['rss_growth_pct']} |"
        )
    q = results.get("queue") or {}
    if q:
        out += [
            "",
            "| queue, long-polling daemons | claims/s | POST p50 ms | POST p95 ms | queue CPU ms per launch | queue CPU % at 5 launches/s |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for d, x in q.items():
            out.append(
                f"| {d} | {x['claims_per_s']} | {x['post']['p50_ms']} | {x['post']['p95_ms']} | "
                f"{x['queue_cpu_ms_per_launch']} | {x.get('queue_cpu_pct_at_5_launches_per_s', '-')} |"
            )
    return "\n".join(out)
