"""A work and size budget for resolving the interpolations of user input.

OmegaConf resolves a reference again every time it is used (no memo), so ``b: ${a}${a}``,
``c: ${b}${b}``, ... doubles the work with each line: 30 short lines are 2^30 resolutions. A
render of input nymph did not write (a dockyard launch, in the queue and in the daemon) runs
inside :func:`limited`: every interpolation OmegaConf evaluates is one step, every string it
parses or produces counts toward the resolved size, and the step that goes past either cap raises
:class:`BudgetSpent` inside the render itself, so the render stops there (it is not left running
in a thread). :mod:`nymph.dockyard.spec.interp` charges the steps and turns the exhaustion into
:class:`nymph.dockyard.errors.DockyardBudgetError`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

#: Interpolations a render of user input may evaluate (the shipped examples take six; each
#: step costs OmegaConf's grammar a fraction of a millisecond).
MAX_STEPS = 2_000
#: Characters the interpolations of one render may parse and produce in all.
MAX_RESOLVED_CHARS = 512 * 1024


class BudgetSpent(BaseException):
    """Raised inside OmegaConf's resolution when the budget is spent.

    A :class:`BaseException` so that OmegaConf's ``except Exception`` wrappers let it through
    to :mod:`nymph.dockyard.spec.interp`, which turns it into a one-line error.
    """


@dataclass(kw_only=True)
class RenderBudget:
    """Caps and what was used so far; :attr:`spent` says which cap ran out, once one did."""

    max_steps: int = MAX_STEPS
    max_chars: int = MAX_RESOLVED_CHARS
    steps: int = 0
    chars: int = 0
    spent: str | None = None

    def step(self) -> None:
        """One interpolation about to be evaluated."""
        self.steps += 1
        if self.spent is None and self.steps > self.max_steps:
            self.spent = (
                f"rendering takes more than {self.max_steps} interpolation steps (nested ${{...}} "
                "references multiply: each use of a reference resolves it again); flatten them"
            )
        self._check()

    def text(self, value: object) -> None:
        """A string about to be parsed, or one an interpolation produced (other values are
        free): the grammar's cost grows with the text, the result's size with both."""
        if isinstance(value, str):
            self.chars += len(value)
        if self.spent is None and self.chars > self.max_chars:
            self.spent = (
                f"rendering parses or produces more than {self.max_chars} characters of interpolated "
                "text; flatten the ${...} references"
            )
        self._check()

    def _check(self) -> None:
        if self.spent is not None:
            raise BudgetSpent(self.spent)


_BUDGET: contextvars.ContextVar[RenderBudget | None] = contextvars.ContextVar("dockyard_budget", default=None)


def current() -> RenderBudget | None:
    """The budget of the render running in this context, if any."""
    return _BUDGET.get()


@contextmanager
def limited(budget: RenderBudget) -> Iterator[RenderBudget]:
    """Run the block's interpolations under ``budget``."""
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)
