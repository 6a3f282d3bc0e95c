"""Time ``GET /v1/namespaces/default/providers/kind/instances`` on a queue holding many
instances (20,000 by default), each with a history of three events, seeded straight into a
fresh SQLite file.

Measures, over real HTTP on 127.0.0.1 (median of ``--repeat`` runs, in ms): the bare route
(what a client without paging gets: all of them before paging, the first page of 500 since),
the first page with ``limit=500``, a page in the middle (its ``continue`` token from the
previous page), and the whole list followed page by page at ``limit=5000``. Run it on an
older checkout to compare (the unknown ``limit`` is then ignored and every answer is the whole
list):

    .venv/bin/python benchmarks/list_bench.py [--instances 20000] [--repeat 5]
    git archive OLD | tar -x -C /tmp/old && PYTHONPATH=/tmp/old .venv/bin/python benchmarks/list_bench.py
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

import nymph
from nymph.queue.auth import create_token
from nymph.queue.db import connect
from nymph.queue.http.app import create_app
from nymph.queue.http.server import make_runner
from nymph.queue.models import Role

PATH = "/v1/namespaces/default/providers/kind/instances"


def seed(path: Path, count: int) -> str:
    """A queue file with provider ``kind`` and ``count`` stopped instances; returns a user token."""
    conn = connect(path)
    provider = {"name": "kind", "launcher": "Kube", "dispatch": "daemon", "kwargs": {"namespace": "jobs"}}
    t0 = time.time() - count
    with conn:
        conn.execute(
            "INSERT INTO providers (namespace, name, body, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
            ("default", "kind", json.dumps(provider), t0, t0),
        )
        conn.executemany(
            "INSERT INTO instances (instance_id, namespace, provider, kube_namespace, state, reason, "
            "message, node, launched_at, updated_at, version, requester) "
            "VALUES (?, 'default', 'kind', 'jobs', 'stopped', 'Completed', '', 'n1', ?, ?, 3, 'bench')",
            [(f"lakeshore-{i:08x}", t0 + i, t0 + i + 1) for i in range(count)],
        )
        conn.executemany(
            "INSERT INTO instance_events (instance_id, state, reason, message, at) VALUES (?, ?, ?, '', ?)",
            [
                (f"lakeshore-{i:08x}", state, reason, t0 + i)
                for i in range(count)
                for state, reason in (("queued", None), ("running", None), ("stopped", "Completed"))
            ],
        )
        token = create_token(conn, role=Role.USER, name="bench").token
    conn.close()
    return token


async def timed(session: aiohttp.ClientSession, url: str) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    async with session.get(url) as resp:
        body = await resp.json()
        assert resp.status == 200, body
    return (time.perf_counter() - start) * 1000, body


async def run(count: int, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "queue.db"
        token = seed(db, count)
        app = create_app(db_path=db)
        runner = make_runner(app, shutdown_timeout=2.0)
        await runner.setup()
        site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}{PATH}"
        out: dict[str, Any] = {"instances": count, "nymph": str(Path(nymph.__file__).parent)}
        try:
            headers = {"Authorization": f"Bearer {token}"}
            async with aiohttp.ClientSession(headers=headers) as s:
                await timed(s, base + "?limit=1")  # warm up
                cases: dict[str, list[float]] = {
                    "bare": [],
                    "first_500": [],
                    "middle_500": [],
                    "all_by_5000": [],
                }
                sizes: dict[str, int] = {}
                for _ in range(repeat):
                    ms, body = await timed(s, base)
                    cases["bare"].append(ms)
                    sizes["bare"] = len(body["items"])
                    ms, body = await timed(s, base + "?limit=500")
                    cases["first_500"].append(ms)
                    sizes["first_500"] = len(body["items"])
                    # the middle: skip ahead by pages of 5000, then time one page of 500
                    token_mid = None
                    seen = 0
                    while seen < count // 2:
                        url = base + "?limit=5000" + (f"&continue={token_mid}" if token_mid else "")
                        _, page = await timed(s, url)
                        seen += len(page["items"])
                        token_mid = page.get("continue")
                        if token_mid is None:
                            break
                    url = base + "?limit=500" + (f"&continue={token_mid}" if token_mid else "")
                    ms, body = await timed(s, url)
                    cases["middle_500"].append(ms)
                    sizes["middle_500"] = len(body["items"])
                    start = time.perf_counter()
                    total, cont = 0, None
                    while True:
                        url = base + "?limit=5000" + (f"&continue={cont}" if cont else "")
                        _, page = await timed(s, url)
                        total += len(page["items"])
                        cont = page.get("continue")
                        if cont is None:
                            break
                    cases["all_by_5000"].append((time.perf_counter() - start) * 1000)
                    sizes["all_by_5000"] = total
            out["median_ms"] = {k: round(statistics.median(v), 1) for k, v in cases.items()}
            out["items"] = sizes
        finally:
            await runner.cleanup()
        return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instances", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    result = asyncio.run(run(args.instances, args.repeat))
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
