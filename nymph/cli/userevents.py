"""``nymph events [PROVIDER]``: a namespace's instance changes, oldest first, one a line (or the
queue's event objects with ``-o json``), and with ``-f`` followed as they happen, resumed after
the last cursor when the connection drops. The parser is built without the client; the handler
imports it when it runs."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from nymph.cli.output import add_output

if TYPE_CHECKING:
    from nymph.client import UserClient
    from nymph.protocol import EventJSON

_DESCRIPTION = (
    "The namespace's instance changes (state, reason, exit code, attempt, group, node, the kind "
    "of a waiting reason), oldest first: one event a line with its cursor. --after CURSOR starts "
    "after an event (or the cursor this command prints on stderr at the end); without -f it "
    "shows at most --limit events. With -f it follows new events as they happen, resuming after "
    "the last one if the connection drops (a queue restart), until Ctrl-C. With -o json, the "
    "queue's event objects: an array, or with -f one object a line (JSON lines). Events older "
    "than the queue's --retention-days are gone (an older cursor is an error). Examples: nymph "
    "events my-cluster -f; nymph events --namespace team-a --instance lakeshore-1a2b3c4d -o json"
)
_COLUMNS = ("CURSOR", "AT", "INSTANCE", "STATE", "REASON", "EXIT", "NODE", "CHANGED")


def event_row(e: EventJSON) -> tuple[str, ...]:
    """An event as the table's cells (pure)."""
    reason = e["reason"] or ""
    if e["waitingKind"]:
        reason = f"{reason} waiting:{e['waitingKind']}".strip()
    return (
        e["cursor"],
        e["at"],
        e["instanceId"],
        e["state"],
        reason or "-",
        "-" if e["exitCode"] is None else str(e["exitCode"]),
        e["node"] or "-",
        ",".join(e["changes"]),
    )


def _line(cells: tuple[str, ...]) -> str:
    widths = (8, 20, 20, 9, 18, 5, 14)
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=False)) + "  " + cells[-1]


def cmd_events(args: argparse.Namespace) -> int:
    import json

    from nymph.cli.output import emit
    from nymph.cli.userverbs import _run
    from nymph.client.events import events_page, follow_events

    filters = {"provider": args.provider, "group": args.group, "instance": args.instance}

    async def body(client: UserClient) -> int:
        if not args.follow:
            items, cursor = await events_page(client, after=args.after, limit=args.limit, filters=filters)
            if not emit(args, items):
                print(_line(_COLUMNS).rstrip())
                for e in items:
                    print(_line(event_row(e)))
            print(f"read on with: --after {cursor}", file=sys.stderr)
            return 0
        as_json = args.output == "json"
        if not as_json:
            print(_line(_COLUMNS).rstrip(), flush=True)

        def show(e: EventJSON) -> None:
            text = json.dumps(e, separators=(",", ":")) if as_json else _line(event_row(e))
            print(text, flush=True)

        await follow_events(client, on_event=show, after=args.after, filters=filters)
        return 0

    try:
        return _run(args, body)
    except KeyboardInterrupt:
        return 130


def register(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "events",
        parents=[common],
        help="list or follow the namespace's instance changes",
        description=_DESCRIPTION,
    )
    p.add_argument(
        "provider", nargs="?", help="only this provider's instances (default: the whole namespace)"
    )
    p.add_argument("--group", help="only the instances of this launch group")
    p.add_argument("--instance", metavar="ID", help="only this instance")
    p.add_argument("--after", metavar="CURSOR", help="start after this event's cursor")
    p.add_argument("--limit", type=int, default=None, help="at most this many events (without -f; 1-5000)")
    p.add_argument("-f", "--follow", action="store_true", help="follow new events until Ctrl-C")
    add_output(p)
    p.set_defaults(func=cmd_events)
