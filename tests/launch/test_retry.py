"""Retry policies (pure): parsing names the bad rule, and decide() retries what the policy names
(never a configuration error it does not name), within the limit, with growing capped backoff
and the adjustments for the reason; a Pod removed with its node is NodeLost, not Deleted."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nymph.errors import ValidationError
from nymph.launch.groups import expand
from nymph.launch.retry import NAMED_ONLY, RETRY_REASONS, decide, memory_bytes, parse_policy, scale_memory
from nymph.launch.state import Reason, deleted_reason


def test_exit_ranges_and_reasons_match_and_the_limit_holds() -> None:
    policy = parse_policy({"limit": 2, "on": ["OOMKilled", "exit:1-5", "exit:137"]}, "retry")
    assert policy is not None
    assert decide(policy, attempt=1, reason="Error", exit_code=3).retry
    assert decide(policy, attempt=1, reason="Error", exit_code=137).why == "rule exit:137 matched"
    assert not decide(policy, attempt=1, reason="Error", exit_code=6).retry
    assert decide(policy, attempt=2, reason="OOMKilled", exit_code=None).retry
    assert "limit of 2" in decide(policy, attempt=3, reason="OOMKilled", exit_code=None).why
    assert not decide(policy, attempt=1, reason="Completed", exit_code=0).retry
    assert not decide(policy, attempt=1, reason="Stopped", exit_code=None).retry


@given(st.sampled_from(sorted(RETRY_REASONS)), st.integers(min_value=1, max_value=5))
def test_without_on_every_failure_but_configuration_errors_is_retried(reason: str, attempt: int) -> None:
    policy = parse_policy({"limit": 5, "backoff": "10s", "maxBackoff": "1m"}, "retry")
    assert policy is not None
    got = decide(policy, attempt=attempt, reason=reason, exit_code=1)
    assert got.retry == (reason not in NAMED_ONLY)
    if got.retry:
        assert got.delay == min(10 * 2 ** (attempt - 1), 60)


def test_adjustments_follow_the_reason() -> None:
    policy = parse_policy({"limit": 1, "memoryFactor": 2, "avoidNode": True}, "retry")
    assert policy is not None
    oom = decide(policy, attempt=1, reason="OOMKilled", exit_code=137)
    assert oom.memory_factor == 2 and not oom.avoid_node
    lost = decide(policy, attempt=1, reason="NodeLost", exit_code=None)
    assert lost.avoid_node and lost.memory_factor is None
    resources = {"requests": {"memory": "1Gi", "cpu": "1"}, "limits": {"memory": "2Gi"}}
    assert scale_memory(resources, 2, cap=3 * 2**30) == {
        "requests": {"memory": str(2**31), "cpu": "1"},
        "limits": {"memory": str(3 * 2**30)},
    }
    assert scale_memory({"requests": {"cpu": "1"}}, 2, cap=None) is None
    assert memory_bytes("512Mi") == 512 * 2**20 and memory_bytes("1G") == 10**9 and memory_bytes("x") is None


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"limit": 1, "on": ["Error", 3]}, "retry.on[1]"),
        ({"limit": 1, "on": ["exit:300"]}, "retry.on[0]"),
        ({"limit": 1, "on": []}, "retry.on"),
        ({"limit": True}, "retry.limit"),
        ({"limit": 1, "maxBackoff": "forever"}, "retry.maxBackoff"),
        ({"limit": 1, "avoidNode": "yes"}, "retry.avoidNode"),
        ("3", "retry"),
    ],
)
def test_a_bad_policy_names_its_part(policy: object, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        parse_policy(policy, "retry")
    assert err.value.field == field


def test_node_lost_is_told_apart_from_deleted() -> None:
    def pod(reason: str) -> dict[str, object]:
        cond = {"type": "DisruptionTarget", "status": "True", "reason": reason}
        return {"status": {"phase": "Running", "conditions": [cond]}}

    assert deleted_reason(pod("DeletionByPodGC")) is Reason.NODE_LOST
    assert deleted_reason(pod("DeletionByTaintManager")) is Reason.NODE_LOST
    assert deleted_reason(pod("EvictionByEvictionAPI")) is Reason.DELETED
    assert deleted_reason({"status": {}}) is Reason.DELETED


def test_a_group_body_expands_in_order_with_items_merged_over_it() -> None:
    got = expand({"mode": "m", "script": "s", "env": {"A": 1}, "items": [{"env": {"B": 2}}, {"mode": "n"}]})
    assert got == [
        {"mode": "m", "script": "s", "env": {"A": 1, "B": 2}},
        {"mode": "n", "script": "s", "env": {"A": 1}},
    ]
    assert len(expand({"mode": "m", "script": "s", "count": 3})) == 3
    with pytest.raises(ValidationError) as err:
        expand({"mode": "m", "script": "s", "items": [{}, {"env": []}]})
    assert err.value.field == "items[1].env"
