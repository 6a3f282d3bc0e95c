"""The I/O edge to Kubernetes: kubectl runner, credentials staging, pod watch."""
