"""The render budget: interpolations of user input that multiply work or size are refused at the
step that spends the budget (counted, not timed), the render stops there, and renders of sane
input (and local renders, which have no budget) are unaffected."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from nymph.dockyard.errors import DockyardBudgetError, DockyardConfigError
from nymph.dockyard.render.task import dockyard_task_manifests
from nymph.dockyard.spec import budget
from nymph.dockyard.spec.budget import RenderBudget, limited
from nymph.dockyard.spec.interp import InterpolationContext, resolve

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
CTX = InterpolationContext(user="u", env={})


def _example(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return data


RECIPE = _example("dockyard-grpo-vllm.yaml")
INFRA = {k: v for k, v in _example("dockyard-grpo-vllm.infra.yaml").items() if k != "namespace"}


def doubling(levels: int, *, seed: str = "x", relative: bool = False) -> dict[str, Any]:
    """``b{n}: ${b{n-1}}${b{n-1}}``: the last key takes 2**levels resolutions unbudgeted
    (``${.b{n-1}}`` with ``relative``, for a bomb below the top level)."""
    dot = "." if relative else ""
    tree: dict[str, Any] = {"b0": seed}
    for n in range(1, levels):
        tree[f"b{n}"] = f"${{{dot}b{n - 1}}}${{{dot}b{n - 1}}}"
    return tree


def render(recipe: dict[str, Any], infra: dict[str, Any], spend: RenderBudget) -> list[dict[str, Any]]:
    return dockyard_task_manifests(recipe=recipe, infra=infra, overrides=[], namespace="jobs", budget=spend)


def test_the_shipped_examples_take_a_handful_of_steps() -> None:
    for name in ("vllm", "sglang"):
        infra = {k: v for k, v in _example(f"dockyard-grpo-{name}.infra.yaml").items() if k != "namespace"}
        spend = RenderBudget()
        render(_example(f"dockyard-grpo-{name}.yaml"), infra, spend)
        assert 0 < spend.steps <= 50 and spend.spent is None
        assert spend.chars < 10_000


@pytest.mark.parametrize("where", ["recipe", "infra"])
def test_a_doubling_bomb_stops_at_the_first_step_past_the_cap(where: str) -> None:
    """2**40 resolutions unbudgeted; refused after exactly max_steps + 1, in the recipe
    (lenient: unresolvable values are kept) and in the infra (strict) alike."""
    spend = RenderBudget(max_steps=500)
    bomb = doubling(40)
    recipe = {**RECIPE, **bomb} if where == "recipe" else RECIPE
    infra = (
        {**INFRA, "labels": {**INFRA["labels"], **doubling(40, relative=True)}} if where == "infra" else INFRA
    )
    with pytest.raises(DockyardBudgetError, match="more than 500 interpolation steps"):
        render(recipe, infra, spend)
    assert spend.steps == 501


def test_infra_scratch_bomb_is_dropped_unresolved() -> None:
    """Keys starting with ``_`` are dropped from the infra before resolution: a bomb there
    costs nothing unless something references it (as the test above does)."""
    spend = RenderBudget(max_steps=500)
    render(RECIPE, {**INFRA, "_b": doubling(40)}, spend)
    assert spend.steps < 50


def test_a_size_bomb_is_refused_by_the_resolved_size() -> None:
    """Few steps, large strings: 16 KiB doubled each level."""
    spend = RenderBudget(max_chars=1_000_000)
    with pytest.raises(DockyardBudgetError, match="more than 1000000 characters"):
        render({**RECIPE, **doubling(20, seed="y" * 16_384)}, INFRA, spend)
    assert spend.steps < 100
    assert spend.chars <= 1_000_000 + 2 * 16_384 * 2**7  # stopped at the first string past the cap


def test_a_bomb_through_resolver_defaults_is_counted_too() -> None:
    tree: dict[str, Any] = {"c0": "x"}
    for n in range(1, 40):
        tree[f"c{n}"] = f"${{oc.env:NOPE,${{c{n - 1}}}}}${{oc.env:NOPE,${{c{n - 1}}}}}"
    spend = RenderBudget(max_steps=300)
    with pytest.raises(DockyardBudgetError):
        render({**RECIPE, **tree}, INFRA, spend)
    assert spend.steps == 301


def test_the_budget_error_is_a_config_error_naming_the_cap() -> None:
    with pytest.raises(DockyardConfigError) as info:
        render({**RECIPE, **doubling(40)}, INFRA, RenderBudget(max_steps=100))
    assert isinstance(info.value, DockyardBudgetError)
    assert "nested ${...} references multiply" in str(info.value)


def test_the_render_thread_ends_when_the_budget_is_spent() -> None:
    """Run in a thread as the queue does: the thread is finished once the error is raised."""
    outcome: list[BaseException] = []

    def work() -> None:
        try:
            render({**RECIPE, **doubling(60)}, INFRA, RenderBudget())
        except DockyardBudgetError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=work, name="render-under-test")
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert len(outcome) == 1


def test_outside_a_budget_interpolations_resolve_in_full() -> None:
    """Local renders have no budget: a small doubling tree resolves completely."""
    assert budget.current() is None
    out = resolve(doubling(8), ctx=CTX, strict=True)
    assert out["b7"] == "x" * 128


def test_a_budget_is_scoped_to_its_block() -> None:
    spend = RenderBudget(max_steps=10)
    with limited(spend):
        assert budget.current() is spend
        with pytest.raises(DockyardBudgetError):
            resolve(doubling(10), ctx=CTX, strict=True)
    assert budget.current() is None
    resolve(doubling(6), ctx=CTX, strict=True)  # no budget again
