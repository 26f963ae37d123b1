"""Rules for the ``algorithm`` section: the advantage estimator and policy loss the
objective becomes, clipping, KL, advantages, dynamic filtering, the overlong penalty and the
critic.

OpenRLHF chooses its advantage normalisation by the estimator's name, so the objective,
std_normalize and scope rules all go through one ``estimator`` choice; this is also where its
math differs from the spec's most, so the deviations are declared here.
"""

from __future__ import annotations

from typing import Any

from stateset_backend.adapters.openrlhf.dialect import OpenRLHFKeys
from stateset_backend.plugin import (
    ExperimentSpec,
    Hardcoded,
    Outcome,
    Pinned,
    Refused,
    carried,
    hardcoded,
    only,
    rl_objective,
    to,
)

KL_CLAMP = 10.0  # compute_approx_kl clamps every estimator's value to [-10, 10]
GROUP_STD_EPSILON = 1e-9  # group_norm: (r - mean) / (std + 1e-9)
BATCH_WHITENED = frozenset({"gae", "reinforce_baseline"})  # estimators OpenRLHF whitens
NO_VALUE_CLIP = 1e9  # a value clip range no value moves by in one update: no clip
# the spec's rollout correction modes as loss.PolicyLoss names them: a type before 0.11.2,
# a (level, mode) pair from it (mask keeps each surviving token's own unclamped weight)
IS_TYPES = {"truncate": "tis", "mask": "icepop", "sequence_mask": "seq-mask-tis"}
IS_LEVEL_MODE = {"truncate": ("token", "clip"), "mask": ("token", "mask"),
                 "sequence_mask": ("seq", "mask")}


# -- what the spec's objective becomes ------------------------------------------------------
def estimator(spec: ExperimentSpec) -> str | Refused:
    """OpenRLHF's advantage estimator for the spec's objective and advantage settings."""
    a = spec.algorithm
    scope, std = a.advantage.scope, a.advantage.std_normalize
    if a.objective == "ppo":
        return "gae" if scope == "batch" else Refused(
            "OpenRLHF whitens GAE advantages over the batch (advantage.scope batch)")
    if a.objective == "reinforce_pp":
        return "reinforce_baseline" if scope == "batch" else Refused(
            "OpenRLHF's REINFORCE++-baseline whitens over the batch (advantage.scope batch)")
    if scope != "group":
        return Refused(f"OpenRLHF normalises {a.objective} advantages within the group only")
    if a.objective == "rloo":
        return "rloo" if not std else Refused("OpenRLHF's RLOO cannot divide by a std")
    if a.objective in ("grpo", "dapo", "gspo", "dr_grpo"):
        # group_norm always divides by the std (it never reads no_std_norm): mean-only is
        # OpenRLHF's dr_grpo estimator
        return "group_norm" if std else "dr_grpo"
    return Refused(f"OpenRLHF has no {a.objective} objective")


def algorithm_rules(f: OpenRLHFKeys) -> dict[str, Any]:
    def objective(value: Any, spec: ExperimentSpec) -> Outcome:
        est = estimator(spec)
        if isinstance(est, Refused):
            return est
        return Pinned({f.estimator: est,
                       f.policy_loss_type: "gspo" if value == "gspo" else "ppo"})

    def ratio_level(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "sequence" and spec.algorithm.objective != "gspo":
            return Refused("OpenRLHF computes sequence-level ratios only for gspo")
        return Pinned({f.policy_loss_type: "gspo" if value == "sequence" else "ppo"})

    def aggregation(value: Any, spec: ExperimentSpec) -> Outcome:
        a = spec.algorithm
        if a.objective == "gspo" and value != "seq_mean_token_mean":
            return Refused("OpenRLHF's GSPO loss is always the mean over sequences of token "
                           "means, whatever the aggregation flag says")
        if a.gae is not None and value != "token_mean":
            return Refused("OpenRLHF's critic loss is always a token mean (the spec "
                           "aggregates the value loss like the policy loss)")
        if f.loss_agg_mode is None:
            if value != "token_mean":
                return Refused("loss aggregation is configurable only from OpenRLHF 0.11.2")
            if f.token_mean_over == "micro_batch":
                return Hardcoded("mean over micro-batches of each micro-batch's token mean",
                                 "token_mean_per_micro_batch")
            return Pinned({}, "OpenRLHF 0.11.1 averages over every token of an optimizer step")
        modes = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean"}
        if value not in modes:
            return Refused(f"OpenRLHF has no {value} aggregation")
        native = {f.loss_agg_mode: modes[value]}
        kl_in_loss = a.kl is not None and a.kl.placement == "loss"
        if value == "seq_mean_token_mean" and (kl_in_loss or a.entropy_coef != 0):
            return Hardcoded("policy loss seq-mean-token-mean, KL and entropy terms "
                             "token-mean", "kl_and_entropy_terms_token_mean", native)
        return Pinned(native)

    def clip(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned({f.eps_clip_low_high: [spec.algorithm.clip.low, spec.algorithm.clip.high]})

    def kl_off(value: Any, spec: ExperimentSpec) -> Outcome:
        # coefficient 0 also means no reference model is loaded
        return Pinned({f.kl_coef: 0.0, f.kl_use_loss: False, f.kl_estimator: "k1"})

    def kl_clamp(value: Any, spec: ExperimentSpec) -> Outcome:
        if value is not None and value != KL_CLAMP:
            return Refused(f"OpenRLHF clamps the KL estimate to [-{KL_CLAMP:g}, {KL_CLAMP:g}] "
                           "(hard-coded); set algorithm.kl.clamp to 10 or null")
        return Hardcoded(KL_CLAMP, "kl_clamped_to_10")

    def std_normalize(value: Any, spec: ExperimentSpec) -> Outcome:
        est = estimator(spec)
        if isinstance(est, Refused):
            return est
        # only the batch whitening reads no_std_norm; the group estimators are chosen above
        return Pinned({f.no_std_norm: est in BATCH_WHITENED and not value, f.estimator: est})

    def std_kind(value: Any, spec: ExperimentSpec) -> Outcome:
        batch = spec.algorithm.advantage.scope == "batch"
        return Hardcoded("population" if batch else "unbiased",
                         "batch_population_std" if batch else "group_unbiased_std")

    def epsilon(value: Any, spec: ExperimentSpec) -> Outcome:
        if spec.algorithm.advantage.scope == "batch":
            return Hardcoded("variance floored at 1e-8 (std at least 1e-4), nothing added",
                             "batch_variance_floor_1e-8")
        return Hardcoded(GROUP_STD_EPSILON, "group_std_plus_1e-9")

    def scope(value: Any, spec: ExperimentSpec) -> Outcome:
        est = estimator(spec)
        return est if isinstance(est, Refused) else Pinned({f.estimator: est})

    def zero_variance(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "keep":
            return Pinned({f.dynamic_filtering: False, f.dynamic_filtering_range: [0, 1]},
                          "OpenRLHF keeps zero-variance groups (their advantages are 0)")
        if spec.algorithm.dynamic_sampling is None:
            return Refused("OpenRLHF excludes zero-variance groups only with dynamic filtering "
                           "(algorithm.dynamic_sampling)")
        return Hardcoded("groups kept iff 0 < mean score < 1", "zero_variance_by_mean_score",
                         {f.dynamic_filtering: True, f.dynamic_filtering_range: [0, 1]})

    def gae_off(value: Any, spec: ExperimentSpec) -> Outcome:
        # no critic: its flags, which every launch pins, at values that train no critic
        return Pinned({f.gamma: 1.0, f.lambd: 1.0, f.freezing_actor_steps: -1,
                       f.value_clip: NO_VALUE_CLIP, **{k: spec.optim.lr for k in f.lr[1:]}})

    def value_clip(value: Any, spec: ExperimentSpec) -> Outcome:
        # an omitted flag means OpenRLHF's 0.5, so 'unclipped' is a range no value reaches
        return Pinned({f.value_clip: NO_VALUE_CLIP if value is None else value})

    def rollout_correction(value: Any, spec: ExperimentSpec) -> Outcome:
        rc = spec.algorithm.rollout_correction
        if rc is None:  # off, explicitly: a launch (or an imported one) says so
            return Pinned({f.is_correction_level: "off"} if f.is_correction_level else
                          {f.is_correction_enable: False} if f.is_correction_enable else {})
        if spec.algorithm.objective == "gspo":
            return Refused("OpenRLHF's GSPO does not weight its loss: with the correction on it "
                           "divides its sequence ratio by the sampler's probabilities instead")
        bounds = [rc.low, rc.high]
        if f.is_correction_level and f.is_correction_mode and f.is_correction_gating and \
                f.is_correction_threshold:
            level, mode = IS_LEVEL_MODE[rc.mode]
            return Pinned({f.is_correction_level: level, f.is_correction_mode: mode,
                           f.is_correction_gating: "ratio", f.is_correction_threshold: bounds})
        if f.is_correction_enable and f.is_correction_type and f.is_correction_threshold:
            return Pinned({f.is_correction_enable: True,
                           f.is_correction_type: IS_TYPES[rc.mode],
                           f.is_correction_threshold: bounds})
        return Refused("this OpenRLHF release has no rollout correction")

    return {
        "algorithm.objective": rl_objective("OpenRLHF", objective),
        "algorithm.group_size": to(f.group_size),
        "algorithm.clip.low": clip,
        "algorithm.clip.high": clip,
        "algorithm.clip.dual_clip": to(f.dual_clip),
        "algorithm.ratio_level": ratio_level,
        "algorithm.loss_aggregation": aggregation,
        "algorithm.kl": kl_off,
        "algorithm.kl.coef": to(f.kl_coef),
        "algorithm.kl.estimator": to(f.kl_estimator),
        "algorithm.kl.placement": to(f.kl_use_loss, convert=lambda v: v == "loss"),
        "algorithm.kl.clamp": kl_clamp,
        "algorithm.advantage.std_normalize": std_normalize,
        "algorithm.advantage.std": std_kind,
        "algorithm.advantage.epsilon": epsilon,
        "algorithm.advantage.scope": scope,
        "algorithm.advantage.zero_variance_groups": zero_variance,
        "algorithm.dynamic_sampling": lambda v, s: Pinned({f.dynamic_filtering: False}),
        "algorithm.dynamic_sampling.max_rounds": hardcoded(None, "refill_without_round_limit"),
        "algorithm.overlong": lambda v, s: Pinned({f.overlong_buffer_len: None,
                                                   f.overlong_penalty_factor: 1.0}),
        "algorithm.overlong.buffer_tokens": to(f.overlong_buffer_len),
        "algorithm.overlong.penalty": to(f.overlong_penalty_factor),
        "algorithm.entropy_coef": to(f.entropy_coef),
        "algorithm.rollout_correction": rollout_correction,  # its leaves: one setting
        "algorithm.gae": gae_off,
        "algorithm.gae.gamma": to(f.gamma),
        "algorithm.gae.lam": to(f.lambd),
        "algorithm.gae.critic.model": only(
            lambda v: v == "separate", "OpenRLHF's critic is a separate value model, never a "
            "head on the actor", carried("OpenRLHF's critic: a separate value model loaded from "
                                        "model.path (critic_pretrain defaults to it)")),
        "algorithm.gae.critic.lr": lambda v, s: Pinned({k: v for k in f.lr[1:]}),
        "algorithm.gae.critic.value_clip": value_clip,
        # the actor trains at global step g (from 0) once g > freezing_actor_steps
        "algorithm.gae.critic.warmup_updates": to(f.freezing_actor_steps,
                                                  convert=lambda v: v - 1),
    }
