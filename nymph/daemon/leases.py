"""The lease ledger: which claimed tasks this daemon holds, and where each one stands.

A task is held (its lease renewed by the claimer) from its audited claim until the queue has
its completion: started once the runner takes it, completing while its completion waits in the
outbox (renewed until the queue has it, so a slow outbox never lets a task be handed out
again), settled when the queue took or refused it for good. A task given up (an outage, a claim
or completion that could not be saved) is abandoned: no longer renewed, handed back soon.
"""

from __future__ import annotations

from typing import Unpack

from nymph.daemon.diskhealth import DiskHealth
from nymph.daemon.outbox import Outbox
from nymph.daemon.outboxitems import Completion
from nymph.logsetup import get_logger
from nymph.protocol import TaskJSON


class LeaseLedger:
    def __init__(
        self, *, outbox: Outbox, disk: DiskHealth, node: str | None = None, daemon_id: str = ""
    ) -> None:
        self.outbox = outbox
        self.disk = disk
        self.log = get_logger("leases", node=node, daemon=daemon_id)
        self.held: dict[str, TaskJSON] = {}  # taskId -> task, leases we renew
        self.started: set[str] = set()  # taskIds whose work has begun
        self.completing: set[str] = set()  # taskIds whose completion is in the outbox
        self.abandoned: list[str] = []  # taskIds to hand back: their claim or completion was not saved

    def hold(self, task_id: str, task: TaskJSON) -> None:
        """The claim of ``task`` is audited: renew its lease from now on."""
        self.held[task_id] = task

    def not_held(self, task_id: str) -> None:
        """A claim that could not be audited: never held, handed back soon."""
        self.abandoned.append(task_id)

    def start(self, task_ids: list[str]) -> None:
        """The runner took these tasks: their work has begun."""
        self.started.update(task_ids)

    def complete(self, **completion: Unpack[Completion]) -> None:
        """Queue a task's completion; its lease keeps being renewed until the queue has it.

        A completion the outbox cannot save (the root cannot be written) is not renewed for
        ever: the task is handed back, and the queue gives it out again."""
        task_id = completion["task_id"]
        self.completing.add(task_id)
        task = self.held.get(task_id)
        instance = task.get("instanceId") if task is not None else None
        try:
            self.outbox.complete(instance=instance if isinstance(instance, str) else None, **completion)
        except OSError as exc:
            self.disk.failed("outbox", exc)
            self.log.error("could not save a completion; handing the task back", task=task_id)
            self.abandon(task_id)

    def is_completing(self, task_id: str) -> bool:
        return task_id in self.completing

    def abandon(self, task_id: str) -> None:
        """Stop renewing ``task_id`` and hand it back to the queue soon."""
        self.completing.discard(task_id)
        self.started.discard(task_id)
        if self.held.pop(task_id, None) is not None:
            self.abandoned.append(task_id)

    def settled(self, task_id: str) -> None:
        """The queue has the completion (or refused it for good)."""
        self.completing.discard(task_id)
        self.started.discard(task_id)
        self.held.pop(task_id, None)

    def dropped(self, task_id: str) -> None:
        """The lease is no longer ours (lost, or released): stop renewing it."""
        self.held.pop(task_id, None)

    def take_abandoned(self) -> list[str]:
        """The tasks to hand back now (each handed back once)."""
        ids, self.abandoned = self.abandoned, []
        return ids

    def held_ids(self) -> list[str]:
        return list(self.held)

    def held_instances(self) -> set[str]:
        """The instance ids of the tasks held (their workdirs are in use)."""
        return {iid for t in self.held.values() if isinstance(iid := t.get("instanceId"), str)}

    def holds_instance(self, instance_id: str) -> bool:
        return any(t.get("instanceId") == instance_id for t in self.held.values())

    def unstarted(self) -> list[str]:
        return [tid for tid in self.held if tid not in self.started]

    def uncompleted(self) -> list[str]:
        return [tid for tid in self.held if tid not in self.completing]
