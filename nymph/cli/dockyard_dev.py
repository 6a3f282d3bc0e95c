"""``nymph dockyard dev connect|stop|setup-secrets`` and ``nymph dockyard cluster dashboard``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nymph.dockyard.errors import DockyardLiveError
from nymph.dockyard.render import devpod

if TYPE_CHECKING:
    from nymph.dockyard.live.kubectl import Kube
from nymph.launch.names import parse_labels


def register(
    verbs: Any,
    cluster_verbs: Any,
    *,
    kube: Callable[[argparse.Namespace], Kube],
    namespace: Callable[[argparse.Namespace], str],
    user: Callable[[], str],
    parser_class: type[argparse.ArgumentParser],
    go: Callable[[Any], int],
    kube_args: Callable[[argparse.ArgumentParser], None],
) -> None:
    def cmd_connect(args: argparse.Namespace) -> int:
        from nymph.dockyard.live import dev
        from nymph.dockyard.live.kubectl import say

        k = kube(args)
        opts = dev.DevOptions(
            user=user(),
            namespace=namespace(args),
            image=args.image,
            pvc=args.pvc,
            labels=parse_labels(args.label, flag="--label", error=DockyardLiveError),
            timeout=args.timeout,
            poll=args.poll,
            shell=args.shell,
        )
        name = asyncio.run(dev.ensure_dev_pod(k, opts, say=say))
        say(f"connecting to {name} (exit the shell to leave; the pod keeps running)")
        code = dev.interactive_shell(k, namespace=opts.namespace, pod=name, shell=opts.shell)
        if code != 0:
            raise DockyardLiveError(
                f"the shell in dev pod {name} ended with exit {code} (kubectl exec -it -n {opts.namespace} "
                f"{name} -- {opts.shell})"
            )
        say(f"dev pod {name} is still running: stop it with 'nymph dockyard dev stop'")
        return 0

    def cmd_stop(args: argparse.Namespace) -> int:
        from nymph.dockyard.live import dev
        from nymph.dockyard.live.kubectl import say

        return go(dev.dev_stop(kube(args), user=user(), namespace=namespace(args), say=say))

    def cmd_secrets(args: argparse.Namespace) -> int:
        from nymph.dockyard.live import dev
        from nymph.dockyard.live.kubectl import say

        data = dev.secret_data(
            list(args.pairs),
            ssh_key=Path(args.ssh_key) if args.ssh_key else None,
            rclone=args.add_rclone,
            home=Path.home(),
        )
        return go(
            dev.setup_secrets(
                kube(args),
                user=user(),
                namespace=namespace(args),
                data=data,
                ssh_key=args.ssh_key is not None,
                say=say,
            )
        )

    def cmd_dashboard(args: argparse.Namespace) -> int:
        from nymph.dockyard.live import dev
        from nymph.dockyard.live.kubectl import say

        return go(
            dev.dashboard_forward(
                kube(args),
                namespace=namespace(args),
                cluster=args.name,
                port=args.port,
                open_browser=args.open,
                timeout=args.timeout,
                say=say,
            )
        )

    d = verbs.add_parser("dev", help="your CPU dev pod on the workspace PVC: connect, stop, setup-secrets")
    dverbs = d.add_subparsers(dest="dev_command", metavar="VERB", parser_class=parser_class)
    d.set_defaults(func=lambda _a: (d.print_help(sys.stderr), 2)[1])
    c = dverbs.add_parser(
        "connect",
        help="create (if needed) your dev pod <user>-dev-pod, wait for it, open a shell in it",
        description="Create your dev pod <user>-dev-pod (CPU only, the workspace PVC at "
        "/mnt/dockyard, your <user>-secrets as environment) unless it exists, wait until it is "
        "Running, then open an interactive shell in it (kubectl exec -it). Warns when the pod "
        "runs another image than --image.",
    )
    c.add_argument("--image", default=devpod.DEFAULT_IMAGE, help=f"image (default {devpod.DEFAULT_IMAGE})")
    c.add_argument(
        "--pvc", default=devpod.WORKSPACE_PVC, help=f"workspace PVC (default {devpod.WORKSPACE_PVC})"
    )
    c.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="an extra pod label")
    c.add_argument("--shell", default="bash", help="the shell to run (default bash)")
    c.add_argument("--timeout", type=float, default=240.0, help="how long to wait for Running (default 240)")
    c.add_argument("--poll", type=float, default=2.0, help=argparse.SUPPRESS)
    c.set_defaults(func=cmd_connect)
    s = dverbs.add_parser("stop", help="delete your dev pod")
    s.set_defaults(func=cmd_stop)
    sec = dverbs.add_parser(
        "setup-secrets",
        help="create or update your <user>-secrets Secret (prints key names only)",
        description="Create your <user>-secrets Secret (the first time HF_TOKEN, WANDB_API_KEY and "
        "--ssh-key are required) or set keys of the existing one. Values go to the API server on "
        "kubectl's stdin and are never printed.",
    )
    sec.add_argument("pairs", nargs="*", metavar="NAME=VALUE")
    sec.add_argument("--ssh-key", metavar="FILE", help="an SSH private key (SSH_KEY_NAME, SSH_KEY_CONTENT)")
    sec.add_argument("--add-rclone", action="store_true", help="~/.config/rclone/rclone.conf as RCLONE_CONF")
    sec.set_defaults(func=cmd_secrets)
    for sub in (c, s, sec):
        kube_args(sub)
        sub.add_argument("-n", "--namespace", help="namespace (default: the kube context's, else default)")

    db = cluster_verbs.add_parser(
        "dashboard",
        help="port-forward a RayCluster's dashboard to localhost until Ctrl-C",
        description="Forward 127.0.0.1:PORT to the head's dashboard (8265) of RayCluster NAME and "
        "print the URL; Ctrl-C stops.",
    )
    db.add_argument("name", metavar="NAME", help="the RayCluster")
    db.add_argument("--port", type=int, default=8265, help="local port (default 8265)")
    db.add_argument("--open", action=argparse.BooleanOptionalAction, default=False, help="open a browser")
    db.add_argument("--timeout", type=float, default=60.0, help="how long to wait for the head (default 60)")
    kube_args(db)
    db.add_argument("-n", "--namespace", help="namespace (default: the kube context's, else default)")
    db.set_defaults(func=cmd_dashboard)
