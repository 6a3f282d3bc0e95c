"""The manual (README.md and docs/*.md) points only at things that exist.

Every relative link names a file of the repository (and, for ``#anchor``, a heading of that
file); every ``make TARGET`` names a Makefile target; every ``nymph SUBCOMMAND ...`` named in a
code span or block walks the real argparse tree of ``nymph.cli`` (subcommands and ``--options``);
the CLI reference lists every subcommand; the performance page is exactly what the generator
makes of the committed ``bench-results.json``.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from benchmarks.scoreboard import page
from nymph.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.M)
_MAKE = re.compile(r"(?:^|[\s(;&|])make((?: +[A-Za-z0-9_.-]+(?:=\S*)?)+)")
_NYMPH = re.compile(r"(?:^|[\s(;&|$])(?:[\w.~-]*/)?nymph((?: +\S+)*)")
_STOP = {"|", "||", "&&", ";", ">", ">>", "<", "#"}


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def _code(text: str) -> list[str]:
    """The code of a page: each fenced block's lines (continuations joined), then each span."""
    out: list[str] = []
    for block in _FENCE.findall(text):
        body = block.split("\n", 1)[1].rsplit("```", 1)[0]
        out += [re.sub(r"(^|\s)#.*$", "", line) for line in body.replace("\\\n", " ").splitlines()]
    prose = _FENCE.sub("", text)
    out += [m.group(2).replace("\n", " ") for m in _SPAN.finditer(prose)]
    return out


def _prose(text: str) -> str:
    """A page without its code, where links are read."""
    return _SPAN.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor a heading gets: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def makefile_targets() -> set[str]:
    targets: set[str] = set()
    for line in (REPO / "Makefile").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+(?: +[A-Za-z0-9_.-]+)*) *:(?!=)", line)
        if m and not line.startswith((".", "\t")):
            targets.update(m.group(1).split())
    return targets


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def command_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("nymph",)) -> list[str]:
    out: list[str] = []
    for name, sub in _subcommands(parser).items():
        out.append(" ".join((*path, name)))
        out += command_paths(sub, (*path, name))
    return out


def check_command(parser: argparse.ArgumentParser, words: list[str]) -> str | None:
    """Why ``nymph WORDS`` is not a command of ``parser``, or None when it is.

    ``a|b`` names alternatives; an option must belong to one of the alternatives reached."""
    current, path = [parser], ["nymph"]
    for raw in words:
        if raw in _STOP or raw.startswith("#"):
            return None
        word = raw.strip("[](),.:")
        if word.startswith("-"):
            flag = word.split("=", 1)[0]
            for f in (f for f in re.split(r"[|/]", flag) if f.startswith("-")):
                if not any(f in p._option_string_actions for p in current):
                    return f"{' '.join(path)} has no option {f}"
            continue
        subs = [_subcommands(p) for p in current]
        if any(subs):
            if word in {"...", "COMMAND"} or not word:
                return None
            nxt: list[argparse.ArgumentParser] = []
            for alt in word.split("|"):
                found = [s[alt] for s in subs if alt in s]
                if not found:
                    return f"{' '.join(path)} has no subcommand {alt!r}"
                nxt += found
            current = nxt
            path.append(word)
    return None


def test_readme_is_a_front_door() -> None:
    """The README stays short: what nymph is, the set-up, an example and links into docs/."""
    assert (REPO / "README.md").stat().st_size <= 10 * 1024


@pytest.mark.parametrize("path", PAGES, ids=_rel)
def test_relative_links_exist(path: Path) -> None:
    """Every relative link of a page names an existing file, and every #anchor a heading of it."""
    broken: list[str] = []
    for target in _LINK.findall(_prose(path.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {_rel(dest)}")
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("path", PAGES, ids=_rel)
def test_make_targets_exist(path: Path) -> None:
    """Every `make TARGET` in a page's code is a target of the Makefile."""
    targets = makefile_targets()
    missing = [
        f"make {word}"
        for line in _code(path.read_text())
        for m in _MAKE.finditer(line)
        for word in m.group(1).split()
        if "=" not in word and word not in targets
    ]
    assert not missing, missing


@pytest.mark.parametrize("path", PAGES, ids=_rel)
def test_nymph_commands_exist(path: Path) -> None:
    """Every `nymph SUBCOMMAND ... --option` in a page's code is in the CLI's argparse tree."""
    parser = build_parser()
    wrong = [
        f"{line!r}: {why}"
        for line in _code(path.read_text())
        if not line.lstrip().startswith("helm ")  # `helm install nymph ...` names a release
        for m in _NYMPH.finditer(line)
        if (why := check_command(parser, m.group(1).split())) is not None
    ]
    assert not wrong, "\n".join(wrong)


def test_reference_lists_every_command() -> None:
    """The CLI reference names every subcommand the parser has, so a new one cannot go unlisted."""
    text = (DOCS / "reference.md").read_text()
    missing = [c for c in command_paths(build_parser()) if f"`{c}`" not in text]
    assert not missing, missing


def test_performance_page_is_generated() -> None:
    """docs/performance.md is what `daemon_bench.py --markdown` makes of bench-results.json."""
    results = json.loads((REPO / "bench-results.json").read_text())
    assert (DOCS / "performance.md").read_text() == page.page(results), (
        "regenerate it: python benchmarks/daemon_bench.py --markdown bench-results.json > docs/performance.md"
    )


def test_checks_catch_what_they_guard() -> None:
    """The command, link and slug checks above refuse what they should (else they pass vacuously)."""
    parser = build_parser()
    assert check_command(parser, ["providers", "add|list|rm", "--launcher", "Kube"]) is None
    assert check_command(parser, ["providers", "frobnicate"]) is not None
    assert check_command(parser, ["launch", "P", "--no-such-flag"]) is not None
    assert check_command(parser, ["results", "list|get", "P", "I", "-o", "D"]) is None
    assert check_command(parser, ["render", "--dreamrc", "x", "|", "kubectl", "-f", "-"]) is None
    assert slug("Security: teams sharing a cluster") == "security-teams-sharing-a-cluster"
    assert slug("`.dreamrc`") == "dreamrc"
    assert "demo" in makefile_targets() and "test" in makefile_targets()
    assert len(command_paths(parser)) > 20
    assert any("nymph providers add" in c for c in command_paths(parser))
    assert _NYMPH.search("--field-manager=nymph -f -") is None


_ROOTS = ("nymph/", "tests/", "manifests/", "benchmarks/", "daemonset/", "charts/", ".ci/", "docs/")
_NAMEISH = re.compile(r"^[\w.-]+(?:/[\w.-]+)*/?$")


def _named_paths(text: str) -> list[str]:
    """Repository paths a page names in code spans: ``nymph/x.py``, ``tests/support/`` (no globs
    or placeholders); a ``module.py::function`` names its file."""
    out: list[str] = []
    for span in _code(text):
        for token in re.split(r"[\s,;()\[\]'\"]+", span):
            token = token.split("::")[0].rstrip(".:")
            if token.startswith(_ROOTS) and _NAMEISH.match(token):
                out.append(token)
    return out


@pytest.mark.parametrize("path", PAGES, ids=_rel)
def test_named_paths_exist(path: Path) -> None:
    """Every repository path a page names (`nymph/queue/openapi.yaml`, `tests/support/`) exists."""
    missing = sorted({p for p in _named_paths(path.read_text()) if not (REPO / p).exists()})
    assert not missing, missing


def test_architecture_names_existing_modules() -> None:
    """The code layout and the path of one launch name modules that exist: `queue/store.py` under
    nymph/, and in the layout table a name anywhere under its row's package (`routes/user.py`)."""
    text = (DOCS / "architecture.md").read_text()
    missing: list[str] = []
    for line in text.splitlines():
        row = re.match(r"^\| `(nymph/[\w/]+/?)(?:\.py)?` \|(.*)\|$", line)
        package = REPO / row.group(1) if row else REPO / "nymph"
        body = row.group(2) if row else line
        for span in _SPAN.finditer(body):
            name = span.group(2).split("::")[0]
            if not re.match(r"^[\w/]+\.(py|yaml)$|^[\w]+/$", name) or name.startswith(_ROOTS):
                continue
            found = (package / name).exists() or (REPO / "nymph" / name).exists()
            if not found and package.is_dir():
                tail = "/" + name.rstrip("/")
                found = any(f.as_posix().endswith(tail) for f in package.rglob(tail.rsplit("/", 1)[1]))
            if not found:
                missing.append(f"{name} (under {_rel(package)})")
    assert not missing, missing


def test_architecture_lists_every_import_contract() -> None:
    """Each import-linter contract of `.importlinter` is listed, by name, in docs/architecture.md."""
    names = re.findall(r"^name *= *(.+?) *$", (REPO / ".importlinter").read_text(), re.M)
    text = (DOCS / "architecture.md").read_text()
    assert names
    assert not [n for n in names if f"| {n} |" not in text], names


@pytest.mark.parametrize(
    "drop", ["targets", "soak", "kubectl_invocation", "idle_daemon", "queue", "scheduling", "raw_paced"]
)
def test_performance_page_renders_a_partial_run(drop: str) -> None:
    """A results document without a section (a smoke run has no targets and no soak) still makes
    a page, with that section's rows left out rather than a crash."""
    results = json.loads((REPO / "bench-results.json").read_text())
    results[drop] = None
    text = page.page(results)
    assert text.startswith(page.HEADER) and "# Performance" in text
    if drop == "targets":
        assert "Against the targets" not in text
    if drop == "raw_paced":
        assert "depends on the pace" not in text


def test_the_paced_comparison_takes_the_pace_nearest_api_modes_rate() -> None:
    """nymph's CPU per launch is set against the API server's per create at the measured pace
    nearest the rate api mode ran at."""
    results = json.loads((REPO / "bench-results.json").read_text())
    results["raw_paced"] = {
        "launches": 1000,
        "burst": {
            "per_s": 400.0,
            "apiserver_cpu_ms_per_create": 2.0,
            "apiserver_cores": 0.8,
            "apiserver_cpu_ms_per_pod_life": 10.0,
        },
        "paced": {
            rate: {
                "per_s": float(rate),
                "apiserver_cpu_ms_per_create": ms,
                "apiserver_cores": 0.5,
                "apiserver_cpu_ms_per_pod_life": 10.0,
            }
            for rate, ms in (("50", 8.0), ("100", 5.0), ("200", 4.0))
        },
    }
    api = results["nymph"]["api"]["throughput"]
    top = api[max(api, key=int)]
    top["per_s"] = 110.0
    top["cpu_ms_per_launch"].update({"queue": 2.0, "daemon": 3.0, "kubectl": 0.0})
    text = page.page(results)
    assert "| 100/s | 5.0 | 0.5 | 10.0 |" in text
    assert "1.00x the API server's per create at the nearest pace (100/s)" in " ".join(text.split())


def test_performance_page_renders_a_run_of_some_configurations() -> None:
    """A run of some configurations only (`--only direct`) still makes a page."""
    results = json.loads((REPO / "bench-results.json").read_text())
    results["nymph"] = {"direct": results["nymph"]["direct"]}
    text = page.page(results)
    assert "| direct | 1000 |" in text and "| api |" not in text
