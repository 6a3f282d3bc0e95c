"""What the queue makes of a daemon's reports after a crash (the crash matrix)."""

from __future__ import annotations

from nymph.client import DaemonIdentity, QueueClient
from nymph.launch.state import InstanceState, Reason
from nymph.queue.models import Report
from nymph.queue.sql.reports import stop_reason
from tests.support.dispatch_helpers import apply
from tests.support.queue_helpers import Queue


def _daemon(q: Queue) -> QueueClient:
    d = q.daemon()
    d.daemon = DaemonIdentity(daemon_id="d1", node="n1")
    return d


async def _running_then_stopped_by_the_user(q: Queue, d: QueueClient) -> str:
    """A launch applied and running on n1, then a stop requested. Returns the instance."""
    iid = (await q.user().launch(provider="kind", mode="small", script="print(1)"))["instanceId"]
    [task] = await d.claim(daemon_id="d1", node="n1", capacity=1, wait=0)
    await d.complete(daemon_id="d1", task_id=task["taskId"], ok=True)
    running = {"seq": 1, "instanceId": iid, "state": "running", "node": "n1"}
    await d.report(daemon_id="d1", stream="s1", reports=[running])
    await q.user().stop(provider="kind", instance_id=iid)
    return iid


async def test_a_pod_found_gone_after_a_stop_request_ended_on_request(kind: Queue) -> None:
    """The daemon that deleted the Pod died before it said so; the next one finds the Pod gone
    and reports Deleted: the instance stopped on request, as the user asked."""
    d = _daemon(kind)
    iid = await _running_then_stopped_by_the_user(kind, d)
    gone = {
        "seq": 2,
        "instanceId": iid,
        "state": "stopped",
        "reason": "Deleted",
        "message": "no Pod found when the daemon started",
    }
    await d.report(daemon_id="d1", stream="s1", reports=[gone])
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert (inst["state"], inst["reason"]) == ("stopped", "Stopped")
    assert inst["message"] == "stopped on request (no Pod found when the daemon started)"


async def test_a_pod_deleted_outside_nymph_without_a_stop_request_stays_deleted(kind: Queue) -> None:
    iid = (await kind.user().launch(provider="kind", mode="small", script="print(1)"))["instanceId"]
    d = _daemon(kind)
    assert await apply(d, daemon_id="d1", node="n1") == [iid]
    gone = {"seq": 1, "instanceId": iid, "state": "stopped", "reason": "Deleted", "message": "deleted"}
    await d.report(daemon_id="d1", stream="s1", reports=[gone])
    inst = await kind.user().get_instance(provider="kind", instance_id=iid)
    assert (inst["state"], inst["reason"], inst["message"]) == ("stopped", "Deleted", "deleted")


def test_only_a_deleted_stop_is_read_as_stopped_on_request() -> None:
    def rep(state: InstanceState, reason: Reason | None) -> Report:
        return Report(
            seq=1,
            instance_id="lakeshore-0000000a",
            state=state.value,
            reason=reason.value if reason else None,
            message=None,
            node=None,
            at=0.0,
        )

    stopped = InstanceState.STOPPED
    assert stop_reason(rep(stopped, Reason.DELETED), stop_requested=True) == ("Stopped", "stopped on request")
    assert stop_reason(rep(stopped, Reason.DELETED), stop_requested=False) == ("Deleted", "")
    assert stop_reason(rep(stopped, Reason.COMPLETED), stop_requested=True) == ("Completed", "")
    assert stop_reason(rep(InstanceState.STOPPING, None), stop_requested=True) == (None, "")
