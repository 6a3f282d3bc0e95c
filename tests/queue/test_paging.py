"""Paged lists over real HTTP, on both backends: ``limit`` and ``continue`` on the instances,
secrets, providers, modes and daemons lists; pages in creation order that never repeat or skip
an item, also while launches are added between pages; the bounds of ``limit`` and refused
tokens; the client following every page; an index range per page (EXPLAIN on SQLite)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from nymph.queue.paging import PageRequest
from nymph.queue.sql import pages
from tests.support.queue_helpers import Queue

NS = "/v1/namespaces/default"
INSTANCES = NS + "/providers/kind/instances"


async def _launch(q: Queue, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        r = await q.call(
            "POST", NS + "/providers/kind/launch", json_body={"mode": "small", "script": "print(1)"}
        )
        assert r.status == 202, r.body
        ids.append(str(r.body["instanceId"]))
    return ids


async def _walk(q: Queue, path: str, *, limit: int, between: Any = None) -> tuple[list[str], list[int]]:
    """Every page of ``path`` as (the ids in order, the size of each page)."""
    seen: list[str] = []
    sizes: list[int] = []
    sep = "&" if "?" in path else "?"
    url = f"{path}{sep}limit={limit}"
    while True:
        r = await q.call("GET", url)
        assert r.status == 200, r.body
        sizes.append(len(r.body["items"]))
        seen += [i.get("instanceId") or i.get("name") or i.get("daemonId") for i in r.body["items"]]
        token = r.body.get("continue")
        if token is None:
            assert set(r.body) == {"items"}
            return seen, sizes
        assert isinstance(token, str) and token
        if between is not None:
            await between()
        url = f"{path}{sep}limit={limit}&continue={token}"


async def test_pages_give_every_instance_once_in_creation_order(kind: Queue) -> None:
    ids = await _launch(kind, 23)
    seen, sizes = await _walk(kind, INSTANCES, limit=5)
    assert seen == ids
    assert sizes == [5, 5, 5, 5, 3]
    # a page that ends with the last item says there is no more (no empty page to fetch)
    seen, sizes = await _walk(kind, INSTANCES, limit=23)
    assert seen == ids and sizes == [23]
    # no limit: the default page (500) holds them all, without a continue
    r = await kind.call("GET", INSTANCES)
    assert [i["instanceId"] for i in r.body["items"]] == ids and "continue" not in r.body


async def test_launches_added_between_pages_never_repeat_or_skip_one(kind: Queue) -> None:
    before = await _launch(kind, 20)
    added: list[str] = []

    async def launch_more() -> None:
        added.extend(await _launch(kind, 3))

    seen, _ = await _walk(kind, INSTANCES, limit=4, between=launch_more)
    assert len(seen) == len(set(seen)), "an instance was listed twice"
    assert seen[: len(before)] == before, "an instance that existed at the start was skipped"
    assert set(seen) <= set(before) | set(added)
    assert seen == before + added  # the new ones come after, in creation order too


async def test_a_concurrent_launcher_never_makes_a_page_repeat_or_skip_one(kind: Queue) -> None:
    before = await _launch(kind, 30)
    added: list[str] = []

    async def launch_meanwhile() -> None:
        for _ in range(15):  # bounded: a walk that chased an endless launcher would never end
            added.extend(await _launch(kind, 1))
            await asyncio.sleep(0.005)

    launcher = asyncio.create_task(launch_meanwhile(), name="test-launcher")

    async def pause() -> None:
        await asyncio.sleep(0.01)

    try:
        seen, _ = await _walk(kind, INSTANCES, limit=3, between=pause)
    finally:
        await launcher
    assert added, "no launch happened while paging"
    # every launch that finished before the walk reached the end is listed; the walk may have
    # ended before the last ones
    assert len(seen) == len(set(seen)), "an instance was listed twice"
    assert seen[: len(before)] == before, "an instance that existed at the start was skipped or moved"
    assert set(seen) <= set(before) | set(added)
    assert seen == before + added[: len(seen) - len(before)]  # the new ones in creation order


async def test_a_state_filter_pages_too_and_binds_its_token(kind: Queue) -> None:
    ids = await _launch(kind, 7)
    await kind.user().stop(provider="kind", instance_id=ids[2])  # queued -> stopped at once
    seen, _ = await _walk(kind, INSTANCES + "?state=queued", limit=2)
    assert seen == [i for i in ids if i != ids[2]]
    r = await kind.call("GET", INSTANCES + "?state=queued&limit=2")
    token = r.body["continue"]
    other = await kind.call("GET", INSTANCES + f"?state=stopped&limit=2&continue={token}")
    assert other.status == 400 and other.body["error"] == "invalid_continue"
    assert "without continue" in other.body["detail"]


@pytest.mark.parametrize("limit", ["0", "5001", "x", "-1", "2.5"])
async def test_a_bad_limit_is_a_400_naming_it(kind: Queue, limit: str) -> None:
    for path in (INSTANCES, NS + "/secrets", NS + "/providers", NS + "/modes", NS + "/daemons"):
        r = await kind.call("GET", f"{path}?limit={limit}")
        assert r.status == 400, (path, r.body)
        assert set(r.body) == {"error", "detail"} and r.body["error"] == "invalid_query"
        assert "limit" in r.body["detail"]


async def test_limits_at_the_bounds_are_accepted(kind: Queue) -> None:
    await _launch(kind, 2)
    for limit in ("1", "5000"):
        r = await kind.call("GET", f"{INSTANCES}?limit={limit}")
        assert r.status == 200, r.body
    assert len((await kind.call("GET", f"{INSTANCES}?limit=1")).body["items"]) == 1


def _tampered(token: str) -> list[str]:
    body, _, check = token.rpartition(".")
    raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    edited = base64.urlsafe_b64encode(raw.replace(b'"k":[', b'"k":[0,')).decode().rstrip("=")
    flipped = check[:-1] + ("0" if check[-1] != "0" else "1")
    return [
        "garbage",
        "a.b",
        token[:-3],
        f"{edited}.{check}",
        f"{body}.{flipped}",
        "x" * 5000,
    ]


async def test_a_bad_continue_token_is_a_400_saying_to_restart(kind: Queue) -> None:
    await _launch(kind, 3)
    token = (await kind.call("GET", f"{INSTANCES}?limit=1")).body["continue"]
    for bad in _tampered(token):
        r = await kind.call("GET", f"{INSTANCES}?limit=1&continue={bad}")
        assert r.status == 400, (bad, r.body)
        assert r.body["error"] == "invalid_continue"
        assert "start the listing again without continue" in r.body["detail"]
    # a token of another list (the modes) is refused on the instances
    for name in ("m1", "m2"):
        body = {"name": name, "provider": "kind", "fields": {"image": "python:3.12-slim"}}
        assert (await kind.call("POST", NS + "/modes", json_body=body)).status == 201
    modes_token = (await kind.call("GET", NS + "/modes?limit=1")).body["continue"]
    r = await kind.call("GET", f"{INSTANCES}?limit=1&continue={modes_token}")
    assert r.status == 400 and r.body["error"] == "invalid_continue"


async def test_secrets_providers_and_modes_page_by_name(queue: Queue) -> None:
    names = [f"s{i:02d}" for i in range(11)]
    for name in reversed(names):
        r = await queue.call("PUT", f"{NS}/secrets/{name}", json_body={"value": "v"})
        assert r.status == 200, r.body
        body = {"name": f"p{name}", "launcher": "Kube", "dispatch": "daemon", "kwargs": {"namespace": "jobs"}}
        assert (await queue.call("POST", NS + "/providers", json_body=body)).status == 201, body
        mode = {"name": f"m{name}", "provider": None, "fields": {"image": "python:3.12-slim"}}
        assert (await queue.call("POST", NS + "/modes", json_body=mode)).status == 201
    for path, prefix in ((NS + "/secrets", ""), (NS + "/providers", "p"), (NS + "/modes", "m")):
        seen, sizes = await _walk(queue, path, limit=4)
        assert seen == [prefix + n for n in names], path
        assert sizes == [4, 4, 3]
    user = queue.user()
    assert [s["name"] for s in await user.list_secrets()] == names
    page = await user.secrets_page(limit=10)
    assert len(page.items) == 10 and page.continue_ is not None
    rest = await user.secrets_page(limit=10, continue_=page.continue_)
    assert [s["name"] for s in rest.items] == names[10:] and rest.continue_ is None


async def test_daemons_page_by_node(queue: Queue) -> None:
    d = queue.daemon()
    nodes = [f"n{i}" for i in range(5)]
    for i, node in enumerate(nodes):
        await d.claim(daemon_id=f"d{i}", node=node, namespaces=[], capacity=1, wait=0)
    seen, sizes = await _walk(queue, NS + "/daemons", limit=2)
    assert seen == [f"d{i}" for i in range(5)] and sizes == [2, 2, 1]
    assert [x["daemonId"] for x in await queue.user().list_daemons()] == seen


async def test_the_client_follows_every_page(kind: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    import nymph.client.paging as paging

    monkeypatch.setattr(paging, "FOLLOW_LIMIT", 3)
    ids = await _launch(kind, 8)
    user = kind.user()
    assert [i["instanceId"] for i in await user.list_instances(provider="kind")] == ids
    first = await user.instances_page(provider="kind", limit=5)
    assert [i["instanceId"] for i in first.items] == ids[:5] and first.continue_
    second = await user.instances_page(provider="kind", limit=5, continue_=first.continue_)
    assert [i["instanceId"] for i in second.items] == ids[5:] and second.continue_ is None


async def test_each_page_is_an_index_range(kind: Queue, backend: str) -> None:
    await _launch(kind, 3)
    for state in (None, "queued"):
        for after in (None, (1.0, "lakeshore-00000000")):
            sql, params = pages.instance_query(
                ns="default", provider="kind", state=state, page=PageRequest(limit=5, after=after)
            )
            if backend == "sqlite":

                def plan_of(c: Any, s: str = sql, p: list[Any] = params) -> list[Any]:
                    return list(c.execute("EXPLAIN QUERY PLAN " + s, p).fetchall())

                plan = await kind.store.db.read(plan_of)
                text = " | ".join(str(row[-1]) for row in plan)
                index = "instances_page_state" if state else "instances_page"
                assert f"SEARCH instances USING INDEX {index} (" in text, text
                assert "TEMP B-TREE" not in text and "SCAN" not in text, text
            else:
                # a table this small is cheaper to scan: forbid that, and the plan must be an
                # index range that needs no sort
                def explain(c: Any, s: str = sql, p: list[Any] = params) -> str:
                    c.execute("SET LOCAL enable_seqscan = off")
                    return "\n".join(str(r[0]) for r in c.execute("EXPLAIN " + s, p).fetchall())

                text = await kind.store.db.read(explain)
                assert "Index Scan using instances_page" in text, text
                assert "Sort" not in text, text
