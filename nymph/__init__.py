"""nymph: an in-cluster job dispatcher for Kubernetes."""

from nymph.kube import slim as _slim

__version__ = "0.1.0"

# The generated Kubernetes client, one class at a time (see nymph.kube.slim).
_slim.install()
