#!/bin/sh
# Entry point of the nymph image: `nymph` with JSON logs (Kubernetes collects stdout/stderr).
# Any arguments are nymph's: `daemon ...`, `queue serve ...`, `audit verify FILE`.
set -eu
exec nymph --log-format json "$@"
