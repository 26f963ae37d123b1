"""A verl plan's launch, as verl's own trainer runs it on this machine's CPUs.

The rehearsal keeps every override the plan gives verl, so the spec's data, reward, objective,
budget, schedule, outputs and identity reach verl exactly as they would on a cluster, and adds
only what a host without an accelerator needs: the ``cpu`` platform and ``hf`` rollout of
``stateset_verl_cpu`` (loaded into every verl process through ``VERL_USE_EXTERNAL_MODULES``),
one logical GPU slot per rank declared to a private Ray instance on the loopback address, and
fewer helper processes than a GPU node runs. Where the plan sets one of those keys itself, the
rehearsal's value replaces it and the launch says so (``replaced``).

Nothing here is part of a plan: ``make_plan`` and ``run`` never call it, and the launch it
returns selects the CPU platform, so it cannot be mistaken for, or stand in for, a GPU launch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from packaging.version import Version

from stateset_backend.plugin import RUN_DIR, Rehearsal, Unsupported, log_rows

HERE = Path(__file__).resolve().parent
MODULE = "stateset_verl_cpu"  # this folder's stateset_verl_cpu.py, on verl's PYTHONPATH
ENTRY = ["-m", "verl.trainer.main_ppo"]
FIRST_RELEASE = Version("0.9.0")  # the first with verl.plugin.platform and VERL_ENGINE_DEVICE
# verl sizes its helpers for a GPU node (8 TransferQueue storage units, 8 reward and 8 agent-loop
# workers, 8 dataloader processes): on a small host Ray waits for cores it lacks (a hang, not an
# error), so one of each, and a logical CPU count for Ray to place them by
HOST = {
    "ray_kwargs.ray_init.num_cpus": "32",  # logical: Ray places helpers by it, not real cores
    "+ray_kwargs.ray_init.address": "local",  # never a cluster already running on this host
    "+ray_kwargs.ray_init._node_ip_address": "127.0.0.1",
    "+ray_kwargs.ray_init.include_dashboard": "false",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units": "1",
    "reward.num_workers": "1",
    "actor_rollout_ref.rollout.agent.num_workers": "1",
    "data.dataloader_num_workers": "0",
    "trainer.device": "cpu",
    "actor_rollout_ref.rollout.name": "hf",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "1",
    "actor_rollout_ref.actor.strategy": "fsdp2",
    "actor_rollout_ref.ref.strategy": "fsdp2",
    # forced: a user's own kernel choice in the plan's override_config is replaced, not met
    "++actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
    "actor_rollout_ref.model.use_remove_padding": "false",
}
ENVIRONMENT = {
    "VERL_PLATFORM": "cpu",
    # picks verl's FSDP engine class, registered for cuda and npu only; the platform stays cpu
    "VERL_ENGINE_DEVICE": "cuda",
    "VERL_USE_EXTERNAL_MODULES": MODULE,
    "RAY_USAGE_STATS_ENABLED": "0",  # a rehearsal reports nothing off the host
    # The rehearsal's Ray is a private head on loopback that ends with the run. Left to its
    # default, a new local cluster turns on token auth and writes ~/.ray/auth_token, after
    # which every later `ray start` on the machine requires that token: the user's own Ray
    # Jobs clients (and the hub's ray provider) would start failing with "Unauthorized".
    "RAY_AUTH_MODE": "disabled",
}


# verl's own comparison of the rollout with the actor's recompute (verl/utils/debug/metrics.py):
# the largest gap between the token probabilities of the two, over the update's response tokens
ROLLOUT_GAP = "training/rollout_probs_diff_max"
COVERS = ("verl's trainer, config, data pipeline, reward loop, FSDP2 update, checkpointing and "
          "logging; generation is a transformers sampler of ours, not vLLM or SGLang")


class VerlPlan(Protocol):
    engine: str
    engine_version: str
    argv: list[str]
    set_env: dict[str, str]


@dataclass(frozen=True)
class RehearsalLaunch:
    """``argv`` and ``set_env`` keep the plan's ``{python}`` and ``{run_dir}`` placeholders;
    ``replaced`` maps each plan override the rehearsal changed to (plan's, rehearsal's)."""

    argv: list[str]
    set_env: dict[str, str]
    replaced: dict[str, tuple[str, str]] = field(default_factory=dict)

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """A local process's environment: ``base`` (the plan's own variables already filled
        in, as the runner prepares an attempt) with the rehearsal's; this folder leads
        ``PYTHONPATH``, and no ``RAY_ADDRESS`` sends verl to another Ray cluster."""
        env = {k: v for k, v in base.items() if k != "RAY_ADDRESS"}
        env.update(ENVIRONMENT)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(HERE), base.get("PYTHONPATH", "")) if p)
        return env


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _value(argv: list[str], key: str) -> str | None:
    found = [a.split("=", 1)[1] for a in argv if "=" in a and _key(a) == key]
    return found[-1] if found else None


def rehearsal_launch(plan: VerlPlan) -> RehearsalLaunch:
    """The plan's verl launch on this machine's CPUs, or Unsupported naming why not."""
    if plan.engine != "verl":
        raise Unsupported(f"a rehearsal runs verl plans; this plan is for {plan.engine}")
    if Version(plan.engine_version) < FIRST_RELEASE:
        raise Unsupported(f"verl {plan.engine_version} has no platform registry (verl "
                          f">={FIRST_RELEASE} has): it cannot run on a host without an "
                          "accelerator")
    if plan.argv[1:3] != ENTRY:
        raise Unsupported("only a main_ppo launch is rehearsed; a conversation plan's "
                          "launcher is not")
    overrides = plan.argv[3:]
    nodes = _value(overrides, "trainer.nnodes")
    ranks = _value(overrides, "trainer.n_gpus_per_node")
    if nodes != "1" or ranks is None or not ranks.isdigit() or int(ranks) < 1:
        raise Unsupported(f"a rehearsal runs one node with one process per GPU of the plan; "
                          f"this plan asks for {nodes} node(s) of {ranks} GPU(s)")
    host = {**HOST, "+ray_kwargs.ray_init.num_gpus": ranks}
    owned = {_key(k) for k in host}
    replaced: dict[str, tuple[str, str]] = {}
    for key, value in host.items():
        before = _value(overrides, _key(key))
        if before is not None and before != value:
            replaced[_key(key)] = (before, value)
    kept = [a for a in overrides if _key(a) not in owned]
    return RehearsalLaunch(argv=[plan.argv[0], *ENTRY, *kept,
                                 *(f"{k}={v}" for k, v in host.items())],
                           set_env={**plan.set_env, **ENVIRONMENT}, replaced=replaced)


def rehearsal(plan: VerlPlan) -> Rehearsal:
    """The rehearsal the verl adapter offers the hub: the CPU launch above, and verl's own
    rollout-against-actor comparison read from its file logger."""
    launch = rehearsal_launch(plan)
    log = plan.set_env.get("VERL_FILE_LOGGER_PATH")

    def rollout_gap(run_dir: Path) -> dict[int, float]:
        path = Path(log.replace(RUN_DIR, str(run_dir))) if log else None
        if path is None or not path.is_file():
            return {}
        gaps = {}
        for row in log_rows(path.read_text(encoding="utf-8")):
            value = row.get("data", {}).get(ROLLOUT_GAP)
            if isinstance(value, int | float) and not isinstance(value, bool):
                gaps[int(row["step"])] = float(value) if math.isfinite(value) else math.inf
        return gaps

    return Rehearsal(argv=launch.argv, environment=launch.environment, replaced=launch.replaced,
                     covers=COVERS, rollout_gap=rollout_gap, gap_metric=ROLLOUT_GAP)
