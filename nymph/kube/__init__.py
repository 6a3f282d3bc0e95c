"""The I/O edge to Kubernetes: kubectl runner, credentials staging (with the policy of what a
kubeconfig ref may reach), Pods through the API with a provider's own connection, pod watch."""

from nymph.kube import slim as _slim

# The generated Kubernetes client, one class at a time (see nymph.kube.slim).
_slim.install()
