"""``optim.warmup_start_ratio``: a warmup that starts from a fraction of the learning rate, as
NeMo RL's recipes do (``LinearLR`` with ``start_factor: 0.1``). The native engine runs it, NeMo
RL reads it as its start factor, the engines that warm up from 0 refuse it, and a start of 0
(or no warmup) is the experiment without one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stateset_backend.common.errors import Unsupported
from stateset_backend.contracts.capabilities import required_capabilities
from stateset_backend.engines.registry import build_registry
from stateset_backend.importing.launch import import_file
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.digest import experiment_digest
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.spec.schedule import lr_factor

ROOT = Path(__file__).parent.parent
RECIPES = ROOT / "examples" / "recipes"
NEMO_RL = RECIPES / "nemo-rl-grpo_math_1B.json"


def _doc(path: Path = NEMO_RL, **optim: object) -> dict:
    """The NeMo RL recipe (which warms up from 0.1 as NeMo RL's own does) with ``optim``
    changed; a warmup from 0 unless the start is given."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["optim"].pop("warmup_start_ratio", None)
    doc["optim"].update(optim)
    return doc


def _spec(**optim: object) -> ExperimentSpec:
    return ExperimentSpec.model_validate(_doc(**optim))


def test_a_start_that_changes_nothing_is_the_experiment_without_one():
    base = experiment_digest(_spec(warmup_steps=10))
    for start in (None, 0, 0.0, -0.0, False, "0"):  # however the input spells a zero
        spec = _spec(warmup_steps=10, warmup_start_ratio=start)
        assert spec.optim.warmup_start_ratio is None and experiment_digest(spec) == base
    for steps in (0, 0.0, False, "0"):
        no_warmup = _spec(warmup_steps=steps, warmup_start_ratio=0.1)
        assert no_warmup.optim.warmup_start_ratio is None
        assert experiment_digest(no_warmup) == experiment_digest(_spec(warmup_steps=0))
    started = _spec(warmup_steps=10, warmup_start_ratio=0.1)
    assert experiment_digest(started) != base
    assert "warmup_start" in required_capabilities(started)
    assert "warmup_start" not in required_capabilities(_spec(warmup_steps=10))


def test_the_schedule_starts_at_the_ratio_and_reaches_lr_at_the_end_of_warmup():
    got = [lr_factor(u, schedule="constant", warmup=4, total=10, min_lr_ratio=0.0,
                     warmup_start=0.2) for u in range(6)]
    assert got == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0, 1.0])
    # without a start, bit for bit the schedule every earlier run had
    assert [lr_factor(u, schedule="cosine", warmup=3, total=9, min_lr_ratio=0.1)
            for u in range(3)] == [u / 3 for u in range(3)]


def test_the_native_engine_steps_its_optimizer_at_those_rates(tmp_path):
    import torch

    from stateset_backend.native.learner import make_optimizer

    model = torch.nn.Linear(2, 1)
    optim = _spec(lr=0.5, warmup_steps=4, warmup_start_ratio=0.2, schedule="constant").optim
    optimizer, scheduler = make_optimizer(model, optim, total_updates=10)
    seen = []
    for _ in range(5):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])


def test_nemo_rl_reads_it_as_linear_lr_start_factor(engine_reads):
    """The start is LinearLR's own ``start_factor``: the plan needs no deviation for it, where
    a warmup from 0 keeps the declared 1e-8 stand-in torch requires."""
    registry = build_registry()
    started = make_plan(_spec(warmup_steps=10, warmup_start_ratio=0.1), registry.get("nemo-rl"),
                        "0.7.0", base_dir=RECIPES)
    ramp = started.native["policy.scheduler"][0]
    assert ramp["name"] == "torch.optim.lr_scheduler.LinearLR"
    assert ramp["kwargs"] == {"start_factor": 0.1, "end_factor": 1.0, "total_iters": 10}
    assert engine_reads(started)["policy.scheduler"][0]["kwargs"]["start_factor"] == 0.1
    assert not [d for d in started.deviations if d["deviation"] == "warmup_start_factor"]
    from_zero = make_plan(_spec(warmup_steps=10), registry.get("nemo-rl"), "0.7.0",
                          base_dir=RECIPES)
    assert from_zero.native["policy.scheduler"][0]["kwargs"]["start_factor"] == 1e-8
    assert [d for d in from_zero.deviations if d["deviation"] == "warmup_start_factor"]


def test_nemo_rl_refuses_a_start_its_scheduler_would_overflow_on(explained):
    """torch's LinearLR divides by its start factor: 1e-310 gives an infinite rate."""
    row = explained(_spec(warmup_steps=4, warmup_start_ratio=1e-310), "nemo-rl", "0.7.0",
                    "optim.warmup_start_ratio")
    assert row.state == "refused" and "overflows" in row.reason


@pytest.mark.parametrize(("engine", "version", "why"), [
    ("verl", "0.9.1", "verl's schedulers warm up from 0"),
    ("openrlhf", "0.11.2", "OpenRLHF's schedulers"),
])
def test_an_engine_that_warms_up_from_zero_refuses_it(explained, engine, version, why):
    spec = _spec(warmup_steps=10, warmup_start_ratio=0.1)
    with pytest.raises(Unsupported, match="missing warmup_start"):
        make_plan(spec, build_registry().get(engine), version, base_dir=RECIPES)
    row = explained(spec, engine, version, "optim.warmup_start_ratio")
    assert row.state == "refused" and why in row.reason


def test_a_nemo_rl_recipe_imports_with_its_warmup_start():
    """Every recipe built on grpo_math_1B.yaml warms up from a tenth of the rate; the
    llama 3.1 recipe writes its own 13-update ramp: the spec keeps both numbers, and the plan
    gives the scheduler list back as NeMo RL reads it. DAPO's start_factor 1e-8 reads as a
    warmup from 0 with the release's declared stand-in, the spec more engines can run."""
    registry = build_registry()
    recipe = RECIPES / "nemo-rl-v0.7.0" / "recipes" / "llm" / \
        "grpo-llama3.1-8b-instruct-2n8g-fsdp2tp1-noncolocated.yaml"
    doc = import_file(registry, "nemo-rl", recipe, "0.7.0").to_json()
    assert (doc["spec"]["optim"]["warmup_steps"],
            doc["spec"]["optim"]["warmup_start_ratio"]) == (13, 0.1)
    fates = {s["key"]: s for s in doc["settings"]}
    assert fates["policy.scheduler"]["reproduced"], fates["policy.scheduler"]
    dapo = import_file(registry, "nemo-rl",
                       RECIPES / "nemo-rl-v0.7.0" / "recipes" / "llm" / "dapo-qwen2.5-7b.v2.yaml",
                       "0.7.0").to_json()
    assert (dapo["spec"]["optim"]["warmup_steps"],
            dapo["spec"]["optim"]["warmup_start_ratio"]) == (10, None)
