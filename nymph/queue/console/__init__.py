"""The web console: server-rendered pages under ``/console/`` for the queue's users, signed in
with the same tokens as the CLI and held to the same authorization (see :mod:`.guard`)."""
