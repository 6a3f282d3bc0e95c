"""Pure dockyard rendering: an :class:`~nymph.dockyard.spec.schema.InfraConfig` becomes
manifests in apply order (:mod:`.manifests`, built from :mod:`.sandbox`, :mod:`.raycluster`,
:mod:`.hardening`, :mod:`.fleets` and :mod:`.governance`).

Also pure: :mod:`.plan` (what the live path applies, and the names KubeRay gives what it
creates), :mod:`.summary` (``check`` output) and :mod:`.task` (the manifests and Role rules of
a dockyard task the daemon dispatches). No subprocess, network, file writes or cluster client.
"""
