"""How the user verbs show the queue's answers: tables, local times, probe checks, and following
an instance's state changes (library code: no argument parsing)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from nymph.cli.exitcodes import INTERRUPTED_EXIT as INTERRUPTED_EXIT
from nymph.cli.exitcodes import NEVER_RAN_EXIT as NEVER_RAN_EXIT
from nymph.cli.exitcodes import WAIT_TIMEOUT_EXIT as WAIT_TIMEOUT_EXIT
from nymph.launch.state import InstanceState, Reason

if TYPE_CHECKING:
    from nymph.client import UserClient


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def when(ts: str) -> str:
    try:
        return datetime.fromisoformat(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return ts


def print_instances(items: Sequence[dict[str, Any]]) -> None:
    if not items:
        print("no instances")
        return
    rows: list[tuple[Any, ...]] = [
        (
            i["instanceId"],
            i["state"],
            i["reason"] or "",
            i["node"] or "",
            when(i["launchedAt"]),
            f"waiting: {i['waiting']}" if i.get("waiting") else i["message"],
        )
        for i in items
    ]
    header: tuple[str, ...] = ("INSTANCE", "STATE", "REASON", "NODE", "LAUNCHED", "MESSAGE")
    if any("attempt" in i for i in items):  # launches with a retry policy: which attempt each is
        header = (*header[:2], "ATTEMPT", *header[2:])
        rows = [(r[0], r[1], str(i.get("attempt", 1)), *r[2:]) for r, i in zip(rows, items, strict=True)]
    print(table(header, rows))


def history_line(entry: Mapping[str, Any]) -> str:
    """One entry of an instance's history, as ``launch --wait`` prints it: its local time, the
    state, the reason in parentheses and the message after a colon."""
    reason = f" ({entry['reason']})" if entry.get("reason") else ""
    message = f": {entry['message']}" if entry.get("message") else ""
    return f"{when(entry['at'])}  {entry['state']}{reason}{message}"


#: The fields ``instance show`` prints after its state, reason, message and node when the
#: instance has them: (label, key).
_SHOWN = (
    ("launched", "launchedAt"),
    ("updated", "updatedAt"),
    ("waiting", "waiting"),
    ("exit code", "exitCode"),
    ("termination reason", "terminationReason"),
    ("termination message", "terminationMessage"),
    ("results error", "resultsError"),
    ("group", "groupId"),
    ("group index", "groupIndex"),
    ("attempt", "attempt"),
    ("retry of", "retryOf"),
    ("retried as", "retriedAs"),
)


def print_instance(inst: Mapping[str, Any]) -> None:
    """``nymph instance show``: one field a line, then the history one entry a line."""
    rows: list[tuple[str, object]] = [
        ("instance", inst["instanceId"]),
        ("provider", inst.get("providerName", "")),
        ("state", inst["state"]),
        ("reason", inst.get("reason") or "-"),
        ("message", inst.get("message") or "-"),
        ("node", inst.get("node") or "-"),
    ]
    for label, key in _SHOWN:
        value = inst.get(key)
        if value is None or value == "":
            continue
        rows.append((label, when(value) if key in ("launchedAt", "updatedAt") else value))
    width = max(len(label) for label, _ in rows) + 1
    for label, value in rows:
        print(f"{label + ':':<{width}} {value}")
    history = inst.get("history") or []
    print("history:" if history else "history: -")
    for entry in history:
        print(f"  {history_line(entry)}")


#: Instance reasons (the taxonomy, and the kubelet's own words) that say a Pod cannot start.
_CANNOT_START = frozenset(
    {
        Reason.IMAGE_PULL.value,
        Reason.CREATE_CONTAINER.value,
        Reason.UNSCHEDULABLE.value,
        Reason.LAUNCH_FAILED.value,
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "RegistryUnavailable",
        "CreateContainerConfigError",
        "RunContainerError",
    }
)


def no_log_yet(inst: Mapping[str, Any]) -> str:
    """Why ``nymph logs`` of ``inst`` has nothing to print (pure): its Pod cannot start (and
    why), it never ran, or it has printed nothing yet."""
    iid, state = inst["instanceId"], inst.get("state")
    reason, message = inst.get("reason") or "", inst.get("message") or ""
    why = reason + (f": {message}" if message else "")
    waiting = state in (InstanceState.QUEUED.value, InstanceState.STARTING.value)
    if waiting and reason in _CANNOT_START:
        return f"no logs for {iid}: its Pod cannot start ({why}); fix that and launch again"
    if state == InstanceState.STOPPED.value:
        ran = any(h.get("state") == InstanceState.RUNNING.value for h in inst.get("history") or [])
        if not ran and reason != Reason.COMPLETED.value:
            return f"no logs for {iid}: it never ran ({why or 'stopped'})"
        return f"no logs for {iid}: the job printed nothing the queue has"
    if state == InstanceState.QUEUED.value:
        waits = f" (waiting: {inst['waiting']})" if inst.get("waiting") else ""
        return f"no logs for {iid} yet: it is still queued{waits} (use -f to wait for it)"
    return f"no logs for {iid} yet: the job has printed nothing the queue has (use -f to wait for it)"


def failed(reason: str | None) -> bool:
    if reason is None:
        return False
    try:
        return Reason(reason).failed
    except ValueError:
        return True


# NEVER_RAN_EXIT, WAIT_TIMEOUT_EXIT and INTERRUPTED_EXIT: nymph.cli.exitcodes (light, for the parsers).


def still_there(inst: Mapping[str, Any]) -> str:
    """What a user who stops waiting for a launch is told: it is still there, and how to stop it."""
    iid, state = inst["instanceId"], inst.get("state") or "unknown"
    if state == InstanceState.STOPPED.value:
        return f"{iid} has stopped ({inst.get('reason') or 'no reason given'})"
    reason = f" ({inst['reason']})" if inst.get("reason") else ""
    ns = inst.get("namespace")
    where = f" --namespace {ns}" if ns and ns != "default" else ""
    return (
        f"{iid} is still {state}{reason} and goes on without this command; "
        f"stop it with: nymph stop {inst.get('providerName') or '<provider>'} {iid}{where}"
    )


def exit_status(inst: Mapping[str, Any]) -> int:
    """The exit status of ``launch --wait`` for a stopped instance: the job's exit code when it
    ran and has one, 1 for a failure without one, :data:`NEVER_RAN_EXIT` when it never ran
    (each failure said on stderr)."""
    iid, reason = inst["instanceId"], inst.get("reason")
    ran = any(h["state"] == InstanceState.RUNNING.value for h in inst.get("history") or [])
    code = inst.get("exitCode")
    if not ran and code is None and reason != Reason.COMPLETED.value:
        message = f": {inst['message']}" if inst.get("message") else ""
        print(f"{iid} never ran: {reason or 'stopped'}{message}", file=sys.stderr)
        return NEVER_RAN_EXIT
    if failed(reason):
        print(f"{iid} failed: {reason}" + (f" (exit code {code})" if code else ""), file=sys.stderr)
    if isinstance(code, int) and code != 0:
        return code if 0 < code < 256 else 1
    return 1 if failed(reason) else 0


def print_checks(result: dict[str, Any] | None) -> bool:
    """Print a probe's checks; False if any failed."""
    all_ok = True
    checks = (result or {}).get("checks")
    if isinstance(checks, list):
        for check in checks:
            if not isinstance(check, dict):
                continue
            ok = bool(check.get("ok"))
            all_ok = all_ok and ok
            detail = check.get("detail") or ""
            print(
                f"  {'ok  ' if ok else 'FAIL'}  {check.get('name', '?')}" + (f": {detail}" if detail else "")
            )
    elif result:
        print(f"  result: {result}")
    if isinstance(result, dict) and result.get("ok") is False:
        all_ok = False
    return all_ok


async def follow(
    client: UserClient,
    *,
    provider: str,
    instance_id: str,
    poll_wait: float = 30.0,
    until_running: bool = False,
    job_exit: bool = False,
) -> int:
    """Print each state change as it happens until the instance stops (or, with
    ``until_running``, runs); 1 if it failed, or with ``job_exit`` :func:`exit_status`."""
    shown = 0
    version = -1
    said: str | None = None
    while True:
        inst = await client.get_instance(
            provider=provider, instance_id=instance_id, after=version, wait=poll_wait
        )
        version = inst["version"]
        for entry in inst["history"][shown:]:
            print(history_line(entry), file=sys.stderr, flush=True)
        shown = len(inst["history"])
        # Why it is still queued (its place, its quota, no node fits), when that changes; read
        # again at least every poll_wait seconds.
        standing = inst.get("waiting") if inst["state"] == InstanceState.QUEUED.value else None
        if standing and standing != said:
            print(f"           waiting: {standing}", file=sys.stderr, flush=True)
        said = standing
        if until_running and inst["state"] == InstanceState.RUNNING.value:
            return 0
        if inst["state"] == InstanceState.STOPPED.value:
            if job_exit:
                return exit_status(inst)
            if failed(inst["reason"]):
                print(f"{instance_id} failed: {inst['reason']}", file=sys.stderr)
                return 1
            return 0
