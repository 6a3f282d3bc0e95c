from __future__ import annotations

import pytest

from nymph.errors import ConfigError
from nymph.launch.config import Mode, Provider, check_launcher
from nymph.launch.dreamrc import (
    load_dreamrc,
    mode_from_cli,
    parse_assignments,
    parse_dreamrc,
    parse_value,
    provider_from_cli,
)


@pytest.mark.parametrize("bad", ["k8s", "K8S", "local", "kube", "KUBE", " Kube", "Kube ", "", None])
def test_only_the_exact_launcher_name_is_accepted(bad: object) -> None:
    with pytest.raises(ConfigError, match="only launcher is 'Kube'"):
        check_launcher(bad)


def test_kube_is_accepted() -> None:
    assert check_launcher("Kube") == "Kube"
    assert Provider(name="p").launcher == "Kube"


def test_provider_namespace_defaults_to_default() -> None:
    assert Provider(name="p").namespace == "default"
    assert Provider(name="p", kwargs={"namespace": "lakeshore"}).namespace == "lakeshore"


def test_name_kwarg_is_not_read_but_unknown_kwargs_are_errors() -> None:
    p = Provider(name="real", kwargs={"name": "ignored", "context": "c"})
    assert p.name == "real"
    assert "name" not in p.to_json()["kwargs"]
    with pytest.raises(ConfigError, match="unknown kwarg.*colour"):
        Provider(name="p", kwargs={"colour": "x"})


def test_unknown_mode_field_is_named() -> None:
    with pytest.raises(ConfigError, match="unknown field.*gpu_count"):
        Mode(name="m", fields={"gpu_count": 1})


def test_cli_forms_parse_structures() -> None:
    p = provider_from_cli("my-cluster", launcher="Kube", kwargs=["context=prod-east", "namespace=lakeshore"])
    assert p.kwargs == {"context": "prod-east", "namespace": "lakeshore"}
    m = mode_from_cli(
        "gpu",
        provider="my-cluster",
        fields=[
            'resources={"limits":{"cpu":"4"}}',
            "node_selector={gpu: a100}",
            "image=python:3.12",
            "env={N: 4}",
        ],
    )
    assert m.fields["resources"] == {"limits": {"cpu": "4"}}
    assert m.fields["node_selector"] == {"gpu": "a100"}
    assert m.fields["image"] == "python:3.12"
    assert m.fields["env"] == {"N": 4}
    with pytest.raises(ConfigError, match="only launcher"):
        provider_from_cli("x", launcher="k8s", kwargs=[])


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8", 8),
        ("true", True),
        ("[a, b]", ["a", "b"]),
        ("hello", "hello"),
        ("a: b: c", "a: b: c"),
        ("", ""),
        ("null", None),
        ("1.5", 1.5),
    ],
)
def test_parse_value(text: str, value: object) -> None:
    assert parse_value(text) == value


def test_parse_assignments_rejects_missing_equals() -> None:
    with pytest.raises(ConfigError, match="--kwarg 'context': expected KEY=VALUE"):
        parse_assignments(["context"], flag="--kwarg")
    assert parse_assignments(["a=b=c"], flag="--field") == {"a": "b=c"}


DREAMRC = """
providers:
  my-cluster: !providers.Kube
    context: prod-east
    namespace: lakeshore
  other: !providers.Kube {}
modes:
  k8s-gpu:
    provider: my-cluster
    image: pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime
    resources: {limits: {nvidia.com/gpu: 1}}
    node_selector: {gpu: a100}
"""


def test_dreamrc_mapping_form() -> None:
    cfg = parse_dreamrc(DREAMRC)
    assert cfg.provider("my-cluster").kwargs == {"context": "prod-east", "namespace": "lakeshore"}
    assert cfg.provider("other").namespace == "default"
    mode = cfg.mode("k8s-gpu")
    assert mode.provider == "my-cluster"
    assert mode.fields["node_selector"] == {"gpu": "a100"}
    assert cfg.provider_for(mode).name == "my-cluster"


def test_dreamrc_list_form_with_name_and_launcher_key() -> None:
    cfg = parse_dreamrc(
        """
providers:
  - !providers.Kube {name: a, namespace: x}
  - {name: b, launcher: Kube}
modes:
  - {name: m, image: busybox}
"""
    )
    assert sorted(cfg.providers) == ["a", "b"]
    assert cfg.providers["a"].kwargs.get("namespace") == "x"
    with pytest.raises(ConfigError, match="names no provider and there are 2"):
        cfg.provider_for(cfg.mode("m"))
    assert cfg.provider_for(cfg.mode("m"), "b").name == "b"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("providers:\n  p: !providers.K8s {}\n", "launcher 'K8s' is not supported"),
        ("providers:\n  p: !providers.kube {}\n", "launcher 'kube' is not supported"),
        ("providers:\n  p: {context: x}\n", "tag the entry '!providers.Kube'"),
        ("providers:\n  p: !providers.Kube {imag: x}\n", "unknown kwarg"),
        ("modes:\n  m: {provider: nope, image: x}\n", "provider 'nope' is not defined"),
        ("providers: [1, 2\n", "not valid YAML at line"),
        ("- a\n- b\n", "expected a mapping"),
        ("modes:\n  m: {imag: x}\n", "unknown field"),
    ],
)
def test_dreamrc_errors_are_clear(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_dreamrc(text, source="test.dreamrc")


def test_a_yaml_error_in_a_dreamrc_names_its_line_column_and_reason_but_not_its_text() -> None:
    text = "server:\n  token: nyq_secret-token-value\n  url: http://q: x\n"
    with pytest.raises(ConfigError) as err:
        parse_dreamrc(text, source="test.dreamrc")
    message = str(err.value)
    assert "at line 3, column 16: mapping values are not allowed here" in message
    assert "nyq_secret" not in message


def test_dreamrc_does_not_execute_python_tags() -> None:
    with pytest.raises(ConfigError):
        parse_dreamrc("providers: !!python/object/apply:os.system ['echo pwned']\n")


def test_load_dreamrc_missing_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="no such file"):
        load_dreamrc(tmp_path / "nope")


def test_unknown_names_list_the_known_ones() -> None:
    cfg = parse_dreamrc(DREAMRC)
    with pytest.raises(ConfigError, match=r"no mode named 'x' \(known: k8s-gpu\)"):
        cfg.mode("x")
