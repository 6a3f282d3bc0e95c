"""The Pod an instance runs as, for reading: the one the queue created (direct path) or the
render of its latest launch task's spec (daemon path, before the daemon pins it to its node).
Neither holds a secret: a spec carries no kubeconfig and no ``$secret`` value."""

from __future__ import annotations

import json
from typing import Any

from nymph.errors import ValidationError
from nymph.launch.render import render_pod
from nymph.launch.spec import LaunchSpec
from nymph.queue.sql.dialect import Conn


def pod_of(conn: Conn, *, instance_id: str) -> dict[str, Any] | None:
    row = conn.execute("SELECT pod FROM instances WHERE instance_id = ?", (instance_id,)).fetchone()
    if row is not None and row["pod"]:
        pod: dict[str, Any] = json.loads(row["pod"])
        return pod
    task = conn.execute(
        "SELECT spec FROM tasks WHERE instance_id = ? AND kind = 'launch' ORDER BY seq DESC LIMIT 1",
        (instance_id,),
    ).fetchone()
    if task is None or not task["spec"]:
        return None
    try:
        return dict(render_pod(LaunchSpec.from_json(json.loads(task["spec"]))))
    except ValidationError:
        return None
