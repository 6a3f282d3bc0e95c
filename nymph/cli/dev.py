"""``nymph dev``: queue + daemon + a sample launch on this machine (the main demo)."""

from __future__ import annotations

import argparse
import os
from typing import Any

_DESCRIPTION = """\
The whole path on one machine, end to end.

Starts the queue service (SQLite under a local state dir) and a daemon; uses the current kube
context when one is reachable, and otherwise starts the embedded local control plane: with a
real node (containerd + kubelet: the sample really runs, in the local python image, and its
output is shown) when the machine allows it, else with kwok (Pods are simulated, and it says
so). Creates a provider and a mode, submits a sample launch, shows each state change as it
happens, lists instances and verifies the audit log. Exits 0 when every step passed. With
--stay the queue and daemon keep running for more launches until Ctrl-C.
"""


def cmd_dev(args: argparse.Namespace) -> int:
    # The queue, the daemon and the local cluster load only when the demo runs.
    from nymph.cli import devenv

    return devenv.run_dev(
        devenv.DevOptions(
            stay=args.stay,
            embedded=args.embedded,
            node=args.node,
            node_kind=args.node_kind,
            script=args.script,
            port=args.port,
            workdir_root=args.workdir_root,
            state_dir=args.state_dir,
        )
    )


def register(sub: Any) -> None:
    p = sub.add_parser(
        "dev",
        help="run queue + daemon + a sample launch on this machine (the main demo)",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--stay", action="store_true", help="keep the queue and daemon running for more launches until Ctrl-C"
    )
    p.add_argument(
        "--embedded",
        action="store_true",
        help="always use the embedded cluster, even if a kube context is reachable",
    )
    p.add_argument(
        "--node-kind",
        choices=("auto", "real", "kwok"),
        default=os.environ.get("NYMPH_NODE") or "auto",
        help="the embedded cluster's node: real (Pods run in containers; needs root, runc and the "
        "CNI plugins), kwok (Pods are simulated) or auto, real when possible "
        "(default: $NYMPH_NODE, else auto)",
    )
    p.add_argument("--node", help="node to pin Pods to on a real cluster (default: its first node)")
    p.add_argument("--script", help="Python file to launch instead of the built-in sample")
    p.add_argument("--port", type=int, help="queue port (default: a free one)")
    p.add_argument(
        "--workdir-root",
        help="workdir root, seen at the same path by this host and the node "
        "(default: the state dir on the embedded cluster, /tmp/nymph on a real one)",
    )
    p.add_argument(
        "--state-dir",
        help="where the queue db, logs, workdirs and audit log go (default: a fresh directory per "
        "run under the user state dir, dev/runs/, keeping the last 5; give one to keep a state "
        "across runs)",
    )
    p.set_defaults(func=cmd_dev)
