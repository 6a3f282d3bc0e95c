"""The direct path's API clients are opened once per connection and credential, and closed
when replaced, idle or old."""

from __future__ import annotations

import asyncio
from typing import Any

from nymph.kube.clientcache import ClientCache, Opener
from tests.support.fakeclock import FakeClock


class FakeClient:
    def __init__(self, n: int) -> None:
        self.n = n
        self.closed = False

    async def close(self) -> None:
        self.closed = True


def cache_with(clock: FakeClock, **kw: Any) -> tuple[ClientCache, list[FakeClient], Opener]:
    opened: list[FakeClient] = []
    cache = ClientCache(clock=clock, **kw)

    async def opener() -> Any:
        await asyncio.sleep(0)
        c = FakeClient(len(opened))
        opened.append(c)
        return c

    return cache, opened, opener


async def test_one_client_serves_every_call_with_the_same_credential() -> None:
    clock = FakeClock()
    cache, opened, opener = cache_with(clock)

    async def call() -> int:
        async with cache.use("k", "fp1", opener) as api:
            await asyncio.sleep(0)
            return int(api.n)

    got = await asyncio.gather(*(call() for _ in range(50)))
    assert set(got) == {0}
    assert len(opened) == 1 and not opened[0].closed


async def test_a_changed_credential_opens_a_new_client_and_closes_the_old_after_its_last_user() -> None:
    clock = FakeClock()
    cache, opened, opener = cache_with(clock)
    async with cache.use("k", "fp1", opener) as old:
        async with cache.use("k", "fp2", opener) as new:
            assert new is not old
            assert not old.closed  # still in use by the outer call
        assert not old.closed
    assert old.closed and not new.closed
    async with cache.use("k", "fp2", opener) as again:
        assert again is new
    assert len(opened) == 2


async def test_clients_past_their_age_are_reopened_and_idle_ones_are_closed() -> None:
    clock = FakeClock()
    cache, opened, opener = cache_with(clock, max_age=300.0, idle=60.0)
    async with cache.use("a", "fp", opener):
        pass
    clock.now = 301.0
    async with cache.use("a", "fp", opener) as api:
        assert api.n == 1
    assert opened[0].closed
    async with cache.use("b", "fp", opener):
        pass
    assert len(cache) == 2
    clock.now = 361.0 + 1
    await cache.sweep()
    assert len(cache) == 0
    assert all(c.closed for c in opened)


async def test_close_closes_everything_not_in_use() -> None:
    clock = FakeClock()
    cache, opened, opener = cache_with(clock)
    for key in ("a", "b", "c"):
        async with cache.use(key, "fp", opener):
            pass
    await cache.close()
    assert [c.closed for c in opened] == [True, True, True]


async def test_a_failed_open_is_not_cached() -> None:
    cache = ClientCache()
    calls = 0

    async def failing() -> Any:
        nonlocal calls
        calls += 1
        raise RuntimeError("cannot load")

    for _ in range(2):
        try:
            async with cache.use("k", "fp", failing):
                raise AssertionError("not reached")
        except RuntimeError:
            pass
    assert calls == 2 and len(cache) == 0
