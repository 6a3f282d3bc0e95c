"""The daemon's process settings: malloc arenas capped and children waited for by pidfd, each
in a fresh interpreter (they are process-wide)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """
    import asyncio, json, threading
    from nymph.daemon.footprint import tune_process
    applied = tune_process()

    async def main():
        proc = await asyncio.create_subprocess_exec("true")
        before = threading.active_count()
        code = await proc.wait()
        return code, before

    code, threads = asyncio.run(main())
    print(json.dumps({**applied, "code": code, "threads": threads}))
    """
)


def _probe(env: dict[str, str]) -> dict[str, object]:
    import json

    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=60, check=True
    )
    return dict(json.loads(out.stdout))


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12+ waits for children by pidfd itself")
def test_children_are_waited_for_without_a_thread_each() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    got = _probe(env)
    assert got["pidfd_child_watcher"] is True and got["code"] == 0
    assert got["threads"] == 1  # the default watcher would have started a thread for "true"
    assert got["malloc_arenas_capped"] is True


def test_an_operators_malloc_arena_max_is_left_alone() -> None:
    got = _probe({**os.environ, "MALLOC_ARENA_MAX": "4"})
    assert got["malloc_arenas_capped"] is False and got["code"] == 0
