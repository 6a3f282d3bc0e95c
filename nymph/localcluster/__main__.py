"""``python -m nymph.localcluster [DIR]``: run the local control plane until Ctrl-C.

``NYMPH_NODE=real|kwok|auto`` (default auto) picks the node: a real one when the machine allows
it, beside the kwok node ``nymph-node-1``."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

from nymph.localcluster.cluster import LocalCluster


def main() -> int:
    workdir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="nymph-cluster-"))
    cluster = LocalCluster(
        workdir,
        node=os.environ.get("NYMPH_NODE") or "auto",
        progress=lambda m: print(f"cluster: {m}", file=sys.stderr),
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with cluster:
        print(
            f"cluster: ready in {cluster.start_seconds:.1f}s ({cluster.node_note}); "
            f"export KUBECONFIG={cluster.kubeconfig}",
            file=sys.stderr,
        )
        print(cluster.kubeconfig, flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
