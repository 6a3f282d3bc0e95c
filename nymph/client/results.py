"""Result files through the queue (for the CLI): list them, download one or all under a
directory, refusing any path that would land outside it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

from nymph.client.user import UserClient
from nymph.launch.results import BadResultPath, check_result_path


async def list_results(client: UserClient, *, provider: str, instance_id: str) -> dict[str, Any]:
    """``{instanceId, items: [{path, size}], error}``."""
    return cast(
        dict[str, Any],
        await client.request("GET", client.results_path(provider=provider, instance_id=instance_id)),
    )


def target(directory: Path, path: str) -> Path:
    """Where result ``path`` goes under ``directory`` (never outside it)."""
    check_result_path(path)
    root = directory.resolve()
    dest = (root / path).resolve()
    if root not in dest.parents:
        raise BadResultPath(f"result path {path[:80]!r} leads outside {directory}")
    return dest


async def download(
    client: UserClient, *, provider: str, instance_id: str, path: str, directory: Path
) -> Path:
    """Write result ``path`` under ``directory`` (its subdirectories created); returns the file."""
    dest = target(directory, path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    url = client.results_path(provider=provider, instance_id=instance_id, path=path)
    tmp = dest.with_name(f".{dest.name}.part")
    try:
        with tmp.open("wb") as fh:
            async with client.stream(url) as resp:
                async for data in resp.content.iter_any():
                    fh.write(data)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest
