"""The rule table: which rule translates each spec leaf for one verl dialect.

Every spec leaf must have a rule, so the table is kept whole, in one place where a missing or
misplaced leaf shows; the section rules live in ``algorithm_rules`` and ``training_rules``. A
conversation replaces some of the data rules, so that switch is made here too.
"""

from __future__ import annotations

from typing import Any

from stateset_backend.adapters.agent_shims import VERL_AGENT_NAME
from stateset_backend.adapters.verl.algorithm_rules import (
    aggregation,
    critic_warmup,
    dual_clip,
    epsilon,
    gae_off,
    kl_clamp,
    kl_coef,
    kl_estimator,
    kl_off,
    kl_placement,
    max_rounds,
    no_dynamic_sampling,
    objective,
    overlong,
    ratio_level,
    scope,
    std,
    std_normalize,
    value_clip,
    zero_variance,
)
from stateset_backend.adapters.verl.dialect import (
    ACTOR,
    MODEL,
    ROLLOUT,
    VAL,
    NativeKeys,
    VerlKeys,
)
from stateset_backend.adapters.verl.training_rules import (
    budget,
    checkpoint_every,
    compute_dtype,
    data_file,
    eps,
    eval_every,
    eval_temperature,
    master_dtype,
    min_lr_ratio,
    mini_batches,
    model_path,
    no_validation,
    optimizer,
    prompt_overflow,
    schedule,
    top_k,
    warmup,
)
from stateset_backend.plugin import (
    REWARD_SHIM_FILE,
    RUN_DIR,
    Dialect,
    ExperimentSpec,
    Outcome,
    Pinned,
    Refused,
    Rule,
    RuleSet,
    by_conversation,
    carried,
    conversation_rules,
    external_rules,
    gpu_workers,
    hardcoded,
    only,
    refuse,
    rl_objective,
    to,
    total_limit,
)

AGENT_LOOPS_FILE = "stateset_agent_loops.yaml"
CONVERTED = f"{RUN_DIR}/data"  # the launcher's converted splits (JSON lines, prompt messages)


def rule_set(dialect: Dialect, keys: VerlKeys) -> RuleSet:
    """The rule for every spec leaf under one verl dialect."""
    k = NativeKeys(dialect, keys)
    fn = keys.reward_function
    return {
        **external_rules("verl"),
        "seed": to(*(k(key) for key in keys.seed)),
        "algorithm.objective": rl_objective("verl", objective(k)),
        "algorithm.group_size": to(f"{ROLLOUT}.n"),
        "algorithm.clip.low": to(f"{ACTOR}.clip_ratio_low"),
        "algorithm.clip.high": to(f"{ACTOR}.clip_ratio_high"),
        "algorithm.clip.dual_clip": dual_clip,
        "algorithm.ratio_level": ratio_level,
        "algorithm.loss_aggregation": aggregation(k),
        "algorithm.kl": kl_off(k),
        "algorithm.kl.coef": kl_coef,
        "algorithm.kl.estimator": kl_estimator,
        "algorithm.kl.placement": kl_placement,
        "algorithm.kl.clamp": kl_clamp,
        "algorithm.advantage.std_normalize": std_normalize,
        "algorithm.advantage.std": std,
        "algorithm.advantage.epsilon": epsilon,
        "algorithm.advantage.scope": scope,
        "algorithm.advantage.zero_variance_groups": zero_variance(k),
        "algorithm.dynamic_sampling": no_dynamic_sampling(k),
        "algorithm.dynamic_sampling.max_rounds": max_rounds,
        "algorithm.overlong": lambda v, s: Pinned({keys.reward_manager: "naive"}),
        "algorithm.overlong.buffer_tokens": overlong(keys),
        "algorithm.overlong.penalty": to(
            f"{keys.reward_kwargs}.overlong_buffer_cfg.penalty_factor"),
        "algorithm.entropy_coef": to(f"{ACTOR}.entropy_coeff"),
        "algorithm.rollout_correction": lambda v, s: Pinned(
            {}, "no correction: every launch pins verl's own correction off where the release "
            "has one")
        if v is None else Refused(
            "verl's algorithm.rollout_correction has modes of its own (weights truncated from "
            "above only, rejection by separate thresholds), none of them the spec's"),
        "algorithm.gae": gae_off(k),
        "algorithm.gae.gamma": to("algorithm.gamma"),
        "algorithm.gae.lam": to("algorithm.lam"),
        "algorithm.gae.critic.model": only(
            lambda v: v == "separate", "verl's critic is a separate value model "
            "(critic.model.path), never a head on the actor", carried(
                "verl's critic: a separate value model loaded from model.path")),
        "algorithm.gae.critic.lr": to(k("critic.optim.lr")),
        "algorithm.gae.critic.value_clip": value_clip,
        "algorithm.gae.critic.warmup_updates": critic_warmup,
        "model.path": model_path,
        "model.dtype": compute_dtype(k),
        "model.param_dtype": master_dtype(k),
        "model.lora": to(f"{MODEL}.lora_rank", convert=lambda v: 0),
        "model.lora.rank": to(f"{MODEL}.lora_rank"),
        "model.lora.alpha": to(f"{MODEL}.lora_alpha"),
        "model.lora.target_modules": to(f"{MODEL}.target_modules"),
        "model.lora.dropout": hardcoded(0.0, "lora_dropout"),
        "data.train.uri": data_file("data.train_files"),
        "data.train.prompt_field": to("data.prompt_key"),
        "data.train.answer_field": carried("verl hands the reward the row's "
                                           "reward_model.ground_truth"),
        "data.validation": no_validation,
        "data.validation.uri": data_file("data.val_files"),
        "data.validation.prompt_field": to("data.prompt_key"),
        "data.validation.answer_field": carried("verl hands the reward the row's "
                                                "reward_model.ground_truth"),
        "data.max_prompt_tokens": to("data.max_prompt_length"),
        "data.max_response_tokens": to("data.max_response_length"),
        "data.max_total_tokens": refuse("verl's rollout gives every response "
                                        "data.max_response_length tokens whatever its "
                                        "prompt's length; it has no budget they share"),
        "data.chat_template": hardcoded(True, "chat_template"),
        "optim.warmup_start_ratio": refuse("verl's schedulers warm up from 0 (before 0.6, with "
                                           "a cosine schedule, from min_lr_ratio * lr, which "
                                           "its deviation declares); no key starts it elsewhere"),
        "data.prompt_overflow": prompt_overflow(k),
        "data.shuffle": to("data.shuffle"),
        "reward.entrypoint": lambda v, s: Pinned({
            f"{fn}.path": f"{RUN_DIR}/{REWARD_SHIM_FILE}", f"{fn}.name": "compute_score"}),
        "rollout.backend": only(lambda v: v in ("vllm", "sglang"), "verl rolls out with "
                                "vllm or sglang", to(f"{ROLLOUT}.name")),
        "rollout.temperature": to(f"{ROLLOUT}.temperature"),
        "rollout.top_p": to(f"{ROLLOUT}.top_p"),
        "rollout.top_k": top_k,
        "optim.kind": optimizer(k),
        "optim.lr": to(k(f"{ACTOR}.optim.lr")),  # the critic's is algorithm.gae.critic.lr
        "optim.betas": lambda v, s: Pinned(k.optim("betas", list(v))),
        "optim.eps": eps(k),
        "optim.weight_decay": k.optim_rule("weight_decay"),
        "optim.grad_clip": to(*keys.grad_clip, *keys.critic_grad_clip),
        "optim.schedule": schedule(k),
        "optim.warmup_steps": warmup(k),
        "optim.min_lr_ratio": min_lr_ratio(k),
        "budget.total_updates": budget,
        "budget.prompts_per_update": to("data.train_batch_size"),
        "budget.ppo_epochs": to(f"{ACTOR}.ppo_epochs"),
        "budget.mini_batches": mini_batches,
        "budget.partial_batch": hardcoded("drop", "partial_batch"),
        "checkpoint.every": checkpoint_every,
        "checkpoint.keep": to("trainer.max_actor_ckpt_to_keep",
                              "trainer.max_critic_ckpt_to_keep"),
        "evaluation.every": eval_every(k),
        "evaluation.temperature": eval_temperature,
        "evaluation.top_p": to(f"{VAL}.top_p"),
        "evaluation.samples": to(f"{VAL}.n"),
        "resources.nodes": to("trainer.nnodes"),
        "resources.gpus_per_node": gpu_workers("verl", "trainer.n_gpus_per_node"),
        **_conversation_rules(k),
    }


# -- conversations: verl's agent loop runs the spec's environment through the shim ----------
def _conversation_rules(k: NativeKeys) -> dict[str, Rule]:
    """The environment leaves, and the data leaves whose meaning a conversation changes (the
    launcher converts the splits; the agent loop checks each opening against the prompt limit;
    the response region holds every turn and observation after the opening)."""

    def switch(spec: ExperimentSpec) -> dict[str, Any]:
        return {f"{ROLLOUT}.agent.default_agent_loop": VERL_AGENT_NAME,
                f"{ROLLOUT}.agent.agent_loop_config_path": f"{RUN_DIR}/{AGENT_LOOPS_FILE}"}

    rules = conversation_rules(
        "verl", switch,
        total_tokens=lambda s: {"data.max_response_length": total_limit(s)
                                - s.data.max_prompt_tokens})
    if not k.keys.agent_loop:
        refuse_kind = rules["environment.kind"]

        def kind(value: Any, spec: ExperimentSpec) -> Outcome:
            if value == "single_turn":
                return refuse_kind(value, spec)
            return Refused("the conversation shim implements verl 0.9.1's agent loop "
                           "interface; earlier releases' agent loops are not translated")

        rules["environment.kind"] = kind
    single = {path: rule for path, rule in _data_rules_single(k).items()}
    for path, conversation in _data_rules_conversation().items():
        rules[path] = by_conversation(single[path], conversation)
    return rules


def _data_rules_single(k: NativeKeys) -> dict[str, Rule]:
    return {"data.train.uri": data_file("data.train_files"),
            "data.validation": no_validation,
            "data.validation.uri": data_file("data.val_files"),
            "data.train.prompt_field": to("data.prompt_key"),
            "data.validation.prompt_field": to("data.prompt_key"),
            "data.max_response_tokens": to("data.max_response_length"),
            "data.prompt_overflow": prompt_overflow(k)}


def _data_rules_conversation() -> dict[str, Rule]:
    def split(name: str, key: str) -> Rule:
        def rule(value: Any, spec: ExperimentSpec) -> Outcome:
            return Pinned({key: f"{CONVERTED}/{name}.jsonl"}, "converted by the launcher: the "
                          "original row (what reset receives) and the prompt field as chat "
                          "messages")

        return rule

    converted = Pinned({"data.prompt_key": "prompt"}, "read by the launcher, which converts "
                       "the split")
    return {"data.train.uri": split("train", "data.train_files"),
            "data.validation": lambda v, s: Pinned({"data.val_files": f"{CONVERTED}/train.jsonl"},
                                                   "no validation split: the converted train "
                                                   "split, never evaluated"),
            "data.validation.uri": split("validation", "data.val_files"),
            "data.train.prompt_field": lambda v, s: converted,
            "data.validation.prompt_field": lambda v, s: converted,
            "data.max_response_tokens": lambda v, s: Pinned({
                "data.max_response_length": total_limit(s) - s.data.max_prompt_tokens},
                "the turn limit when environment.max_turn_tokens is null; verl's response "
                "region holds every turn and observation after the opening"),
            "data.prompt_overflow": lambda v, s: Pinned(
                {"data.filter_overlong_prompts": False}, "the agent loop renders each task's "
                "opening with the chat template and the environment's tools; one over "
                "data.max_prompt_tokens fails its conversation, which stops the run")}

