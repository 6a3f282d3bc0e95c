"""Running claimed tasks: batching, bounded concurrency, a handler per task kind.

The runner takes tasks off the :class:`~nymph.daemon.workqueue.WorkQueue`, groups what can be applied together
(launches: one apply call for many Pods) and runs each group at once, with at most
``concurrency`` tasks running in all. The handler of a task is looked up in a :class:`HandlerRegistry` by its
:class:`~nymph.protocol.TaskKind` (a ``stop`` also by the kind of launch it ends); a kind with
no handler fails the task for good with a clear message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from nymph.daemon.audit import AuditWriteError
from nymph.daemon.tasks.context import TaskContext
from nymph.daemon.tasks.validate import BadTask, CheckedTask, Refused
from nymph.daemon.workqueue import Claimed, WorkQueue
from nymph.errors import NymphError
from nymph.logsetup import get_logger
from nymph.protocol import TaskJSON, TaskKind

BatchHandler = Callable[[TaskContext, list[CheckedTask]], Awaitable[None]]
OneHandler = Callable[[TaskContext, CheckedTask], Awaitable[None]]
#: What the registry sorts: checked tasks, or tasks as sent (to see which handler would take them).
Task = TypeVar("Task", CheckedTask, TaskJSON)


def stopped_kind(task: Mapping[str, Any]) -> TaskKind:
    """The kind of launch a ``stop`` task ends. The queue sends the stop of a dockyard instance
    with that instance's spec under ``"dockyard"``; any other stop ends a Pod launch."""
    spec = task.get("spec")
    return TaskKind.DOCKYARD if isinstance(spec, Mapping) and "dockyard" in spec else TaskKind.LAUNCH


class UnknownTaskKind(NymphError):
    """A task of a kind this daemon has no handler for."""


@dataclass(frozen=True)
class HandlerKey:
    """What a handler is registered under: the task's kind and, for a stop, what it stops."""

    kind: TaskKind
    stops: TaskKind | None = None

    @classmethod
    def of(cls, checked: CheckedTask | TaskJSON) -> HandlerKey:
        """The key of a task (checked, or off the wire). Raises :class:`UnknownTaskKind`."""
        task = checked.task if isinstance(checked, CheckedTask) else checked
        try:
            kind = TaskKind(task.get("kind"))
        except ValueError:
            raise UnknownTaskKind(f"unknown task kind {task.get('kind')!r}") from None
        return cls(kind, stopped_kind(task) if kind is TaskKind.STOP else None)


@dataclass(frozen=True)
class Handler:
    key: HandlerKey
    run: BatchHandler
    batched: bool  # tasks of this key that arrive together are handled in one call


class HandlerRegistry:
    def __init__(self) -> None:
        self._handlers: dict[HandlerKey, Handler] = {}

    def _add(self, handler: Handler) -> None:
        if handler.key in self._handlers:
            raise NymphError(f"a handler for {handler.key} is registered already")
        self._handlers[handler.key] = handler

    def add(self, kind: TaskKind, handler: OneHandler, *, stops: TaskKind | None = None) -> None:
        """Register a handler that takes one task at a time."""

        async def one_by_one(ctx: TaskContext, tasks: list[CheckedTask]) -> None:
            for task in tasks:
                await handler(ctx, task)

        self._add(Handler(HandlerKey(kind, stops), one_by_one, batched=False))

    def add_batch(self, kind: TaskKind, handler: BatchHandler) -> None:
        """Register a handler that takes every task of ``kind`` that arrived together."""
        self._add(Handler(HandlerKey(kind), handler, batched=True))

    def lookup(self, task: CheckedTask | TaskJSON) -> Handler:
        """The handler of ``task``. Raises :class:`UnknownTaskKind`."""
        key = HandlerKey.of(task)
        try:
            return self._handlers[key]
        except KeyError:
            what = key.kind.value if key.stops is None else f"{key.kind.value} of {key.stops.value}"
            raise UnknownTaskKind(f"unknown task kind {what!r}") from None

    def group(
        self, batch: list[Task]
    ) -> tuple[list[tuple[Handler, list[Task]]], list[tuple[Task, UnknownTaskKind]]]:
        """Split a batch into handler groups: each batched key's tasks together (first), then
        the rest one each; and the tasks no handler takes, with the reason."""
        batched: dict[HandlerKey, tuple[Handler, list[Task]]] = {}
        singles: list[tuple[Handler, list[Task]]] = []
        unknown: list[tuple[Task, UnknownTaskKind]] = []
        for task in batch:
            try:
                handler = self.lookup(task)
            except UnknownTaskKind as exc:
                unknown.append((task, exc))
                continue
            if handler.batched:
                batched.setdefault(handler.key, (handler, []))[1].append(task)
            else:
                singles.append((handler, [task]))
        return list(batched.values()) + singles, unknown


class Runner:
    def __init__(
        self,
        *,
        work: WorkQueue,
        registry: HandlerRegistry,
        context: TaskContext,
        concurrency: int,
        batch_max: int,
        linger: float = 0.0,
    ) -> None:
        self.queue = work
        self.registry = registry
        self.ctx = context
        self.concurrency = concurrency
        self.batch_max = batch_max
        #: How long a batch may wait to fill while other work runs (kubectl: see _linger).
        self.linger = linger
        self.work: set[asyncio.Task[None]] = set()
        self.log = get_logger("runner", node=context.node)

    async def run(self, *, ready: Callable[[], Awaitable[object]]) -> None:
        """Take tasks off the work queue for good; ``ready`` is awaited before the first one."""
        await ready()
        while True:
            first = await self.queue.get()
            # At most ``concurrency`` tasks run at once (the claimer prefetches beyond them).
            room = await self.queue.wait_slot(self.concurrency)
            batch = [first, *self.queue.take(min(self.batch_max, room) - 1)]
            if self.linger > 0 and len(batch) < self.batch_max and self.work:
                await self._linger(batch)
            self.queue.begin(batch)
            groups, unknown = self.registry.group(self._checked(batch))
            for task, exc in unknown:
                self.ctx.complete(task_id=task.task_id, ok=False, error=str(exc), retryable=False)
                self.queue.end(1)
            for handler, tasks in groups:
                job = asyncio.create_task(self._run(handler, tasks), name=f"work:{tasks[0].task_id}")
                self.work.add(job)
                job.add_done_callback(self.work.discard)

    async def _linger(self, batch: list[Claimed]) -> None:
        """While other work runs, wait up to ``linger`` seconds for ``batch`` to fill (as slots
        free and claims arrive): one kubectl run costs about the same for one Pod as for
        a full batch, so a run started for a single launch while another runs wastes most of it.
        With nothing else running a batch starts at once (no latency added at low load)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.linger
        while self.work:
            room = self.concurrency - self.queue.inflight - len(batch)
            taken = self.queue.take(min(room, self.batch_max - len(batch)))
            batch.extend(taken)
            room -= len(taken)
            left = deadline - loop.time()
            if len(batch) >= self.batch_max or left <= 0:
                return
            arrived = await self.queue.wait_change(timeout=left, take=room > 0)
            if arrived is not None:
                batch.append(arrived)

    def _checked(self, batch: list[Claimed]) -> list[CheckedTask]:
        """The tasks of ``batch`` whose every field checked out; the others fail for good."""
        good: list[CheckedTask] = []
        for task in batch:
            if isinstance(task, Refused):
                self._refuse(task.error)
                self.queue.end(1)
                continue
            good.append(task)
        return good

    def _refuse(self, exc: BadTask) -> None:
        message = str(exc)[:1000]
        self.log.warning("refused a task that does not check out", task=exc.task_id, error=message)
        self.ctx.metrics.tasks_refused.inc()
        if exc.task_id is None:
            return  # the claimer holds no task without a usable id
        try:
            self.ctx.audit.append(
                "refuse", task=exc.task_id, node=self.ctx.node, result="refused", error=message
            )
        except AuditWriteError as err:
            self.ctx.disk.failed("audit log", err)
        self.ctx.complete(task_id=exc.task_id, ok=False, error=message, retryable=False)

    async def _run(self, handler: Handler, tasks: list[CheckedTask]) -> None:
        try:
            # The claims of these tasks (and all records before them) are durable before any acts.
            await self.ctx.audit.synced()
            await handler.run(self.ctx, tasks)
        except AuditWriteError as exc:
            # The work may be done, but it cannot be recorded: hand it back as retryable (a
            # redelivery adopts what was applied) and pause claiming until the root is writable.
            self.ctx.disk.failed("audit log", exc)
            for t in tasks:
                if not self.queue.completed(t.task_id):
                    self.ctx.complete(
                        task_id=t.task_id,
                        ok=False,
                        error=f"the daemon cannot write its audit log: {exc}"[:1000],
                        retryable=True,
                    )
        except Exception:
            self.log.exception("task handling crashed", tasks=[t.task_id for t in tasks])
            for t in tasks:
                if not self.queue.completed(t.task_id):
                    self.ctx.complete(
                        task_id=t.task_id, ok=False, error="internal error in the daemon", retryable=True
                    )
        finally:
            self.queue.end(len(tasks))

    async def drain(self, *, grace: float) -> None:
        """Let running work finish within ``grace`` seconds, then cancel what is left."""
        if not self.work:
            return
        _, pending = await asyncio.wait(self.work, timeout=grace)
        for p in pending:
            p.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5)
