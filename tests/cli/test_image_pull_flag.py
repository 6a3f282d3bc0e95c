"""``nymph queue serve --image-pull-timeout``: a duration that becomes the queue's default for
launches whose mode names none (2 minutes without the flag); anything else is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nymph.queue.http import serve as serve_module
from nymph.queue.models import QueueSettings
from tests.support.queue_helpers import run_cli as run


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[QueueSettings]:
    got: list[QueueSettings] = []

    async def fake_serve(*, settings: QueueSettings, **_: Any) -> None:
        got.append(settings)

    monkeypatch.setattr(serve_module, "serve", fake_serve)
    return got


@pytest.mark.parametrize(("flag", "seconds"), [([], 120), (["--image-pull-timeout", "10m"], 600)])
def test_the_flag_sets_the_queue_default(
    served: list[QueueSettings],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    flag: list[str],
    seconds: int,
) -> None:
    """The setting reaches the queue: 2m by default, the flag's duration otherwise."""
    code, _, err = run(capsys, "queue", "serve", "--db", str(tmp_path / "q.db"), *flag)
    assert code == 0, err
    assert [s.launch.image_pull_timeout for s in served] == [seconds]


def test_a_bad_duration_is_refused(
    served: list[QueueSettings], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A value that is not a duration is an error naming the flag; the queue does not start."""
    code, _, err = run(
        capsys, "queue", "serve", "--db", str(tmp_path / "q.db"), "--image-pull-timeout", "soon"
    )
    assert code == 2 and "--image-pull-timeout" in err and "not a duration" in err
    assert served == []
