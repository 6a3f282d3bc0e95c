"""``python -m nymph.localcluster [DIR]``: run the local control plane until Ctrl-C."""

from __future__ import annotations

import signal
import sys
import tempfile
import threading
from pathlib import Path

from nymph.localcluster.cluster import LocalCluster


def main() -> int:
    workdir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="nymph-cluster-"))
    cluster = LocalCluster(workdir, progress=lambda m: print(f"cluster: {m}", file=sys.stderr))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with cluster:
        print(
            f"cluster: ready in {cluster.start_seconds:.1f}s; export KUBECONFIG={cluster.kubeconfig}",
            file=sys.stderr,
        )
        print(cluster.kubeconfig, flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
