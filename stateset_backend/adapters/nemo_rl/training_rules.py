"""Rules around the objective: sequence lengths, LoRA, the converted data splits, the
optimizer and its scheduler list, budget, checkpoints and validation.

NeMo RL takes its schedule as a list of torch schedulers and its data as the launcher's
converted splits, so these rules build those native shapes from the spec's settings.
"""

from __future__ import annotations

from typing import Any

from stateset_backend.adapters.nemo_rl import launcher as launcher
from stateset_backend.adapters.nemo_rl.dialect import NemoRLKeys
from stateset_backend.plugin import (
    RUN_DIR,
    ExperimentSpec,
    Hardcoded,
    Outcome,
    Pinned,
    Refused,
    Rule,
    carried,
    even_split,
    hardcoded,
    is_conversation,
    refuse,
    to,
    total_limit,
    turn_limit,
)

LORA_TARGETS_ALL = "all-linear"
# torch's LinearLR needs a start factor in (0, 1]: warmup starts at this fraction of lr
# instead of 0 (the dialects declare it as ``warmup_start_factor``)
WARMUP_START = 1e-8
NEVER = 10_000_000_000  # NeMo RL's own "never" for periods (ConstantLR total_iters)
CONSTANT = {"name": "torch.optim.lr_scheduler.ConstantLR",
            "kwargs": {"factor": 1.0, "total_iters": NEVER}}


def lengths(spec: ExperimentSpec) -> dict[str, Any]:
    """NeMo RL's sequence limit and per-generation limit: one response, or a conversation's
    total and turn limits."""
    if is_conversation(spec):
        return {"policy.max_total_sequence_length": total_limit(spec),
                "policy.generation.max_new_tokens": turn_limit(spec)}
    data = spec.data
    total = data.max_total_tokens or data.max_prompt_tokens + data.max_response_tokens
    return {"policy.max_total_sequence_length": total,
            "policy.generation.max_new_tokens": data.max_response_tokens}


def lora_rules(k: NemoRLKeys, label: str) -> dict[str, Rule]:
    if not k.lora:
        no = refuse(f"{label} has no LoRA")
        return {"model.lora": carried("full fine-tuning"), "model.lora.rank": no,
                "model.lora.alpha": no, "model.lora.dropout": no,
                "model.lora.target_modules": no}
    key = k.lora

    def targets(value: Any, spec: ExperimentSpec) -> Outcome:
        every = value == LORA_TARGETS_ALL
        return Pinned({f"{key}.target_modules": [] if every else list(value),
                       f"{key}.match_all_linear": every})

    return {"model.lora": to(f"{key}.enabled", convert=lambda v: False),
            # the rank is always present when LoRA is on: it switches it on
            "model.lora.rank": lambda v, s: Pinned({f"{key}.dim": v, f"{key}.enabled": True}),
            "model.lora.alpha": to(f"{key}.alpha"),
            "model.lora.dropout": to(f"{key}.dropout"),
            "model.lora.target_modules": targets}


def data_split(name: str, k: NemoRLKeys) -> Rule:
    """The launcher converts each local split into ResponseDataset rows in the run
    directory (see ``launcher.py``); NeMo RL reads those."""
    converted = f"{RUN_DIR}/{launcher.DATA_DIR}/{name}.jsonl"
    keys = {"input_key": launcher.INPUT, "output_key": launcher.OUTPUT}

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        if value is None:  # no validation split
            if k.custom_data == "flat":
                return Pinned({}, "no val_data_path: NeMo RL validates nothing")
            return Pinned({"data.validation": None})
        split = getattr(spec.data, name)
        if "://" in split.uri and not split.uri.startswith("file://"):
            return Refused("the NeMo RL launch converts local split files only")
        if k.custom_data == "flat":  # one dataset section, train and validation paths
            path = "train_data_path" if name == "train" else "val_data_path"
            return Pinned({"data.dataset_name": "ResponseDataset", f"+data.{path}": converted,
                           **{f"+data.{key}": v for key, v in keys.items()}})
        if name == "train":
            return Pinned({"data.train.dataset_name": "ResponseDataset",
                           "data.train.split_validation_size": 0.0,
                           "+data.train.data_path": converted,
                           **{f"+data.train.{key}": v for key, v in keys.items()}})
        return Pinned({"data.validation": {"dataset_name": "ResponseDataset",
                                           "data_path": converted, **keys}})

    return rule


def optim_rules() -> dict[str, Rule]:
    def schedule(value: Any, spec: ExperimentSpec) -> Outcome:
        native = {"policy.scheduler": _scheduler(spec)}
        if spec.optim.warmup_steps and not spec.optim.warmup_start_ratio:
            return Hardcoded(f"lr * ({WARMUP_START:g} + (1 - {WARMUP_START:g}) * u / W)",
                             "warmup_start_factor", native)
        return Pinned(native)

    return {"optim.kind": to("policy.optimizer.name", convert=lambda v: "torch.optim.AdamW"),
            "optim.lr": to("policy.optimizer.kwargs.lr"),
            "optim.betas": to("policy.optimizer.kwargs.betas", convert=list),
            "optim.eps": to("policy.optimizer.kwargs.eps"),
            "optim.weight_decay": to("policy.optimizer.kwargs.weight_decay"),
            "optim.grad_clip": to("policy.max_grad_norm"),
            "optim.schedule": lambda v, s: Pinned({"policy.scheduler": _scheduler(s)}),
            "optim.min_lr_ratio": lambda v, s: Pinned({"policy.scheduler": _scheduler(s)}),
            "optim.warmup_steps": schedule,
            "optim.warmup_start_ratio": warmup_start}


def warmup_start(value: Any, spec: ExperimentSpec) -> Outcome:
    """LinearLR's own start factor (NeMo RL's recipes warm up from 0.1 * lr). torch divides
    by it at every step, so below the 1e-8 it stands in for 0 with the rate overflows."""
    if value is not None and value < WARMUP_START:
        return Refused(f"NeMo RL's LinearLR divides by its start factor: below {WARMUP_START:g} "
                       "the learning rate overflows; a warmup from 0 is optim.warmup_start_ratio "
                       "null")
    return Pinned({"policy.scheduler": _scheduler(spec)})


def _scheduler(spec: ExperimentSpec) -> list[dict[str, Any]]:
    """torch schedulers in NeMo RL's SequentialLR list, stepped once per update: linear
    warmup over W updates, then constant or a decay to min_lr_ratio * lr at total_updates."""
    o, total = spec.optim, spec.budget.total_updates
    warmup, decay = o.warmup_steps, total - o.warmup_steps
    after: dict[str, Any] = CONSTANT
    if o.schedule == "linear" and decay > 0:
        after = {"name": "torch.optim.lr_scheduler.LinearLR",
                 "kwargs": {"start_factor": 1.0, "end_factor": o.min_lr_ratio,
                            "total_iters": decay}}
    elif o.schedule == "cosine" and decay > 0:
        after = {"name": "torch.optim.lr_scheduler.CosineAnnealingLR",
                 "kwargs": {"T_max": decay, "eta_min": o.min_lr_ratio * o.lr}}
    if not warmup:
        return [after, {"milestones": []}]
    ramp = {"name": "torch.optim.lr_scheduler.LinearLR",
            "kwargs": {"start_factor": o.warmup_start_ratio or WARMUP_START, "end_factor": 1.0,
                       "total_iters": warmup}}
    return [ramp, after, {"milestones": [warmup]}]


def budget_rules() -> dict[str, Rule]:
    def mini_batches(value: Any, spec: ExperimentSpec) -> Outcome:
        samples = spec.budget.prompts_per_update * spec.algorithm.group_size
        return even_split(samples, value, "samples") or \
            Pinned({"policy.train_global_batch_size": samples // value})

    # NeMo RL stops at max_num_steps or after max_num_epochs passes, whichever comes first;
    # the launcher checks that one pass holds at least one update, so T passes hold T updates
    return {"budget.total_updates": to("grpo.max_num_steps", "grpo.max_num_epochs"),
            "budget.prompts_per_update": to("grpo.num_prompts_per_step"),
            "budget.ppo_epochs": hardcoded(1, "ppo_epochs"),
            "budget.mini_batches": mini_batches,
            "budget.partial_batch": hardcoded("drop", "partial_batch")}


def checkpoint_rules(k: NemoRLKeys) -> dict[str, Rule]:
    optimizer = {k.save_optimizer: True} if k.save_optimizer else {}

    def every(value: Any, spec: ExperimentSpec) -> Outcome:
        # NeMo RL also saves at the last update, which is the spec's "null = only at the end"
        return Pinned({"checkpointing.enabled": True,
                       "checkpointing.save_period": NEVER if value is None else value,
                       "checkpointing.checkpoint_must_save_by": None, **optimizer})

    # without a metric NeMo RL keeps the newest keep_top_k (null: all)
    return {"checkpoint.every": every,
            "checkpoint.keep": lambda v, s: Pinned({"checkpointing.keep_top_k": v,
                                                     "checkpointing.metric_name": None,
                                                     "checkpointing.higher_is_better": True})}


def evaluation_rules(k: NemoRLKeys) -> dict[str, Rule]:
    at_end = {k.val_at_end: False} if k.val_at_end else {}

    def every(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned({"grpo.val_period": 0 if value is None else value,
                       "grpo.val_at_start": False, **at_end})

    # validate() samples with the rollout's settings (greedy=False), one response per prompt
    return {"evaluation.every": every,
            "evaluation.temperature": _validation_temperature,
            "evaluation.top_p": lambda v, s: Hardcoded(s.rollout.top_p, "validation_top_p"),
            "evaluation.samples": hardcoded(1, "validation_samples")}


def _validation_temperature(value: Any, spec: ExperimentSpec) -> Outcome:
    rollout = spec.rollout
    if rollout.top_k is None:
        return Hardcoded(rollout.temperature, "validation_temperature")
    return Hardcoded(f"{rollout.temperature} with top_k {rollout.top_k}",
                     "validation_temperature")

