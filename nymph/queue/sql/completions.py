"""A batch of completions from one daemon session, in one transaction (synchronous SQL on the
database thread).

Each item is finished exactly as a single completion is (:func:`nymph.queue.sql.dispatch.complete`:
checked against its task's lease and the session, idempotent per task), in its own savepoint:
an item the queue refuses (404 ``task_not_found``, 409 ``lease_lost``, ...) is rolled back to
its savepoint alone and answered with that refusal, the others go on. Nothing is committed, and
so nothing is answered, before the whole batch is: a queue that dies mid-batch has kept none
of it, and the daemon's re-sent batch is answered as the first would have been. A batch re-sent
after its commit (the answer was lost on the way) is answered item by item as each single call
re-sent would be: ``duplicate: true`` for what this daemon finished, 409 ``lease_lost`` for a
task it handed back for a retry.
"""

from __future__ import annotations

from collections.abc import Sequence

from nymph.protocol import CompleteAnswer
from nymph.queue.errors import ServiceError
from nymph.queue.models import DaemonSession, RetrySettings, TaskCompletion
from nymph.queue.sql import dispatch
from nymph.queue.sql.dialect import Conn

#: The answer to one item: what a single completion would answer, or the refusal it would raise.
Outcome = CompleteAnswer | ServiceError

_SAVEPOINT = "nymph_completion"


def complete_many(
    conn: Conn,
    *,
    session: DaemonSession,
    items: Sequence[TaskCompletion],
    now: float,
    retry: RetrySettings,
) -> tuple[list[Outcome], set[str]]:
    """Finish ``items`` in order; returns one outcome per item and the instances that changed."""
    outcomes: list[Outcome] = []
    changed: set[str] = set()
    for item in items:
        conn.execute(f"SAVEPOINT {_SAVEPOINT}")
        try:
            body, instance_id = dispatch.complete(
                conn,
                session=session,
                task_id=item.task_id,
                ok=item.ok,
                error=item.error,
                retryable=item.retryable,
                result=dict(item.result) if item.result is not None else None,
                now=now,
                retry=retry,
                attempt=item.attempt,
            )
        except ServiceError as exc:
            conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
            conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
            outcomes.append(exc)
            continue
        conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
        outcomes.append(body)
        if instance_id is not None:
            changed.add(instance_id)
    return outcomes, changed
