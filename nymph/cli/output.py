"""``-o/--output {table,json,yaml}`` of the list and show verbs: the table a person reads (the
default), or the API's own objects for a script (a list as an array of its items, a show as the
object), JSON with a trailing newline or YAML through ``yaml.safe_dump``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

FORMATS = ("table", "json", "yaml")


def add_output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default="table",
        help="table (the default, for reading), json or yaml (the API's objects, for a script; "
        "e.g. -o json | jq)",
    )


def render(data: Any, fmt: str) -> str:
    """``data`` as ``fmt`` (``json`` or ``yaml``), ending with a newline (pure)."""
    if fmt == "json":
        return json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    if fmt == "yaml":
        import yaml

        text: str = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
        return text
    raise ValueError(f"no such output format: {fmt!r}")


def emit(args: argparse.Namespace, data: Any) -> bool:
    """Print ``data`` and return True when ``-o`` asks for json or yaml; False for the table
    (the caller prints it)."""
    fmt = getattr(args, "output", "table") or "table"
    if fmt == "table":
        return False
    sys.stdout.write(render(data, fmt))
    sys.stdout.flush()
    return True
