"""Property tests for the formats where quoting goes wrong easily."""

from __future__ import annotations

import json
import shlex
from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from nymph.dockyard.render import fleets
from nymph.dockyard.spec.interp import InterpolationContext, resolve
from nymph.dockyard.spec.overrides import apply_override, parse_override

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCXYZ0123456789_-./:", min_size=1, max_size=20)
amounts = st.one_of(st.integers(min_value=0, max_value=10**6), st.floats(0, 1e6, allow_nan=False))
resources = st.dictionaries(names, amounts, max_size=6)


@given(resources)
def test_ray_resources_round_trip_in_every_authored_form(data: dict[str, Any]) -> None:
    bare = json.dumps(data)
    single = fleets.format_resources(data, where="x")
    double = '"' + bare.replace("\\", "\\\\").replace('"', '\\"') + '"'
    for form in (bare, single, double):
        assert fleets.parse_resources(form, where="x") == data


@given(resources)
def test_ray_resources_survive_the_ray_start_shell_command(data: dict[str, Any]) -> None:
    # KubeRay builds `ray start ... --resources=<value>` and runs it through a shell.
    value = fleets.format_resources(data, where="x")
    words = shlex.split(f"ray start --resources={value} --block")
    assert words[0:2] == ["ray", "start"] and words[-1] == "--block"
    assert len(words) == 4
    assert json.loads(words[2].removeprefix("--resources=")) == data


@given(st.text(max_size=40).filter(lambda s: "${" not in s))
def test_text_without_interpolations_is_unchanged(text: str) -> None:
    ctx = InterpolationContext(user="u", env={})
    assert resolve({"k": text, "l": [text]}, ctx=ctx) == {"k": text, "l": [text]}


@given(
    st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), min_size=1, max_size=4),
    st.one_of(st.integers(), st.booleans(), st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)),
)
def test_override_sets_the_value_at_the_path(path: list[str], value: Any) -> None:
    assume(path[0] != "infra")  # infra.* targets the other tree
    assume(value not in ("null", "true", "false", "yes", "no", "on", "off"))  # YAML keywords
    text = ".".join(path) + "=" + (json.dumps(value) if not isinstance(value, str) else value)
    override = parse_override(text)
    assert override.target == "recipe"
    tree: dict[str, Any] = {}
    apply_override(tree, override)
    node: Any = tree
    for part in path:
        node = node[part]
    assert node == value
