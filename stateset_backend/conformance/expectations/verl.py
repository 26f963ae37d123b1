"""verl's keys, as its releases' own config and code read them."""

from __future__ import annotations

from stateset_backend.conformance.expectations.common import Expect, OneOf, kl_at, single_turn

# verl's names for the estimators (core_algos.kl_penalty): k1 "kl"/"k1", k2 "mse"/"k2",
# k3 "low_var_kl"/"k3"
VERL_KL = {"k1": OneOf(("kl", "k1")), "k2": OneOf(("mse", "k2")),
           "k3": OneOf(("low_var_kl", "k3"))}
# verl's advantage estimators (core_algos.AdvantageEstimator)
VERL_ESTIMATOR = {"grpo": OneOf(("grpo",)), "dr_grpo": OneOf(("grpo",)),
                  "dapo": OneOf(("grpo",)), "gspo": OneOf(("grpo",)),
                  "cispo": OneOf(("grpo",)), "rloo": OneOf(("rloo",)),
                  "reinforce_pp": OneOf(("reinforce_plus_plus",
                                         "reinforce_plus_plus_baseline")),
                  "ppo": OneOf(("gae",))}
A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"

VERL: list[tuple[tuple[str, ...], Expect]] = [
    ((f"{R}.n",), lambda s: s.algorithm.group_size),
    ((f"{A}.clip_ratio_low",), lambda s: s.algorithm.clip.low),
    ((f"{A}.clip_ratio_high",), lambda s: s.algorithm.clip.high),
    (("data.max_prompt_length",), lambda s: s.data.max_prompt_tokens),
    (("data.max_response_length",),
     lambda s: s.data.max_response_tokens if single_turn(s) else None),
    (("data.train_batch_size",), lambda s: s.budget.prompts_per_update),
    # verl counts its mini-batch in prompts (it multiplies by rollout.n itself)
    ((f"{A}.ppo_mini_batch_size",),
     lambda s: s.budget.prompts_per_update // s.budget.mini_batches),
    ((f"{A}.ppo_epochs",), lambda s: s.budget.ppo_epochs),
    ((f"{A}.optim.lr",), lambda s: s.optim.lr),
    ((f"{A}.optim.weight_decay",), lambda s: s.optim.weight_decay),
    ((f"{A}.grad_clip",), lambda s: s.optim.grad_clip),
    ((f"{R}.temperature",), lambda s: s.rollout.temperature),
    ((f"{R}.top_p",), lambda s: s.rollout.top_p),
    ((f"{A}.entropy_coeff",), lambda s: s.algorithm.entropy_coef),
    ((f"{A}.loss_agg_mode",), lambda s: s.algorithm.loss_aggregation.replace("_", "-")),
    (("algorithm.adv_estimator",), lambda s: VERL_ESTIMATOR[s.algorithm.objective]),
    ((f"{A}.use_kl_loss",), lambda s: kl_at(s, "loss") is not None),
    ((f"{A}.kl_loss_type",),
     lambda s: VERL_KL[k.estimator] if (k := kl_at(s, "loss")) is not None else None),
    ((f"{A}.kl_loss_coef",), lambda s: k.coef if (k := kl_at(s, "loss")) is not None else None),
    (("algorithm.use_kl_in_reward",), lambda s: kl_at(s, "reward") is not None),
    (("algorithm.kl_penalty",),
     lambda s: VERL_KL[k.estimator] if (k := kl_at(s, "reward")) is not None else None),
    (("algorithm.kl_ctrl.kl_coef",),
     lambda s: k.coef if (k := kl_at(s, "reward")) is not None else None),
]
