"""Rehearsal: verl's own ``main_ppo`` runs the hub's verl plan of the main job on this machine's
CPUs for 2 GRPO updates, and what verl leaves is what the hub reads back.

The plan is the one ``make_plan`` writes for a GPU node; ``rehearsal_launch`` keeps all of its
overrides and adds the host's (the ``cpu`` platform and ``hf`` rollout verl loads through its
own extension points). The model is the native engine's tiny Llama (its config and tokenizer,
a chat template, seeded weights), built in code (rehearsal_setup): nothing is downloaded.

Needs verl's environment (STATESET_TEST_VERL_PYTHON, as ``.ci/run`` builds it); the rehearsal
runs in about a minute and a half on 2 cores.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from optional_installs import VERL_PYTHON_MISSING
from rehearsal_setup import VERL_PYTHON, tiny_llama
from rehearsal_setup import verl_python as verl_rehearsal_python
from slurm_cluster import ON_ONE_WORKER

from stateset_backend.adapters.verl.adapter import VerlAdapter
from stateset_backend.adapters.verl.rehearsal import rehearsal_launch
from stateset_backend.adapters.verl.rehearsal.launch import ENVIRONMENT
from stateset_backend.common.errors import Unsupported
from stateset_backend.engines.registry import AdapterEntry
from stateset_backend.plan.launch_plan import LaunchPlan, make_plan
from stateset_backend.providers.local import run_local
from stateset_backend.runs.runner import collect_and_validate, fill_placeholders, prepare_attempt
from stateset_backend.runs.store import RunStore
from stateset_backend.spec.content import directory_digest
from stateset_backend.spec.files import parse_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "external"
SPEC = EXAMPLES / "verl-rehearsal.json"
needs_verl = pytest.mark.skipif(VERL_PYTHON is None, reason=VERL_PYTHON_MISSING)


def _plan(model: Path | None = None, **changes: Any) -> LaunchPlan:
    doc = json.loads(SPEC.read_text())
    if model is not None:
        doc["model"].update(path=str(model), revision=directory_digest(model))
    for section, values in changes.items():
        doc[section].update(values)
    adapter = AdapterEntry(VerlAdapter(), "builtin", "stateset-backend", "0.1.0")
    return make_plan(parse_spec(doc), adapter, "0.9.1", base_dir=EXAMPLES)


# -- the launch: what it keeps, what it adds, what it refuses (no verl needed) ----------------
def test_the_rehearsal_keeps_every_plan_override_and_says_what_it_replaces():
    plan = _plan()
    launch = rehearsal_launch(plan)
    assert launch.argv[:3] == ["{python}", "-m", "verl.trainer.main_ppo"]
    replaced = {"actor_rollout_ref.rollout.name"}
    kept = [a for a in plan.argv[3:] if a.split("=", 1)[0].lstrip("+") not in replaced]
    assert launch.argv[3:3 + len(kept)] == kept  # in the plan's order, before the host's
    assert launch.replaced == {"actor_rollout_ref.rollout.name": ("vllm", "hf")}
    assert {"trainer.device=cpu", "+ray_kwargs.ray_init.num_gpus=1",
            "+ray_kwargs.ray_init.address=local"} <= set(launch.argv)
    assert launch.set_env == {**plan.set_env, **ENVIRONMENT}
    env = launch.environment({"RAY_ADDRESS": "10.0.0.1:6379", "PYTHONPATH": "/elsewhere"})
    assert "RAY_ADDRESS" not in env and env["VERL_PLATFORM"] == "cpu"
    assert env["PYTHONPATH"].endswith(os.pathsep + "/elsewhere")
    assert (Path(env["PYTHONPATH"].split(os.pathsep)[0]) / "stateset_verl_cpu.py").is_file()


def test_a_plan_never_holds_the_rehearsal_settings():
    plan = _plan()
    assert not {"trainer.device=cpu", "actor_rollout_ref.rollout.name=hf"} & set(plan.argv)
    assert not set(ENVIRONMENT) & set(plan.set_env)


@pytest.mark.parametrize("change, reason", [
    ({"engine": "openrlhf"}, "this plan is for openrlhf"),
    ({"engine_version": "0.8.0"}, "verl 0.8.0 has no platform registry"),
    ({"argv": ["{python}", "{run_dir}/stateset_verl_agent.py", "trainer.nnodes=1"]},
     "conversation plan's launcher"),
])
def test_what_cannot_be_rehearsed_is_refused(change, reason):
    plan = _plan().model_copy(update=change)
    with pytest.raises(Unsupported, match=reason):
        rehearsal_launch(plan)


def test_a_multi_node_plan_is_refused():
    plan = _plan(resources={"nodes": 2})
    with pytest.raises(Unsupported, match="this plan asks for 2 node"):
        rehearsal_launch(plan)


# -- the run ------------------------------------------------------------------------------------
@needs_verl
def test_the_cpu_module_refuses_to_load_into_any_other_run():
    """verl imports a module named in VERL_USE_EXTERNAL_MODULES into every process; without
    the rehearsal's platform it fails the import instead of moving a GPU run onto gloo."""
    assert VERL_PYTHON is not None
    launch = rehearsal_launch(_plan())
    env = {**launch.environment(dict(os.environ)), "VERL_PLATFORM": ""}
    proc = subprocess.run([VERL_PYTHON, "-c", "import verl"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0
    assert "loads only with VERL_PLATFORM=cpu" in proc.stderr


@pytest.fixture(scope="module")
def verl_python() -> str:
    return verl_rehearsal_python()


def _log_tail(run_dir: Path) -> str:
    lines = (run_dir / "stderr.log").read_text(errors="replace").splitlines()
    return "\n".join(line for line in lines[-60:] if "Continuous Token" not in line)


@pytest.mark.slow
@needs_verl
@ON_ONE_WORKER  # Ray: the Ray provider's tests stop every Ray instance on the host
def test_verl_trains_the_main_job_on_cpus_and_the_hub_reads_it_back(verl_python, tmp_path):
    plan = _plan(tiny_llama(tmp_path / "tiny-llama-support", seed=1234))
    adapter = VerlAdapter()
    store = RunStore(tmp_path / "runs")
    attempt = store.begin_attempt(plan)
    prepared = prepare_attempt(plan, adapter, attempt, None, python=verl_python,
                               engine_home=None, echo_stderr=False)
    launch = rehearsal_launch(plan)
    run_dir = prepared.run_dir
    argv = [fill_placeholders(a, run_dir, verl_python, None) for a in launch.argv]
    started = time.monotonic()
    exit_ = run_local(argv, cwd=run_dir, env=launch.environment(prepared.env), timeout=400,
                      stdout_path=prepared.stdout_path, stderr_path=prepared.stderr_path)
    wall = time.monotonic() - started
    print(f"verl rehearsal: exit {exit_.code} after {wall:.0f} s")
    assert exit_.code == 0, _log_tail(run_dir)

    # verl's own file logger: 2 steps, every metric finite
    log = run_dir / Path(plan.set_env["VERL_FILE_LOGGER_PATH"]).name
    steps = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        numbers = [v for v in step["data"].values() if isinstance(v, (int, float))]
        assert numbers and all(math.isfinite(v) for v in numbers), step
    first, second = (s["data"] for s in steps)
    print(f"step 1 actor/kl_loss = {first['actor/kl_loss']!r}")
    # policy equals reference at the first update: the k3 KL is exactly 0 (a reference in
    # another precision than the actor shows here first)
    assert first["actor/kl_loss"] == 0.0
    assert second["actor/kl_loss"] > 0.0  # the first update moved the policy
    # the rollout's log-probs are the learner's recompute, before and after a weight sync
    assert first["training/rollout_probs_diff_max"] < 1e-6
    assert second["training/rollout_probs_diff_max"] < 1e-6
    assert any(key.startswith("val-core/") for key in second)  # validation at evaluation.every

    # verl's checkpoint layout, every update (checkpoint.every 1, keep 2)
    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    for step in (1, 2):
        actor = checkpoints / f"global_step_{step}" / "actor"
        assert (actor / "model_world_size_1_rank_0.pt").is_file()
        assert (actor / "huggingface" / "config.json").is_file()
        assert (checkpoints / f"global_step_{step}" / "data.pt").is_file()

    # the hub's verl adapter reads the run back: identity, updates, metrics, every check
    result = collect_and_validate(plan, adapter, attempt, plan.validated_spec(), exit_, None,
                                  started="", duration=wall)
    assert result.status == "succeeded", [c for c in result.checks if not c.ok]
    assert result.committed_updates == 2 and result.planned_updates == 2
    assert (result.run_id, result.experiment_digest) == (plan.run_id, plan.experiment_digest)
    assert result.metrics.initial["kl"] == 0.0
