"""``nymph queue``: the control-plane queue service (aiohttp + SQLite).

Users send providers, modes and launches; nymph daemons claim tasks by long-poll under leases,
report state, and upload logs. The protocol is ``openapi.yaml`` in this package, also served at
``GET /openapi.yaml``.
"""

from nymph.queue.http.app import create_app
from nymph.queue.models import QueueSettings

__all__ = ["QueueSettings", "create_app"]
