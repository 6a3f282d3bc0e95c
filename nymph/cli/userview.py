"""How the user verbs show the queue's answers: tables, local times, probe checks, and following
an instance's state changes (library code: no argument parsing)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

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
    rows = [
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
    print(table(("INSTANCE", "STATE", "REASON", "NODE", "LAUNCHED", "MESSAGE"), rows))


def failed(reason: str | None) -> bool:
    if reason is None:
        return False
    try:
        return Reason(reason).failed
    except ValueError:
        return True


#: ``nymph launch --wait`` exits with this when the job never ran (ImagePull, LaunchFailed,
#: Unschedulable, stopped before it started...): the job's own exit codes are the others.
NEVER_RAN_EXIT = 125


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
            reason = f" ({entry['reason']})" if entry["reason"] else ""
            message = f": {entry['message']}" if entry["message"] else ""
            print(f"{when(entry['at'])}  {entry['state']}{reason}{message}", file=sys.stderr, flush=True)
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
