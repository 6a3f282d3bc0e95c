"""``nymph render``: print the Pod a launch becomes, without touching a cluster."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from nymph.launch import names
from nymph.launch.dreamrc import load_dreamrc, parse_assignments
from nymph.launch.render import render_pod, to_json, to_yaml
from nymph.launch.script import read_script
from nymph.launch.spec import build_launch_spec


def cmd_render(args: argparse.Namespace) -> int:
    config = load_dreamrc(args.dreamrc)
    mode = config.mode(args.mode)
    provider = config.provider_for(mode, args.provider)
    tags = names.parse_labels(args.tag)
    env = parse_assignments(args.env, flag="--env")
    body: dict[str, Any] = {"script": read_script(args.script), "tags": tags}
    if env:
        body["env"] = env
    spec = build_launch_spec(
        provider=provider,
        mode=mode,
        body=body,
        instance_id=args.instance_id or names.new_instance_id(),
        owner_namespace=args.namespace,
    )
    for warning in spec.warnings:
        print(f"nymph: warning: {warning}", file=sys.stderr)
    pod = render_pod(spec, node=args.node, workdir_root=args.workdir_root)
    sys.stdout.write(to_json(pod) if args.output == "json" else to_yaml(pod))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "render",
        help="print the Pod manifest a launch renders to",
        description=(
            "Render a launch into its Pod manifest, exactly as the daemon would apply it. "
            "Nothing is sent anywhere. Example: nymph render --dreamrc .dreamrc --mode k8s-gpu "
            "--script train.py --tag team=ml | kubectl apply --dry-run=server -f -"
        ),
    )
    p.add_argument(
        "--dreamrc", default=".dreamrc", help="config file with providers: and modes: (default: ./.dreamrc)"
    )
    p.add_argument("--mode", required=True, help="mode name (the Pod shape)")
    p.add_argument("--script", required=True, help="Python file to run in the Pod ('-' for stdin)")
    p.add_argument("--provider", help="provider name (default: the mode's provider)")
    p.add_argument(
        "--tag", action="append", default=[], metavar="KEY=VALUE", help="extra Pod label (repeatable)"
    )
    p.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="extra env var (repeatable)"
    )
    p.add_argument("--instance-id", help="Pod name lakeshore-XXXXXXXX (default: a fresh one)")
    p.add_argument(
        "--namespace",
        default="default",
        help="control-plane namespace of the launch (label lakeshore.namespace)",
    )
    p.add_argument(
        "--node", help="pin the Pod to this node (required node affinity on kubernetes.io/hostname)"
    )
    p.add_argument("--workdir-root", help="mount <root>/work/<instanceId> from the node at /workdir")
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml", help="output format")
    p.set_defaults(func=cmd_render)
