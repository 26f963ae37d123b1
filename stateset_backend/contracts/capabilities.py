"""The closed capability vocabulary, and what a spec requires from an engine.

A capability names one thing an engine must be able to do for the experiment to be the same
experiment. The vocabulary is closed so that a contract cannot claim a capability nobody
checks: an unknown name in a contract is an error, not a silent no-op.
"""

from __future__ import annotations

from typing import get_args

from stateset_backend.spec.model import (
    DType,
    ExperimentSpec,
    KLEstimator,
    KLPlacement,
    LossAggregation,
    Objective,
    RatioLevel,
    RewardKind,
    RolloutBackend,
    RolloutCorrectionMode,
    StdKind,
)


def _family(prefix: str, literal: object) -> set[str]:
    return {f"{prefix}:{value}" for value in get_args(literal)}


# Capabilities that are not a family over one spec enum.
_STANDALONE = {
    "clip:asymmetric",
    "advantage:no_std_normalize",
    "zero_variance:exclude",
    "dynamic_sampling",
    "overlong_penalty",
    "shared_token_budget",
    "warmup_start",
    "entropy_bonus",
    "lora",
    "multi_turn",
    "tool_use",
    "critic",
    "validation",
    "checkpoint",
    "resume:exact",
    "multi_node",
    "sft:packed",
    "init:from_run",
}

VOCABULARY: frozenset[str] = frozenset(
    _STANDALONE
    | _family("objective", Objective)
    | _family("ratio", RatioLevel)
    | _family("loss_agg", LossAggregation)
    | _family("kl", KLPlacement)
    | _family("kl_estimator", KLEstimator)
    | _family("advantage_std", StdKind)
    | _family("rollout", RolloutBackend)
    | _family("reward", RewardKind)
    | _family("dtype", DType)
    | _family("rollout_correction", RolloutCorrectionMode)
)


def unknown(names: set[str] | list[str]) -> list[str]:
    """Names that are not in the vocabulary, sorted."""
    return sorted(set(names) - VOCABULARY)


def required_capabilities(spec: ExperimentSpec) -> frozenset[str]:
    """Everything an engine must provide to run this spec as written."""
    alg = spec.algorithm
    need = {
        f"objective:{alg.objective}",
        f"loss_agg:{alg.loss_aggregation}",
        f"reward:{spec.reward.kind}",
        f"dtype:{spec.model.dtype}",
    }
    if alg.sft is not None:  # the RL settings of an sft spec are inert: nothing is sampled
        if alg.sft.layout == "packed":
            need.add("sft:packed")
    else:
        need |= _rl_capabilities(spec)
    if spec.model.from_run is not None:
        need.add("init:from_run")
    if spec.model.lora is not None:
        need.add("lora")
    if spec.environment.kind != "single_turn":
        need.add(spec.environment.kind)
    if spec.evaluation.every is not None:
        need.add("validation")
    if spec.checkpoint.every is not None:
        need.add("checkpoint")
    if spec.resources.nodes > 1:
        need.add("multi_node")
    assert need <= VOCABULARY, sorted(need - VOCABULARY)
    return frozenset(need)


def _rl_capabilities(spec: ExperimentSpec) -> set[str]:
    """What sampling, the ratio, the advantage and the reference need."""
    alg = spec.algorithm
    need = {f"ratio:{alg.ratio_level}", f"rollout:{spec.rollout.backend}"}
    if alg.clip.low != alg.clip.high:
        need.add("clip:asymmetric")
    if alg.kl is not None:
        need |= {f"kl:{alg.kl.placement}", f"kl_estimator:{alg.kl.estimator}"}
    if alg.advantage.std_normalize:
        need.add(f"advantage_std:{alg.advantage.std}")
    else:
        need.add("advantage:no_std_normalize")
    if alg.advantage.zero_variance_groups == "exclude":
        need.add("zero_variance:exclude")
    if alg.dynamic_sampling is not None:
        need.add("dynamic_sampling")
    if alg.overlong is not None:
        need.add("overlong_penalty")
    if spec.data.max_total_tokens is not None:
        need.add("shared_token_budget")
    if spec.optim.warmup_start_ratio is not None:
        need.add("warmup_start")
    if alg.entropy_coef > 0:
        need.add("entropy_bonus")
    if alg.gae is not None:
        need.add("critic")
    if alg.rollout_correction is not None:
        need.add(f"rollout_correction:{alg.rollout_correction.mode}")
    return need
