"""The queue's log line for a daemon write refused as not the instance's (see
:mod:`nymph.queue.sql.binding`): who sent what for which instance, never a credential."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import structlog

from nymph.queue.errors import NotInstanceDaemon
from nymph.queue.models import DaemonSession

log = structlog.get_logger(__name__, component="queue.dispatch")


def log_refusal(exc: NotInstanceDaemon, *, session: DaemonSession, route: str) -> None:
    """The log line of one refused write (an item of a batch, answered with it)."""
    log.warning(
        "dispatch write refused: not the instance's daemon",
        route=route,
        action=exc.action,
        instance=exc.instance_id,
        daemon=session.daemon_id,
        node=session.node,
        session=session.session_id,
        namespaces=list(session.namespaces),
        scope=session.scope,
    )


@contextmanager
def logged_refusal(*, session: DaemonSession, route: str) -> Iterator[None]:
    """Log (and re-raise) a :class:`NotInstanceDaemon` raised inside."""
    try:
        yield
    except NotInstanceDaemon as exc:
        log_refusal(exc, session=session, route=route)
        raise
