"""Configuration that lakeshore users bring unchanged: the provider named as a
mode field, ``name`` kwargs ignored, kwargs merged provider then mode, and a launch that cannot
change the connection."""

from __future__ import annotations

import logging

import pytest

from nymph.errors import ConfigError, ValidationError
from nymph.launch.config import Mode, Provider, check_dispatch_kwargs, connection_kwargs
from nymph.launch.dreamrc import mode_from_cli, parse_dreamrc
from nymph.launch.spec import build_launch_spec

IID = "lakeshore-0123abcd"

LAKESHORE_DREAMRC = """
providers:
  my-cluster: !providers.Kube
    name: my-cluster
    context: prod-east
    namespace: lakeshore
    image: ghcr.io/acme/base:1
modes:
  k8s-gpu:
    name: k8s-gpu
    provider: my-cluster
    image: ghcr.io/acme/train:1.4
    namespace: lakeshore-gpu
    resources: {limits: {nvidia.com/gpu: 1}}
  plain:
    fields: {provider: my-cluster}
"""


def test_provider_given_as_a_field_works_like_the_flag() -> None:
    by_field = mode_from_cli("k8s-gpu", provider=None, fields=["provider=my-cluster", "image=py:3"])
    by_flag = mode_from_cli("k8s-gpu", provider="my-cluster", fields=["image=py:3"])
    assert by_field == by_flag
    assert by_field.provider == "my-cluster" and by_field.fields == {"image": "py:3"}
    assert mode_from_cli("m", provider="p", fields=["provider=p"]).provider == "p"
    with pytest.raises(ConfigError, match="differs from the provider 'q'"):
        mode_from_cli("m", provider="q", fields=["provider=p"])


def test_name_kwarg_is_ignored_with_a_debug_log(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="nymph.launch.config"):
        p = Provider(name="real", kwargs={"name": "other", "namespace": "ns"})
        m = Mode(name="m", fields={"name": "x", "image": "py"})
    assert "name" not in p.kwargs and "name" not in m.fields
    assert sum("'name' is not read" in r.getMessage() for r in caplog.records) == 2


def test_lakeshore_dreamrc_is_accepted_and_merges_provider_then_mode() -> None:
    cfg = parse_dreamrc(LAKESHORE_DREAMRC)
    provider, gpu = cfg.provider("my-cluster"), cfg.mode("k8s-gpu")
    assert cfg.mode("plain").provider == "my-cluster"
    assert connection_kwargs(provider, gpu) == {"context": "prod-east", "namespace": "lakeshore-gpu"}
    spec = build_launch_spec(provider=provider, mode=gpu, body={"script": "print(1)"}, instance_id=IID)
    assert spec.image == "ghcr.io/acme/train:1.4"  # the mode wins
    assert spec.namespace == "lakeshore-gpu"
    plain = build_launch_spec(
        provider=provider, mode=cfg.mode("plain"), body={"script": "print(1)"}, instance_id=IID
    )
    assert plain.image == "ghcr.io/acme/base:1" and plain.namespace == "lakeshore"  # from the provider


def test_a_launch_body_cannot_change_the_connection() -> None:
    provider = Provider(name="p", kwargs={"namespace": "lakeshore"}, dispatch="direct")
    mode = Mode(name="m", fields={"image": "py"})
    for key in ("namespace", "context", "kubeconfig"):
        with pytest.raises(ValidationError, match=f"launch.fields.{key}"):
            build_launch_spec(
                provider=provider,
                mode=mode,
                body={"script": "x", "fields": {key: "elsewhere"}},
                instance_id=IID,
            )


def test_direct_is_the_default_dispatch() -> None:
    assert Provider(name="p").dispatch == "direct" and Provider(name="p").direct
    cfg = parse_dreamrc(LAKESHORE_DREAMRC)
    assert cfg.provider("my-cluster").dispatch == "direct"
    assert (
        parse_dreamrc("providers:\n  d: !providers.Kube {dispatch: daemon}\n").provider("d").dispatch
        == "daemon"
    )


def test_daemon_providers_refuse_connection_kwargs() -> None:
    daemon = Provider(name="d", kwargs={"context": "prod"}, dispatch="daemon")
    with pytest.raises(ConfigError, match="means nothing on a 'dispatch: daemon' provider"):
        check_dispatch_kwargs(daemon)
    ok = Provider(name="d", kwargs={"namespace": "x"}, dispatch="daemon")
    check_dispatch_kwargs(ok)
    with pytest.raises(ConfigError, match="mode 'm': kubeconfig"):
        check_dispatch_kwargs(ok, Mode(name="m", fields={"kubeconfig": "/k"}))
    check_dispatch_kwargs(Provider(name="x", kwargs={"context": "c"}, dispatch="direct"))
