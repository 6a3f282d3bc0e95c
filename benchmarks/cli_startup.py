"""How long the ``nymph`` command takes to start, against the bare interpreter in the same run.

Runs each command ``--repeat`` times in a fresh interpreter (``python -m nymph.cli ...``, output
discarded), takes the median wall time of each, and divides it by the median of ``python -c
pass``: ``nymph --help``, ``nymph instances --help`` and ``nymph launch --help`` (building the
parser), and whole user calls against a real ``nymph queue serve`` the benchmark starts on a
fresh SQLite file: ``nymph instances bench`` (a list) and ``nymph launch bench`` (a script read,
a launch sent and accepted). The runs are interleaved so a busy machine slows every command
alike. Merges the ratios into ``bench-results.json`` under ``cli_startup_ratio`` (its other
keys kept):

    .venv/bin/python benchmarks/cli_startup.py [--repeat 15] [--out bench-results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import schedule_bench  # noqa: E402
from nymph.logsetup import configure_logging  # noqa: E402

#: name -> the arguments after ``python``; ``{url}`` is the benchmark's queue
COMMANDS: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "--help": ["-m", "nymph.cli", "--help"],
    "instances --help": ["-m", "nymph.cli", "instances", "--help"],
    "launch --help": ["-m", "nymph.cli", "launch", "--help"],
    # whole calls: the handler, the HTTP client, the request and its answer
    "instances": ["-m", "nymph.cli", "instances", "bench", "--url", "{url}", "--namespace", "team-a"],
    "launch": [
        "-m", "nymph.cli", "launch", "bench", "--mode", "tiny", "--script", "benchmarks/cli_startup.py",
        "--url", "{url}", "--namespace", "team-a",
    ],
}  # fmt: skip
BASELINE = "python -c pass"


def _once(args: list[str], env: Mapping[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
        cwd=REPO,
        env=dict(env),
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0 and "--help" not in args:
        raise RuntimeError(
            f"nymph {' '.join(args[2:4])} failed ({done.returncode}): {done.stderr.strip()[-300:]}"
        )
    return elapsed


def measure(repeat: int, *, url: str, token: str) -> dict[str, float]:
    """The median seconds of each command, run ``repeat`` times each, interleaved."""
    env = {**os.environ, "NYMPH_TOKEN": token}
    commands = {name: [a.replace("{url}", url) for a in args] for name, args in COMMANDS.items()}
    for args in commands.values():  # warm the file cache and the bytecode
        _once(args, env)
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeat):
        for name, args in commands.items():
            samples[name].append(_once(args, env))
    return {name: statistics.median(times) for name, times in samples.items()}


async def measure_with_queue(repeat: int) -> dict[str, float]:
    """:func:`measure` against a queue started on a fresh database, stopped at the end."""
    with tempfile.TemporaryDirectory(prefix="nymph-cli-bench-") as tmp:
        async with schedule_bench.queue(str(Path(tmp) / "queue.db")) as q:
            return await asyncio.to_thread(measure, repeat, url=q.url, token=q.user_token)


def ratios(medians: dict[str, float]) -> dict[str, float]:
    base = medians[BASELINE]
    return {name: round(t / base, 2) for name, t in medians.items() if name != BASELINE}


def merge(path: Path, section: dict[str, Any]) -> dict[str, Any]:
    """``path``'s document with ``cli_startup_ratio`` replaced by ``section`` (other keys kept)."""
    doc: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    doc["cli_startup_ratio"] = section
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=15, help="runs of each command (default 15)")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results.json")
    parser.add_argument("--no-write", action="store_true", help="print the figures only")
    args = parser.parse_args(argv)
    configure_logging(level="warning")
    try:
        medians = asyncio.run(measure_with_queue(args.repeat))
    finally:  # the queue process is stopped whatever happened
        for proc in list(schedule_bench._PROCS):
            schedule_bench._stop(proc)
    figures = ratios(medians)
    section: dict[str, Any] = {
        **figures,
        "median_ms": {name: round(t * 1000, 1) for name, t in medians.items()},
        "repeat": args.repeat,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    for name, t in medians.items():
        ratio = "" if name == BASELINE else f"  {figures[name]:>5.2f}x"
        print(f"{name:<20} {t * 1000:>7.1f} ms{ratio}")
    if not args.no_write:
        args.out.write_text(json.dumps(merge(args.out, section), indent=2) + "\n")
        print(f"written to {args.out} (under cli_startup_ratio)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
