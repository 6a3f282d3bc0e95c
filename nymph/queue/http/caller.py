"""Who calls a dispatch route: the caller's daemon session, and the check that a ``daemonId``
the body names is that session's own (the dispatch, log and result routes share it)."""

from __future__ import annotations

from aiohttp import web

from nymph.queue.errors import Forbidden, Unprocessable
from nymph.queue.http.bodies import Fields
from nymph.queue.http.keys import PRINCIPAL
from nymph.queue.models import DaemonSession


def daemon_session(
    request: web.Request, f: Fields | None = None, *, refuse_empty: bool = True
) -> DaemonSession:
    """The caller's session; a ``daemonId`` in the body must be its daemon id (403
    ``wrong_daemon``); an empty one is a 422 (with ``refuse_empty``; else it is just not the
    session's, a 403)."""
    session = request[PRINCIPAL].session
    assert session is not None  # the auth middleware admits sessions only
    if f is not None:
        claimed = f.string("daemonId", required=False)
        if refuse_empty and claimed is not None and not claimed.strip():
            raise Unprocessable("body.daemonId must not be empty")
        if claimed is not None and claimed != session.daemon_id:
            raise Forbidden(
                f"this session belongs to daemon {session.daemon_id!r}, not {claimed!r}: each "
                "daemon registers for its own session",
                code="wrong_daemon",
            )
    return session
