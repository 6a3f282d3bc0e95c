"""``nymph results list|get PROVIDER ID``: the files a job wrote under ``/workdir/out/``,
uploaded by its daemon when it finished and kept with the log's retention."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nymph.cli.output import add_output
from nymph.errors import ConfigError

if TYPE_CHECKING:
    from nymph.client import UserClient

_HELP = (
    "Results are the regular files a job writes under /workdir/out/ (symlinks and anything "
    "resolving outside the workdir are refused), uploaded when it finishes, at most "
    "--results-cap (64MiB) per instance, kept --retention-days (7) after it stopped. They exist "
    "on the daemon path only: a dispatch: direct launch has no workdir."
)


def cmd_results_list(args: argparse.Namespace) -> int:
    from nymph.cli.output import emit
    from nymph.cli.userverbs import _run
    from nymph.cli.userview import table
    from nymph.client.results import list_results

    async def body(client: UserClient) -> int:
        got = await list_results(client, provider=args.provider, instance_id=args.instance_id)
        items = got.get("items") or []
        if emit(args, items):
            pass
        elif items:
            print(table(("PATH", "SIZE"), [(i["path"], i["size"]) for i in items]))
        else:
            print(f"no results for {args.instance_id}")
        if got.get("error"):
            print(f"not kept: {got['error']}", file=sys.stderr)
        return 0

    return _run(args, body)


def cmd_results_get(args: argparse.Namespace) -> int:
    from nymph.cli.userverbs import _run
    from nymph.client.results import download, list_results, target
    from nymph.launch.results import BadResultPath

    directory = Path(args.directory or args.instance_id).expanduser()

    async def body(client: UserClient) -> int:
        if args.path:
            paths = [args.path]
        else:
            got = await list_results(client, provider=args.provider, instance_id=args.instance_id)
            paths = [str(i["path"]) for i in got.get("items") or []]
            if not paths:
                print(f"no results for {args.instance_id}: nothing to download", file=sys.stderr)
                return 0  # empty is not an error
        try:
            existing = [dest for dest in (target(directory, path) for path in paths) if dest.exists()]
        except BadResultPath as exc:
            raise ConfigError(str(exc)) from None
        if existing and not args.force:
            names = ", ".join(str(dest) for dest in existing[:3]) + (" ..." if len(existing) > 3 else "")
            raise ConfigError(
                f"{len(existing)} file(s) already there, not replaced: {names} "
                "(--force replaces them, -d DIR writes elsewhere)"
            )
        for path in paths:
            try:
                dest = await download(
                    client,
                    provider=args.provider,
                    instance_id=args.instance_id,
                    path=path,
                    directory=directory,
                )
            except BadResultPath as exc:
                raise ConfigError(str(exc)) from None
            print(dest)
        return 0

    return _run(args, body)


class _NotADirectory(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *_: Any, **__: Any) -> None:
        parser.error(
            "-o/--output is the output format of the list and show verbs; results get writes "
            "files: give the directory with -d DIR (or --dir DIR)"
        )


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    results = sub.add_parser(
        "results", help="list and download an instance's result files", description=_HELP
    )
    rsub = results.add_subparsers(dest="results_command", metavar="COMMAND", required=True)
    p = rsub.add_parser("list", parents=[common], help="list an instance's result files", description=_HELP)
    p.add_argument("provider")
    p.add_argument("instance_id", metavar="ID")
    add_output(p)
    p.set_defaults(func=cmd_results_list)
    p = rsub.add_parser(
        "get",
        parents=[common],
        help="download result files (all, or PATH) under ./ID/ or -d DIR",
        description=_HELP + " Files go under ./ID/ unless -d DIR is given; a file already "
        "there is never replaced without --force (then nothing is downloaded).",
    )
    p.add_argument("provider")
    p.add_argument("instance_id", metavar="ID")
    p.add_argument(
        "path", nargs="?", metavar="PATH", help="one file (relative to /workdir/out/); default: all"
    )
    p.add_argument(
        "-d",
        "--dir",
        dest="directory",
        metavar="DIR",
        help="where to write them (default: ./ID/, the instance id)",
    )
    # -o/--output is the output format of the list and show verbs: here it is refused, saying
    # what to write instead, rather than taken for a directory.
    p.add_argument("-o", "--output", action=_NotADirectory, help=argparse.SUPPRESS)
    p.add_argument("--force", action="store_true", help="replace files that are already there")
    p.set_defaults(func=cmd_results_get)
