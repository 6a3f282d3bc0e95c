"""What a launch is built from, read in one statement on either backend: its provider, its mode
(checked against the provider) and its namespace's quota, the defaults when there is none, and
a clear 404 for a provider or a mode that does not exist."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import pytest

from nymph.launch.config import Mode, Provider
from nymph.queue.errors import NotFound
from nymph.queue.scheduling import Quota
from nymph.queue.sql import catalog, launches
from nymph.queue.sql.dialect import Conn
from nymph.queue.sql.quotas import put_quota
from tests.support.queue_helpers import Queue


async def test_the_provider_mode_and_quota_are_read_together(kind: Queue) -> None:
    def read(conn: Conn) -> tuple[str, str, str | None, Quota]:
        provider, mode, quota = launches.launch_catalog(
            conn, ns="default", provider_name="kind", mode_name="small"
        )
        return provider.name, mode.name, provider.namespace, quota

    name, mode, kube_ns, quota = await kind.store.db.read(read)
    assert (name, mode, kube_ns, quota) == ("kind", "small", "jobs", Quota())

    limited = Quota(weight=Fraction(3, 2), max_running=4, resources={"cpu": Fraction(8)}, max_runtime=600)
    await kind.store.db.write(lambda conn: put_quota(conn, "default", limited, now=1.0))
    assert (await kind.store.db.read(read))[3] == limited
    # another namespace's quota is not this one's
    await kind.store.db.write(lambda conn: put_quota(conn, "other", Quota(max_running=1), now=1.0))
    assert (await kind.store.db.read(read))[3] == limited


@pytest.mark.parametrize(
    ("provider", "mode", "code"),
    [("nope", "small", "provider_not_found"), ("kind", "nope", "mode_not_found")],
)
async def test_a_missing_provider_or_mode_is_a_404_naming_it(
    kind: Queue, provider: str, mode: str, code: str
) -> None:
    def read(conn: Conn) -> object:
        return launches.launch_catalog(conn, ns="default", provider_name=provider, mode_name=mode)

    with pytest.raises(NotFound) as raised:
        await kind.store.db.read(read)
    assert raised.value.code == code and "nope" in str(raised.value)


async def test_a_replaced_provider_or_mode_is_read_as_it_now_is(kind: Queue) -> None:
    """A stored provider and mode are parsed once while their bodies stay the same (the next
    launch gets the very same objects), and a replaced body is what the next launch reads."""

    def read(conn: Conn) -> tuple[Provider, Mode]:
        provider, mode, _ = launches.launch_catalog(
            conn, ns="default", provider_name="kind", mode_name="small"
        )
        return provider, mode

    provider, mode = await kind.store.db.read(read)
    again = await kind.store.db.read(read)
    assert again[0] is provider and again[1] is mode

    moved = dataclasses.replace(provider, kwargs={**provider.kwargs, "namespace": "elsewhere"})
    wider = dataclasses.replace(mode, fields={**mode.fields, "image": "busybox:2"})
    await kind.store.db.write(
        lambda conn: catalog.put_provider(conn, ns="default", provider=moved, replace=True)
    )
    await kind.store.db.write(lambda conn: catalog.put_mode(conn, ns="default", mode=wider, replace=True))
    provider, mode = await kind.store.db.read(read)
    assert provider.namespace == "elsewhere" and mode.fields["image"] == "busybox:2"
