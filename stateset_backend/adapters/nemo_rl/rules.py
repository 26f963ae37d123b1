"""The rule table: which rule translates each spec leaf for one NeMo RL dialect, and the
features the spec has no name for, which the objective's rule switches off.

Every spec leaf must have a rule, so the table is kept whole, in one place where a missing or
misplaced leaf shows; the section rules live in ``algorithm_rules`` and ``training_rules``.
"""

from __future__ import annotations

from typing import Any

from stateset_backend.adapters.agent_shims import NEMO_RL_ENV as CONVERSATION_ENV
from stateset_backend.adapters.agent_shims import NEMO_RL_PROCESSOR as CONVERSATION_PROCESSOR
from stateset_backend.adapters.nemo_rl import launcher as launcher
from stateset_backend.adapters.nemo_rl.algorithm_rules import (
    advantage_rules,
    aggregation,
    kl_rules,
    overlong,
    ratio_level,
)
from stateset_backend.adapters.nemo_rl.dialect import NemoRLKeys
from stateset_backend.adapters.nemo_rl.training_rules import (
    budget_rules,
    checkpoint_rules,
    data_split,
    evaluation_rules,
    lengths,
    lora_rules,
    optim_rules,
)
from stateset_backend.plugin import (
    Dialect,
    ExperimentSpec,
    Outcome,
    Pinned,
    Refused,
    RuleSet,
    carried,
    conversation_rules,
    external_rules,
    gpu_workers,
    hardcoded,
    is_conversation,
    only,
    pinned_model_path,
    refuse,
    rl_objective,
    to,
    total_limit,
    turn_limit,
)

OPENING_OVER_LIMIT = ("the launcher renders every task's opening with the chat template and the "
                      "environment's tools; one over data.max_prompt_tokens fails its "
                      "conversation, which stops the run")

def rule_set(dialect: Dialect, k: NemoRLKeys) -> RuleSet:
    """The rule for every spec leaf under one NeMo RL dialect."""
    label = f"NeMo RL {dialect.name}"

    def objective(value: Any, spec: ExperimentSpec) -> Outcome:
        native: dict[str, Any] = dict(k.fixed)  # features the spec has no name for, off
        native["grpo.use_leave_one_out_baseline"] = value == "rloo"
        if k.adv_estimator:
            native[k.adv_estimator] = "reinforce_plus_plus" \
                if value == "reinforce_pp" else "grpo"
        elif value == "reinforce_pp":
            return Refused(f"{label} has no REINFORCE++ estimator")
        if k.cispo:
            native[k.cispo] = value == "cispo"
        elif value == "cispo":
            return Refused(f"{label} has no CISPO loss")
        return Pinned(native)

    converted = carried("read by the launcher, which converts the split", hub=True)
    return {
        **external_rules("NeMo RL"),
        "seed": to("grpo.seed"),
        "algorithm.objective": rl_objective("NeMo RL", objective),
        "algorithm.group_size": to("grpo.num_generations_per_prompt"),
        "algorithm.clip.low": to("loss_fn.ratio_clip_min"),
        "algorithm.clip.high": to("loss_fn.ratio_clip_max"),
        "algorithm.clip.dual_clip": to("loss_fn.ratio_clip_c"),
        "algorithm.ratio_level": ratio_level,
        "algorithm.loss_aggregation": aggregation,
        **kl_rules(k, label),
        **advantage_rules(),
        "algorithm.dynamic_sampling": lambda v, s: Pinned({
            "grpo.use_dynamic_sampling": False,
            "grpo.dynamic_sampling_max_gen_batches": 1}),
        # NeMo RL generates up to max_gen_batches + 1 batches for one update
        "algorithm.dynamic_sampling.max_rounds": lambda v, s: Pinned({
            "grpo.use_dynamic_sampling": True,
            "grpo.dynamic_sampling_max_gen_batches": v}),
        "algorithm.overlong": lambda v, s: Pinned(overlong(s)),
        "algorithm.overlong.buffer_tokens": lambda v, s: Pinned(overlong(s)),
        "algorithm.overlong.penalty": lambda v, s: Pinned(overlong(s)),
        "algorithm.entropy_coef": hardcoded(0.0, "entropy_bonus"),
        "algorithm.rollout_correction": lambda v, s: Pinned(
            {}, "no correction: every launch pins loss_fn.use_importance_sampling_correction "
            "off") if v is None else Refused(
            "NeMo RL's importance-sampling correction also weights the KL term of the loss, "
            "and is not mapped onto the spec's modes"),
        "algorithm.gae": carried("no critic: group-relative advantages"),
        "algorithm.gae.gamma": refuse("NeMo RL's GRPO has no critic"),
        "algorithm.gae.lam": refuse("NeMo RL's GRPO has no critic"),
        "model.path": lambda v, s: Pinned({"policy.model_name": pinned_model_path(s)}),
        "model.dtype": to("policy.precision"),
        # DTensor v2 loads float32 master weights and keeps fp32 optimizer state; the FSDP2
        # mixed-precision policy computes in policy.precision
        "model.param_dtype": hardcoded("float32", "param_dtype"),
        **lora_rules(k, label),
        "data.train.uri": data_split("train", k),
        "data.train.prompt_field": converted,
        "data.train.answer_field": converted,
        "data.validation": data_split("validation", k),
        "data.validation.uri": data_split("validation", k),
        "data.validation.prompt_field": carried("read by the launcher", hub=True),
        "data.validation.answer_field": carried("read by the launcher", hub=True),
        "data.test": carried("never read during training"),
        # the launcher drops longer prompts, so NeMo RL's own limit (length >= limit ->
        # a zero-loss stub) never fires: it is set one above the spec's
        "data.max_prompt_tokens": lambda v, s: Pinned({
            **lengths(s), "data.max_input_seq_length": v + 1}),
        "data.max_response_tokens": lambda v, s: Pinned(lengths(s)),
        # vLLM stops a sequence at max_model_len, which NeMo RL sets from this limit
        "data.max_total_tokens": lambda v, s: Pinned(lengths(s)),
        "data.chat_template": only(lambda v: v is True, "the NeMo RL launch renders every "
                                   "prompt with the model's chat template",
                                   to("policy.tokenizer.chat_template_kwargs",
                                      convert=lambda v: None)),
        "data.prompt_overflow": only(
            lambda v: v in ("drop", "error"), "the NeMo RL launch drops prompts over "
            "data.max_prompt_tokens (or stops on them); it does not truncate them",
            lambda v, s: Pinned({}, OPENING_OVER_LIMIT) if is_conversation(s) else
            Pinned({}, "the launcher counts each prompt's tokens with the model's "
                   "tokenizer and chat template and drops (or stops on) those over the "
                   "limit")),
        "data.shuffle": to("data.shuffle"),
        "reward.entrypoint": lambda v, s: Pinned({f"+env.{launcher.ENV_NAME}": {
            "entrypoint": v, "sha256": s.reward.sha256}}),
        **conversation_rules(
            "NeMo RL", switch=lambda s: _environment_keys(k, s),
            turns=lambda s: {"grpo.max_rollout_turns": s.environment.max_turns},
            turn_tokens=lambda s: {"policy.generation.max_new_tokens": turn_limit(s)},
            total_tokens=lambda s: {"policy.max_total_sequence_length": total_limit(s)},
            cuts_turns_at_total=True),
        "reward.kind": lambda v, s: Pinned(_environment_keys(k, s)) if v == "python" or
        (v == "environment" and is_conversation(s)) else
        Refused("only python and environment rewards are translated for NeMo RL"),
        "rollout.backend": only(lambda v: v == "vllm", "NeMo RL generates with vLLM here",
                                to("policy.generation.backend")),
        "rollout.temperature": to("policy.generation.temperature"),
        "rollout.top_p": only(lambda v: k.min_top_p is None or v >= k.min_top_p,
                              f"{label}'s vLLM generation refuses top_p below "
                              f"{k.min_top_p}", to("policy.generation.top_p")),
        "rollout.top_k": only(lambda v: v is None or k.min_top_k is None
                              or v >= k.min_top_k, f"{label}'s vLLM generation refuses "
                              f"top_k below {k.min_top_k}", to("policy.generation.top_k")),
        **optim_rules(),
        **budget_rules(),
        **checkpoint_rules(k),
        **evaluation_rules(k),
        "resources.nodes": to("cluster.num_nodes"),
        "resources.gpus_per_node": gpu_workers("NeMo RL", "cluster.gpus_per_node"),
    }


def _environment_keys(k: NemoRLKeys, spec: ExperimentSpec) -> dict[str, Any]:
    """The environment and processor NeMo RL's data setup names: the python reward's, or the
    conversation shim's (registered by the launcher under these names)."""
    keys = {f"{k.data_defaults}.prompt_file": None, f"{k.data_defaults}.system_prompt_file": None}
    if not is_conversation(spec):
        return {**keys, f"{k.data_defaults}.env_name": launcher.ENV_NAME,
                f"{k.data_defaults}.processor": launcher.PROCESSOR_NAME}
    env = spec.environment
    return {**keys, f"{k.data_defaults}.env_name": CONVERSATION_ENV,
            f"{k.data_defaults}.processor": CONVERSATION_PROCESSOR,
            f"+env.{CONVERSATION_ENV}": {"entrypoint": env.entrypoint, "sha256": env.sha256}}

