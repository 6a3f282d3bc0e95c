"""Direct dispatch: the queue itself creates, lists, watches, stops and reaps the Pods of
``dispatch: direct`` providers with each provider's own connection (see :mod:`nymph.kube.pods`).

* :mod:`.settings`: the operator's choices (allowed kubeconfig dirs, ambient credentials, key file);
* :mod:`.connect`: connections from providers and modes, secrets fetched from the store;
* :mod:`.launcher`: launch, list (live Pods merged with history), stop, probe;
* :mod:`.watches`: one Pod watch per distinct connection, started on demand, stopped when idle;
* :mod:`.janitor`: reconcile on start, reap finished Pods after a delay keeping their log tail.
"""
