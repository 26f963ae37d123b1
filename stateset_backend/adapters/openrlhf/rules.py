"""The rule table: which rule translates each spec leaf for one OpenRLHF dialect.

Every spec leaf must have a rule, so the table is kept whole, in one place where a missing or
misplaced leaf shows; the section rules live in ``algorithm_rules`` and ``training_rules``. A
conversation replaces some of the data rules, so that switch is made here too.
"""

from __future__ import annotations

from typing import Any

from stateset_backend.adapters.openrlhf.algorithm_rules import algorithm_rules
from stateset_backend.adapters.openrlhf.dialect import OpenRLHFKeys
from stateset_backend.adapters.openrlhf.training_rules import (
    data_rules,
    dtype,
    evaluation_every,
    evaluation_top_p,
    mini_batches,
    no_best,
    optim_rules,
    total_updates,
)
from stateset_backend.plugin import (
    REWARD_SHIM_FILE,
    RUN_DIR,
    AdapterBug,
    Hardcoded,
    Pinned,
    Refused,
    RuleSet,
    by_conversation,
    carried,
    conversation_rules,
    disabled_when_none,
    external_rules,
    gpu_workers,
    hardcoded,
    only,
    pinned_model_path,
    refuse,
    to,
    total_limit,
    turn_limit,
)

KEEP_ALL = 2**31 - 1  # OpenRLHF always rotates checkpoints (default 3): "keep all" is a huge N
AGENT_FILE = "stateset_openrlhf_agent.py"  # agent_shims/openrlhf_agent.py in the run folder
CONVERTED = f"{RUN_DIR}/data"  # the agent launcher's converted splits
TASK_FIELD = "stateset_task"  # each converted row's original row (the label)


def rule_set(f: OpenRLHFKeys) -> RuleSet:
    """The rule for every spec leaf under one OpenRLHF dialect."""
    rules = {**external_rules("OpenRLHF"), **algorithm_rules(f), **optim_rules(f),
             **data_rules(f)}
    return {
        **rules,
        "seed": to(f.seed),
        "model.path": lambda v, s: Pinned({f.model: pinned_model_path(s)}),
        "model.dtype": dtype(f),
        "model.param_dtype": only(
            lambda v: v == "float32", "OpenRLHF keeps DeepSpeed's fp32 master weights and "
            "Adam state (ZeRO stage >= 1); it cannot keep them in bfloat16",
            carried("DeepSpeed ZeRO-2 mixed precision: fp32 master weights and Adam "
                    "state")),
        "model.lora": lambda v, s: Pinned({f.lora_rank: 0, f.lora_alpha: 16,
                                           f.lora_dropout: 0.0,
                                           f.target_modules: ["all-linear"]},
                                          "no LoRA (rank 0; the other keys are unused)"),
        "model.lora.rank": to(f.lora_rank),
        "model.lora.alpha": only(lambda v: float(v).is_integer(), "OpenRLHF takes an "
                                 "integer LoRA alpha", to(f.lora_alpha, convert=int)),
        "model.lora.dropout": to(f.lora_dropout),
        "model.lora.target_modules": to(f.target_modules,
                                        convert=lambda v: [v] if isinstance(v, str) else v),
        "reward.entrypoint": lambda v, s: Pinned({f.reward_url:
                                                  f"{RUN_DIR}/{REWARD_SHIM_FILE}"}),
        "rollout.backend": only(lambda v: v == "vllm", "OpenRLHF rolls out with vLLM",
                                lambda v, s: Hardcoded("vllm with min_tokens=1",
                                                       "min_one_response_token",
                                                       {})),
        # --max_len is shared only with --max_new_tokens unset, when nothing else caps a
        # response and no prompt is cut at max_prompt_tokens: not the spec's two limits
        "data.max_total_tokens": refuse(
            "OpenRLHF shares --max_len between a prompt and its response only when "
            "--max_new_tokens is unset, and then no response limit applies and no prompt is "
            "cut at data.max_prompt_tokens"),
        "optim.warmup_start_ratio": refuse("OpenRLHF's schedulers (transformers' get_scheduler) "
                                           "warm up from 0; no flag starts them elsewhere"),
        "rollout.temperature": to(f.temperature),
        "rollout.top_p": to(f.top_p),
        "rollout.top_k": lambda v, s: Pinned({}, "OpenRLHF never passes top_k to vLLM "
                                             "(always -1: no top-k)") if v is None else
        Refused("OpenRLHF always samples without top-k (vLLM top_k -1)"),
        "budget.total_updates": total_updates,
        "budget.prompts_per_update": to(f.rollout_batch_size, f.generate_batch_size),
        "budget.ppo_epochs": to(f.max_epochs),
        "budget.mini_batches": mini_batches(f),
        "budget.partial_batch": hardcoded("the first U*B rows of the split, every pass",
                                          "fixed_train_rows"),
        "checkpoint.every": disabled_when_none(f.save_steps, -1),
        "checkpoint.keep": lambda v, s: Pinned({f.max_ckpt_num: KEEP_ALL if v is None
                                                else v, **no_best(f)}),
        "evaluation.every": evaluation_every(f),
        "evaluation.temperature": to(f.eval_temperature),
        "evaluation.samples": to(f.eval_samples),
        "evaluation.top_p": evaluation_top_p,
        "resources.nodes": to(f.nodes),
        "resources.gpus_per_node": gpu_workers("OpenRLHF", f.gpus_per_node),
        **_conversation_rules(f, rules),
    }


# -- conversations: OpenRLHF's agent executor runs the spec's environment through the shim --
def _conversation_rules(f: OpenRLHFKeys, single: dict[str, Any]) -> dict[str, Any]:
    """The environment leaves, and the data leaves a conversation changes: the launcher
    converts each split (``prompt`` messages, the original row as the label), the executor
    checks each opening against the prompt limit and samples each turn with the turn limit
    inside ``max_len``, the total limit."""
    if f.agent_func_path is None:
        raise AdapterBug("every OpenRLHF dialect names its agent_func_path flag")
    flag = f.agent_func_path
    rules: dict[str, Any] = conversation_rules(
        "OpenRLHF", lambda s: {flag: f"{RUN_DIR}/{AGENT_FILE}"},
        turn_tokens=lambda s: {f.max_new_tokens: turn_limit(s)},
        total_tokens=lambda s: {f.max_len: total_limit(s)})

    def split(key: str, name: str) -> Any:
        return lambda v, s: Pinned({key: f"{CONVERTED}/{name}.jsonl"}, "converted by the "
                                   "launcher: prompt messages and the original row (what reset "
                                   "receives, OpenRLHF's label)")

    prompt = Pinned({f.input_key: "prompt"}, "read by the launcher, which converts the split")
    label = Pinned({f.label_key: TASK_FIELD}, "the original row, which reset receives")
    conversation = {
        "data.train.uri": split(f.prompt_data, "train"),
        "data.validation.uri": split(f.eval_data, "validation"),
        "data.train.prompt_field": lambda v, s: prompt,
        "data.validation.prompt_field": lambda v, s: prompt,
        "data.train.answer_field": lambda v, s: label,
        "data.validation.answer_field": lambda v, s: label,
        "data.max_prompt_tokens": lambda v, s: Pinned({f.max_len: total_limit(s)},
                                                      "each opening must fit it"),
        "data.max_response_tokens": lambda v, s: Pinned({f.max_new_tokens: turn_limit(s)}),
        "data.prompt_overflow": lambda v, s: Pinned({}, "the executor renders each task's "
                                                    "opening with the chat template and the "
                                                    "environment's tools; one over "
                                                    "data.max_prompt_tokens fails its "
                                                    "conversation, which stops the run"),
    }
    for path, rule in conversation.items():
        rules[path] = by_conversation(single[path], rule)
    return rules

