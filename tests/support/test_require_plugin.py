import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, policy: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sk.py").write_text(
        "import pytest\n\ndef test_a():\n    pytest.skip('no thing')\n\ndef test_b():\n    pass\n"
    )
    env = {**os.environ, "NYMPH_E2E": policy, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.support.require_plugin",
            "-p",
            "no:cacheprovider",
            str(tmp_path / "test_sk.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )


def test_a_skip_fails_the_run_under_require(tmp_path: Path) -> None:
    res = run(tmp_path, "require")
    assert res.returncode == 1, res.stdout
    assert "skipped tests are failures" in res.stdout and "test_a" in res.stdout


def test_a_skip_is_only_a_skip_elsewhere(tmp_path: Path) -> None:
    res = run(tmp_path, "auto")
    assert res.returncode == 0, res.stdout
