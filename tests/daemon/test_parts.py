from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from nymph.daemon.audit import AuditLog, verify
from nymph.daemon.outbox import DropItem, Outbox
from nymph.daemon.settings import load_settings
from nymph.daemon.tracker import pod_node
from nymph.daemon.workdirs import WorkdirError, Workdirs
from nymph.errors import ConfigError, ValidationError
from nymph.kube import errors as ke

IID = "lakeshore-0123abcd"


# --- outbox ----------------------------------------------------------------------------------


async def test_outbox_sends_in_order_and_retries_until_the_queue_answers(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    sent: list[tuple[str, list[Any]]] = []
    fail = {"n": 3}

    async def send(kind: str, batch: list[dict[str, Any]]) -> None:
        if fail["n"] > 0:
            fail["n"] -= 1
            raise ConnectionError("queue down")
        sent.append((kind, [b.get("seq") or b.get("taskId") for b in batch]))

    for i in range(5):
        box.report(instance_id=IID, state="running" if i % 2 else "starting")
    box.complete(task_id="t1", ok=True)
    box.report(instance_id=IID, state="stopped", reason="Completed")
    task = asyncio.create_task(box.run(send))
    assert await box.flush(timeout=20)
    task.cancel()
    # The completion and the report after it go in one batch (the sender sends the completion
    # first); the reports before it on its instance, not.
    assert sent == [("report", [1, 2, 3, 4, 5]), ("complete", ["t1", 6])]
    assert box.pending == 0


async def test_a_flush_does_not_wait_out_a_long_backoff_once_the_queue_is_back(tmp_path: Path) -> None:
    """A daemon that stops flushes its outbox for a few seconds: a send waiting out a backoff of
    many seconds (the queue was down, and is back) tries again at once."""
    box = Outbox(tmp_path)
    tries: list[float] = []
    down = {"n": 6}  # backoffs 0.5, 1, 2, 4, 8, 15 s: the sixth failure waits 15 s or more

    async def send(kind: str, batch: list[dict[str, Any]]) -> None:
        tries.append(asyncio.get_running_loop().time())
        if down["n"] > 0:
            down["n"] -= 1
            if down["n"] == 0:
                back.set()
            raise ConnectionError("queue down")

    back = asyncio.Event()
    box.report(instance_id=IID, state="stopped", reason="Completed")
    runner = asyncio.create_task(box.run(send))
    try:
        # the first five failures are hurried on by short flushes (their backoffs add up to 15-23 s)
        while down["n"] > 1:
            await box.flush(timeout=0.01)  # each try is hurried on; the queue is still down
            await asyncio.sleep(0.01)
        await back.wait()  # the sixth failure: now its backoff is 15 s or more
        assert await box.flush(timeout=5), "the queue was back: the flush sent it"
    finally:
        runner.cancel()
    assert box.pending == 0 and len(tries) == 7


async def test_outbox_survives_a_restart_without_resending_acknowledged_items(tmp_path: Path) -> None:
    first = Outbox(tmp_path)
    got: list[int] = []

    async def send_one_batch(kind: str, batch: list[dict[str, Any]]) -> None:
        got.extend(b["seq"] for b in batch)

    first.batch_max = 2
    for _ in range(5):
        first.report(instance_id=IID, state="running")
    # Send exactly one batch, then "crash".
    kind, batch = first._next_batch()
    await send_one_batch(kind, batch)
    for _ in batch:
        first.mem.popleft()
    first._ack(batch)
    second = Outbox(tmp_path)
    assert [i["seq"] for i in second.mem] == [3, 4, 5]
    assert {i["stream"] for i in second.mem} == {first.stream}


async def test_outbox_sends_reports_past_a_log_chunk_and_loses_nothing_on_a_restart(tmp_path: Path) -> None:
    """The reports behind a log chunk go out in one send with those before it, the chunk next
    on its own; until the chunk is sent the acknowledgement stays below it, so an outbox
    reopened in between sends the chunk again (and the report after it, which the queue
    ignores by its seq): nothing is lost."""
    box = Outbox(tmp_path)
    box.report(instance_id=IID, state="starting")
    box.log_chunk(instance_id=IID, offset=0, data=b"hello", final=False)
    box.report(instance_id=IID, state="running")
    kind, batch = box._next_batch()
    assert kind == "report" and [b["seq"] for b in batch] == [1, 2]
    box._taken(batch)
    box._ack(batch)
    assert [b["kind"] for b in box.mem] == ["logchunk"]
    reopened = Outbox(tmp_path)
    assert [(b["kind"], b.get("seq")) for b in reopened.mem] == [("logchunk", None), ("report", 2)]

    sent: list[tuple[str, list[Any]]] = []

    async def send(kind: str, batch: list[dict[str, Any]]) -> None:
        sent.append((kind, [b.get("seq", b.get("offset")) for b in batch]))

    task = asyncio.create_task(box.run(send))
    assert await box.flush(timeout=20)
    task.cancel()
    assert sent == [("logchunk", [0])]
    assert box.pending == 0 and Outbox(tmp_path).pending == 0


async def test_a_lingering_outbox_sends_what_arrives_meanwhile_with_the_first_item(tmp_path: Path) -> None:
    """With a linger, a send waits that long for more items: reports made while it waits go
    in the same send as the first."""
    box = Outbox(tmp_path, linger=0.2)
    sent: list[list[int]] = []

    async def send(kind: str, batch: list[dict[str, Any]]) -> None:
        sent.append([b["seq"] for b in batch])

    box.report(instance_id=IID, state="starting")
    task = asyncio.create_task(box.run(send))
    await asyncio.sleep(0.02)
    for _ in range(4):
        box.report(instance_id=IID, state="running")
    assert await box.flush(timeout=20)
    task.cancel()
    assert sent == [[1, 2, 3, 4, 5]]


def test_outbox_linger_is_checked(tmp_path: Path) -> None:
    """A linger outside 0-5 s is refused with the range to use."""
    cfg = tmp_path / "d.yaml"
    cfg.write_text("outbox_linger: 30\nkube: {namespaces: [a]}\n")
    with pytest.raises(ConfigError, match="0 to 5 seconds"):
        load_settings(config_file=str(cfg), environ={"NYMPH_TOKEN": "tok"})
    cfg.write_text("outbox_linger: 0.5\nkube: {namespaces: [a]}\n")
    assert load_settings(config_file=str(cfg), environ={"NYMPH_TOKEN": "tok"}).outbox_linger == 0.5


async def test_outbox_memory_is_bounded_and_overflow_comes_back_from_disk_in_order(tmp_path: Path) -> None:
    box = Outbox(tmp_path, memory_max=3, batch_max=2)
    for _ in range(10):
        box.report(instance_id=IID, state="running")
    assert len(box.mem) == 3 and box.backlog == 7
    seen: list[int] = []

    async def send(kind: str, batch: list[dict[str, Any]]) -> None:
        seen.extend(b["seq"] for b in batch)

    task = asyncio.create_task(box.run(send))
    assert await box.flush(timeout=10)
    task.cancel()
    assert seen == list(range(1, 11))


async def test_a_report_batch_stays_under_the_queues_body_limit(tmp_path: Path) -> None:
    """200 reports with the longest message and termination message are about 1.3 MB: sent as
    one batch the queue would refuse it as too large (413), and a refused batch is dropped."""
    limit = 1024 * 1024
    box = Outbox(tmp_path)
    for _ in range(200):
        box.report(
            instance_id=IID,
            state="stopped",
            reason="Error",
            message="m" * 5000,
            termination=(1, "Error", "t" * 5000),
        )
    bodies: list[int] = []
    seen: list[int] = []

    async def send(kind: str, batch: list[dict[str, Any]]) -> None:
        reports = [
            {k: v for k, v in b.items() if not k.startswith("_") and k not in ("kind", "stream")}
            for b in batch
        ]
        body = len(json.dumps({"daemonId": "d", "stream": batch[0]["stream"], "reports": reports}))
        if body > limit:
            raise DropItem("413: request body too large")
        bodies.append(body)
        seen.extend(b["seq"] for b in batch)

    task = asyncio.create_task(box.run(send))
    assert await box.flush(timeout=20)
    task.cancel()
    assert seen == list(range(1, 201))  # nothing dropped, in order
    assert len(bodies) >= 3 and max(bodies) <= box.batch_bytes + 16 * 1024
    # A restarted daemon reads the sizes back from the file and batches the same way.
    again = Outbox(tmp_path / "again")
    for _ in range(120):
        again.report(instance_id=IID, state="running", message="m" * 5000, termination=(0, "", "t" * 5000))
    reread = Outbox(tmp_path / "again")
    kind, batch = reread._next_batch()
    assert kind == "report" and 1 < len(batch) < 120
    assert sum(len(json.dumps(b)) for b in batch) <= reread.batch_bytes + 16 * 1024


async def test_outbox_drops_items_the_queue_refuses_for_good(tmp_path: Path) -> None:
    box = Outbox(tmp_path, batch_max=1)  # one item per send: the refused one alone is dropped
    box.complete(task_id="lost-lease", ok=True)
    box.complete(task_id="fine", ok=True)
    done: list[str] = []

    async def send(kind: str, batch: list[dict[str, Any]]) -> None:
        if batch[0]["taskId"] == "lost-lease":
            raise DropItem("409")
        done.append(batch[0]["taskId"])

    task = asyncio.create_task(box.run(send))
    assert await box.flush(timeout=10)
    task.cancel()
    assert done == ["fine"]


# --- audit -----------------------------------------------------------------------------------


def test_audit_chain_and_head(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    for i in range(4):
        log.append("apply", instance=IID, task=f"t{i}", manifest_sha256="a" * 64, result="ok")
    assert verify(tmp_path / "audit.jsonl").ok
    again = AuditLog(tmp_path / "audit.jsonl")  # reopening continues the chain
    again.append("reap", instance=IID, result="reaped")
    res = verify(tmp_path / "audit.jsonl")
    assert res.ok and res.records == 5
    with pytest.raises(Exception, match="unknown audit action"):
        log.append("rm -rf", instance=IID)


def test_audit_never_stores_registered_secrets(tmp_path: Path) -> None:
    from nymph.logsetup import forget_secret, register_secret

    register_secret("super-secret-token-value")
    try:
        rec = AuditLog(tmp_path / "a.jsonl").append("apply", error="denied for super-secret-token-value")
    finally:
        forget_secret("super-secret-token-value")
    assert "super-secret" not in json.dumps(rec)
    assert verify(tmp_path / "a.jsonl").ok


# --- workdirs --------------------------------------------------------------------------------


def test_workdirs_created_with_mode_and_removed(tmp_path: Path) -> None:
    w = Workdirs(root=tmp_path, mode=0o770)
    p = w.create(IID)
    assert p == tmp_path / "work" / IID and p.is_dir()
    assert oct(p.stat().st_mode & 0o777) == "0o770"
    assert w.create(IID) == p  # idempotent for a redelivered launch
    assert w.remove(IID) and not p.exists()
    assert not w.remove(IID)


@pytest.mark.parametrize("bad", ["../etc", "lakeshore-../../x", "/abs", "lakeshore-0123abcg"])
def test_workdirs_refuse_unchecked_ids(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ValidationError):
        Workdirs(root=tmp_path).create(bad)


def test_workdirs_refuse_a_symlink_escaping_the_root(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    w = Workdirs(root=tmp_path / "root")
    w.base.mkdir(parents=True)
    os.symlink(outside, w.base / IID)
    with pytest.raises(WorkdirError, match="outside"):
        w.create(IID)
    assert w.remove(IID)  # removes the link, never the target
    assert outside.exists()


# --- settings --------------------------------------------------------------------------------


def test_settings_precedence_file_env_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "d.yaml"
    cfg.write_text("concurrency: 3\nqueue: {url: http://file:1, poll_wait: 7}\nkube: {namespaces: [a, b]}\n")
    s = load_settings(
        config_file=str(cfg), environ={"NYMPH_TOKEN": "tok", "NODE_NAME": "n1", "NYMPH_URL": "http://env:2"}
    )
    assert (s.concurrency, s.queue.url, s.queue.poll_wait, s.kube.namespaces, s.node) == (
        3,
        "http://env:2",
        7.0,
        ("a", "b"),
        "n1",
    )
    s = load_settings(
        config_file=str(cfg),
        environ={"NYMPH_TOKEN": "tok"},
        queue="http://flag:3",
        concurrency=5,
        namespaces=["c"],
    )
    assert (s.queue.url, s.concurrency, s.kube.namespaces) == ("http://flag:3", 5, ("c",))
    assert "tok" not in repr(s)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({}, 128),  # kubectl (the default): two runs of --batch-max 64
        ({"batch_max": 4}, 8),
        ({"batch_max": 1}, 8),
        ({"batch_max": 20}, 40),
        ({"apply_with": "api"}, 8),
        ({"apply_with": "api", "batch_max": 4}, 8),
        ({"concurrency": 3}, 3),
        ({"concurrency": 0, "apply_with": "api"}, 8),
    ],
)
def test_concurrency_defaults_to_what_the_apply_path_needs(flags: dict[str, Any], expected: int) -> None:
    s = load_settings(config_file=None, environ={"NYMPH_TOKEN": "t", "NYMPH_NAMESPACES": "a"}, **flags)
    assert s.concurrency == expected == s.in_flight


@pytest.mark.parametrize(
    ("env", "flags", "message"),
    [
        ({}, {}, "no queue token"),
        ({"NYMPH_TOKEN": "t"}, {"apply_with": "helm"}, "use kubectl or api"),
        ({"NYMPH_TOKEN": "t"}, {"concurrency": -1}, "at least 1"),
        ({"NYMPH_TOKEN": "t"}, {"workdir_root": "rel/path"}, "absolute"),
    ],
)
def test_settings_errors(env: dict[str, str], flags: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(config_file=None, environ=env, **flags)


def test_settings_file_unknown_key(tmp_path: Path) -> None:
    cfg = tmp_path / "d.yaml"
    cfg.write_text("queue: {urll: x}\n")
    with pytest.raises(ConfigError, match="unknown setting 'urll'"):
        load_settings(config_file=str(cfg), environ={"NYMPH_TOKEN": "t"})


# --- classification and node ownership ------------------------------------------------------


@pytest.mark.parametrize(
    ("stderr", "cls", "transient"),
    [
        ('Error from server (Forbidden): pods "x" is forbidden: User "u" cannot create', ke.Forbidden, False),
        ('The Pod "x" is invalid: spec.containers[0].image: Required value', ke.Invalid, False),
        ('Error from server (AlreadyExists): pods "x" already exists', ke.AlreadyExists, False),
        ("Error from server (Conflict): Operation cannot be fulfilled", ke.Conflict, True),
        (
            'error: Apply failed with 1 conflict: conflict with "Python-urllib" using v1: .spec.restartPolicy',
            ke.FieldConflict,
            False,
        ),
        (
            "Error from server (TooManyRequests): the server has received too many requests",
            ke.Throttled,
            True,
        ),
        (
            "The connection to the server 127.0.0.1:6443 was refused - did you specify the right host or port?",
            ke.Unavailable,
            True,
        ),
        ("Unable to connect to the server: dial tcp: i/o timeout", ke.Unavailable, True),
        ("error: You must be logged in to the server (Unauthorized)", ke.Unauthorized, False),
    ],
)
def test_kubectl_errors_are_classified(stderr: str, cls: type[ke.KubeError], transient: bool) -> None:
    err = ke.classify_kubectl(stderr)
    assert type(err) is cls and err.transient is transient and err.message == stderr


@pytest.mark.parametrize(
    ("status", "cls"),
    [(403, ke.Forbidden), (404, ke.NotFound), (422, ke.Invalid), (429, ke.Throttled), (503, ke.Unavailable)],
)
def test_api_status_classification(status: int, cls: type[ke.KubeError]) -> None:
    assert type(ke.from_status(status, "m")) is cls


def test_a_field_managers_conflict_is_not_worth_a_retry_but_a_version_conflict_is() -> None:
    owned = ke.from_status(409, 'Apply failed with 2 conflicts: conflicts with "kubectl": .spec')
    assert type(owned) is ke.FieldConflict and not owned.transient
    stale = ke.from_status(409, "Operation cannot be fulfilled on pods: the object has been modified")
    assert type(stale) is ke.Conflict and stale.transient


def test_pod_node_prefers_the_affinity_pin() -> None:
    from nymph.launch.config import Mode, Provider
    from nymph.launch.render import render_pod
    from nymph.launch.spec import build_launch_spec

    spec = build_launch_spec(
        provider=Provider(name="p"),
        mode=Mode(name="m", fields={"image": "x"}),
        body={"script": "1"},
        instance_id=IID,
    )
    pod: dict[str, Any] = dict(render_pod(spec, node="node-a"))
    assert pod_node(pod) == "node-a"
    assert pod_node({"spec": {"nodeName": "node-b"}}) == "node-b"
    assert pod_node({"spec": {}}) is None


async def test_outbox_drops_a_torn_tail_and_keeps_every_whole_item(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    for _ in range(3):
        box.report(instance_id=IID, state="running")
    with (tmp_path / "outbox.jsonl").open("a") as fh:
        fh.write('{"kind":"report","stream":"x","se')  # a crash mid-write
    again = Outbox(tmp_path)
    assert [i["seq"] for i in again.mem] == [1, 2, 3]
    again.report(instance_id=IID, state="stopped")  # lands on a whole line of its own
    third = Outbox(tmp_path)
    assert [i.get("state") for i in third.mem] == ["running", "running", "running", "stopped"]


async def test_outbox_keeps_going_after_a_failed_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = Outbox(tmp_path)
    box.report(instance_id=IID, state="starting")
    real_write = os.write
    calls = {"n": 0}

    def flaky(fd: int, data: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            real_write(fd, bytes(data)[:7])  # a torn line first
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", flaky)
    with pytest.raises(OSError):
        box.report(instance_id=IID, state="running")
    box.report(instance_id=IID, state="stopped")
    monkeypatch.setattr(os, "write", real_write)
    sent: list[str] = []

    async def send(kind: str, batch: list[dict[str, Any]]) -> None:
        sent.extend(b["state"] for b in batch)

    task = asyncio.create_task(box.run(send))
    assert await box.flush(timeout=10)
    task.cancel()
    assert sent == ["starting", "stopped"]
    reloaded = Outbox(tmp_path)
    assert reloaded.pending == 0


def test_audit_refuses_to_continue_a_chain_cut_short(tmp_path: Path) -> None:
    from nymph.daemon.audit import AuditError

    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    for i in range(3):
        log.append("apply", task=f"t{i}", result="ok")
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:2]) + "\n")  # the last record dropped
    with pytest.raises(AuditError, match="records are missing"):
        AuditLog(path)
    assert not verify(path).ok


async def test_outbox_items_are_fsynced_once_per_batch_before_they_are_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nymph.daemon.durable import Appender

    events: list[str] = []
    monkeypatch.setattr(Appender, "fsync", lambda self: events.append(f"fsync {self.path.name}"))
    box = Outbox(tmp_path)
    for state in ("starting", "running", "stopped"):
        box.report(instance_id=IID, state=state)
    assert events == []  # written, not yet fsynced: appends cost no fsync each
    assert [json.loads(x)["state"] for x in (tmp_path / "outbox.jsonl").read_text().splitlines()] == [
        "starting",
        "running",
        "stopped",
    ]

    async def send(kind: str, batch: list[dict[str, Any]]) -> None:
        events.append(f"send {len(batch)}")

    task = asyncio.create_task(box.run(send))
    assert await box.flush(timeout=10)
    task.cancel()
    assert events == ["fsync outbox.jsonl", "send 3"]
