"""When a built-in engine's plan must declare a deviation, from the engine's code: the specs
on which the engine computes something other than the spec's math. A plan that runs such a
spec without declaring it gives the user the spec's word for a run that is not the spec's; one
that declares it elsewhere warns of a difference the run does not have.

Each entry: the deviation's name and the specs (on the releases) it applies to. Only what the
kit knows from the engine is here; a deviation an adapter declares that no entry names is
held to nothing more than being reachable (``declared_deviations_run``).
"""

from __future__ import annotations

from collections.abc import Callable

from packaging.version import Version

from stateset_backend.spec.model import ExperimentSpec

Applies = Callable[[ExperimentSpec, Version], bool]


def _optimizer_steps(spec: ExperimentSpec) -> int:
    """Optimizer steps an update: one per mini-batch of each pass."""
    return spec.budget.ppo_epochs * spec.budget.mini_batches


# the scheduler advances with the optimizer (OpenRLHF's DeepSpeed engine steps it in
# optimizer_step; the HF Trainer under TRL in its training step), so W warmup updates and a
# decay over T updates run over W*k and T*k optimizer steps: the rate moves within an update
PER_OPTIMIZER_STEP: dict[str, Applies] = {
    "lr_warmup_per_optimizer_step":
        lambda s, v: s.optim.warmup_steps > 0 and _optimizer_steps(s) > 1,
    "lr_decay_per_optimizer_step":
        lambda s, v: s.optim.schedule != "constant" and _optimizer_steps(s) > 1,
}


def _kl_in_loss(spec: ExperimentSpec) -> bool:
    return spec.algorithm.kl is not None and spec.algorithm.kl.placement == "loss"


OPENRLHF: dict[str, Applies] = {
    **PER_OPTIMIZER_STEP,
    # PolicyLoss applies loss_agg_mode to the policy term only; the actor adds its KL and
    # entropy terms through masked_mean, a token mean (ppo_actor's training_step)
    "kl_and_entropy_terms_token_mean":
        lambda s, v: s.algorithm.loss_aggregation == "seq_mean_token_mean" and
        (_kl_in_loss(s) or s.algorithm.entropy_coef != 0),
}

VERL: dict[str, Applies] = {
    # the legacy workers before 0.6.1 run the actor's and the reference's forward under
    # torch.autocast(dtype=torch.bfloat16) whatever their FSDP precision (workers/actor/
    # dp_actor.py's _forward_micro_batch); 0.6.1 reads the dtype from fsdp_config.dtype
    "bf16_autocast": lambda s, v: v < Version("0.6.1") and s.model.dtype != "bfloat16",
}

NEMO_RL: dict[str, Applies] = {
    # from 0.7 the KL penalty in the loss is differentiated with its score-function term
    # (algorithms/loss_functions.py), for every estimator
    "kl_score_function_gradient": lambda s, v: v >= Version("0.7.0") and _kl_in_loss(s),
}

BUILTIN: dict[str, dict[str, Applies]] = {"openrlhf": OPENRLHF, "trl": PER_OPTIMIZER_STEP,
                                          "verl": VERL, "nemo-rl": NEMO_RL}


def undeclared(engine: str, version: Version, spec: ExperimentSpec,
               declared: set[str]) -> tuple[list[str], list[str]]:
    """(deviations the engine's ``version`` runs on ``spec`` that the plan does not declare,
    deviations it declares that the engine does not run on it), of those the kit knows for
    ``engine``."""
    known = BUILTIN.get(engine, {})
    applies = {name for name, rule in known.items() if rule(spec, version)}
    return sorted(applies - declared), sorted((declared & set(known)) - applies)
