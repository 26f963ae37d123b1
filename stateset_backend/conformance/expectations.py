"""What the built-in engines must read for the spec's most error-prone settings, written from
the engines' own documentation and code, never from an adapter.

The kit's other checks hold an adapter to its own translation; these hold it to the engine:
a swapped clip pair, a mini-batch counted in responses instead of prompts, a response limit
that includes the prompt or an estimator mapped to the wrong name passes every check that only
compares an adapter with itself. Each entry: the option's spellings across releases (the first
the release's surface has is the one), and the value (or the values, where the engine accepts
aliases) it must read for a spec. Settings a spec makes moot return None (not checked).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stateset_backend.spec.model import ExperimentSpec

Expect = Callable[[ExperimentSpec], Any]


class OneOf(tuple[Any, ...]):
    """Values the engine accepts as the same setting (verl's KL estimator aliases)."""


def _single_turn(spec: ExperimentSpec) -> bool:
    return spec.environment.kind == "single_turn"


def _kl(spec: ExperimentSpec, placement: str) -> Any:
    kl = spec.algorithm.kl
    return kl if kl is not None and kl.placement == placement else None


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
     lambda s: s.data.max_response_tokens if _single_turn(s) else None),
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
    ((f"{A}.use_kl_loss",), lambda s: _kl(s, "loss") is not None),
    ((f"{A}.kl_loss_type",),
     lambda s: VERL_KL[k.estimator] if (k := _kl(s, "loss")) is not None else None),
    ((f"{A}.kl_loss_coef",), lambda s: k.coef if (k := _kl(s, "loss")) is not None else None),
    (("algorithm.use_kl_in_reward",), lambda s: _kl(s, "reward") is not None),
    (("algorithm.kl_penalty",),
     lambda s: VERL_KL[k.estimator] if (k := _kl(s, "reward")) is not None else None),
    (("algorithm.kl_ctrl.kl_coef",),
     lambda s: k.coef if (k := _kl(s, "reward")) is not None else None),
]

# OpenRLHF: flat option strings before 0.10.2, dotted after (its own parser's)
OPENRLHF: list[tuple[tuple[str, ...], Expect]] = [
    (("--n_samples_per_prompt", "--rollout.n_samples_per_prompt"),
     lambda s: s.algorithm.group_size),
    (("--eps_clip_low_high", "--actor.eps_clip_low_high"),
     lambda s: [s.algorithm.clip.low, s.algorithm.clip.high]),
    (("--actor_learning_rate", "--actor.adam.lr"), lambda s: s.optim.lr),
    (("--l2", "--actor.adam.weight_decay"), lambda s: s.optim.weight_decay),
    (("--max_norm", "--actor.max_norm"), lambda s: s.optim.grad_clip),
    (("--temperature", "--rollout.temperature"), lambda s: s.rollout.temperature),
    (("--top_p", "--rollout.top_p"), lambda s: s.rollout.top_p),
    (("--rollout_batch_size", "--rollout.batch_size"), lambda s: s.budget.prompts_per_update),
    # OpenRLHF's train batch is counted in samples (prompts x samples per prompt)
    (("--train_batch_size", "--train.batch_size"),
     lambda s: s.budget.prompts_per_update * s.algorithm.group_size // s.budget.mini_batches),
    (("--kl_estimator", "--algo.kl.estimator"),
     lambda s: s.algorithm.kl.estimator if s.algorithm.kl is not None else None),
]

# NeMo RL: its GRPO master config (examples/configs/grpo_math_1B.yaml)
NEMO_RL: list[tuple[tuple[str, ...], Expect]] = [
    (("grpo.num_generations_per_prompt",), lambda s: s.algorithm.group_size),
    (("grpo.num_prompts_per_step",), lambda s: s.budget.prompts_per_update),
    (("loss_fn.ratio_clip_min",), lambda s: s.algorithm.clip.low),
    (("loss_fn.ratio_clip_max",), lambda s: s.algorithm.clip.high),
    (("policy.optimizer.kwargs.lr",), lambda s: s.optim.lr),
    (("policy.optimizer.kwargs.weight_decay",), lambda s: s.optim.weight_decay),
    (("policy.max_grad_norm",), lambda s: s.optim.grad_clip),
    (("policy.generation.temperature",), lambda s: s.rollout.temperature),
    (("policy.generation.top_p",), lambda s: s.rollout.top_p),
]

def _rl(expect: Expect) -> Expect:
    """An expectation of an RL launch; an sft spec runs another trainer (not checked)."""
    return lambda s: None if s.algorithm.objective == "sft" else expect(s)


def _sft(expect: Expect) -> Expect:
    return lambda s: expect(s) if s.algorithm.objective == "sft" else None


# TRL: GRPOConfig's fields (TRL's epsilon pair is CISPO's weight cap there: not checked); an sft
# spec runs SFTTrainer, whose SFTConfig fields the TRL plugin names sft.<field>
TRL: list[tuple[tuple[str, ...], Expect]] = [
    (("num_generations",), _rl(lambda s: s.algorithm.group_size)),
    (("epsilon",), _rl(lambda s: None if s.algorithm.objective == "cispo"
                       else s.algorithm.clip.low)),
    (("epsilon_high",),
     _rl(lambda s: None if s.algorithm.objective == "cispo" else s.algorithm.clip.high)),
    (("learning_rate",), _rl(lambda s: s.optim.lr)),
    (("weight_decay",), _rl(lambda s: s.optim.weight_decay)),
    (("max_grad_norm",), _rl(lambda s: s.optim.grad_clip)),
    (("num_iterations",), _rl(lambda s: s.budget.ppo_epochs)),
    (("temperature",), _rl(lambda s: s.rollout.temperature)),
    (("top_p",), _rl(lambda s: s.rollout.top_p)),
    (("max_completion_length",),
     _rl(lambda s: s.data.max_response_tokens if _single_turn(s) else None)),
    (("sft.learning_rate",), _sft(lambda s: s.optim.lr)),
    (("sft.weight_decay",), _sft(lambda s: s.optim.weight_decay)),
    (("sft.max_grad_norm",), _sft(lambda s: s.optim.grad_clip)),
    # one optimizer step per update, on the update's rows
    (("sft.per_device_train_batch_size",), _sft(lambda s: s.budget.prompts_per_update)),
    (("sft.gradient_accumulation_steps",), _sft(lambda s: 1)),
    (("sft.max_steps",), _sft(lambda s: s.budget.total_updates)),
    # the loss on the answer (completion) tokens only
    (("sft.completion_only_loss",), _sft(lambda s: True)),
]

BUILTIN = {"verl": VERL, "openrlhf": OPENRLHF, "nemo-rl": NEMO_RL, "trl": TRL}


def expected(engine: str, spec: ExperimentSpec,
             surface: dict[str, Any] | None) -> dict[str, Any]:
    """{engine key: the value (or OneOf values) the engine must read} for this spec."""
    options = (surface or {}).get("options", {})
    out: dict[str, Any] = {}
    for spellings, expect in BUILTIN.get(engine, []):
        key = next((k for k in spellings if k in options), None) if options else spellings[0]
        value = expect(spec)
        if key is not None and value is not None:
            out[key] = value
    return out
