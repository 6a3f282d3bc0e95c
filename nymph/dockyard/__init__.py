"""dockyard: a recipe plus an infra spec become the manifests of one RL training run.

The infra spec follows dockyard-k8s's ``InfraConfig`` so infra files written for it work
unchanged. The pure pipeline is::

    load.load_config(...)  ->  LoadedConfig (recipe mapping + typed InfraConfig)
    render.render_manifests(infra=...)  ->  manifests in apply order

``dispatch.dockyard_task_manifests`` is the same pipeline for a daemon task (recipe and infra
in memory, render-only kinds left out) and ``dispatch.DOCKYARD_ROLE_RULES`` the Role rules it
needs. The live layer takes the ordered manifest list as it is: ``plan`` and ``status`` are
pure; ``live`` (kubectl), ``rayapi`` (the Ray Jobs REST API over aiohttp) and ``endpoint``
(how the head's dashboard is reached) are the I/O edges; ``launch``, ``observe`` and
``doctor`` are the verbs wired by ``livecli``.
"""
