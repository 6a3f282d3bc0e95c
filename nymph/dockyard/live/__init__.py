"""The live dockyard commands: the I/O edges and the verbs built on them.

Edges: :mod:`.kubectl` (the cluster, over kubectl), :mod:`.rayapi` (the Ray Jobs REST API),
:mod:`.endpoint` (how the head's dashboard is reached). :mod:`.status` reads live objects into
verdicts (pure). Verbs: :mod:`.run` (``run``, ``cluster up|down``), :mod:`.observe`
(``status``, ``cluster list``, ``logs``, ``job``) and :mod:`.doctor`.
"""
