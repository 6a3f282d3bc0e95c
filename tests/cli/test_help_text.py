"""Every command's ``--help`` is plain text: no reStructuredText markup from docstrings."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from nymph.cli import build_parser

MARKUP = re.compile(r"``|`[^`\s][^`]*`|\*\*|:(mod|class|func|meth|data):")


def _texts(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, str]]:
    yield path, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _texts(child, f"{path} {name}")


def test_no_help_text_shows_markup() -> None:
    found = [
        (path, m.group(0)) for path, text in _texts(build_parser(), "nymph") if (m := MARKUP.search(text))
    ]
    assert found == []


def test_dev_help_is_the_plain_description(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["dev", "--help"])
    out = capsys.readouterr().out
    assert "with a\nreal node (containerd + kubelet" in out and "--stay the queue and daemon" in out
