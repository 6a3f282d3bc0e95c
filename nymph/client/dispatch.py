"""The calls a nymph daemon makes (:class:`DispatchClient`), each through a daemon session.

The client registers with its token (the daemon bootstrap token) on the first dispatch call, as
the daemon identity the call names (or the ``daemon`` given at construction), keeps that session
for the identity, registers a new identity when a call names one, and registers again when the
queue answers that the session lapsed or is unknown (a restarted queue), then retries the call
once. The session credential is never logged.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Unpack, cast

from nymph.client.errors import (
    BY_CODE,
    BY_STATUS,
    QueueAuthError,
    QueueConflict,
    QueueError,
    QueueNotFound,
    QueueRegistrationRefused,
    QueueUnavailable,
)
from nymph.client.transport import Transport, TransportOptions
from nymph.protocol import ActiveJSON, CompleteAnswer, RenewAnswer, ReportAck, SessionJSON, TaskJSON

#: Answers (401 codes) after which the client registers again and retries the call once.
SESSION_LOST_CODES = frozenset({"session_expired", "unknown_session", "session_required"})

#: The batch form of ``/v1/dispatch/complete`` (queues older than it answer 404 ``not_found``).
COMPLETIONS_PATH = "/v1/dispatch/completions"
LOGCHUNKS_BATCH_PATH = "/v1/dispatch/logchunks/batch"


@dataclass(frozen=True)
class DaemonIdentity:
    """Who a daemon registers as: its id, its node ("" if unknown) and the kube namespaces it
    serves (empty: every namespace)."""

    daemon_id: str
    node: str = ""
    namespaces: tuple[str, ...] = ()


class DispatchClient(Transport):
    """The dispatch routes (``/v1/dispatch/...``), for a daemon."""

    def __init__(self, *, daemon: DaemonIdentity | None = None, **options: Unpack[TransportOptions]) -> None:
        super().__init__(**options)
        #: The identity dispatch calls register as (learned from the calls when not given).
        self.daemon = daemon
        self._registered: DaemonIdentity | None = None
        self._session_token: str | None = None
        #: The session of each identity this client registered (a client acting as several
        #: daemons keeps each one's session: registering a live one again would replace it, and
        #: the queue would hand its leases back).
        self._sessions: dict[DaemonIdentity, str] = {}
        self._register_lock = asyncio.Lock()
        #: The queue has no batch route for completions: send them one at a time.
        self._single_completions = False
        self._single_chunks = False

    async def register(self, *, identity: DaemonIdentity) -> SessionJSON:
        """Register ``identity`` with the client's (bootstrap) token; later dispatch calls use
        the session credential it returns."""
        body = {
            "daemonId": identity.daemon_id,
            "node": identity.node,
            "namespaces": list(identity.namespaces),
        }
        try:
            answer = await self.request("POST", "/v1/dispatch/register", json=body)
        except QueueConflict as exc:
            raise QueueRegistrationRefused(
                str(exc), status=exc.status, code=exc.code, detail=exc.detail
            ) from None
        token = answer.get("sessionToken") if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token:
            raise QueueUnavailable("the queue answered a registration without a session credential")
        self._session_token = token
        self._registered = identity
        self._sessions[identity] = token
        return cast(SessionJSON, answer)

    def _identity(
        self, *, daemon_id: str | None, node: str | None = None, namespaces: Sequence[str] | None = None
    ) -> DaemonIdentity:
        """The identity a dispatch call acts as: the one given or learned, with what the call names."""
        base = self.daemon or self._registered
        if base is None:
            base = DaemonIdentity(daemon_id=daemon_id or f"{node or 'daemon'}-{secrets.token_hex(4)}")
        changes: dict[str, Any] = {}
        if daemon_id is not None:
            changes["daemon_id"] = daemon_id
        if node is not None:
            changes["node"] = node
        if namespaces is not None:
            changes["namespaces"] = tuple(namespaces)
        return replace(base, **changes)

    async def _session_for(self, identity: DaemonIdentity, *, stale: str | None = None) -> str:
        async with self._register_lock:
            token = self._sessions.get(identity)
            if token is None or (stale is not None and token == stale):
                await self.register(identity=identity)
            else:
                self._session_token, self._registered = token, identity
            assert self._session_token is not None
            return self._session_token

    async def _dispatch(
        self,
        method: str,
        path: str,
        *,
        identity: DaemonIdentity,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Any:
        credential = await self._session_for(identity)
        try:
            return await self.request(
                method, path, json=json, params=params, timeout=timeout, bearer=credential
            )
        except QueueAuthError as exc:
            if exc.status != 401 or exc.code not in SESSION_LOST_CODES:
                raise
        credential = await self._session_for(identity, stale=credential)
        return await self.request(method, path, json=json, params=params, timeout=timeout, bearer=credential)

    async def claim(
        self,
        *,
        daemon_id: str,
        node: str,
        namespaces: Sequence[str] = (),
        capacity: int,
        wait: float = 30.0,
        lease_seconds: int | None = None,
        node_info: Mapping[str, Any] | None = None,
    ) -> list[TaskJSON]:
        """Claim up to ``capacity`` tasks; ``node_info`` is what the daemon's node offers
        (:meth:`nymph.launch.placement.NodeOffer.to_json`), so the queue hands it only launches
        that node can run."""
        identity = self._identity(daemon_id=daemon_id, node=node, namespaces=namespaces)
        body: dict[str, Any] = {
            "daemonId": daemon_id,
            "node": node,
            "namespaces": list(namespaces),
            "capacity": capacity,
            "wait": wait,
        }
        if lease_seconds is not None:
            body["leaseSeconds"] = lease_seconds
        if node_info is not None:
            body["nodeInfo"] = dict(node_info)
        answer = await self._dispatch(
            "POST", "/v1/dispatch/claim", identity=identity, json=body, timeout=self.timeout + wait
        )
        return _claimed_tasks(answer)

    async def renew(
        self, *, daemon_id: str, task_ids: Sequence[str], lease_seconds: int | None = None
    ) -> RenewAnswer:
        body: dict[str, Any] = {"daemonId": daemon_id, "taskIds": list(task_ids)}
        if lease_seconds is not None:
            body["leaseSeconds"] = lease_seconds
        identity = self._identity(daemon_id=daemon_id)
        return cast(
            RenewAnswer, await self._dispatch("POST", "/v1/dispatch/renew", identity=identity, json=body)
        )

    async def release(self, *, daemon_id: str, task_ids: Sequence[str]) -> list[str]:
        return await self._release(daemon_id, {"taskIds": list(task_ids)})

    async def release_all(self, *, daemon_id: str) -> list[str]:
        """Hand back every lease this daemon holds (it stops, its work sent); the ids handed back."""
        return await self._release(daemon_id, {"all": True})

    async def _release(self, daemon_id: str, which: dict[str, Any]) -> list[str]:
        identity = self._identity(daemon_id=daemon_id)
        body = {"daemonId": daemon_id, **which}
        answer = await self._dispatch("POST", "/v1/dispatch/release", identity=identity, json=body)
        return cast(list[str], answer["released"])

    async def complete(
        self,
        *,
        daemon_id: str,
        task_id: str,
        ok: bool,
        error: str | None = None,
        retryable: bool = False,
        result: Mapping[str, Any] | None = None,
    ) -> CompleteAnswer:
        body: dict[str, Any] = {"daemonId": daemon_id, "taskId": task_id, "ok": ok, "retryable": retryable}
        if error is not None:
            body["error"] = error
        if result is not None:
            body["result"] = dict(result)
        identity = self._identity(daemon_id=daemon_id)
        return cast(
            CompleteAnswer,
            await self._dispatch("POST", "/v1/dispatch/complete", identity=identity, json=body),
        )

    async def complete_many(
        self, *, daemon_id: str, completions: Sequence[Mapping[str, Any]]
    ) -> list[CompleteAnswer | QueueError]:
        """Send many completions (each the keywords of :meth:`complete`, with ``task_id``) in one
        request; per completion, in order, the answer :meth:`complete` would return or the
        :class:`QueueError` it would raise. A queue without the batch route (404: one older than
        it) gets one :meth:`complete` each, from then on. A failure of the whole request (the
        queue unreachable, a 5xx) is raised: nothing of it was committed."""
        if not completions:
            return []
        if self._single_completions:
            return await self._complete_each(daemon_id=daemon_id, completions=completions)
        body = {"daemonId": daemon_id, "completions": [_completion_body(c) for c in completions]}
        identity = self._identity(daemon_id=daemon_id)
        try:
            answer = await self._dispatch("POST", COMPLETIONS_PATH, identity=identity, json=body)
        except QueueNotFound:
            # The batch route itself never answers 404 (each item has its own answer): this is
            # a queue older than it.
            self._single_completions = True
            return await self._complete_each(daemon_id=daemon_id, completions=completions)
        return _completion_answers(answer, count=len(completions))

    async def _complete_each(
        self, *, daemon_id: str, completions: Sequence[Mapping[str, Any]]
    ) -> list[CompleteAnswer | QueueError]:
        out: list[CompleteAnswer | QueueError] = []
        for c in completions:
            try:
                out.append(await self.complete(daemon_id=daemon_id, **c))
            except (QueueUnavailable, QueueRegistrationRefused):
                raise  # not about the item: the caller sends them all again later
            except QueueError as exc:
                out.append(exc)
        return out

    async def report(self, *, daemon_id: str, stream: str, reports: Sequence[Mapping[str, Any]]) -> ReportAck:
        """Send reports (each shaped as :class:`nymph.protocol.ReportJSON`)."""
        body = {"daemonId": daemon_id, "stream": stream, "reports": [dict(r) for r in reports]}
        identity = self._identity(daemon_id=daemon_id)
        return cast(
            ReportAck, await self._dispatch("POST", "/v1/dispatch/report", identity=identity, json=body)
        )

    async def upload_logs(self, *, daemon_id: str, instance_id: str, logs: str) -> None:
        body = {"daemonId": daemon_id, "instanceId": instance_id, "logs": logs}
        await self._dispatch(
            "POST", "/v1/dispatch/logs", identity=self._identity(daemon_id=daemon_id), json=body
        )

    async def ship_log_chunk(
        self,
        *,
        daemon_id: str,
        instance_id: str,
        offset: int,
        data: bytes,
        cursor: str | None = None,
        final: bool = False,
        note: str | None = None,
    ) -> dict[str, Any]:
        """Ship the log of ``instance_id`` from byte ``offset``; overlaps are de-duplicated by the queue."""
        body = {
            "daemonId": daemon_id,
            **_chunk_body(
                instance_id=instance_id, offset=offset, data=data, cursor=cursor, final=final, note=note
            ),
        }
        identity = self._identity(daemon_id=daemon_id)
        answer = await self._dispatch("POST", "/v1/dispatch/logchunks", identity=identity, json=body)
        return cast(dict[str, Any], answer)

    async def ship_log_chunks(
        self, *, daemon_id: str, chunks: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any] | QueueError]:
        """Ship many chunks (each the keywords of :meth:`ship_log_chunk`) in one request; per
        chunk, in order, the answer :meth:`ship_log_chunk` would return or the
        :class:`QueueError` it would raise. A queue without the batch route (404: one older than
        it) gets one :meth:`ship_log_chunk` each, from then on. A failure of the whole request
        (the queue unreachable, a 5xx) is raised: nothing of it was stored."""
        if not chunks:
            return []
        if self._single_chunks:
            return await self._ship_each(daemon_id=daemon_id, chunks=chunks)
        body = {"daemonId": daemon_id, "chunks": [_chunk_body(**c) for c in chunks]}
        identity = self._identity(daemon_id=daemon_id)
        try:
            answer = await self._dispatch("POST", LOGCHUNKS_BATCH_PATH, identity=identity, json=body)
        except QueueNotFound:
            # The batch route itself never answers 404 (each item has its own answer): this is
            # a queue older than it.
            self._single_chunks = True
            return await self._ship_each(daemon_id=daemon_id, chunks=chunks)
        return _batch_answers(answer, count=len(chunks), what="log chunk")

    async def _ship_each(
        self, *, daemon_id: str, chunks: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any] | QueueError]:
        out: list[dict[str, Any] | QueueError] = []
        for c in chunks:
            try:
                out.append(await self.ship_log_chunk(daemon_id=daemon_id, **c))
            except (QueueUnavailable, QueueRegistrationRefused):
                raise  # not about the item: the caller sends them all again later
            except QueueError as exc:
                out.append(exc)
        return out

    async def upload_result(
        self,
        *,
        daemon_id: str,
        instance_id: str,
        path: str | None = None,
        offset: int = 0,
        data: bytes = b"",
        eof: bool = False,
        error: str | None = None,
    ) -> None:
        """A chunk of result file ``path`` from ``offset`` (``eof`` completes it), and/or why
        some results were not kept."""
        body: dict[str, Any] = {"daemonId": daemon_id, "instanceId": instance_id}
        if path is not None:
            body |= {
                "path": path,
                "offset": offset,
                "data": base64.b64encode(data).decode("ascii"),
                "eof": eof,
            }
        if error is not None:
            body["error"] = error[:2000]
        identity = self._identity(daemon_id=daemon_id)
        await self._dispatch("POST", "/v1/dispatch/results", identity=identity, json=body)

    async def active(self, *, node: str) -> list[ActiveJSON]:
        identity = self._identity(daemon_id=None, node=node)
        body = await self._dispatch("GET", "/v1/dispatch/active", identity=identity, params={"node": node})
        return cast(list[ActiveJSON], body["items"])


def _completion_body(c: Mapping[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"taskId": c["task_id"], "ok": c["ok"], "retryable": bool(c.get("retryable"))}
    if c.get("error") is not None:
        body["error"] = c["error"]
    if c.get("result") is not None:
        body["result"] = dict(c["result"])
    return body


def _chunk_body(
    *,
    instance_id: str,
    offset: int,
    data: bytes,
    cursor: str | None = None,
    final: bool = False,
    note: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "instanceId": instance_id,
        "offset": offset,
        "data": base64.b64encode(data).decode("ascii"),
        "final": final,
    }
    if cursor is not None:
        body["cursor"] = cursor
    if note is not None:
        body["note"] = note[:2000]
    return body


def _completion_answers(answer: object, *, count: int) -> list[CompleteAnswer | QueueError]:
    """Each item of a batch answer as :meth:`DispatchClient.complete` would have it."""
    return cast(list[CompleteAnswer | QueueError], _batch_answers(answer, count=count, what="completion"))


def _batch_answers(answer: object, *, count: int, what: str) -> list[dict[str, Any] | QueueError]:
    """Each item of a batch answer (``answers``: ``httpStatus`` and ``body`` per item) as the
    single call would have it: its body, or the error its status and code make (a 5xx item, or
    an answer of another shape, raises)."""
    items = answer.get("answers") if isinstance(answer, dict) else None
    if not isinstance(items, list) or len(items) != count or not all(isinstance(i, dict) for i in items):
        raise QueueUnavailable(f"the queue answered a batch of {what}s without one answer per {what}")
    out: list[dict[str, Any] | QueueError] = []
    for item in items:
        status, body = item.get("httpStatus"), item.get("body")
        if not isinstance(status, int) or not isinstance(body, dict):
            raise QueueUnavailable(f"the queue answered a {what} without a status and a body")
        if status < 300:
            out.append(body)
            continue
        code = body.get("error") if isinstance(body.get("error"), str) else None
        detail = str(body.get("detail") or f"HTTP {status}")
        if status >= 500:
            raise QueueUnavailable(f"the queue failed on a {what}: {detail} (HTTP {status})", status=status)
        cls = BY_CODE.get(code or "") or BY_STATUS.get(status, QueueError)
        out.append(cls(f"{detail} (HTTP {status})", status=status, code=code, detail=detail))
    return out


def _claimed_tasks(answer: object) -> list[TaskJSON]:
    """The tasks of a claim answer; a queue that answers another shape is a :class:`QueueError`
    (the claim loop backs off), and an entry that is not an object is dropped (the daemon's task
    checks refuse the rest of what is malformed)."""
    tasks = answer.get("tasks") if isinstance(answer, dict) else None
    if not isinstance(tasks, list):
        raise QueueUnavailable("the queue answered a claim without a list of tasks (is it a nymph queue?)")
    return [cast(TaskJSON, t) for t in tasks if isinstance(t, dict)]
