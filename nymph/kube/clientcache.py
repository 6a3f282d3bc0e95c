"""API clients kept open between calls, one per connection and credential.

Opening a client means staging the kubeconfig, parsing it, building an SSL context and, on the
first request, a TLS handshake: about 10 ms of CPU, more than the create it serves. A cached
client is used again while its credential is unchanged (the caller's ``fingerprint``: a hash
of the secret's content, or of the kubeconfig file's identity and times), for at most
``max_age`` seconds (exec and token credentials are read again), and closed once nobody used it
for ``idle`` seconds. A client being replaced is closed when its last user is done with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from kubernetes_asyncio import client

Opener = Callable[[], Awaitable[client.ApiClient]]


@dataclass
class _Entry:
    api: client.ApiClient
    fingerprint: str
    opened: float
    last_used: float
    users: int = 0


@dataclass
class ClientCache:
    max_age: float = 300.0
    idle: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _entries: dict[str, _Entry] = field(default_factory=dict)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    _retired: list[_Entry] = field(default_factory=list)
    opened: int = 0

    def _fresh(self, entry: _Entry | None, fingerprint: str) -> bool:
        return (
            entry is not None
            and entry.fingerprint == fingerprint
            and self.clock() - entry.opened < self.max_age
        )

    async def _get(self, key: str, fingerprint: str, opener: Opener) -> _Entry:
        entry = self._entries.get(key)
        if self._fresh(entry, fingerprint):
            assert entry is not None
            return entry
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            entry = self._entries.get(key)
            if self._fresh(entry, fingerprint):
                assert entry is not None
                return entry
            api = await opener()
            self.opened += 1
            if entry is not None:
                self._retire(key)
            t = self.clock()
            entry = self._entries[key] = _Entry(api=api, fingerprint=fingerprint, opened=t, last_used=t)
            return entry

    def _retire(self, key: str) -> None:
        entry = self._entries.pop(key)
        self._retired.append(entry)

    @contextlib.asynccontextmanager
    async def use(self, key: str, fingerprint: str, opener: Opener) -> AsyncIterator[client.ApiClient]:
        """The client of ``key`` (opened by ``opener`` when missing, stale or of another
        ``fingerprint``), held for the block."""
        entry = await self._get(key, fingerprint, opener)
        entry.users += 1
        try:
            yield entry.api
        finally:
            entry.users -= 1
            entry.last_used = self.clock()
            await self.sweep()

    async def sweep(self) -> None:
        """Close replaced clients nobody uses any more, and those idle or past ``max_age``."""
        t = self.clock()
        for key, entry in list(self._entries.items()):
            if entry.users == 0 and (t - entry.last_used >= self.idle or t - entry.opened >= self.max_age):
                self._retire(key)
        done = [e for e in self._retired if e.users == 0]
        self._retired = [e for e in self._retired if e.users > 0]
        for entry in done:
            await entry.api.close()

    def __len__(self) -> int:
        return len(self._entries)

    async def close(self) -> None:
        """Close every client (at shutdown; users still holding one keep it until they return)."""
        for key in list(self._entries):
            self._retire(key)
        await self.sweep()
