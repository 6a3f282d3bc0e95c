"""``priority`` and ``max_runtime`` on plain data: where each is set, how it is checked, what it
travels as in the spec, what it renders, how a Pod past its deadline is reported, and a
namespace's runtime limits."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nymph.daemon.tracker import Track, decide_event, ended_report
from nymph.errors import ConfigError, ValidationError
from nymph.launch.config import Mode, Provider
from nymph.launch.dreamrc import mode_from_cli, parse_dreamrc
from nymph.launch.render import launch_annotation, render_pod
from nymph.launch.runlimits import PRIORITY_MAX, PRIORITY_MIN, apply_runtime_limits, check_priority
from nymph.launch.spec import LaunchSpec, build_launch_spec
from nymph.launch.state import InstanceState, Reason, pod_reason, pod_state
from nymph.queue.sql.direct import pod_change

IID = "lakeshore-0123abcd"


def spec(mode: dict[str, Any] | None = None, **body: Any) -> LaunchSpec:
    return build_launch_spec(
        provider=Provider(name="p", kwargs={"namespace": "jobs"}),
        mode=Mode(name="m", fields={"image": "python:3.12", **(mode or {})}),
        body={"script": "print(1)", **body},
        instance_id=IID,
    )


# --- priority ---------------------------------------------------------------------------------


def test_priority_defaults_to_zero_and_the_launch_wins_over_the_mode() -> None:
    assert spec().priority == 0
    assert spec({"priority": 10}).priority == 10
    assert spec({"priority": 10}, priority=-3).priority == -3
    assert spec({"priority": 10}, fields={"priority": 5}).priority == 5
    assert spec({"priority": 10}, fields={"priority": 5}, priority=7).priority == 7
    assert spec({"priority": 10}, priority=None).priority == 10
    assert spec(priority=PRIORITY_MAX).priority == PRIORITY_MAX
    assert spec(priority=PRIORITY_MIN).priority == PRIORITY_MIN


@pytest.mark.parametrize(
    "bad", [PRIORITY_MAX + 1, PRIORITY_MIN - 1, 10**20, True, False, 1.0, 2.5, "10", "x", [1], {}]
)
@pytest.mark.parametrize(
    ("where", "field"),
    [("body", "launch.priority"), ("fields", "launch.fields.priority")],
)
def test_a_bad_launch_priority_names_its_field(bad: object, where: str, field: str) -> None:
    body: dict[str, Any] = {"priority": bad} if where == "body" else {"fields": {"priority": bad}}
    with pytest.raises(ValidationError) as err:
        spec(**body)
    assert err.value.field == field


@pytest.mark.parametrize("bad", [1001, -1001, True, 1.5, "10", "high"])
def test_a_bad_mode_priority_is_refused_when_the_mode_is_made(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"mode 'm': mode\.priority: "):
        Mode(name="m", fields={"image": "x", "priority": bad})
    with pytest.raises(ConfigError, match=r"provider 'p': provider\.priority: "):
        Provider(name="p", kwargs={"priority": bad})


@given(st.integers())
def test_priority_bounds(n: int) -> None:
    if PRIORITY_MIN <= n <= PRIORITY_MAX:
        assert check_priority(n, "f") == n
    else:
        with pytest.raises(ValidationError, match=r"^f: .* out of range"):
            check_priority(n, "f")


# --- max_runtime ------------------------------------------------------------------------------


def test_max_runtime_comes_from_the_mode_or_the_launch_fields() -> None:
    assert spec().max_runtime is None
    assert spec({"max_runtime": "30m"}).max_runtime == 1800
    assert spec({"max_runtime": 600}).max_runtime == 600
    assert spec({"max_runtime": "30m"}, fields={"max_runtime": "2h"}).max_runtime == 7200
    assert spec({"max_runtime": "30m"}, fields={"max_runtime": None}).max_runtime is None


@pytest.mark.parametrize("bad", ["soon", "1.5h", 0, -1, 1.5, True, "400d", [60]])
def test_a_bad_max_runtime_names_its_field_and_the_accepted_forms(bad: object) -> None:
    with pytest.raises(ValidationError) as err:
        spec(fields={"max_runtime": bad})
    assert err.value.field == "launch.fields.max_runtime"
    with pytest.raises(ConfigError, match=r"mode 'm': mode\.max_runtime: "):
        Mode(name="m", fields={"max_runtime": bad})


def test_the_cli_and_dreamrc_forms_of_both_fields() -> None:
    mode = mode_from_cli("m", provider="p", fields=["image=x", "priority=10", "max_runtime=30m"])
    assert mode.fields == {"image": "x", "priority": 10, "max_runtime": "30m"}
    assert mode_from_cli("m", provider="p", fields=["max_runtime=90"]).fields == {"max_runtime": 90}
    with pytest.raises(ConfigError, match="mode.priority"):
        mode_from_cli("m", provider="p", fields=["priority=high"])
    cfg = parse_dreamrc(
        "providers:\n  p: !providers.Kube {}\nmodes:\n  m: {provider: p, image: x, priority: -5, max_runtime: 2h}\n"
    )
    got = build_launch_spec(
        provider=cfg.provider("p"), mode=cfg.mode("m"), body={"script": "x"}, instance_id=IID
    )
    assert (got.priority, got.max_runtime) == (-5, 7200)


# --- the spec's JSON --------------------------------------------------------------------------


def test_both_travel_in_the_spec_json() -> None:
    s = spec({"max_runtime": "2h"}, priority=10)
    data = s.to_json()
    assert data["priority"] == 10 and data["maxRuntime"] == 7200
    assert LaunchSpec.from_json(data) == s


def test_a_spec_at_the_defaults_is_the_json_it_always_was() -> None:
    s = spec()
    data = s.to_json()
    assert "priority" not in data and "maxRuntime" not in data
    old = dataclasses.replace(s, launch_uid=None)
    assert launch_annotation(LaunchSpec.from_json(old.to_json())) == launch_annotation(old)


def test_an_old_stored_spec_loads_with_the_defaults() -> None:
    old = {
        "instanceId": IID,
        "provider": "p",
        "ownerNamespace": "default",
        "namespace": "jobs",
        "image": "python:3.12",
        "script": "print(1)",
        "resources": None,
        "env": [],
        "nodeSelector": [],
        "tolerations": [],
        "serviceAccount": None,
        "imagePullSecrets": [],
        "labels": [],
    }
    loaded = LaunchSpec.from_json(old)
    assert loaded.priority == 0 and loaded.max_runtime is None
    assert loaded.to_json() == old


@pytest.mark.parametrize(
    ("key", "value"),
    [("priority", 5000), ("priority", "1"), ("priority", True), ("maxRuntime", 0), ("maxRuntime", "x")],
)
def test_a_spec_off_the_wire_is_checked(key: str, value: object) -> None:
    data = {**spec().to_json(), key: value}
    with pytest.raises(ValidationError) as err:
        LaunchSpec.from_json(data)
    assert err.value.field == f"spec.{key}"


# --- the render -------------------------------------------------------------------------------


def test_active_deadline_is_rendered_iff_max_runtime_is_set() -> None:
    assert "activeDeadlineSeconds" not in render_pod(spec())["spec"]
    assert "activeDeadlineSeconds" not in render_pod(spec(priority=9))["spec"]
    pod = render_pod(spec(fields={"max_runtime": "5s"}), node="n1", workdir_root="/var/lib/nymph")
    assert pod["spec"]["activeDeadlineSeconds"] == 5
    assert render_pod(spec({"max_runtime": "1d"}))["spec"]["activeDeadlineSeconds"] == 86_400


def test_priority_changes_nothing_in_the_pod() -> None:
    plain = render_pod(dataclasses.replace(spec(), launch_uid="u1"))
    high = render_pod(dataclasses.replace(spec(priority=50), launch_uid="u1"))
    assert plain == high


# --- a Pod past its deadline ------------------------------------------------------------------


def deadline_pod(*, deleting: bool = False) -> dict[str, Any]:
    """A Pod as the kubelet leaves it once ``activeDeadlineSeconds`` passed: Failed, reason
    DeadlineExceeded, its container killed (exit 137)."""
    pod: dict[str, Any] = {
        "metadata": {"name": IID, "namespace": "jobs"},
        "spec": {"activeDeadlineSeconds": 5, "nodeName": "n1"},
        "status": {
            "phase": "Failed",
            "reason": "DeadlineExceeded",
            "message": "Pod was active on the node longer than the specified deadline",
            "containerStatuses": [
                {
                    "name": "user",
                    "state": {
                        "terminated": {
                            "exitCode": 137,
                            "reason": "Error",
                            "containerID": "containerd://abc",
                        }
                    },
                }
            ],
        },
    }
    if deleting:
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return pod


def test_a_pod_past_its_deadline_is_stopped_deadline_exceeded() -> None:
    pod = deadline_pod()
    assert pod_state(pod) is InstanceState.STOPPED
    reason, message = pod_reason(pod)
    assert reason is Reason.DEADLINE_EXCEEDED and "deadline" in message
    assert Reason.DEADLINE_EXCEEDED.failed


def test_the_daemon_tracker_reports_it_so() -> None:
    decision = decide_event("MODIFIED", deadline_pod(), Track(namespace="jobs"))
    assert decision.report is not None
    assert decision.report.key == ("stopped", "DeadlineExceeded")
    assert decision.report.termination == (137, "Error", "")
    end = ended_report(deadline_pod(deleting=True))
    assert end is not None and end.key == ("stopped", "DeadlineExceeded")
    gone = decide_event("DELETED", deadline_pod(deleting=True), Track(namespace="jobs"))
    assert gone.report is not None and gone.report.key == ("stopped", "DeadlineExceeded")


def test_the_direct_path_reports_it_so() -> None:
    assert pod_change(deadline_pod(), deleted=False, stop_requested=False)[:2] == (
        "stopped",
        "DeadlineExceeded",
    )
    assert pod_change(deadline_pod(), deleted=True, stop_requested=False)[:2] == (
        "stopped",
        "DeadlineExceeded",
    )
    assert pod_change(deadline_pod(), deleted=True, stop_requested=True)[:2] == ("stopped", "Stopped")


# --- a namespace's runtime limits -------------------------------------------------------------


def test_the_default_fills_in_a_launch_that_names_none() -> None:
    s = spec()
    assert apply_runtime_limits(s, default=None, cap=None) is s
    assert apply_runtime_limits(s, default=3600, cap=None).max_runtime == 3600
    assert apply_runtime_limits(s, default=None, cap=7200).max_runtime is None
    assert apply_runtime_limits(s, default=10_800, cap=7200).max_runtime == 7200


def test_a_launch_within_the_cap_keeps_its_own() -> None:
    s = spec(fields={"max_runtime": "30m"})
    assert apply_runtime_limits(s, default=3600, cap=7200).max_runtime == 1800
    assert apply_runtime_limits(s, default=None, cap=1800).max_runtime == 1800


def test_a_launch_over_the_cap_is_refused_naming_the_field_and_the_cap() -> None:
    with pytest.raises(ValidationError) as err:
        apply_runtime_limits(spec(fields={"max_runtime": "3h"}), default=None, cap=7200)
    assert err.value.field == "launch.fields.max_runtime"
    assert str(err.value).startswith(
        "launch.fields.max_runtime: 3h is more than this namespace's maxRuntime 2h"
    )


@given(
    st.one_of(st.none(), st.integers(1, 10**6)),
    st.one_of(st.none(), st.integers(1, 10**6)),
    st.one_of(st.none(), st.integers(1, 10**6)),
)
def test_the_limits_hold_for_any_values(asked: int | None, default: int | None, cap: int | None) -> None:
    s = dataclasses.replace(spec(), max_runtime=asked)
    try:
        got = apply_runtime_limits(s, default=default, cap=cap)
    except ValidationError:
        assert asked is not None and cap is not None and asked > cap
        return
    if cap is not None and got.max_runtime is not None:
        assert got.max_runtime <= cap
    if cap is not None and default is not None:
        assert got.max_runtime is not None
    if asked is not None:
        assert got.max_runtime == asked
    elif default is not None:
        assert got.max_runtime == (default if cap is None else min(default, cap))
    assert dataclasses.replace(got, max_runtime=s.max_runtime) == s
