"""What the daemon makes of a misbehaving peer's answers: a claim answer without a list of
tasks is a queue error and entries that are not objects are dropped; an API server unreachable
during validation is transient, while a real validation error stays invalid."""

from __future__ import annotations

import pytest

from nymph.client.dispatch import _claimed_tasks
from nymph.client.errors import QueueError
from nymph.kube.errors import Invalid, Unavailable, classify_kubectl


@pytest.mark.parametrize("answer", [None, [], "tasks", {"tasks": None}, {"tasks": {"a": 1}}, {}])
def test_a_claim_answer_without_a_task_list_is_a_queue_error(answer: object) -> None:
    with pytest.raises(QueueError, match="without a list of tasks"):
        _claimed_tasks(answer)


def test_claim_entries_that_are_not_objects_are_dropped() -> None:
    assert _claimed_tasks({"tasks": [1, "x", None, {"taskId": "task-1"}]}) == [{"taskId": "task-1"}]


def test_an_unreachable_api_server_during_validation_is_transient_not_invalid() -> None:
    text = (
        'error: error validating "STDIN": error validating data: failed to download openapi: '
        'Get "https://127.0.0.1:6443/openapi/v2?timeout=32s": dial tcp 127.0.0.1:6443: '
        "connect: connection refused; if you choose to ignore these errors, turn validation off"
    )
    assert isinstance(classify_kubectl(text), Unavailable)


def test_a_real_validation_error_stays_invalid() -> None:
    text = 'The Pod "lakeshore-1a2b3c4d" is invalid: spec.containers[0].image: Required value'
    assert isinstance(classify_kubectl(text), Invalid)
