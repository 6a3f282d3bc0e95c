"""The benchmark scoreboard behind ``make bench`` (see benchmarks/daemon_bench.py)."""
