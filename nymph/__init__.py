"""nymph: an in-cluster job dispatcher for Kubernetes."""

__version__ = "0.1.0"
