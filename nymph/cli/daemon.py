"""``nymph daemon`` and ``nymph audit verify``: the daemon's command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from nymph import eventloop  # imports asyncio only when a loop is made


def cmd_daemon(args: argparse.Namespace) -> int:
    # Loaded only when the daemon runs: its Kubernetes client would add a second or more to the
    # start-up of every other command (there is no import cycle to avoid here).
    from nymph.daemon.daemon import run_locked
    from nymph.daemon.footprint import tune_process
    from nymph.daemon.settings import load_settings

    settings = load_settings(
        config_file=args.config,
        queue=args.queue,
        token=args.token,
        node=args.node,
        namespaces=args.namespace,
        workdir_root=args.workdir_root,
        kubeconfig=args.kubeconfig,
        context=args.context,
        concurrency=args.concurrency,
        apply_with=args.apply_with,
        listen=args.listen,
        poll_wait=args.poll_wait,
        lease_seconds=args.lease_seconds,
        reap_after=args.reap_after,
        shutdown_grace_seconds=args.grace,
        batch_max=args.batch_max,
    )

    async def main() -> int:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            if not stopping.is_set():
                stopping.set()
                return
            # A second one: stop now. What was made durable stays (the outbox and the audit log
            # are on disk; the next start sends what is unsent, and its registration hands the
            # leases of this session back).
            sys.stderr.write(
                f"nymph daemon: second {sig.name}: exiting now, without finishing in-flight work\n"
            )
            sys.stderr.flush()
            os._exit(128 + sig.value)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        return await run_locked(settings, stopping=stopping)

    tune_process()  # before the loop and its threads exist
    return eventloop.run(main())


#: The audit log's name under the daemon's root (``--workdir-root``), as the daemon writes it.
AUDIT_LOG = "audit.jsonl"


def _head_problem(log: Path) -> str:
    """Why the end of ``log`` cannot be checked ('' when its ``.head`` file can be read)."""
    head = log.with_name(log.name + ".head")
    try:
        data = json.loads(head.read_text(encoding="utf-8"))
        int(data["seq"]), str(data["hash"])
    except FileNotFoundError:
        return f"no {head.name} beside it"
    except (OSError, ValueError, KeyError, TypeError):
        return f"{head.name} cannot be read"
    return ""


def cmd_audit_verify(args: argparse.Namespace) -> int:
    from nymph.daemon.audit import verify

    log = Path(args.file).expanduser()
    if log.is_dir():
        if not (log / AUDIT_LOG).is_file():
            print(
                f"FAILED: {log} is a directory without {AUDIT_LOG}: give the audit log, or the "
                f"daemon's root directory (its --workdir-root), which holds {AUDIT_LOG}",
                file=sys.stderr,
            )
            return 1
        log = log / AUDIT_LOG
    result = verify(log)
    if result.ok:
        unchecked = _head_problem(log)
        if unchecked:
            print(f"ok: {result.records} records, chain intact; its end is unchecked ({unchecked})")
            print(
                "note: records removed from the end of the log would not show; copy the .head "
                "file with the log to check its end"
            )
        else:
            print(f"ok: {result.records} records, chain intact")
        for note in result.notes:
            print(f"note: {note} (repaired, and audited, at the daemon's next start)")
        return 0
    where = f" (line {result.line})" if result.line else ""
    print(f"FAILED{where}: {result.problem}", file=sys.stderr)
    return 1


def register(sub: Any) -> None:
    p = sub.add_parser(
        "daemon",
        help="run the per-node daemon: claim launches, apply Pods, watch, report, reap",
        description=(
            "Run the nymph daemon. It long-polls the queue for tasks, renders each launch into a Pod "
            "pinned to this node with a hostPath workdir, applies it with kubectl (server-side apply), "
            "watches its Pods and reports their state back. Settings come from --config FILE, then "
            "the environment (NYMPH_URL, NYMPH_TOKEN, NODE_NAME, NYMPH_NAMESPACES, NYMPH_WORKDIR_ROOT), "
            "then these flags. " + eventloop.HELP
        ),
    )
    p.add_argument(
        "--queue", metavar="URL", help="queue service URL (env NYMPH_URL; default http://127.0.0.1:8700)"
    )
    p.add_argument(
        "--token", help="daemon token (env NYMPH_TOKEN; create with 'nymph queue token create --role daemon')"
    )
    p.add_argument(
        "--node", help="this node's name (env NODE_NAME, from the downward API); Pods are pinned to it"
    )
    p.add_argument(
        "--namespace", action="append", default=[], help="namespace to serve (repeatable; default: default)"
    )
    p.add_argument(
        "--workdir-root",
        help="root of workdirs <root>/work/<instanceId>, the audit log and state (default /var/lib/nymph)",
    )
    p.add_argument(
        "--kubeconfig",
        help="kubeconfig (default: in-cluster ServiceAccount, then KUBECONFIG, then ~/.kube/config)",
    )
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument(
        "--concurrency",
        type=int,
        help="most tasks in flight at once (default: 8 with --apply-with api; with kubectl, two runs of "
        "--batch-max and at least 8, so 128: a kubectl run costs little more for 64 Pods than for one)",
    )
    p.add_argument(
        "--batch-max",
        type=int,
        help="most launches per kubectl invocation (default 64; 1 disables batching); "
        "a batch is what is ready: at low load a launch starts at once",
    )
    p.add_argument("--apply-with", choices=("kubectl", "api"), help="apply path (default kubectl)")
    p.add_argument("--listen", help="health/metrics server HOST:PORT (default 127.0.0.1:9700)")
    p.add_argument(
        "--poll-wait",
        type=float,
        help="long-poll hold in seconds (default 50; work that comes answers it at once)",
    )
    p.add_argument(
        "--lease-seconds", type=int, help="task lease length (default 60); renewed every third of it"
    )
    p.add_argument(
        "--reap-after",
        type=float,
        help="seconds after a Pod ends before it and its workdir are removed (default 600)",
    )
    p.add_argument("--grace", type=float, help="seconds to finish in-flight applies on SIGTERM (default 20)")
    p.add_argument("--config", help="YAML file with daemon settings")
    p.set_defaults(func=cmd_daemon)

    a = sub.add_parser("audit", help="check the daemon's audit log")
    asub = a.add_subparsers(dest="audit_command", metavar="COMMAND")
    v = asub.add_parser(
        "verify",
        help="verify the hash chain of an audit log",
        description="Exit 0 if the chain is intact; otherwise exit 1 naming the first bad record. "
        "The end of the log is checked against its .head file; without one, the output says the "
        "end is unchecked.",
    )
    v.add_argument(
        "file",
        metavar="PATH",
        help=f"the audit log (e.g. /var/lib/nymph/{AUDIT_LOG}, with its .head file beside it), or the "
        f"daemon's root directory holding {AUDIT_LOG}",
    )
    v.set_defaults(func=cmd_audit_verify)
