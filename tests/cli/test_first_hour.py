"""The first-hour walkthrough (docs/first-hour.md) is true: every command in its ``first-hour``
blocks, run in order in one shell against ``nymph dev --stay`` on the real node, exits with the
code its comment names (0 when none) and prints the words it promises; ``nymph dev`` itself
shows the sample's real output and leaves no process behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.devstay import start_dev_stay

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "first-hour.md"
BLOCK = re.compile(r"^```sh first-hour\n(.*?)^```", re.S | re.M)
PROMISE = re.compile(r"\s+#\s+(?:exits (\d+)(?::\s*(.*))?|prints:\s*(.*))$")


@dataclass(frozen=True)
class Step:
    command: str
    code: int
    words: str


def steps(page: str) -> list[Step]:
    """The page's commands in order: a heredoc stays one step with its body."""
    found: list[Step] = []
    for block in BLOCK.findall(page):
        lines = block.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if not line.strip():
                continue
            heredoc = re.search(r"<<'(\w+)'", line)
            if heredoc:
                body = [line]
                while i < len(lines) and lines[i] != heredoc.group(1):
                    body.append(lines[i])
                    i += 1
                body.append(lines[i])
                i += 1
                found.append(Step("\n".join(body), 0, ""))
                continue
            promise = PROMISE.search(line)
            command = line[: promise.start()] if promise else line
            code = int(promise.group(1)) if promise and promise.group(1) else 0
            words = (promise.group(2) or promise.group(3) or "").strip() if promise else ""
            found.append(Step(command.strip(), code, words))
    return found


def test_the_page_parses_into_steps_with_their_promises() -> None:
    parsed = steps(PAGE.read_text())
    assert len(parsed) > 20
    assert any(s.command.startswith("cat > job.py") and s.command.endswith("EOF") for s in parsed)
    wait = next(s for s in parsed if "--mode broken" in s.command)
    assert (wait.code, wait.words) == (125, "ImagePull")


def _script(parsed: list[Step], *, state: Path, bindir: Path, out: Path) -> str:
    lines = ["set -u"]
    for n, step in enumerate(parsed):
        command = step.command.replace("~/.local/state/nymph/dev/current/user.env", str(state / "user.env"))
        command = command.replace("$PWD/.venv/bin", str(bindir))
        lines.append(f'{{ {command}\n}} >"{out}/{n}.out" 2>&1 </dev/null; echo "{n} $?" >>"{out}/codes"')
    return "\n".join(lines) + "\n"


def test_every_command_of_the_first_hour_does_what_the_page_says(
    real_node_assets: Path, tmp_path: Path
) -> None:
    state = tmp_path / "dev"
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "none"), "NYMPH_NODE": "real"}
    proc, said = start_dev_stay(state, env=env)
    assert "Ctrl-C stops everything" in said, said
    assert "real node: Pods run in containers" in said and "printed in its container" in said

    parsed = steps(PAGE.read_text())
    work, out = tmp_path / "shell", tmp_path / "outputs"
    work.mkdir()
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NYMPH_")}
    env["HOME"] = str(tmp_path / "home")  # no .dreamrc or state of the machine's user
    script = _script(parsed, state=state, bindir=Path(sys.executable).parent, out=out)
    done = subprocess.run(["bash", "-c", script], cwd=work, env=env, timeout=420, check=False)
    assert done.returncode == 0
    codes = dict(line.split() for line in (out / "codes").read_text().splitlines())
    wrong = []
    for n, step in enumerate(parsed):
        text = (out / f"{n}.out").read_text(errors="replace")
        if int(codes[str(n)]) != step.code or step.words not in text:
            wrong.append(
                f"{step.command!r}: exit {codes[str(n)]} (page: {step.code}), output:\n{text[-600:]}"
            )
    assert not wrong, "\n\n".join(wrong)

    proc.send_signal(signal.SIGINT)
    stdout, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    # the sample's own print, read back from its container: its instance id and the Pod's hostname
    hello = [line for line in stdout.splitlines() if "hello from lakeshore-" in line]
    assert hello and hello[0].rstrip().endswith(" on " + hello[0].split("hello from ")[1].split()[0])
    left = subprocess.run(["pgrep", "-f", str(state)], capture_output=True, text=True)
    assert left.stdout.strip() == "", f"processes left behind: {left.stdout}"
