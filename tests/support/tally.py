"""The fault suite's measured totals, written as one line to ``fault-summary.txt`` at the end.

Every test of the fault suite (marker ``faults``) adds what it actually did (launches run, kills injected, bad inputs
sent...) and what it found (failed restarts, lost or duplicated launches, 5xx answers, leaked
secrets). The line is written even when a test fails, so a red run still says what it measured.
A test that is a figure of its own (the crash matrix on each backend, the replica kill) adds a
line of its own as well (:meth:`Tally.figure`), written after the totals.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
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
    #: One line per run that is a figure of its own, in the order they ran.
    figures: list[str] = field(default_factory=list)

    def figure(
        self, name: str, *, launches: int, kills: int, lost: int, duplicated: int, seconds: float
    ) -> str:
        text = f"{name}: launches {launches}, kills {kills}, lost {lost}, duplicated {duplicated}, {seconds:.0f} s"
        self.figures.append(text)
        return text

    def line(self) -> str:
        return (
            f"launches run {self.launches}, kills injected {self.kills}, "
            f"restarts that failed {self.restarts_failed}, lost {self.lost}, "
            f"duplicated {self.duplicated}, bad inputs tried {self.bad_inputs}, "
            f"5xx {self.server_errors}, secret leaks {self.secret_leaks}"
        )

    def write(self, path: Path = SUMMARY) -> list[str]:
        lines = [self.line(), *self.figures]
        path.write_text("".join(f"{line}\n" for line in lines))
        return lines

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, [] if f.name == "figures" else 0)


TALLY = Tally()
