"""Rules around the objective: optimizer and schedule, data, dtype, budget and validation.

OpenRLHF steps its scheduler per optimizer step, reads one prompt and answer key for every
split and has no validation top_p, so several of these settings are declared as deviations or
refused rather than mapped to a flag.
"""

from __future__ import annotations

from typing import Any

from stateset_backend.adapters.openrlhf.budget import optimizer_steps_per_update, warmup_ratio
from stateset_backend.adapters.openrlhf.dialect import OpenRLHFKeys
from stateset_backend.plugin import (
    ExperimentSpec,
    Hardcoded,
    Outcome,
    Pinned,
    Refused,
    carried,
    even_split,
    to,
)

DTYPE = {"bfloat16": "bf16", "float16": "fp16"}
SCHEDULER = {"constant": "constant_with_warmup", "cosine": "cosine_with_min_lr",
             "linear": "linear"}


def optim_rules(f: OpenRLHFKeys) -> dict[str, Any]:
    def eps(value: Any, spec: ExperimentSpec) -> Outcome:
        if f.eps is None:  # FusedAdam built without an eps argument
            return Hardcoded(1e-8, "adam_eps_1e-8")
        return Pinned({k: value for k in f.eps})

    def weight_decay(value: Any, spec: ExperimentSpec) -> Outcome:
        native = {k: value for k in f.weight_decay}
        if value == 0:
            return Pinned(native)
        return Hardcoded("the spec's decay on every parameter except biases and norm weights",
                         "weight_decay_spares_bias_and_norm", native)

    def schedule(value: Any, spec: ExperimentSpec) -> Outcome:
        name = SCHEDULER[value]
        if name not in f.schedulers:
            return Refused(f"OpenRLHF before 0.11.1 passes a minimum-LR argument to every "
                           f"schedule, and its {name} schedule does not take one (TypeError)")
        native = {k: name for k in f.lr_scheduler}
        if value != "constant" and optimizer_steps_per_update(spec) > 1:
            return Hardcoded("decay advanced per optimizer step (k per update)",
                             "lr_decay_per_optimizer_step", native)
        return Pinned(native)

    def min_lr_ratio(value: Any, spec: ExperimentSpec) -> Outcome:
        kind = spec.optim.schedule
        if kind == "linear" and value > 0:
            return Refused("OpenRLHF's linear schedule decays to 0 (min_lr_ratio is passed only "
                           "to its cosine_with_min_lr schedule)")
        if f.min_lr_ratio is None:
            if kind == "cosine":
                return Hardcoded(f.fixed_min_lr_ratio, "cosine_floor_fixed")
            return Pinned({}, f"a {kind} schedule has no floor")
        return Pinned({k: value for k in f.min_lr_ratio})

    def warmup(value: Any, spec: ExperimentSpec) -> Outcome:
        native = {k: warmup_ratio(value, spec) for k in f.warmup_ratio}
        if value > 0 and optimizer_steps_per_update(spec) > 1:
            return Hardcoded("warmup over warmup_steps * k optimizer steps",
                             "lr_warmup_per_optimizer_step", native)
        return Pinned(native)

    return {
        "optim.kind": carried("AdamW (DeepSpeed FusedAdam in decoupled-decay mode)"),
        # the actor's flag; the critic's (f.lr[1:]) is algorithm.gae.critic.lr
        "optim.lr": lambda v, s: Pinned({f.lr[0]: v}),
        "optim.betas": lambda v, s: Pinned({k: list(v) for k in f.betas}),
        "optim.eps": eps,
        "optim.weight_decay": weight_decay,
        "optim.grad_clip": lambda v, s: Pinned({k: v for k in f.max_norm}),
        "optim.schedule": schedule,
        "optim.warmup_steps": warmup,
        "optim.min_lr_ratio": min_lr_ratio,
    }


def data_rules(f: OpenRLHFKeys) -> dict[str, Any]:
    def overflow(value: Any, spec: ExperimentSpec) -> Outcome:
        if value in ("truncate_right", "error"):
            return Refused("OpenRLHF truncates an over-long prompt from the left (it has no "
                           "prompt filter, right truncation or error)")
        return Hardcoded("truncate_left", "overlong_prompt_truncated_left")

    def shuffle(value: Any, spec: ExperimentSpec) -> Outcome:
        if not value:
            return Refused("OpenRLHF always shuffles the prompts of every pass")
        return Hardcoded("shuffled by an RNG not seeded from the spec seed",
                         "unseeded_prompt_order")

    return {
        "data.train.uri": to(f.prompt_data),
        "data.train.prompt_field": to(f.input_key),
        "data.train.answer_field": to(f.label_key),
        "data.validation": lambda v, s: Pinned({f.eval_data: None}),
        "data.validation.uri": to(f.eval_data),
        "data.validation.prompt_field": lambda v, s: Pinned({}, "the train split's prompt key")
        if v == s.data.train.prompt_field
        else Refused("OpenRLHF reads one prompt field for the train and validation splits"),
        "data.validation.answer_field": lambda v, s: Pinned({}, "the train split's answer key")
        if v == s.data.train.answer_field
        else Refused("OpenRLHF reads one answer field for the train and validation splits"),
        "data.max_prompt_tokens": lambda v, s: Pinned(
            {f.max_len: v + s.data.max_response_tokens}),
        "data.max_response_tokens": to(f.max_new_tokens),
        "data.chat_template": to(f.apply_chat_template),
        "data.prompt_overflow": overflow,
        "data.shuffle": shuffle,
    }


def dtype(f: OpenRLHFKeys) -> Any:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        if value not in DTYPE:
            return Refused("OpenRLHF trains in bf16 or fp16")
        native = {f.param_dtype: DTYPE[value]}
        if value == "float16":
            return Hardcoded("float16 training, bfloat16 vLLM rollout", "fp16_rollout_in_bf16",
                             native)
        return Pinned(native)

    return rule


def total_updates(value: Any, spec: ExperimentSpec) -> Outcome:
    if spec.algorithm.dynamic_sampling is not None:
        return Hardcoded("total_updates minus the updates whose prompts were consumed by "
                         "refills", "refill_consumes_prompts")
    return Pinned({}, "passes and rows kept are sized from the train split's row count when "
                      "the launch is rendered, so exactly this many updates run")


def mini_batches(f: OpenRLHFKeys) -> Any:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        samples = spec.budget.prompts_per_update * spec.algorithm.group_size
        return even_split(samples, value, "samples") or \
            Pinned({f.train_batch_size: samples // value})

    return rule


def no_best(f: OpenRLHFKeys) -> dict[str, Any]:
    """0.10.1+ save extra best_* checkpoints and evict by metric unless told 'none'."""
    return {} if f.best_metric_key is None else {f.best_metric_key: "none"}


def evaluation_every(f: OpenRLHFKeys) -> Any:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        e = spec.evaluation
        # the decoding keys are set even when no validation runs: their defaults are recorded
        return Pinned({f.eval_steps: -1 if value is None else value,
                       f.eval_temperature: e.temperature, f.eval_samples: e.samples,
                       **no_best(f)})

    return rule


def evaluation_top_p(value: Any, spec: ExperimentSpec) -> Outcome:
    if spec.evaluation.temperature == 0:
        return Pinned({}, "greedy validation decoding ignores top_p")
    if value == spec.rollout.top_p:
        return Pinned({}, "OpenRLHF validates with the rollout's top_p")
    return Refused("OpenRLHF validates with the rollout's top_p (it has no validation top_p); "
                   "set evaluation.top_p to rollout.top_p")
