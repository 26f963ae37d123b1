"""Adapter for OpenRLHF: ``python -m openrlhf.cli.train_ppo_ray`` with argparse flags.

OpenRLHF renamed every flag into a dotted hierarchy at 0.10.2, and argparse accepts any
unambiguous abbreviation of a flag, so a stale or shortened flag can silently land on another
option. Every flag here is an exact option string taken from the contract's dialect for the
installed version, and every flag whose release default changes the math is passed on every
launch (the contract records those defaults; the core refuses a launch that leaves one out).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from stateset_backend.adapters.agent_shims import CONFIG_FILE as CONVERSATION_FILE
from stateset_backend.adapters.agent_shims import shim_files
from stateset_backend.plugin import (
    PYTHON,
    REWARD_SHIM_FILE,
    RUN_DIR,
    AdapterBug,
    Artifact,
    Checkpoint,
    Collected,
    Dialect,
    DialectKeys,
    EngineAdapter,
    ExperimentSpec,
    Hardcoded,
    InvalidInput,
    KitSupport,
    LaunchContext,
    NativeLaunch,
    Outcome,
    Pinned,
    Refused,
    RuleSet,
    Translation,
    Uncountable,
    Unsupported,
    atomic_write_bytes,
    by_conversation,
    carried,
    check_options,
    conversation_rules,
    conversation_settings,
    disabled_when_none,
    environment_file,
    even_split,
    external_rules,
    hardcoded,
    is_conversation,
    local_path,
    local_splits,
    only,
    pinned_model_path,
    reward_shim,
    rl_objective,
    split_rows,
    stage_checkpoint,
    to,
    total_limit,
    turn_limit,
    with_owned_keys,
)

TENSORBOARD = "tensorboard"
CHECKPOINTS = "checkpoints"
KEEP_ALL = 2**31 - 1  # OpenRLHF always rotates checkpoints (default 3): "keep all" is a huge N
KL_CLAMP = 10.0  # compute_approx_kl clamps every estimator's value to [-10, 10]
GROUP_STD_EPSILON = 1e-9  # group_norm: (r - mean) / (std + 1e-9)
# canonical metric -> OpenRLHF's TensorBoard tag
METRICS = {"reward/mean": "train/reward", "loss/policy": "train/policy_loss", "kl": "train/kl",
           "entropy": "train/entropy_loss", "grad_norm": "train/actor_grad_norm",
           "lr": "train/actor_lr", "response_length/mean": "train/response_length",
           "val/reward/mean": "eval/reward"}
DTYPE = {"bfloat16": "bf16", "float16": "fp16"}
SCHEDULER = {"constant": "constant_with_warmup", "cosine": "cosine_with_min_lr",
             "linear": "linear"}
AGENT_FILE = "stateset_openrlhf_agent.py"  # agent_shims/openrlhf_agent.py in the run folder
CONVERTED = f"{RUN_DIR}/data"  # the agent launcher's converted splits
TASK_FIELD = "stateset_task"  # each converted row's original row (the label)
BATCH_WHITENED = frozenset({"gae", "reinforce_baseline"})  # estimators OpenRLHF whitens
NO_VALUE_CLIP = 1e9  # a value clip range no value moves by in one update: no clip


class OpenRLHFKeys(DialectKeys):
    """One release range's option strings (None: the release has no such flag) and the few
    behaviours that differ between releases without a flag of their own."""

    # identity, inputs, outputs and resources
    model: str
    prompt_data: str
    eval_data: str
    input_key: str
    label_key: str
    reward_url: str
    run_name: str
    tensorboard: str
    ckpt_path: str
    save_path: str
    load_checkpoint: str
    nodes: str
    gpus_per_node: str
    vllm_engines: str
    micro_rollout_batch_size: str
    micro_train_batch_size: str
    # algorithm
    estimator: str
    group_size: str
    policy_loss_type: str
    loss_agg_mode: str | None
    eps_clip_low_high: str
    dual_clip: str
    entropy_coef: str
    kl_coef: str
    kl_estimator: str
    kl_use_loss: str
    no_std_norm: str
    gamma: str
    lambd: str
    value_clip: str
    freezing_actor_steps: str  # updates (0-based) up to this one train the critic only
    overlong_buffer_len: str
    overlong_penalty_factor: str
    dynamic_filtering: str
    dynamic_filtering_range: str
    # optimizer: the actor's flag and, where the critic has its own, the critic's
    lr: list[str]
    betas: list[str]
    eps: list[str] | None
    weight_decay: list[str]
    max_norm: list[str]
    lr_scheduler: list[str]
    warmup_ratio: list[str]
    min_lr_ratio: list[str] | None
    # budget, prompts, sampling, validation, checkpoints, dtypes, LoRA
    num_episodes: str
    rollout_batch_size: str
    generate_batch_size: str
    train_batch_size: str
    max_epochs: str
    max_samples: str
    seed: str
    max_len: str
    max_new_tokens: str
    apply_chat_template: str
    temperature: str
    top_p: str
    eval_temperature: str
    eval_samples: str
    eval_steps: str
    save_steps: str
    max_ckpt_num: str
    best_metric_key: str | None
    param_dtype: str
    lora_rank: str
    lora_alpha: str
    lora_dropout: str
    target_modules: str
    # behaviours
    schedulers: list[str]  # lr_scheduler names this release's scheduler call accepts
    fixed_min_lr_ratio: float | None  # the cosine floor when the release has no flag for it
    token_mean_over: str  # "micro_batch" (before 0.11.1) or "optimizer_step"
    fixed: dict[str, Any]  # switches every launch sets to the same value
    agent_func_path: str | None = None  # the agent executor file (multi-turn)


def render_flags(native: dict[str, Any]) -> list[str]:
    """argparse argv: True -> bare flag, False/None -> omitted, a scalar -> ``--flag=value``
    (so a value that starts with ``--`` stays a value), lists -> several values.

    A key that is not a ``--flag`` would become a positional argument, and a list item that
    starts with ``-`` (other than a number) would be read as an option: both are refused."""
    argv: list[str] = []
    for flag, value in sorted(native.items()):
        if not flag.startswith("--") or "=" in flag or len(flag) < 3:
            raise InvalidInput(f"{flag!r}: OpenRLHF options are --flags (without '=')")
        if value is False or value is None:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, list | tuple):
            items = [str(v) for v in value]
            for item in items:
                if item.startswith("-") and not _NUMBER.match(item):
                    raise InvalidInput(f"{flag}: list value {item!r} would be read as an "
                                       "option")
            argv += [flag, *items]
        else:
            if str(value) == "--":  # argparse drops a "--" even after "=": the value is lost
                raise InvalidInput(f"{flag}: the value '--' cannot reach OpenRLHF (its argument "
                                   "parser reads it as the end of the options)")
            argv.append(f"{flag}={value}")
    return argv


# argparse's own test for a negative number (a value, not an option), in Python 3.11.
_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


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


def optimizer_steps_per_update(spec: ExperimentSpec) -> int:
    return spec.budget.ppo_epochs * spec.budget.mini_batches


def warmup_ratio(warmup_updates: int, spec: ExperimentSpec) -> float:
    """A ratio OpenRLHF turns back into exactly warmup_updates * k optimizer steps: it computes
    ceil(total_steps * ratio), and W / T itself often lands one step high (7/25 * 25 > 7)."""
    k = optimizer_steps_per_update(spec)
    steps, total = warmup_updates * k, spec.budget.total_updates * k
    if steps == 0:
        return 0.0
    ratio = (steps - 0.5) / total
    assert math.ceil(total * ratio) == steps
    return ratio


def train_rows(spec: ExperimentSpec, base_dir: str | None) -> int:
    """OpenRLHF has no step limit, so the number of updates follows from the split's size."""
    try:
        return split_rows(spec.data.train.uri, Path(base_dir or "."))
    except Uncountable as exc:
        raise Unsupported(f"OpenRLHF has no step limit, so the launch sizes its passes over "
                          f"data.train from the split's row count, which cannot be counted: "
                          f"{exc}") from None


def passes(spec: ExperimentSpec, rows: int) -> tuple[int, int]:
    """(passes, rows kept) so that exactly total_updates whole updates run: each pass over the
    first U*B rows makes U updates, with U the largest divisor of T that fits in the split."""
    total, batch = spec.budget.total_updates, spec.budget.prompts_per_update
    fit = rows // batch
    if fit == 0:
        raise Unsupported(f"data.train has {rows} rows, fewer than one update's "
                          f"{batch} prompts (budget.prompts_per_update)")
    per_pass = max(u for u in range(1, min(fit, total) + 1) if total % u == 0)
    return total // per_pass, per_pass * batch


# -- rules, by section ------------------------------------------------------------------------
def _algorithm_rules(f: OpenRLHFKeys) -> dict[str, Any]:
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


def _optim_rules(f: OpenRLHFKeys) -> dict[str, Any]:
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


def _data_rules(f: OpenRLHFKeys) -> dict[str, Any]:
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


def _dtype(f: OpenRLHFKeys) -> Any:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        if value not in DTYPE:
            return Refused("OpenRLHF trains in bf16 or fp16")
        native = {f.param_dtype: DTYPE[value]}
        if value == "float16":
            return Hardcoded("float16 training, bfloat16 vLLM rollout", "fp16_rollout_in_bf16",
                             native)
        return Pinned(native)

    return rule


def _total_updates(value: Any, spec: ExperimentSpec) -> Outcome:
    if spec.algorithm.dynamic_sampling is not None:
        return Hardcoded("total_updates minus the updates whose prompts were consumed by "
                         "refills", "refill_consumes_prompts")
    return Pinned({}, "passes and rows kept are sized from the train split's row count when "
                      "the launch is rendered, so exactly this many updates run")


def _mini_batches(f: OpenRLHFKeys) -> Any:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        samples = spec.budget.prompts_per_update * spec.algorithm.group_size
        return even_split(samples, value, "samples") or \
            Pinned({f.train_batch_size: samples // value})

    return rule


def _no_best(f: OpenRLHFKeys) -> dict[str, Any]:
    """0.10.1+ save extra best_* checkpoints and evict by metric unless told 'none'."""
    return {} if f.best_metric_key is None else {f.best_metric_key: "none"}


def _evaluation_every(f: OpenRLHFKeys) -> Any:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        e = spec.evaluation
        # the decoding keys are set even when no validation runs: their defaults are recorded
        return Pinned({f.eval_steps: -1 if value is None else value,
                       f.eval_temperature: e.temperature, f.eval_samples: e.samples,
                       **_no_best(f)})

    return rule


def _evaluation_top_p(value: Any, spec: ExperimentSpec) -> Outcome:
    if spec.evaluation.temperature == 0:
        return Pinned({}, "greedy validation decoding ignores top_p")
    if value == spec.rollout.top_p:
        return Pinned({}, "OpenRLHF validates with the rollout's top_p")
    return Refused("OpenRLHF validates with the rollout's top_p (it has no validation top_p); "
                   "set evaluation.top_p to rollout.top_p")


class OpenRLHFAdapter(EngineAdapter):
    name = "openrlhf"
    contract_file = "openrlhf.json"
    dialect_keys = OpenRLHFKeys
    cluster_launch = "ray"  # its launch is a Ray driver: a cluster's nodes join a Ray cluster

    def rules(self, dialect: Dialect) -> RuleSet:
        f: OpenRLHFKeys = self.keys(dialect)
        rules = {**external_rules("OpenRLHF"), **_algorithm_rules(f), **_optim_rules(f),
                 **_data_rules(f)}
        return {
            **rules,
            "seed": to(f.seed),
            "model.path": lambda v, s: Pinned({f.model: pinned_model_path(s)}),
            "model.dtype": _dtype(f),
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
                                                           {f.vllm_engines: 1})),
            "rollout.temperature": to(f.temperature),
            "rollout.top_p": to(f.top_p),
            "rollout.top_k": lambda v, s: Pinned({}, "OpenRLHF never passes top_k to vLLM "
                                                 "(always -1: no top-k)") if v is None else
            Refused("OpenRLHF always samples without top-k (vLLM top_k -1)"),
            "budget.total_updates": _total_updates,
            "budget.prompts_per_update": to(f.rollout_batch_size, f.generate_batch_size),
            "budget.ppo_epochs": to(f.max_epochs),
            "budget.mini_batches": _mini_batches(f),
            "budget.partial_batch": hardcoded("the first U*B rows of the split, every pass",
                                              "fixed_train_rows"),
            "checkpoint.every": disabled_when_none(f.save_steps, -1),
            "checkpoint.keep": lambda v, s: Pinned({f.max_ckpt_num: KEEP_ALL if v is None
                                                    else v, **_no_best(f)}),
            "evaluation.every": _evaluation_every(f),
            "evaluation.temperature": to(f.eval_temperature),
            "evaluation.samples": to(f.eval_samples),
            "evaluation.top_p": _evaluation_top_p,
            "resources.nodes": to(f.nodes),
            "resources.gpus_per_node": to(f.gpus_per_node),
            **_conversation_rules(f, rules),
        }

    def kit_support(self) -> KitSupport:
        # the kit reads OpenRLHF's launches and writes its outputs with its own knowledge;
        # a free-text option of the release's own spelling (flags renamed at 0.10.2)
        return KitSupport(option_key=lambda plan: "--wandb_project" if self.keys(
            plan.resolved_dialect()).run_name.startswith("--wandb") else
            "--logger.wandb.project")

    def render(self, translation: Translation, spec: ExperimentSpec,
               ctx: LaunchContext) -> NativeLaunch:
        f: OpenRLHFKeys = self.keys(ctx.dialect)
        check_options("openrlhf", ctx.engine_version, spec.engine_options.get("openrlhf", {}))
        owned = {f.run_name: ctx.run_name,
                 f.tensorboard: f"{RUN_DIR}/{TENSORBOARD}",
                 f.ckpt_path: f"{RUN_DIR}/{CHECKPOINTS}",
                 f.save_path: f"{RUN_DIR}/final"}
        episodes, rows = passes(spec, train_rows(spec, ctx.base_dir))
        budget = {f.num_episodes: episodes, f.max_samples: rows}
        # Micro-batch sizes trade memory for speed (and, before 0.11.1, weigh the token mean,
        # which the contract declares); OpenRLHF needs at least one micro-batch per actor
        # process, so take the largest size (<= 8) that gives that.
        processes = max(1, spec.resources.nodes * max(spec.resources.gpus_per_node, 1))
        samples = spec.budget.prompts_per_update * spec.algorithm.group_size
        micro = max(1, min(8, samples // processes))
        memory = {f.micro_rollout_batch_size: micro, f.micro_train_batch_size: micro}
        native = with_owned_keys("openrlhf", {**f.fixed, **memory, **translation.native},
                                 {**owned, **budget})
        # the engine runs in the run folder: local splits are named by absolute path
        for key in (f.prompt_data, f.eval_data):
            if native.get(key) is not None and not str(native[key]).startswith(RUN_DIR):
                local = local_path(native[key], Path(ctx.base_dir or "."))
                native[key] = str(local) if local is not None else native[key]
        if is_conversation(spec):
            return NativeLaunch(
                argv=[PYTHON, f"{RUN_DIR}/{AGENT_FILE}", *render_flags(native)],
                files=_conversation_files(spec, ctx),
                env=["CUDA_VISIBLE_DEVICES", "HF_HOME", "WANDB_API_KEY"], native=native)
        return NativeLaunch(
            argv=[PYTHON, "-m", "openrlhf.cli.train_ppo_ray", *render_flags(native)],
            files={REWARD_SHIM_FILE: reward_shim(spec, ctx.base_dir, "OpenRLHF", REWARD_CALL)},
            env=["CUDA_VISIBLE_DEVICES", "HF_HOME", "WANDB_API_KEY"],
            native=native)

    def collect(self, attempt_dir: Path, ctx: LaunchContext) -> Collected:
        from stateset_backend.plugin import canonical_rows, read_scalars

        out = Collected(raw_metric_names=dict(METRICS))
        # OpenRLHF writes TensorBoard events under <tensorboard_dir>/<run name>
        log_dir = attempt_dir / TENSORBOARD / ctx.run_name
        if log_dir.is_dir():
            out.run_id, out.experiment_digest = ctx.run_id, ctx.experiment_digest
            out.metrics = canonical_rows(read_scalars(log_dir), METRICS)
        out.committed_updates = max((int(r["step"]) for r in out.metrics
                                     if "loss/policy" in r), default=0)
        for step_dir in sorted((attempt_dir / CHECKPOINTS / "_actor").glob("global_step*")):
            step = int(step_dir.name.removeprefix("global_step"))
            out.artifacts += [Artifact(str(p.relative_to(attempt_dir)), "checkpoint", step)
                              for p in sorted(step_dir.rglob("*")) if p.is_file()]
        return out

    def latest_checkpoint(self, attempt_dir: Path) -> Checkpoint | None:
        steps = sorted((attempt_dir / CHECKPOINTS / "_actor").glob("global_step*"),
                       key=lambda p: int(p.name.removeprefix("global_step")))
        if not steps:
            return None
        return Checkpoint(steps[-1], int(steps[-1].name.removeprefix("global_step")))

    def resume_argv(self, checkpoint: Checkpoint, argv: list[str],
                    attempt_dir: Path) -> list[str]:
        """OpenRLHF reloads only from its own ckpt path (DeepSpeed's ``latest`` tag under
        ``_actor`` and, with a critic, ``_critic``): stage the checkpoint there and switch
        loading on. Without the staged tag OpenRLHF would warn and start from scratch."""
        root = checkpoint.path.parent.parent  # <ckpt path>/_actor/global_stepN
        tag = checkpoint.path.name
        for role in ("_actor", "_critic"):
            if (root / role / tag).is_dir():
                stage_checkpoint(root / role / tag, attempt_dir / CHECKPOINTS / role / tag)
                atomic_write_bytes(attempt_dir / CHECKPOINTS / role / "latest", tag.encode())
        flat = any(a == "--ckpt_path" or a.startswith("--ckpt_path=") for a in argv)
        load_flag = "--load_checkpoint" if flat else "--ckpt.load_enable"
        return [*argv, load_flag]


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



def _conversation_files(spec: ExperimentSpec, ctx: LaunchContext) -> dict[str, str]:
    """The executor, the shared shim and their settings (JSON; nothing from the spec becomes
    source)."""
    import json

    base = Path(ctx.base_dir or ".")
    settings = conversation_settings(spec, environment_file(spec, base), pinned_model_path(spec),
                                     local_splits(spec, base, "OpenRLHF conversation",
                                                  "prompt_field"))
    return {**shim_files("openrlhf_agent.py"),
            CONVERSATION_FILE: json.dumps(settings, indent=2, sort_keys=True)}


REWARD_CALL = '''

def reward_func(queries, prompts, labels, **kwargs):
    import torch

    scores = [float(score(p, q[len(p):], a)) for q, p, a in zip(queries, prompts, labels)]
    rewards = torch.tensor(scores)
    return {"rewards": rewards, "scores": rewards, "extra_logs": {}}
'''
