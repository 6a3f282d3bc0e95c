"""The fault suite's measured totals, written as one line to ``fault-summary.txt`` at the end.

Every test of the fault suite (marker ``faults``) adds what it actually did (launches run, kills injected, bad inputs
sent...) and what it found (failed restarts, lost or duplicated launches, 5xx answers, leaked
secrets). The line is written even when a test fails, so a red run still says what it measured.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUMMARY = REPO / "fault-summary.txt"


@dataclass
class Tally:
    launches: int = 0
    kills: int = 0
    restarts_failed: int = 0
    lost: int = 0
    duplicated: int = 0
    bad_inputs: int = 0
    server_errors: int = 0
    secret_leaks: int = 0

    def line(self) -> str:
        return (
            f"launches run {self.launches}, kills injected {self.kills}, "
            f"restarts that failed {self.restarts_failed}, lost {self.lost}, "
            f"duplicated {self.duplicated}, bad inputs tried {self.bad_inputs}, "
            f"5xx {self.server_errors}, secret leaks {self.secret_leaks}"
        )

    def write(self, path: Path = SUMMARY) -> str:
        text = self.line()
        path.write_text(text + "\n")
        return text

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)


TALLY = Tally()
