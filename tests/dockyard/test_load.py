"""Loading: files, anchors, interpolations, the four override layers, namespace inference."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.dockyard.errors import DockyardConfigError
from nymph.dockyard.render.manifests import render_manifests, to_yaml
from nymph.dockyard.spec.interp import InterpolationContext, resolve
from nymph.dockyard.spec.load import Environment, LoadedConfig, load_config, sanitize_user

Write = Callable[[str, str], Path]

RECIPE = """\
grpo:
  max_num_steps: 100
policy:
  model_name: qwen
"""

INFRA = """\
namespace: team-a
image: dockyard/img:1
launch:
  mode: attach
  attach: existing
"""


def load(
    write: Write,
    env: Environment,
    *,
    infra: str | None = INFRA,
    recipe: str = RECIPE,
    overrides: tuple[str, ...] = (),
) -> LoadedConfig:
    recipe_path = write("recipe.yaml", recipe)
    infra_path = write("run.infra.yaml", infra) if infra is not None else None
    return load_config(recipe_path=recipe_path, infra_path=infra_path, overrides=overrides, environment=env)


def failure(write: Write, env: Environment, **kw: Any) -> DockyardConfigError:
    with pytest.raises(DockyardConfigError) as info:
        load(write, env, **kw)
    return info.value


# -- files --------------------------------------------------------------------------------


def test_infra_file_and_recipe(write: Write, env: Environment) -> None:
    loaded = load(write, env)
    assert loaded.infra.namespace == "team-a"
    assert loaded.recipe == {"grpo": {"max_num_steps": 100}, "policy": {"model_name": "qwen"}}
    assert loaded.infra_source.endswith("run.infra.yaml")
    assert loaded.namespace_source == "infra"


def test_infra_block_in_the_recipe(write: Write, env: Environment) -> None:
    block = "infra:\n" + "".join(f"  {line}\n" for line in INFRA.splitlines())
    loaded = load(write, env, infra=None, recipe=RECIPE + block)
    assert loaded.infra.image == "dockyard/img:1"
    assert "infra" not in loaded.recipe
    assert loaded.infra_source.endswith("recipe.yaml (infra:)")


def test_infra_in_both_places_is_an_error(write: Write, env: Environment) -> None:
    err = failure(write, env, recipe=RECIPE + "infra:\n  image: x\n")
    assert err.path == "infra"
    assert err.source is not None and err.source.endswith("recipe.yaml")
    assert "use one" in err.message


def test_wrapped_infra_file(write: Write, env: Environment) -> None:
    wrapped = "infra:\n" + "".join(f"  {line}\n" for line in INFRA.splitlines())
    assert load(write, env, infra=wrapped).infra.image == "dockyard/img:1"


def test_wrapped_infra_file_with_stray_keys(write: Write, env: Environment) -> None:
    wrapped = "grpo: {}\ninfra:\n  image: x\n"
    assert "unexpected top-level keys next to infra: grpo" in str(failure(write, env, infra=wrapped))


def test_missing_file(write: Write, env: Environment, tmp_path: Path) -> None:
    with pytest.raises(DockyardConfigError, match="no such file") as info:
        load_config(recipe_path=tmp_path / "nope.yaml", environment=env)
    assert info.value.source == str(tmp_path / "nope.yaml")


def test_duplicate_keys_are_an_error(write: Write, env: Environment) -> None:
    err = failure(write, env, infra=INFRA + "image: other\n")
    assert "duplicate key 'image' (first at line 2)" in err.message
    assert err.message.startswith("line 6:")


def test_invalid_yaml(write: Write, env: Environment) -> None:
    err = failure(write, env, infra="image: [unclosed\n")
    assert err.source is not None and err.source.endswith("run.infra.yaml")
    assert err.message.startswith("line ")


def test_recipe_defaults_inheritance(write: Write, env: Environment) -> None:
    write("base.yaml", "grpo:\n  max_num_steps: 5\n  seed: 1\npolicy:\n  model_name: base\n")
    loaded = load(write, env, recipe="defaults: base.yaml\ngrpo:\n  max_num_steps: 7\n")
    assert loaded.recipe == {"grpo": {"max_num_steps": 7, "seed": 1}, "policy": {"model_name": "base"}}


def test_defaults_cycle(write: Write, env: Environment) -> None:
    write("a.yaml", "defaults: recipe.yaml\n")
    assert "inheritance cycle" in str(failure(write, env, recipe="defaults: a.yaml\n"))


# -- anchors --------------------------------------------------------------------------------


ANCHORED = """\
_anchors:
  shm: &shm
    - {name: dshm, mountPath: /dev/shm}
  vol: &vol
    - {name: dshm, emptyDir: {medium: Memory}}
namespace: team-a
image: img:1
launch: {mode: bringup}
kuberay:
  name: grpo
  spec:
    headGroupSpec:
      template:
        spec:
          containers: [{name: head, volumeMounts: *shm}]
          volumes: *vol
    workerGroupSpecs:
      - groupName: trainer
        replicas: 1
        template:
          spec:
            containers: [{name: w, volumeMounts: *shm}]
            volumes: *vol
      - groupName: inference
        replicas: 1
        template:
          spec:
            containers: [{name: w, volumeMounts: *shm}]
            volumes: *vol
"""


def test_anchors_are_dropped_and_aliases_are_independent(write: Write, env: Environment) -> None:
    loaded = load(write, env, infra=ANCHORED + "checkpoints: {kind: pvc, pvcName: ck}\n")
    text = to_yaml(render_manifests(infra=loaded.infra))
    assert "_anchors" not in text
    assert "&id" not in text and "*id" not in text
    spec = yaml.safe_load(text)["spec"]
    head_mounts = spec["headGroupSpec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert [m["name"] for m in head_mounts] == ["dshm", "checkpoints"]
    volumes = spec["workerGroupSpecs"][0]["template"]["spec"]["volumes"]
    assert [v["name"] for v in volumes] == ["dshm", "checkpoints"]


def test_any_underscore_scratch_key_is_dropped(write: Write, env: Environment) -> None:
    loaded = load(write, env, infra="_shared: &img img:9\n" + INFRA.replace("dockyard/img:1", "*img"))
    assert loaded.infra.image == "img:9"


def test_recipe_anchors_key_is_dropped(write: Write, env: Environment) -> None:
    loaded = load(write, env, recipe="_anchors:\n  s: &s 3\n" + RECIPE + "extra: *s\n")
    assert "_anchors" not in loaded.recipe
    assert loaded.recipe["extra"] == 3


# -- interpolations ---------------------------------------------------------------------------


def test_user_and_env_interpolations(write: Write, env: Environment) -> None:
    env = dataclasses.replace(env, env={"TEAM": "vision"}, user="jo-smith")
    infra = INFRA + (
        "labels:\n"
        "  owner: ${user:}\n"
        "  team: ${oc.env:TEAM}\n"
        "  tier: ${oc.env:TIER,gold}\n"
        "  both: ${oc.env:NOPE,${user:}}-x\n"
    )
    labels = load(write, env, infra=infra).infra.labels
    assert labels == {"owner": "jo-smith", "team": "vision", "tier": "gold", "both": "jo-smith-x"}


def test_missing_env_var_names_the_key_and_file(write: Write, env: Environment) -> None:
    err = failure(write, env, infra=INFRA + "labels:\n  team: ${oc.env:TEAM}\n")
    assert err.path == "infra.labels.team"
    assert err.source is not None and err.source.endswith("run.infra.yaml")
    assert "environment variable TEAM is not set" in err.message


def test_references_keep_their_type(write: Write, env: Environment) -> None:
    infra = INFRA + ("sandbox:\n  port: 8000\n  replicas: ${sandbox.port}\n  name: pool-${.port}\n")
    sandbox = load(write, env, infra=infra).infra.sandbox
    assert sandbox is not None
    assert (sandbox.replicas, sandbox.name) == (8000, "pool-8000")


def test_infra_references_fall_back_to_the_recipe(write: Write, env: Environment) -> None:
    loaded = load(write, env, infra=INFRA + "labels:\n  model: ${policy.model_name}\n")
    assert loaded.infra.labels == {"model": "qwen"}


def test_unknown_reference_is_an_error(write: Write, env: Environment) -> None:
    err = failure(write, env, infra=INFRA + "labels:\n  x: ${nowhere.key}\n")
    assert err.path == "infra.labels.x"
    assert "no key nowhere.key in infra" in err.message


def test_circular_reference(write: Write, env: Environment) -> None:
    err = failure(write, env, infra=INFRA + "labels:\n  a: ${labels.b}\n  b: ${labels.a}\n")
    assert "circular interpolation" in err.message


def test_unknown_resolver_in_infra_is_an_error(write: Write, env: Environment) -> None:
    err = failure(write, env, infra=INFRA + "labels:\n  x: ${mul:2,3}\n")
    assert "unknown resolver 'mul'" in err.message
    assert "supported: user, oc.env" in err.message


def test_recipe_keeps_resolvers_it_does_not_know(write: Write, env: Environment) -> None:
    recipe = RECIPE + "grpo2:\n  steps: ${mul:${grpo.max_num_steps},2}\n  copy: ${grpo.max_num_steps}\n"
    loaded = load(write, env, recipe=recipe)
    assert loaded.recipe["grpo2"] == {"steps": "${mul:${grpo.max_num_steps},2}", "copy": 100}


def test_escaped_interpolation_is_literal() -> None:
    ctx = InterpolationContext(user="u", env={})
    assert resolve({"a": "\\${user:}"}, ctx=ctx) == {"a": "${user:}"}


def test_interpolation_of_a_mapping_inside_text_is_an_error() -> None:
    ctx = InterpolationContext(user="u", env={})
    with pytest.raises(DockyardConfigError, match="cannot be part of a string"):
        resolve({"m": {"k": 1}, "s": "x-${m}"}, ctx=ctx, label="infra")


def test_relative_parent_reference() -> None:
    ctx = InterpolationContext(user="u", env={})
    tree = {"name": "top", "inner": {"deeper": {"x": "${..y}"}, "y": 2}}
    assert resolve(tree, ctx=ctx)["inner"]["deeper"]["x"] == 2


def test_null_env_default() -> None:
    ctx = InterpolationContext(user="u", env={})
    assert resolve({"a": "${oc.env:X,null}"}, ctx=ctx) == {"a": None}


@pytest.mark.parametrize(
    ("raw", "clean"),
    [("Jo_Smith", "jo-smith"), ("first.last", "first-last"), ("__", "unknown"), ("a" * 80, "a" * 63)],
)
def test_user_names_are_sanitized(raw: str, clean: str) -> None:
    assert sanitize_user(raw) == clean


# -- layers -------------------------------------------------------------------------------------


def test_layer_order(write: Write, env: Environment) -> None:
    user_defaults = env.home / ".config" / "dockyard-k8s" / "defaults.yaml"
    user_defaults.parent.mkdir(parents=True)
    user_defaults.write_text(
        "infra:\n  scheduler: {kind: kai, queue: from-user}\n  priorityClassName: user-prio\n"
        "  serviceAccount: user-sa\n"
    )
    infra = INFRA + "scheduler: {queue: from-infra}\nserviceAccount: infra-sa\n"
    loaded = load(write, env, infra=infra, overrides=("infra.serviceAccount=cli-sa",))
    # shipped defaults: workspace kind; user defaults: priority + kai; infra file: queue; CLI: sa
    assert loaded.infra.workspace.kind.value == "rayUpload"
    assert loaded.infra.priorityClassName == "user-prio"
    assert loaded.infra.scheduler.kind.value == "kai"
    assert loaded.infra.scheduler.queue == "from-infra"
    assert loaded.infra.serviceAccount == "cli-sa"


def test_user_defaults_from_the_environment_variable(write: Write, env: Environment) -> None:
    path = write("team-defaults.yaml", "priorityClassName: team-prio\n")
    env = dataclasses.replace(env, env={"DOCKYARD_K8S_DEFAULTS": str(path)})
    assert load(write, env).infra.priorityClassName == "team-prio"


def test_named_user_defaults_must_exist(write: Write, env: Environment, tmp_path: Path) -> None:
    env = dataclasses.replace(env, env={"DOCKYARD_K8S_DEFAULTS": str(tmp_path / "gone.yaml")})
    err = failure(write, env)
    assert err.source == str(tmp_path / "gone.yaml")
    assert "DOCKYARD_K8S_DEFAULTS" in err.message


def test_unknown_key_names_the_layer_that_set_it(write: Write, env: Environment) -> None:
    path = write("team-defaults.yaml", "sandbox:\n  replica: 3\n")
    env = dataclasses.replace(env, env={"DOCKYARD_K8S_DEFAULTS": str(path)})
    err = failure(write, env, infra=INFRA + "sandbox: {port: 9000}\n")
    assert err.source == str(path)
    assert err.path == "infra.sandbox.replica"
    assert "allowed: annotations, env, healthCheckTimeoutS, injectUrls" in err.message


def test_overrides_parse_values_as_yaml(write: Write, env: Environment) -> None:
    loaded = load(
        write,
        env,
        overrides=(
            "infra.sandbox.replicas=4",
            "infra.imagePullSecrets=[a, b]",
            "infra.sandbox.injectUrls=false",
            "grpo.max_num_steps=10",
            "+grpo.new_key=hello world",
            "~policy",
        ),
    )
    assert loaded.infra.sandbox is not None
    assert loaded.infra.sandbox.replicas == 4
    assert loaded.infra.sandbox.injectUrls is False
    assert loaded.infra.imagePullSecrets == ("a", "b")
    assert loaded.recipe == {"grpo": {"max_num_steps": 10, "new_key": "hello world"}}


def test_override_error_names_the_override(write: Write, env: Environment) -> None:
    err = failure(write, env, overrides=("infra.sandbox.replica=3",))
    assert err.source == "override 'infra.sandbox.replica=3'"
    assert err.path == "infra.sandbox.replica"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("infra=3", "set a key below infra"),
        ("novalue", "expected KEY=VALUE"),
        ("a..b=1", "malformed key"),
        ("~grpo.missing", "no such key to delete"),
        ("grpo.max_num_steps.x=1", "not a mapping"),
    ],
)
def test_bad_overrides(write: Write, env: Environment, text: str, fragment: str) -> None:
    err = failure(write, env, overrides=(text,))
    assert fragment in err.message
    assert err.source == f"override {text!r}"


def test_override_indexes_lists(write: Write, env: Environment) -> None:
    infra = INFRA + "placement:\n  tolerations: [{key: a}, {key: b}]\n"
    loaded = load(write, env, infra=infra, overrides=("infra.placement.tolerations.1.key=c",))
    assert [t.key for t in loaded.infra.placement.tolerations] == ["a", "c"]


# -- namespace inference ---------------------------------------------------------------------------


NO_NS = INFRA.replace("namespace: team-a\n", "")

KUBECONFIG = """\
current-context: {current}
contexts:
  - name: dev
    context: {{cluster: c, namespace: from-dev}}
  - name: prod
    context: {{cluster: c}}
"""


def test_namespace_from_the_kube_context(write: Write, env: Environment) -> None:
    kc = write("kubeconfig", KUBECONFIG.format(current="dev"))
    loaded = load(write, dataclasses.replace(env, kubeconfigs=(kc,)), infra=NO_NS)
    assert loaded.infra.namespace == "from-dev"
    assert loaded.namespace_source.startswith("kube context 'dev'")


def test_kubeconfig_from_the_environment_first_file_wins(write: Write, env: Environment) -> None:
    first = write("kc1", "current-context: dev\n")
    second = write("kc2", KUBECONFIG.format(current="prod"))
    env = dataclasses.replace(env, kubeconfigs=None, env={"KUBECONFIG": f"{first}:{second}"})
    assert load(write, env, infra=NO_NS).infra.namespace == "from-dev"


def test_kubeconfig_in_home(write: Write, env: Environment) -> None:
    (env.home / ".kube").mkdir()
    (env.home / ".kube" / "config").write_text(KUBECONFIG.format(current="dev"))
    env = dataclasses.replace(env, kubeconfigs=None)
    assert load(write, env, infra=NO_NS).infra.namespace == "from-dev"


def test_namespace_from_the_service_account(write: Write, env: Environment) -> None:
    kc = write("kubeconfig", KUBECONFIG.format(current="prod"))  # context without a namespace
    sa = write("sa-namespace", "in-pod\n")
    loaded = load(write, dataclasses.replace(env, kubeconfigs=(kc,), sa_namespace_path=sa), infra=NO_NS)
    assert loaded.infra.namespace == "in-pod"
    assert loaded.namespace_source.startswith("service account")


def test_namespace_default(write: Write, env: Environment) -> None:
    broken = write("kubeconfig", ": not yaml [")
    loaded = load(write, dataclasses.replace(env, kubeconfigs=(broken,)), infra=NO_NS)
    assert (loaded.infra.namespace, loaded.namespace_source) == ("default", "fallback")


def test_explicit_namespace_wins(write: Write, env: Environment) -> None:
    kc = write("kubeconfig", KUBECONFIG.format(current="dev"))
    assert load(write, dataclasses.replace(env, kubeconfigs=(kc,))).infra.namespace == "team-a"


def test_loading_is_deterministic(write: Write, env: Environment) -> None:
    first = load(write, env, infra=ANCHORED)
    second = load(write, env, infra=ANCHORED)
    assert first == second
    assert to_yaml(render_manifests(infra=first.infra)) == to_yaml(render_manifests(infra=second.infra))


# -- errors name the user's file ------------------------------------------------------------------


RAYJOB_INFRA = """\
namespace: team-a
image: img:1
launch: {mode: rayjob, entrypoint: ""}
kuberay: {name: grpo, spec: {}}
"""


@pytest.mark.parametrize("infra", [RAYJOB_INFRA, RAYJOB_INFRA.replace(', entrypoint: ""', "")])
def test_empty_entrypoint_is_reported_against_the_users_infra(
    write: Write, env: Environment, infra: str
) -> None:
    err = failure(write, env, infra=infra)
    assert err.path == "infra.launch.entrypoint"
    assert err.source is not None and err.source.endswith("run.infra.yaml")
    assert "defaults.yaml" not in str(err)
