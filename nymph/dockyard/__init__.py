"""dockyard: a recipe plus an infra spec become the manifests of one RL training run.

The infra spec follows dockyard-k8s's ``InfraConfig`` so infra files written for it work
unchanged. Three layers, each importing only the ones before it:

* :mod:`nymph.dockyard.spec`: the infra schema and loading a recipe + infra pair (YAML,
  layers, interpolation, overrides, strict parsing, namespace inference);
* :mod:`nymph.dockyard.render` (pure): the manifests in apply order, what the live path does
  with them (``plan``), the ``check`` summary, and the manifests of a daemon task (``task``);
* :mod:`nymph.dockyard.live`: the cluster edges (kubectl, the Ray Jobs REST API, reaching the
  head's dashboard) and the live verbs (``run``, ``observe``, ``doctor``).

The pipeline::

    spec.load.load_config(...)  ->  LoadedConfig (recipe mapping + typed InfraConfig)
    render.manifests.render_manifests(infra=...)  ->  manifests in apply order

``render.task.dockyard_task_manifests`` is the same pipeline for a daemon task (recipe and
infra in memory, render-only kinds left out) and ``render.task.DOCKYARD_ROLE_RULES`` the Role
rules it needs; :mod:`nymph.dockyard.ownership` (pure, light: the daemon imports it) says which
launch a live object belongs to. The ``nymph dockyard`` command is :mod:`nymph.cli.dockyard` (with the live
verbs in :mod:`nymph.cli.dockyard_live`); this package parses no arguments.
"""
