"""The exit codes of the user commands, one rule for all, and the text every user command's
``--help`` ends with (light: the parsers use it).

The rule: an empty answer is not an error (0, with a note); 1 is the job's failure; 2 a usage
or queue error; 124, 125 and 130 say how ``launch --wait`` ended without the job's own code.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

#: The command did what it was asked; an empty answer too (nothing listed, no log yet, no
#: results): that is not an error, and a note says so.
OK = 0
#: The job failed: ``launch --wait`` (the job's own exit code when it has one, else 1),
#: ``launch-dockyard --wait``, a failed check of ``providers test``.
JOB_FAILED = 1
#: A usage error or an error from the queue (not found, refused, unreachable, invalid).
USAGE_OR_QUEUE_ERROR = 2
#: ``nymph launch --wait --timeout D`` exits with this when D passed first (as ``timeout(1)``
#: does); the launch goes on.
WAIT_TIMEOUT_EXIT = 124
#: ``nymph launch --wait`` exits with this when the job never ran (ImagePull, LaunchFailed,
#: Unschedulable, stopped before it started...): the job's own exit codes are the others.
NEVER_RAN_EXIT = 125
#: Ctrl-C, as for any command interrupted by SIGINT.
INTERRUPTED_EXIT = 130

EXIT_CODES = f"""\
exit codes: {OK} done, an empty answer included (nothing listed, no log yet, no results: not
an error, a note says so); {JOB_FAILED} the job failed (launch --wait exits with the job's own
exit code when it has one; launch-dockyard --wait; a failed check of providers test);
{USAGE_OR_QUEUE_ERROR} a usage error or an error from the queue (no such provider or
instance, refused token, queue unreachable); {WAIT_TIMEOUT_EXIT} launch --wait --timeout gave
up waiting; {NEVER_RAN_EXIT} the job never ran (launch --wait: ImagePull, LaunchFailed,
Unschedulable, stopped before it started); {INTERRUPTED_EXIT} interrupted (Ctrl-C)."""


def each_parser(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every parser of a command under it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from each_parser(child)


def document(parser: argparse.ArgumentParser) -> None:
    """End the help of ``parser`` and of every command under it with :data:`EXIT_CODES`."""
    for each in each_parser(parser):
        if each.epilog is None:
            each.epilog = EXIT_CODES
