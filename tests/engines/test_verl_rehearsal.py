"""Rehearsal: verl's own ``main_ppo`` runs the hub's verl plan of the main job on this machine's
CPUs for 2 GRPO updates with two FSDP ranks, and what verl leaves is what the hub reads back
(the one-rank run and its resume are ``rehearse``'s test, tests/test_rehearse.py).

The plan is the one ``make_plan`` writes for a GPU node; ``rehearsal_launch`` keeps all of its
overrides and adds the host's (the ``cpu`` platform and ``hf`` rollout verl loads through its
own extension points). The model is the native engine's tiny Llama (its config and tokenizer,
a chat template, seeded weights), built in code (rehearsal_setup): nothing is downloaded.

Needs verl's environment (STATESET_TEST_VERL_PYTHON, as ``.ci/run`` builds it); the two-rank
run takes three to four minutes and some 6.5 GiB on 2 cores.
"""

from __future__ import annotations

import json
import os
import shutil
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
from stateset_backend.engines.adapter import LaunchContext
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


def test_verl_says_where_it_resumed_in_its_own_log_and_every_kept_checkpoint_is_found(tmp_path):
    """What the resume check (and `run --resume`) reads: verl numbers its steps from the global
    step it restored, so a log beginning at step 2 continued from update 1, and one beginning
    at 1 started afresh; every checkpoint up to verl's marker is whole, a newer one is not,
    and what verl's retention leaves of an older one (its data.pt) is no checkpoint."""
    plan, adapter = _plan(), VerlAdapter()
    ctx = LaunchContext(plan.run_id, plan.experiment_digest, plan.engine_version,
                        plan.resolved_dialect())

    def resumed_from(*steps: int) -> int | None:
        (tmp_path / f"{ctx.run_name}.jsonl").write_text("".join(
            json.dumps({"step": s, "data": {"actor/kl_loss": 0.0}}) + "\n" for s in steps))
        return adapter.collect(tmp_path, ctx).resumed_from

    assert (resumed_from(1, 2), resumed_from(2), resumed_from(3, 4)) == (None, 1, 2)
    checkpoints = tmp_path / "checkpoints"
    for step in (1, 2, 3, 10):
        (checkpoints / f"global_step_{step}" / "actor").mkdir(parents=True)
        (checkpoints / f"global_step_{step}" / "actor" / "model.pt").write_bytes(b"w")
        (checkpoints / f"global_step_{step}" / "data.pt").write_bytes(b"d")
    # verl 0.9.1 with max_actor_ckpt_to_keep removes the actor folder, not the step's
    shutil.rmtree(checkpoints / "global_step_1" / "actor")
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("3")
    assert [c.update for c in adapter.checkpoints(tmp_path)] == [2, 3]
    latest = adapter.latest_checkpoint(tmp_path)
    assert latest is not None and latest.update == 3
    collected = adapter.collect(tmp_path, ctx)
    assert sorted({a.step for a in collected.artifacts if a.kind == "checkpoint"}) == [2, 3, 10]
    assert any("global_step_1 holds no weights" in n for n in collected.notes)


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
def test_two_fsdp_ranks_train_the_main_job_over_gloo_and_the_hub_reads_it_back(verl_python,
                                                                             tmp_path):
    """Two FSDP ranks on the host (gloo collectives), each with its own rollout replica: the
    sharded update, the weight gathering for the sync and the per-rank checkpoint shards run
    as on a two-GPU node. The one-rank run, and its resume, are `rehearse`'s test."""
    plan = _plan(tiny_llama(tmp_path / "tiny-llama-support", seed=1234),
                 resources={"gpus_per_node": 2})
    launch = rehearsal_launch(plan)
    # verl places one worker per logical GPU slot the private Ray declares
    assert {"trainer.n_gpus_per_node=2", "+ray_kwargs.ray_init.num_gpus=2"} <= set(launch.argv)
    adapter = VerlAdapter()
    store = RunStore(tmp_path / "runs")
    attempt = store.begin_attempt(plan)
    prepared = prepare_attempt(plan, adapter, attempt, None, python=verl_python,
                               engine_home=None, echo_stderr=False)
    run_dir = prepared.run_dir
    argv = [fill_placeholders(a, run_dir, verl_python, None) for a in launch.argv]
    started = time.monotonic()
    exit_ = run_local(argv, cwd=run_dir, env=launch.environment(prepared.env), timeout=500,
                      stdout_path=prepared.stdout_path, stderr_path=prepared.stderr_path)
    wall = time.monotonic() - started
    print(f"verl rehearsal, two ranks: exit {exit_.code} after {wall:.0f} s")
    assert exit_.code == 0, _log_tail(run_dir)

    result = collect_and_validate(plan, adapter, attempt, plan.validated_spec(), exit_, None,
                                  started="", duration=wall)
    assert result.status == "succeeded", [c for c in result.checks if not c.ok]
    assert result.committed_updates == 2 and result.planned_updates == 2
    # policy equals reference at update 1 on both ranks: the KL averaged over them is 0
    assert result.metrics.initial["kl"] == 0.0
    gaps = adapter.rehearse(plan).rollout_gap
    assert gaps is not None and max(gaps(run_dir).values()) < 1e-6
    for step in (1, 2):  # each rank saves its own shard
        actor = run_dir / "checkpoints" / f"global_step_{step}" / "actor"
        assert {p.name for p in actor.glob("model_world_size_*")} == {
            "model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"}
