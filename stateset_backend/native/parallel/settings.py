"""What the native engine's data-parallel mode cannot do, torch-free, so the adapter refuses it
when the plan is made (exit 3) and the trainer refuses it again before anything loads.

Data parallelism here splits each update's groups across ranks and all-reduces gradients; that
equals one process only when everything computed before the loss is local to a group. Settings
that need the whole batch at once (batch-wide whitening, refilling excluded groups, the
critic's batch-normalised token advantages, conversations with their own workers) would each
need a gather of their own, and none is implemented: they are refused rather than approximated.
Where the ranks run (one node or several) does not enter: the split depends on the world size
and each process's global rank alone.
"""

from __future__ import annotations

from typing import Any


def world_size(spec: Any) -> int:
    return int(spec.resources.world_size)


def data_parallel_refusals(spec: Any) -> list[str]:
    """One line per setting that has no exact data-parallel meaning in the native engine."""
    size = world_size(spec)
    if size == 1:
        return []
    alg, problems = spec.algorithm, list[str]()
    where = f"with {size} processes"
    if alg.objective == "sft":
        problems.append(f"algorithm.objective sft {where}: supervised fine-tuning runs in one "
                        "process")
    if spec.environment.kind != "single_turn":
        problems.append(f"environment.kind {spec.environment.kind} {where}: conversations run "
                        "in one process")
    if alg.gae is not None:
        problems.append(f"algorithm.gae (PPO with a critic) {where}: the critic's advantages "
                        "are normalised over the whole batch")
    if alg.advantage.std_normalize and alg.advantage.scope == "batch":
        problems.append(f"algorithm.advantage.scope batch {where}: batch whitening needs every "
                        "rank's rewards; use scope group")
    if alg.advantage.zero_variance_groups == "exclude":
        problems.append(f"algorithm.advantage.zero_variance_groups exclude {where}: excluding "
                        "(and refilling) groups changes how many each rank holds")
    if spec.budget.prompts_per_update < size:
        problems.append(f"budget.prompts_per_update {spec.budget.prompts_per_update} is fewer "
                        f"than the {size} processes: every process needs at least one group")
    return problems
