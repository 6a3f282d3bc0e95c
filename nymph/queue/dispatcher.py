"""One interface for the two dispatch paths, so the routes never choose one.

A provider's ``dispatch`` decides who creates its Pods: ``daemon`` queues a task a nymph daemon
claims (:class:`QueuedDispatch`, over the store), ``direct`` has the queue create the Pod itself
(:class:`~nymph.queue.direct.launcher.DirectDispatch`). :class:`Dispatchers` picks the one for a
provider, or for an instance, once per request; both accept a launch in the same transaction
(:func:`nymph.queue.sql.launches.accept`) and differ only after it. A launch reads its
provider's dispatch in that transaction, not before it (:meth:`Dispatchers.launch`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from nymph.protocol import InstanceJSON, LaunchAccepted
from nymph.queue.errors import Conflict
from nymph.queue.models import Principal
from nymph.queue.paging import Page, PageRequest
from nymph.queue.sql.launches import WrongPath
from nymph.queue.store import Store

#: Providers whose last seen dispatch is remembered (a hint: a launch checks it).
_PATHS_KEPT = 10_000


class Dispatcher(Protocol):
    async def launch(
        self,
        *,
        ns: str,
        provider: str,
        body: Mapping[str, Any],
        idempotency_key: str | None,
        principal: Principal,
    ) -> LaunchAccepted:
        """Accept a launch (validated in full first) and start it on this path: the 202 body."""

    async def list_instances(
        self, *, ns: str, provider: str, state: str | None, page: PageRequest
    ) -> Page[InstanceJSON]:
        """One page of the provider's instances in creation order (of one state when ``state``
        is given)."""

    async def stop(
        self, *, ns: str, provider: str, instance_id: str, grace: int | None, principal: Principal
    ) -> None:
        """Stop an instance (nothing to do for one already stopped or gone)."""

    async def probe(self, *, ns: str, provider: str, mode: str | None, principal: Principal) -> str:
        """Check the provider end to end; the id of the task that holds the result."""


class QueuedDispatch:
    """``dispatch: daemon``: the launch becomes a task a daemon of the cluster claims."""

    def __init__(self, *, store: Store) -> None:
        self.store = store

    async def launch(
        self,
        *,
        ns: str,
        provider: str,
        body: Mapping[str, Any],
        idempotency_key: str | None,
        principal: Principal,
    ) -> LaunchAccepted:
        return await self.store.launch(
            ns=ns, provider=provider, body=body, idempotency_key=idempotency_key, principal=principal
        )

    async def list_instances(
        self, *, ns: str, provider: str, state: str | None, page: PageRequest
    ) -> Page[InstanceJSON]:
        return await self.store.lists.instances(ns=ns, provider=provider, state=state, page=page)

    async def stop(
        self, *, ns: str, provider: str, instance_id: str, grace: int | None, principal: Principal
    ) -> None:
        await self.store.stop_instance(
            ns=ns, provider=provider, instance_id=instance_id, grace=grace, principal=principal
        )

    async def probe(self, *, ns: str, provider: str, mode: str | None, principal: Principal) -> str:
        return await self.store.probe(ns=ns, provider=provider, mode=mode, principal=principal)


class Dispatchers:
    """Picks the dispatcher of a provider (its ``dispatch``) or of an instance (the path that
    created it: a provider can change its dispatch while its instances live on)."""

    def __init__(self, *, store: Store, queued: Dispatcher, direct: Dispatcher) -> None:
        self.store = store
        self.queued = queued
        self.direct = direct
        #: (namespace, provider) -> whether it dispatched directly when last seen.
        self._paths: dict[tuple[str, str], bool] = {}

    async def launch(
        self,
        *,
        ns: str,
        provider: str,
        body: Mapping[str, Any],
        idempotency_key: str | None,
        principal: Principal,
    ) -> LaunchAccepted:
        """Accept a launch on its provider's path without a read of its own first: the path
        the provider had when last seen is taken, and its transaction, which reads the provider
        anyway, finds one whose dispatch changed before writing anything
        (:class:`~nymph.queue.sql.launches.WrongPath`); the launch then takes the other path.
        NotFound when there is no such provider."""
        key = (ns, provider)
        direct = self._paths.get(key, False)
        for _ in range(3):
            dispatcher = self.direct if direct else self.queued
            try:
                return await dispatcher.launch(
                    ns=ns, provider=provider, body=body, idempotency_key=idempotency_key, principal=principal
                )
            except WrongPath as exc:
                direct = exc.direct
                if len(self._paths) >= _PATHS_KEPT:
                    self._paths.clear()
                self._paths[key] = direct
        raise Conflict(
            f"provider {provider!r} kept changing its dispatch while this launch was being "
            "accepted: send it again",
            code="provider_changed",
        )

    async def for_provider(self, *, ns: str, provider: str) -> Dispatcher:
        """NotFound when there is no such provider."""
        p = await self.store.get_provider_config(ns=ns, name=provider)
        return self.direct if p.direct else self.queued

    async def for_instance(self, *, instance_id: str) -> Dispatcher:
        return self.direct if await self.store.direct.is_direct(instance_id=instance_id) else self.queued
