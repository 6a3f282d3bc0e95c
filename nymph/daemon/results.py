"""Result files: when a Pod's ``user`` container has ended, the regular files under its
workdir's ``out/`` are uploaded to the queue (in chunks, idempotent by offset), before the
reaper removes the workdir (:meth:`ResultUploads.settled`).

Only regular files: a symlink, a device, anything that resolves outside the workdir is refused
and named in the error the instance record shows; so is whatever goes beyond the cap. Files are
opened with ``O_NOFOLLOW`` and checked again on the open descriptor, so a swap for a symlink
after the scan reads nothing outside. The workdir itself is what makes the upload durable: it
stays until the upload is done, and a restarted daemon uploads again (the queue drops repeats).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nymph.client import (
    QueueBadRequest,
    QueueClient,
    QueueConflict,
    QueueNotFound,
    QueueNotInstanceDaemon,
    QueueUnavailable,
)
from nymph.daemon.marks import MarkBook
from nymph.daemon.tracker import Tracker
from nymph.daemon.workdirs import Workdirs
from nymph.launch.results import DEFAULT_RESULTS_CAP, RESULTS_DIR, BadResultPath, check_result_path
from nymph.launch.state import container_termination
from nymph.logsetup import get_logger

CHUNK = 384 * 1024


@dataclass(frozen=True)
class Found:
    path: str  # relative to out/
    file: Path
    size: int


def has_results(workdir: Path) -> bool:
    """Whether ``workdir`` has anything where results go (one ``lstat``)."""
    return os.path.lexists(workdir / RESULTS_DIR)


def collect(workdir: Path, *, cap: int) -> tuple[list[Found], list[str]]:
    """The regular files under ``workdir/out`` within ``cap`` bytes, and what was refused."""
    out = workdir / RESULTS_DIR
    problems: list[str] = []
    try:
        st = os.lstat(out)
    except OSError:
        return [], []
    if not stat.S_ISDIR(st.st_mode):
        return [], [f"{RESULTS_DIR} is not a directory (a symlink?): nothing uploaded"]
    root = workdir.resolve()
    found: list[Found] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(out, followlinks=False):
        dirnames.sort()
        for name in [*sorted(filenames), *[d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]]:
            full = Path(dirpath) / name
            rel = full.relative_to(out).as_posix()
            try:
                check_result_path(rel)
                st = os.lstat(full)
            except (BadResultPath, OSError) as exc:
                problems.append(f"{rel[:200]}: {exc}")
                continue
            if stat.S_ISLNK(st.st_mode):
                problems.append(f"{rel}: a symlink, refused")
                continue
            if not stat.S_ISREG(st.st_mode):
                problems.append(f"{rel}: not a regular file, refused")
                continue
            if root not in full.resolve().parents:
                problems.append(f"{rel}: resolves outside the workdir, refused")
                continue
            if total + st.st_size > cap:
                problems.append(f"{rel}: over the results cap of {cap} bytes, not uploaded")
                continue
            total += st.st_size
            found.append(Found(path=rel, file=full, size=st.st_size))
    return found, problems


def read_chunks(file: Path, *, size: int) -> list[tuple[int, bytes]]:
    """The file's bytes in chunks, read through a descriptor that cannot follow a symlink."""
    fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{file.name}: not a regular file")
        out: list[tuple[int, bytes]] = []
        offset = 0
        while offset < size:
            data = os.read(fd, min(CHUNK, size - offset))
            if not data:
                break
            out.append((offset, data))
            offset += len(data)
        return out
    finally:
        os.close(fd)


class ResultUploads:
    def __init__(
        self,
        *,
        client: QueueClient,
        daemon_id: str,
        tracker: Tracker,
        workdirs: Workdirs,
        state_dir: Path,
        cap: int = DEFAULT_RESULTS_CAP,
    ) -> None:
        self.client = client
        self.daemon_id = daemon_id
        self.tracker = tracker
        self.workdirs = workdirs
        #: Instances whose results are uploaded (kept until their Pod is deleted).
        self.done = MarkBook(state_dir / "results.marks")
        # A daemon of an earlier version kept one empty-ish file per instance in <state>/results.
        self.done.adopt(state_dir / "results", lambda path: (path.name, {}))
        self.cap = cap
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.log = get_logger("results")

    async def on_pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        if not self.tracker.mine(pod):
            return
        name = str((pod.get("metadata") or {}).get("name") or "")
        if kind == "DELETED":
            if name and name not in self.tasks:
                with contextlib.suppress(OSError):
                    self.done.drop(name)  # the Pod is gone for good
            return
        if not name or name in self.tasks or name in self.done or container_termination(pod) is None:
            return
        task = asyncio.create_task(self._upload(name), name=f"results:{name}")
        self.tasks[name] = task
        task.add_done_callback(functools.partial(self._done, name))

    def _done(self, name: str, task: asyncio.Task[None]) -> None:
        self.tasks.pop(name, None)
        if not task.cancelled() and task.exception() is not None:
            self.log.warning("result upload failed", instance=name, error=repr(task.exception())[:300])

    def settled(self, name: str) -> bool:
        return name not in self.tasks

    async def close(self) -> None:
        tasks = list(self.tasks.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self.done.close()

    async def _send(self, **kwargs: Any) -> None:
        backoff = 0.5
        while True:
            try:
                await self.client.upload_result(daemon_id=self.daemon_id, **kwargs)
                return
            except QueueUnavailable:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 15.0)

    async def _upload(self, name: str) -> None:
        workdir = self.workdirs.path(name)
        # Most launches leave no results: one lstat here instead of a trip to a thread (whose
        # hand-off costs more CPU than the walk it saves when there is nothing to walk).
        found, problems = (
            await asyncio.to_thread(collect, workdir, cap=self.cap) if has_results(workdir) else ([], [])
        )
        try:
            for f in found:
                try:
                    chunks = await asyncio.to_thread(read_chunks, f.file, size=f.size)
                except OSError as exc:
                    problems.append(f"{f.path}: cannot be read ({exc.__class__.__name__})")
                    continue
                if not chunks:
                    chunks = [(0, b"")]
                for i, (offset, data) in enumerate(chunks):
                    await self._send(
                        instance_id=name, path=f.path, offset=offset, data=data, eof=i == len(chunks) - 1
                    )
            if problems:
                await self._send(instance_id=name, error="; ".join(problems)[:2000])
        except (QueueConflict, QueueNotFound, QueueBadRequest, QueueNotInstanceDaemon) as exc:
            self.log.warning("the queue refused results", instance=name, detail=str(exc)[:300])
        # Not fsynced: a mark lost to a power cut uploads again, which the queue takes as the
        # same chunks (idempotent by offset).
        self.done.put(name, {})
        if found or problems:
            self.log.info("results uploaded", instance=name, files=len(found), refused=len(problems))
