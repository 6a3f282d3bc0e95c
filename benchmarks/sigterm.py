"""How a benchmark run as a script stops on make's SIGTERM."""

from __future__ import annotations

import signal
import sys


def unwind_on_sigterm() -> None:
    """Make SIGTERM (like SIGINT) unwind as an error (exit 143), so every process the run
    started is stopped. Called under ``__main__`` only, not in ``main()``: smoke tests run
    ``main()`` inside the test process, whose own SIGTERM handling this would replace."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
