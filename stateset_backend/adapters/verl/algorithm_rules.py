"""Rules for the ``algorithm`` section: objective, clipping, KL, advantages, dynamic
sampling, the overlong penalty and the critic.

This is where verl's math differs from the spec's most, so these rules are kept together and
apart from the table: each one writes a value from a closed mapping, declares what the release
hard-codes (a deviation the contract quantifies) or refuses with the reason.
"""

from __future__ import annotations

from typing import Any

from stateset_backend.adapters.verl.dialect import (
    ACTOR,
    AGGREGATION,
    ESTIMATOR,
    FILTER,
    GROUP_NORMALISED,
    GRPO_EPSILON,
    K3_CLAMP,
    KL_TYPE,
    LOSS_MODE,
    NO_DUAL_CLIP,
    NO_VALUE_CLIP,
    WHITENED,
    NativeKeys,
    VerlKeys,
    loss_mode,
)
from stateset_backend.plugin import ExperimentSpec, Hardcoded, Outcome, Pinned, Refused, Rule


def objective(k: NativeKeys) -> Rule:
    fixed = {k(key): k.defaults[key] for key in k.keys.fixed}
    # a module the critic's worker imports before it builds its model (a custom architecture
    # registers there); before 0.8 its release default follows the actor's, an interpolation
    # no recorded default can be, so it is held at the actor's pinned null beside it
    fixed["critic.model.external_lib"] = None

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned({"algorithm.adv_estimator": ESTIMATOR[value],
                       f"{ACTOR}.policy_loss.loss_mode": loss_mode(spec), **fixed})

    return rule


def ratio_level(value: Any, spec: ExperimentSpec) -> Outcome:
    if value == "sequence" and spec.algorithm.objective != "gspo":
        return Refused("verl computes a sequence-level ratio only in its gspo loss mode")
    return Pinned({f"{ACTOR}.policy_loss.loss_mode": loss_mode(spec)})


def dual_clip(value: Any, spec: ExperimentSpec) -> Outcome:
    key = f"{ACTOR}.clip_ratio_c"
    if spec.algorithm.objective in LOSS_MODE:
        if value is not None:
            return Refused(f"verl's {loss_mode(spec)} loss has no dual clip")
        return Pinned({key: NO_DUAL_CLIP}, f"verl's {loss_mode(spec)} loss has no dual clip")
    if value is None:
        return Pinned({key: NO_DUAL_CLIP}, "clip_ratio_c = 1e9: verl clamps the log-ratio to "
                      "[-20, 20], so every ratio is below exp(20) < 1e9 and the dual clip never "
                      "binds (verl's default 3.0 would dual-clip)")
    return Pinned({key: value})


def aggregation(k: NativeKeys) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        native: dict[str, Any] = {f"{ACTOR}.loss_agg_mode": AGGREGATION[value]}
        scale = f"{ACTOR}.loss_scale_factor"
        if value == "seq_mean_token_sum_norm":
            if not k.has(scale):
                return Refused("verl before 0.7 divides the token sums by the micro-batch's "
                               "padded width and not by the number of sequences")
            native[scale] = spec.data.max_response_tokens
        elif k.has(scale):
            native[scale] = None
        if value == "token_mean" and k.keys.token_mean == "micro_batch":
            return Hardcoded("micro-batch token means", "micro_batch_token_mean", native)
        return Pinned(native)

    return rule


def kl_off(k: NativeKeys) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned({f"{ACTOR}.use_kl_loss": False, "algorithm.use_kl_in_reward": False,
                       f"{ACTOR}.kl_loss_coef": 0.0, f"{ACTOR}.kl_loss_type": "low_var_kl",
                       "algorithm.kl_ctrl.kl_coef": 0.0, "algorithm.kl_penalty": "kl"},
                      "no KL: both of verl's KL switches off, their coefficients 0")

    return rule


def _in_loss(spec: ExperimentSpec) -> bool:
    return spec.algorithm.kl is not None and spec.algorithm.kl.placement == "loss"


def kl_coef(value: Any, spec: ExperimentSpec) -> Outcome:
    key = f"{ACTOR}.kl_loss_coef" if _in_loss(spec) else "algorithm.kl_ctrl.kl_coef"
    return Pinned({key: value})


def kl_estimator(value: Any, spec: ExperimentSpec) -> Outcome:
    key = f"{ACTOR}.kl_loss_type" if _in_loss(spec) else "algorithm.kl_penalty"
    return Pinned({key: KL_TYPE[value]})


def kl_placement(value: Any, spec: ExperimentSpec) -> Outcome:
    """The switches, and the unused placement's coefficient at 0 (its estimator at verl's
    default name), so no KL term is left to a default."""
    loss = value == "loss"
    unused = {"algorithm.kl_ctrl.kl_coef": 0.0, "algorithm.kl_penalty": "kl"} if loss else \
        {f"{ACTOR}.kl_loss_coef": 0.0, f"{ACTOR}.kl_loss_type": "low_var_kl"}
    return Pinned({f"{ACTOR}.use_kl_loss": loss, "algorithm.use_kl_in_reward": not loss,
                   **unused})


def kl_clamp(value: Any, spec: ExperimentSpec) -> Outcome:
    assert spec.algorithm.kl is not None
    if spec.algorithm.kl.estimator == "k3":
        return Hardcoded(K3_CLAMP, "k3_clamp")
    if value is not None:
        return Refused(f"verl does not clamp the {spec.algorithm.kl.estimator} estimate")
    return Pinned({}, f"verl does not clamp the {spec.algorithm.kl.estimator} estimate")


def std_normalize(value: Any, spec: ExperimentSpec) -> Outcome:
    objective = spec.algorithm.objective
    if objective == "rloo" and value:
        return Refused("verl's RLOO cannot divide advantages by a std")
    if objective in WHITENED and not value:
        return Refused(f"verl always whitens {objective} advantages")
    return Pinned({"algorithm.norm_adv_by_std_in_grpo": value},
                  "" if objective in GROUP_NORMALISED else f"unused by verl's {objective}")


def std(value: Any, spec: ExperimentSpec) -> Outcome:
    # GRPO: torch.std of the group; whitening: masked_var, Bessel-corrected over tokens
    return Hardcoded("unbiased", "advantage_std")


def epsilon(value: Any, spec: ExperimentSpec) -> Outcome:
    if spec.algorithm.objective in WHITENED:
        return Hardcoded("1e-8 added to the variance", "whitening_epsilon")
    return Hardcoded(GRPO_EPSILON, "grpo_epsilon")


def scope(value: Any, spec: ExperimentSpec) -> Outcome:
    objective = spec.algorithm.objective
    if objective in WHITENED:
        return Pinned({}, "verl's masked_whiten: over the batch's response tokens, each "
                          "sample weighted by its token count") if value == "batch" \
            else Refused(f"verl whitens {objective} advantages over the batch, not per group")
    if value == "batch":
        return Refused(f"verl's {ESTIMATOR[objective]} advantages are per group")
    return Pinned({}, "verl groups responses by prompt (uid)")


def zero_variance(k: NativeKeys) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "keep" and spec.algorithm.objective in WHITENED:
            return Pinned({}, f"verl whitens {spec.algorithm.objective} advantages over the "
                              "batch: no group is centred on its own")
        if value == "keep":
            return Hardcoded("kept, centred by a float32 group mean", "zero_variance_float_mean",
                             {})
        if spec.algorithm.dynamic_sampling is None or k.keys.filter_groups is None:
            return Refused("verl excludes zero-variance groups only with dynamic sampling "
                           "(verl >= 0.9)")
        native = {f"{FILTER}.enable": True, f"{FILTER}.metric": k.keys.filter_metric}
        if k.keys.filter_metric == "acc" and spec.algorithm.overlong is not None:
            return Hardcoded("exclude by score before the overlong penalty", "filter_on_score",
                             native)
        return Pinned(native, f"groups compared on {k.keys.filter_metric!r}: the reward the "
                              "advantage uses")

    return rule


def no_dynamic_sampling(k: NativeKeys) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        if k.keys.filter_groups is None:
            return Pinned({}, "this release's trainer has no dynamic sampling")
        return Pinned({f"{FILTER}.enable": False, f"{FILTER}.metric": k.defaults[
            f"{FILTER}.metric"], f"{FILTER}.max_num_gen_batches": 0})

    return rule


def max_rounds(value: Any, spec: ExperimentSpec) -> Outcome:
    return Hardcoded(None, "unbounded_refill", {f"{FILTER}.enable": True,
                                                f"{FILTER}.max_num_gen_batches": 0})


def overlong(keys: VerlKeys) -> Rule:
    """The DAPO reward manager with its overlong buffer (reward_kwargs are not in the base
    config, hence Hydra's ``+`` append, which the dialect's key carries)."""

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        kw = keys.reward_kwargs
        return Pinned({keys.reward_manager: "dapo",
                       f"{kw}.overlong_buffer_cfg.enable": True,
                       f"{kw}.overlong_buffer_cfg.len": value,
                       f"{kw}.overlong_buffer_cfg.log": False,
                       f"{kw}.max_resp_len": spec.data.max_response_tokens})

    return rule


def gae_off(k: NativeKeys) -> Rule:
    """No critic: the critic's keys a release records are pinned at their recorded values."""
    idle = {key: k.defaults[key] for key in ("critic.optim.lr", "trainer.critic_warmup")
            if k.has(key)}

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned(idle, "no critic")

    return rule


def critic_warmup(value: Any, spec: ExperimentSpec) -> Outcome:
    """verl updates the actor at step s (from 1) once critic_warmup <= s: N critic-only
    updates is critic_warmup N + 1."""
    return Pinned({"trainer.critic_warmup": value + 1 if value else 0})


def value_clip(value: Any, spec: ExperimentSpec) -> Outcome:
    """verl always clips the value; a range no value moves by in one update is no clip (the
    clamp returns V itself)."""
    return Pinned({"critic.cliprange_value": NO_VALUE_CLIP if value is None else value})

