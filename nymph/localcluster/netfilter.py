"""The host's packet filter as the local cluster sees it: snapshots of the iptables rules and
ipsets, and the exact undo of what one process added between two snapshots.

A snapshot holds ``iptables-save`` (and ``ip6tables-save``) without comments and counters, and
the names ``ipset list -n`` prints. :func:`undo_script` (pure) turns a before and an after into
an ``iptables-restore --noflush`` script that removes, in one transaction per table, only what
was added *and* is owned (a name the caller's predicate claims): the added rules of chains that
were already there (``-D``, so another program's rules stay where they are), then the added
chains (``-F`` all of them, then ``-X``). Nothing that was there before is flushed or deleted.
"""

from __future__ import annotations

import difflib
import re
import shlex
import shutil
import subprocess
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from nymph.errors import NymphError

#: family -> (save, restore) commands
FAMILIES: Mapping[str, tuple[str, str]] = {
    "ipv4": ("iptables-save", "iptables-restore"),
    "ipv6": ("ip6tables-save", "ip6tables-restore"),
}
_COUNTERS = re.compile(r" \[\d+:\d+\]$")

Owned = Callable[[str], bool]
#: table -> chain -> (policy, rules in order, each its ``-A CHAIN ...`` line)
Tables = dict[str, dict[str, tuple[str, list[str]]]]


class NetfilterError(NymphError):
    """An iptables or ipset command failed."""


@dataclass(frozen=True)
class Snapshot:
    """The host's rules (family -> normalised save text) and ipset names."""

    rules: Mapping[str, str]
    ipsets: tuple[str, ...]


def normalise(save: str) -> str:
    """``iptables-save`` output without its comment lines and chain counters."""
    lines = [_COUNTERS.sub("", line) for line in save.splitlines() if line and not line.startswith("#")]
    return "".join(f"{line}\n" for line in lines)


def parse(save: str) -> Tables:
    tables: Tables = {}
    current: dict[str, tuple[str, list[str]]] | None = None
    for line in normalise(save).splitlines():
        if line.startswith("*"):
            current = tables.setdefault(line[1:], {})
        elif current is None or line == "COMMIT":
            continue
        elif line.startswith(":"):
            name, _, policy = line[1:].partition(" ")
            current[name] = (policy, current.get(name, ("", []))[1])
        elif line.startswith("-A "):
            chain = line.split()[1]
            current.setdefault(chain, ("-", []))[1].append(line)
    return tables


def _words(rule: str) -> list[str]:
    try:
        return shlex.split(rule)
    except ValueError:
        return rule.split()


def rule_owned(rule: str, owned: Owned) -> bool:
    """Whether a rule names an owned chain or set (its target, a ``--match-set``, a comment)."""
    return any(owned(w) for w in _words(rule)[2:])


def undo_script(before: str, after: str, *, owned: Owned) -> str:
    """The ``iptables-restore --noflush`` script removing what is owned and was added between the
    two saves; empty when there is nothing to remove."""
    old, new = parse(before), parse(after)
    out: list[str] = []
    for table, chains in new.items():
        was = old.get(table, {})
        lines: list[str] = []
        for chain, (_, rules) in chains.items():
            if chain not in was:
                continue
            extra = Counter(rules) - Counter(was[chain][1])
            for rule in rules:
                if extra[rule] > 0 and rule_owned(rule, owned):
                    extra[rule] -= 1
                    lines.append("-D" + rule[2:])
        added = [c for c in chains if c not in was and owned(c)]
        lines += [f"-F {c}" for c in added] + [f"-X {c}" for c in added]
        if lines:
            out += [f"*{table}", *lines, "COMMIT"]
    return "".join(f"{line}\n" for line in out)


def _canonical(save: str) -> list[str]:
    """The rules as sorted chain declarations and each chain's rules in order (the order chains
    are declared in depends on how a table was last rewritten, not on what it does)."""
    out: list[str] = []
    for table, chains in sorted(parse(save).items()):
        out.append(f"*{table}")
        for chain in sorted(chains):
            policy, rules = chains[chain]
            out += [f":{chain} {policy}", *rules]
    return out


def differences(before: Snapshot, after: Snapshot) -> list[str]:
    """A unified diff of the rules and ipsets (empty when the host is as it was)."""
    out: list[str] = []
    for family in sorted(set(before.rules) | set(after.rules)):
        a, b = _canonical(before.rules.get(family, "")), _canonical(after.rules.get(family, ""))
        out += list(difflib.unified_diff(a, b, f"{family} before", f"{family} after", lineterm=""))
    out += list(
        difflib.unified_diff(
            list(before.ipsets), list(after.ipsets), "ipsets before", "ipsets after", lineterm=""
        )
    )
    return out


# -- I/O ---------------------------------------------------------------------------------------


def _run(argv: list[str], *, data: str | None = None) -> str:
    try:
        res = subprocess.run(argv, input=data, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetfilterError(f"{argv[0]}: {exc}") from exc
    if res.returncode != 0:
        raise NetfilterError(f"{' '.join(argv)} exited {res.returncode}: {res.stderr.strip()[-800:]}")
    return res.stdout


def missing_tools() -> list[str]:
    return [t for t in ("iptables-save", "iptables-restore", "ipset") if shutil.which(t) is None]


def snapshot() -> Snapshot:
    rules = {f: normalise(_run([save])) for f, (save, _) in FAMILIES.items() if shutil.which(save)}
    return Snapshot(rules=rules, ipsets=tuple(sorted(_run(["ipset", "list", "-n"]).split())))


def undo(before: Snapshot, after: Snapshot, *, owned: Owned) -> None:
    """Remove what is owned and was added from ``before`` to ``after``: the rules and chains, then
    the ipsets (a set still named by a rule cannot go)."""
    for family, text in after.rules.items():
        script = undo_script(before.rules.get(family, ""), text, owned=owned)
        if script:
            _run([FAMILIES[family][1], "--noflush"], data=script)
    for name in after.ipsets:
        if name not in before.ipsets and owned(name):
            _run(["ipset", "destroy", name])
