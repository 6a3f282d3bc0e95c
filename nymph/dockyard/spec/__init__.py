"""The dockyard infra spec: schema, YAML reading, layers, interpolation, overrides, parsing.

:func:`nymph.dockyard.spec.load.load_config` reads a recipe and its infra (and the shipped
``defaults.yaml`` beside it) into a :class:`~nymph.dockyard.spec.load.LoadedConfig`. All I/O
here is reading files; nothing is written and no cluster is called.
"""
