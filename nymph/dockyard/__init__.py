"""dockyard: a recipe plus an infra spec become the manifests of one RL training run.

The infra spec follows dockyard-k8s's ``InfraConfig`` so infra files written for it work
unchanged. The pure pipeline is::

    load.load_config(...)  ->  LoadedConfig (recipe mapping + typed InfraConfig)
    render.render_manifests(infra=...)  ->  manifests in apply order

A live layer (apply, submit, follow) takes the ordered manifest list as it is.
"""
