"""``--limit``, ``--all`` and ``--continue`` of the list verbs, and the hint on stderr that says
how to get the next page.

The queue answers lists a page at a time (at most 5000 items, 500 unless asked). ``nymph
instances`` shows the first page (500) and says when more follow; the other list verbs show
everything unless given ``--limit``. ``--limit N`` shows one page of N and, when more follow,
prints on stderr the command that shows the next one (the same, with ``--continue TOKEN``);
``--all`` follows every page.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from nymph.errors import NymphError

T = TypeVar("T")

MAX_LIMIT = 5_000
DEFAULT_LIMIT = 500
FOLLOW_LIMIT = MAX_LIMIT


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (1-{MAX_LIMIT})") from None
    if not 1 <= value <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"{value} is not between 1 and {MAX_LIMIT}")
    return value


def add_paging(parser: argparse.ArgumentParser, *, what: str, first_page: bool) -> None:
    """``--limit``, ``--all`` and ``--continue`` for a verb listing ``what`` (plural);
    ``first_page``: without them the verb shows the first page (else everything)."""
    default = (
        f"without --limit or --all: the first {DEFAULT_LIMIT} {what}, saying on stderr when more follow"
        if first_page
        else f"without --limit: every one of the {what}"
    )
    g = parser.add_argument_group("paging", f"The queue lists {what} a page at a time ({default}).")
    g.add_argument(
        "--limit",
        type=_limit,
        metavar="N",
        help=f"show one page of at most N {what} (1-{MAX_LIMIT}); when more follow, stderr says the "
        "command that shows the next page",
    )
    g.add_argument("--all", action="store_true", help=f"show every one of the {what}, following every page")
    g.add_argument(
        "--continue",
        dest="continue_",
        metavar="TOKEN",
        help="show the page after the one that printed TOKEN (copy the command stderr printed)",
    )


def next_command(command: Sequence[str], *, namespace: str, limit: int | None, token: str) -> str:
    """The command line that shows the next page (pure): ``nymph`` and ``command`` (the verb and
    its filters), the namespace unless the default, ``--limit`` when given and ``--continue
    TOKEN``. Never the token or URL flags: the hint is printed where others may read it."""
    words = ["nymph", *command]
    if namespace != "default":
        words += ["-n", namespace]
    if limit is not None:
        words += ["--limit", str(limit)]
    return shlex.join([*words, "--continue", token])


PageFn = Callable[[int | None, str | None], Awaitable[Any]]


async def fetch(
    args: argparse.Namespace,
    page: PageFn,
    *,
    what: str,
    first_page: bool,
    command: Sequence[str],
) -> list[Any]:
    """The items the paging flags ask for; ``page(limit, continue_)`` returns a
    :class:`nymph.client.Page`. When one page was shown and more follow, writes on stderr the
    command (``command``: the verb and its filters, as :func:`next_command` takes) that shows the
    next one."""
    limit: int | None = getattr(args, "limit", None)
    token: str | None = getattr(args, "continue_", None)
    if getattr(args, "all", False):
        if limit is not None:
            raise NymphError("--all shows every page; --limit shows one: give one of them")
        items: list[Any] = []
        while True:
            got = await page(FOLLOW_LIMIT, token)
            items.extend(got.items)
            if got.continue_ is None or got.continue_ == token:
                return items
            token = got.continue_
    if limit is None and token is None and not first_page:
        return await fetch(_with_all(args), page, what=what, first_page=first_page, command=command)
    got = await page(limit, token)
    if got.continue_ is not None:
        shown = limit or DEFAULT_LIMIT
        namespace = str(getattr(args, "namespace", "default") or "default")
        again = next_command(command, namespace=namespace, limit=limit, token=got.continue_)
        print(
            f"showing {len(got.items)} {what} (a page of at most {shown}); more follow. Next page:\n"
            f"  {again}\nor every one: the same command with --all instead of --limit/--continue",
            file=sys.stderr,
        )
    return list(got.items)


def _with_all(args: argparse.Namespace) -> argparse.Namespace:
    copy = argparse.Namespace(**vars(args))
    copy.all = True
    return copy
