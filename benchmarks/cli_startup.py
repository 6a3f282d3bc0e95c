"""How long the ``nymph`` command takes to start, against the bare interpreter in the same run.

Runs each command ``--repeat`` times in a fresh interpreter (``python -m nymph.cli ...``, output
discarded), takes the median wall time of each, and divides it by the median of ``python -c
pass``: ``nymph --help``, ``nymph instances --help`` and ``nymph launch --help`` (building the
parser), and ``nymph instances kind`` against a port where nothing listens (the handler and the
HTTP client loaded, up to the first request). The runs are interleaved
so a busy machine slows every command alike. Merges the ratios into ``bench-results.json``
under ``cli_startup_ratio`` (its other keys kept):

    .venv/bin/python benchmarks/cli_startup.py [--repeat 15] [--out bench-results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

#: name -> the arguments after ``python``
COMMANDS: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "--help": ["-m", "nymph.cli", "--help"],
    "instances --help": ["-m", "nymph.cli", "instances", "--help"],
    "launch --help": ["-m", "nymph.cli", "launch", "--help"],
    # the whole start of a user command: its handler and the HTTP client loaded, up to the
    # first request (refused at once: nothing listens on port 9)
    "instances (no queue)": ["-m", "nymph.cli", "instances", "kind", "--url", "http://127.0.0.1:9"],
}
BASELINE = "python -c pass"


def _once(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, cwd=REPO
    )
    return time.perf_counter() - started


def measure(repeat: int) -> dict[str, float]:
    """The median seconds of each command, run ``repeat`` times each, interleaved."""
    for args in COMMANDS.values():  # warm the file cache and the bytecode
        _once(args)
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(repeat):
        for name, args in COMMANDS.items():
            samples[name].append(_once(args))
    return {name: statistics.median(times) for name, times in samples.items()}


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
    medians = measure(args.repeat)
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
