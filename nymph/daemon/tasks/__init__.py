"""Task handlers: one module per kind of work, each given a :class:`TaskContext` and its tasks."""
