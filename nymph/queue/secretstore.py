"""The secret store's async face: set, list (names and dates), remove, and read for a call.

Values go in sealed (:mod:`nymph.queue.secrets`) and only :meth:`SecretStore.plaintext` takes
them out, for the direct dispatch's staging; no route returns one, no log line names one.
"""

from __future__ import annotations

import time

import structlog

from nymph.kube.credentials import SECRET_NAME
from nymph.protocol import now
from nymph.queue.db import Backend
from nymph.queue.errors import BadRequest
from nymph.queue.secrets import SecretBox
from nymph.queue.sql import secrets as sql

log = structlog.get_logger(__name__, component="queue.secrets")

MAX_SECRET_BYTES = 256 * 1024
#: Values read with a ``max_age`` kept at most this many (expired ones are dropped first).
_RECENT_MAX = 1024


def check_secret_name(name: object) -> str:
    if not isinstance(name, str) or not SECRET_NAME.match(name):
        raise BadRequest(
            f"secret name {name!r} is not valid: 1-253 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
            code="invalid_name",
        )
    return name


class SecretStore:
    def __init__(self, *, db: Backend, box: SecretBox) -> None:
        self.db = db
        self.box = box
        #: (ns, name) -> (when read, value): values read for calls, used again for ``max_age``.
        self._recent: dict[tuple[str, str], tuple[float, str]] = {}
        #: Counts this replica's changes: a read that a change overtook is not kept.
        self._changes = 0

    async def check(self) -> None:
        """At start: a database that holds secrets needs the key that opens them."""
        self.box.check(sample=await self.db.read(sql.sample))

    async def put(self, *, ns: str, name: str, value: str) -> dict[str, str]:
        check_secret_name(name)
        if not value:
            raise BadRequest("a secret value must not be empty", code="invalid_secret")
        if len(value.encode("utf-8", errors="surrogatepass")) > MAX_SECRET_BYTES:
            raise BadRequest(f"a secret holds at most {MAX_SECRET_BYTES} bytes", code="invalid_secret")
        have = await self.db.read(sql.sample) is not None
        blob = self.box.seal(ns=ns, name=name, value=value, have_secrets=have)
        created = await self.db.write(lambda conn: sql.put(conn, ns=ns, name=name, ciphertext=blob, ts=now()))
        self._changed(ns, name)
        log.info("secret stored", namespace=ns, name=name, created=created)
        items = await self.list(ns=ns)
        return next(i for i in items if i["name"] == name)

    async def list(self, *, ns: str) -> list[dict[str, str]]:
        return await self.db.read(lambda conn: sql.listing(conn, ns=ns))

    async def delete(self, *, ns: str, name: str) -> None:
        await self.db.write(lambda conn: sql.delete(conn, ns=ns, name=name))
        self._changed(ns, name)
        log.info("secret removed", namespace=ns, name=name)

    async def plaintext(self, *, ns: str, name: str, max_age: float = 0.0) -> str:
        """The value of secret ``name``. With ``max_age``, a value this replica read less than
        that many seconds ago is used again without reading the store (a call's credential:
        a change made through this replica is seen at once, one made through another within
        ``max_age``); without, the store is read."""
        key = (ns, name)
        if max_age > 0:
            hit = self._recent.get(key)
            if hit is not None and time.monotonic() - hit[0] < max_age:
                return hit[1]
        changes = self._changes
        blob = await self.db.read_one(lambda conn: sql.get(conn, ns=ns, name=name))
        value = self.box.open(ns=ns, name=name, blob=blob)
        if max_age > 0 and changes == self._changes:
            self._keep(key, value, max_age)
        return value

    def _changed(self, ns: str, name: str) -> None:
        self._changes += 1
        self._recent.pop((ns, name), None)

    def _keep(self, key: tuple[str, str], value: str, max_age: float) -> None:
        now_ = time.monotonic()
        if len(self._recent) >= _RECENT_MAX:
            self._recent = {k: v for k, v in self._recent.items() if now_ - v[0] < max_age}
            if len(self._recent) >= _RECENT_MAX:
                self._recent.clear()
        self._recent[key] = (now_, value)
