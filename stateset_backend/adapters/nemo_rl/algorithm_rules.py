"""Rules for the ``algorithm`` section that need more than a key: the ratio level, loss
aggregation, KL (in the loss or in the reward), advantages and the overlong shaping.

NeMo RL hard-codes much of its GRPO math, so these rules mostly declare what a release does
(deviations the contract quantifies) or refuse what it cannot do, release by release.
"""

from __future__ import annotations

from typing import Any

from stateset_backend.adapters.nemo_rl.dialect import NemoRLKeys
from stateset_backend.plugin import (
    ExperimentSpec,
    Hardcoded,
    Outcome,
    Pinned,
    Refused,
    Rule,
    hardcoded,
    to,
    zero_variance_rule,
)


def ratio_level(value: Any, spec: ExperimentSpec) -> Outcome:
    if value == "sequence" and spec.algorithm.objective != "gspo":
        return Refused("NeMo RL uses sequence-level ratios only for GSPO")
    return Pinned({"loss_fn.sequence_level_importance_ratios": value == "sequence"})


def aggregation(value: Any, spec: ExperimentSpec) -> Outcome:
    levels = {"token_mean": True, "seq_mean_token_mean": False}
    if value not in levels:
        return Refused(f"NeMo RL has no {value} aggregation")
    return Pinned({"loss_fn.token_level_loss": levels[value]})


def kl_rules(k: NemoRLKeys, label: str) -> dict[str, Rule]:
    """KL in the loss: coefficient, estimator and both of NeMo RL's clamps (the log-ratio clamp
    at +-20 belongs to k3 only; the estimate's clamp is the spec's)."""
    in_reward = {k.kl_in_reward: False} if k.kl_in_reward else {}

    def off(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned({"loss_fn.reference_policy_kl_penalty": 0.0,
                       "loss_fn.reference_policy_kl_type": "k3",  # unused at coefficient 0
                       "loss_fn.kl_input_clamp_value": None,
                       "loss_fn.kl_output_clamp_value": None, **in_reward})

    def estimator(value: Any, spec: ExperimentSpec) -> Outcome:
        native = {"loss_fn.reference_policy_kl_type": value,
                  "loss_fn.kl_input_clamp_value": 20.0 if value == "k3" else None}
        if k.kl_gradient == "score_function" and spec.algorithm.kl is not None and \
                spec.algorithm.kl.placement == "loss":
            return Hardcoded(f"{value}, gradient with the score-function term",
                             "kl_score_function_gradient", native)
        return Pinned(native)

    def placement(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "loss":
            return Pinned(dict(in_reward), "" if in_reward else
                          f"{label} adds the KL only to the loss")
        if not k.kl_reward or not k.kl_in_reward:
            return Refused(f"{label} puts KL into the reward only in ways that differ from "
                           "the spec (none before 0.6; 0.6 also keeps it in the loss)")
        if spec.algorithm.objective != "reinforce_pp":
            return Refused(f"{label} puts KL into the reward only with REINFORCE++ (other "
                           "estimators would drop it)")
        return Hardcoded("per token, after the baseline", "kl_reward_per_token",
                         {k.kl_in_reward: True})

    def clamp(value: Any, spec: ExperimentSpec) -> Outcome:
        kl = spec.algorithm.kl
        if kl is not None and kl.placement == "reward":  # NeMo RL's calculate_kl defaults
            return Hardcoded(10.0, "kl_reward_clamp",
                             {"loss_fn.kl_output_clamp_value": value})
        return Pinned({"loss_fn.kl_output_clamp_value": value})

    return {"algorithm.kl": off,
            "algorithm.kl.coef": to("loss_fn.reference_policy_kl_penalty"),
            "algorithm.kl.estimator": estimator,
            "algorithm.kl.placement": placement,
            "algorithm.kl.clamp": clamp}


def advantage_rules() -> dict[str, Rule]:
    """GRPO estimator: r - group mean (leave-one-out for rloo) over (unbiased std + 1e-6),
    applied only where std > 0. REINFORCE++: r - group mean, then token-weighted whitening
    over the batch with a population variance floored at 1e-8."""

    def std(value: Any, spec: ExperimentSpec) -> Outcome:
        if spec.algorithm.objective == "reinforce_pp":
            return hardcoded("population", "reinforce_pp_std")(value, spec)
        return hardcoded("unbiased", "advantage_std")(value, spec)

    def epsilon(value: Any, spec: ExperimentSpec) -> Outcome:
        if spec.algorithm.objective == "reinforce_pp":
            return Hardcoded("variance floor 1e-8", "reinforce_pp_variance_floor")
        return Hardcoded(1e-6, "advantage_epsilon")

    def scope(value: Any, spec: ExperimentSpec) -> Outcome:
        objective = spec.algorithm.objective
        if objective == "reinforce_pp":
            if value != "batch":
                return Refused("NeMo RL's REINFORCE++ always whitens over the batch")
            return Hardcoded("batch, token-weighted", "reinforce_pp_token_whitening")
        if value != "group":
            return Refused("NeMo RL whitens over the batch only with REINFORCE++")
        if objective == "rloo" and spec.algorithm.advantage.std_normalize:
            return Hardcoded("leave-one-out std", "rloo_leave_one_out_std")
        return Pinned({}, "NeMo RL's GRPO estimator normalises within each group")

    def normalize(value: Any, spec: ExperimentSpec) -> Outcome:
        if spec.algorithm.objective == "reinforce_pp" and not value:
            return Refused("NeMo RL's REINFORCE++ always whitens the advantages")
        return Pinned({"grpo.normalize_rewards": value})

    excluded = zero_variance_rule("NeMo RL", "dynamic sampling",
                                  {"grpo.use_dynamic_sampling": True})

    def zero_variance(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "exclude" and spec.algorithm.objective == "rloo":
            return Refused("with a leave-one-out baseline NeMo RL's dynamic sampling filters "
                           "single samples by their leave-one-out std, not whole groups")
        return excluded(value, spec)

    return {"algorithm.advantage.std_normalize": normalize,
            "algorithm.advantage.std": std,
            "algorithm.advantage.epsilon": epsilon,
            "algorithm.advantage.scope": scope,
            "algorithm.advantage.zero_variance_groups": zero_variance}


def overlong(spec: ExperimentSpec) -> dict[str, Any]:
    """DAPO's soft overlong punishment over the response budget, or the shaping off."""
    ov = spec.algorithm.overlong
    return {"grpo.reward_shaping.enabled": ov is not None,
            "grpo.reward_shaping.overlong_buffer_length": ov.buffer_tokens if ov else 128,
            "grpo.reward_shaping.overlong_buffer_penalty": ov.penalty if ov else 1.0,
            "grpo.reward_shaping.max_response_length": spec.data.max_response_tokens}

