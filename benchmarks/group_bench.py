"""Time accepting N launches (1,000 by default) as one launch group against N single launches,
on a fresh queue (SQLite) over real HTTP on 127.0.0.1.

Measures the median of ``--repeat`` group POSTs (``POST .../providers/kind/launches`` with
``count: N``, each on an empty queue's backlog growing by N) and the time of N single
``POST .../launch`` calls one after another; the figure that counts is their ratio
(``single_vs_group_ratio``), with the group's own time beside it. ``--write FILE`` merges the
result into a bench-results.json under ``groups``:

    .venv/bin/python benchmarks/group_bench.py [--launches 1000] [--repeat 3] [--write bench-results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from nymph.queue.auth import create_token
from nymph.queue.db import connect
from nymph.queue.http.app import create_app
from nymph.queue.http.server import make_runner
from nymph.queue.models import Role

NS = "/v1/namespaces/default"


def _token(path: Path) -> str:
    conn = connect(path)
    with conn:
        token = create_token(conn, role=Role.USER, name="bench").token
    conn.close()
    return token


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> float:
    start = time.perf_counter()
    async with session.post(url, json=body) as resp:
        answer = await resp.json()
        assert resp.status in (201, 202), answer
    return time.perf_counter() - start


async def run(launches: int, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "queue.db"
        app = create_app(db_path=db)
        runner = make_runner(app, shutdown_timeout=2.0)
        await runner.setup()
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}{NS}"
        try:
            headers = {"Authorization": f"Bearer {_token(db)}"}
            async with aiohttp.ClientSession(headers=headers) as s:
                provider = {
                    "name": "kind",
                    "launcher": "Kube",
                    "dispatch": "daemon",
                    "kwargs": {"namespace": "jobs"},
                }
                await _post(s, base + "/providers", provider)
                await _post(
                    s, base + "/modes", {"name": "small", "provider": "kind", "fields": {"image": "python:3"}}
                )
                launch = {"mode": "small", "script": "print(1)\n"}
                await _post(s, base + "/providers/kind/launch", launch)  # warm up
                group = [await _post(s, base + "/providers/kind/launches", {**launch, "count": launches})]
                group += [
                    await _post(s, base + "/providers/kind/launches", {**launch, "count": launches})
                    for _ in range(repeat - 1)
                ]
                start = time.perf_counter()
                for _ in range(launches):
                    await _post(s, base + "/providers/kind/launch", launch)
                single = time.perf_counter() - start
        finally:
            await runner.cleanup()
    group_s = statistics.median(group)
    return {
        "launches": launches,
        "group_post_s": round(group_s, 3),
        "single_posts_s": round(single, 3),
        "single_vs_group_ratio": round(single / group_s, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--launches", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument(
        "--write", metavar="FILE", help="merge the result into this bench-results.json under groups"
    )
    args = p.parse_args(argv)
    result = asyncio.run(run(args.launches, args.repeat))
    json.dump(result, sys.stdout, indent=2)
    print()
    if args.write:
        path = Path(args.write)
        data = json.loads(path.read_text())
        data["groups"] = result
        path.write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
