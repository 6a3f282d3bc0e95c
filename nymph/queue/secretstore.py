"""The secret store's async face: set, list (names and dates), remove, and read for a call.

Values go in sealed (:mod:`nymph.queue.secrets`) and only :meth:`SecretStore.plaintext` takes
them out, for the direct dispatch's staging; no route returns one, no log line names one.
"""

from __future__ import annotations

import structlog

from nymph.kube.credentials import SECRET_NAME
from nymph.protocol import now
from nymph.queue.db import Backend
from nymph.queue.errors import BadRequest
from nymph.queue.secrets import SecretBox
from nymph.queue.sql import secrets as sql

log = structlog.get_logger(__name__, component="queue.secrets")

MAX_SECRET_BYTES = 256 * 1024


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
        log.info("secret stored", namespace=ns, name=name, created=created)
        items = await self.list(ns=ns)
        return next(i for i in items if i["name"] == name)

    async def list(self, *, ns: str) -> list[dict[str, str]]:
        return await self.db.read(lambda conn: sql.listing(conn, ns=ns))

    async def delete(self, *, ns: str, name: str) -> None:
        await self.db.write(lambda conn: sql.delete(conn, ns=ns, name=name))
        log.info("secret removed", namespace=ns, name=name)

    async def plaintext(self, *, ns: str, name: str) -> str:
        blob = await self.db.read_one(lambda conn: sql.get(conn, ns=ns, name=name))
        return self.box.open(ns=ns, name=name, blob=blob)
