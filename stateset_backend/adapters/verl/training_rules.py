"""Rules for everything around the objective: model, data, sampling, optimizer and schedule,
budget, checkpoints and validation.

Most of these restate a spec setting under verl's key and in verl's unit (prompts, updates,
parquet files); the few that cannot are refused here, where the setting is translated.
"""

from __future__ import annotations

from typing import Any

from stateset_backend.adapters.verl.dialect import (
    ACTOR,
    ADAM_EPS,
    MODEL,
    PRECISION,
    REF,
    ROLLOUT,
    VAL,
    NativeKeys,
)
from stateset_backend.plugin import (
    ExperimentSpec,
    Hardcoded,
    Outcome,
    Pinned,
    Refused,
    Rule,
    even_split,
    pinned_model_path,
)


def model_path(value: Any, spec: ExperimentSpec) -> Outcome:
    path = pinned_model_path(spec)
    keys = [f"{MODEL}.path"] + (["critic.model.path"] if spec.algorithm.gae else [])
    return Pinned({k: path for k in keys})


def _fsdp_models(k: NativeKeys) -> tuple[str, ...]:
    """The FSDP config section of every model verl builds from the policy's weights. Each
    reads its own precision, and verl fills a missing one with bfloat16 params (the KL
    reference's too), so each is pinned: a reference computed in another precision than the
    actor gives a non-zero KL while the policy still equals it."""
    return f"{ACTOR}.fsdp_config", f"{REF}.fsdp_config", k.keys.critic_fsdp


def compute_dtype(k: NativeKeys) -> Rule:
    """Where a release reads the forward's precision from the launch (each model's FSDP mixed
    precision, and before 0.8 the actor's and reference's autocast dtype), it is pinned. Where
    its forward autocasts to bfloat16 whatever it is told, a float32 or float16 spec keeps its
    weights and optimizer but not its matmuls: declared for the actor and the reference, which
    still agree with each other, so the KL stays exact; refused for PPO's critic."""

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        if spec.algorithm.gae is not None and value != "bfloat16" and \
                k.keys.critic_autocast == "bfloat16":
            return Refused("verl before 0.8 runs its critic's forward under "
                           "torch.autocast(bfloat16) whatever the critic's FSDP precision: PPO "
                           f"computes the values in {value} only on verl >= 0.8")
        native: dict[str, Any] = {f"{ROLLOUT}.dtype": value}
        for section in _fsdp_models(k):
            mixed = f"{section}.mixed_precision"
            native |= {k(f"{mixed}.param_dtype"): PRECISION[value],
                       k(f"{mixed}.reduce_dtype"): "fp32", k(f"{mixed}.buffer_dtype"): "fp32"}
        if k.keys.autocast == "fsdp_dtype":  # the forward's autocast dtype
            native |= {k(f"{section}.fsdp_config.dtype"): value for section in (ACTOR, REF)}
        if k.keys.autocast == "bfloat16":
            return Hardcoded("bfloat16", "bf16_autocast", native)
        return Pinned(native)

    return rule


def master_dtype(k: NativeKeys) -> Rule:
    """The reference holds the policy's initial weights in the actor's dtype (before 0.6
    verl loads a reference in bfloat16), so the two agree while the policy has not moved; the
    critic's master weights and optimizer state are held as the actor's are."""

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned({k(f"{section}.model_dtype"): PRECISION[value]
                       for section in _fsdp_models(k)})

    return rule


def data_file(key: str) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        if not str(value).endswith(".parquet"):
            return Refused("verl reads parquet files in its own row format (prompt messages, "
                           "reward_model.ground_truth); convert the split first")
        return Pinned({key: value})

    return rule


def no_validation(value: Any, spec: ExperimentSpec) -> Outcome:
    """verl always builds a validation dataset: it is the train split, never evaluated."""
    return Pinned({"data.val_files": spec.data.train.uri}, "no validation split: verl's "
                  "validation set is the train split, never evaluated (test_freq -1, no "
                  "validation before training)")


def prompt_overflow(k: NativeKeys) -> Rule:
    mode = k.keys.prompt_truncation

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        drop = value == "drop"
        native: dict[str, Any] = {"data.filter_overlong_prompts": drop}
        if k.has("data.truncation"):
            native["data.truncation"] = {"drop": "error", "truncate_left": "left",
                                         "truncate_right": "right", "error": "error"}[value]
        if drop:
            return Pinned(native, "verl drops prompts whose chat-templated length exceeds "
                                  "max_prompt_length before training")
        if mode == "dataset":
            return Pinned(native)
        if mode == "left" and value == "truncate_left":
            return Pinned(native, "verl's agent loop left-truncates a prompt over "
                                  "rollout.prompt_length (= max_prompt_length)")
        where = "verl 0.8 on always truncates from the left" if mode == "left" else \
            "verl 0.7 neither truncates nor rejects an overlong prompt"
        return Refused(f"{where}; use prompt_overflow 'drop' (or verl <= 0.6 for {value})")

    return rule


def top_k(value: Any, spec: ExperimentSpec) -> Outcome:
    return Pinned({f"{ROLLOUT}.top_k": -1 if value is None else value})


def eval_every(k: NativeKeys) -> Rule:
    greedy = {f"{VAL}.temperature": 0.0, f"{VAL}.top_p": 1.0, f"{VAL}.n": 1,
              f"{VAL}.do_sample": False, f"{VAL}.top_k": -1}

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        native = {"trainer.test_freq": -1 if value is None else value,
                  "trainer.val_before_train": False}
        return Pinned({**native, **greedy} if value is None else native)

    return rule


def eval_temperature(value: Any, spec: ExperimentSpec) -> Outcome:
    return Pinned({f"{VAL}.temperature": value, f"{VAL}.do_sample": value > 0,
                   f"{VAL}.top_k": -1})


def schedule(k: NativeKeys) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "linear":
            return Refused("verl's FSDP optimizer has constant and cosine schedules only")
        native = {**k.optim("num_cycles", 0.5), **k.optim("zero_indexed_step", True)}
        if k.has(f"{ACTOR}.optim.lr_scheduler_type"):
            return Pinned({**native, **k.optim("lr_scheduler_type", value),
                           **k.optim("warmup_style", None)})
        return Pinned({**native, **k.optim("warmup_style", value)})

    return rule


def warmup(k: NativeKeys) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned({**k.optim("lr_warmup_steps", value),
                       **k.optim("lr_warmup_steps_ratio", 0.0)},
                      "verl steps its scheduler once per update; update u < W runs at lr * u / W")

    return rule


def min_lr_ratio(k: NativeKeys) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        native = k.optim("min_lr_ratio", value)
        o = spec.optim
        if k.keys.cosine_warmup_from_floor and o.schedule == "cosine" and value > 0:
            if spec.algorithm.gae is not None:
                return Refused("verl 0.4/0.5's critic cosine schedule has no floor")
            if o.warmup_steps > 0:
                return Hardcoded("warmup from min_lr_ratio * lr", "cosine_warmup_from_floor",
                                 native)
        return Pinned(native)

    return rule


def optimizer(k: NativeKeys) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        native = {**k.optim("optimizer", "AdamW"), **k.optim("optimizer_impl", "torch.optim")}
        return Pinned(native) if native else Hardcoded("adamw", "adamw")

    return rule


def eps(k: NativeKeys) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        native = k.optim("override_optimizer_config", {"eps": value})
        return Pinned(native) if native else Hardcoded(ADAM_EPS, "adam_eps")

    return rule


def budget(value: Any, spec: ExperimentSpec) -> Outcome:
    return Pinned({"trainer.total_training_steps": value, "trainer.total_epochs": value},
                  "verl stops after total_training_steps updates; total_epochs = the same number "
                  "is enough passes, since every pass has at least one update")


def mini_batches(value: Any, spec: ExperimentSpec) -> Outcome:
    prompts = spec.budget.prompts_per_update
    return even_split(prompts, value, "prompts") or \
        Pinned({f"{ACTOR}.ppo_mini_batch_size": prompts // value},
               "verl's mini-batch size is in prompts")


def checkpoint_every(value: Any, spec: ExperimentSpec) -> Outcome:
    if value is None:
        return Pinned({"trainer.save_freq": spec.budget.total_updates},
                      "only at the end: save_freq = total_updates")
    return Pinned({"trainer.save_freq": value}, "and at the last update, as verl always does")
