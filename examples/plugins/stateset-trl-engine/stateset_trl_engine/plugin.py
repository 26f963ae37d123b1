"""The TRL adapter: the spec as a GRPOConfig (RL objectives) or an SFTConfig (objective sft)
and a generated script that runs GRPOTrainer or SFTTrainer.

Every spec leaf ends pinned (a GRPOConfig field; an SFTConfig field, named ``sft.<field>`` so
the two trainers' keys and defaults never mix; or a ``launch.*`` setting the generated script
honours), refused, or declared (a behaviour TRL hard-codes, named in the contract). The launch
is one Python file written into the run folder: its settings are a JSON literal, never
formatted into code, and the code around them is the fixed ``launch_script.py``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import importlib
import inspect
import json
from importlib import resources
from pathlib import Path
from typing import Any

from stateset_backend.plugin import (
    LOWER_IS_BETTER,
    MANIFEST,
    PYTHON,
    REWARD_SHIM_FILE,
    RUN_DIR,
    RUNTIME_FILE,
    STAGED_CHECKPOINT,
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
    NotApplicable,
    Outcome,
    Pinned,
    Refused,
    Rehearsal,
    RuleSet,
    Translation,
    added_constants,
    carried,
    compared_values,
    distribution_version,
    even_split,
    external_rules,
    hookimpl,
    local_path,
    log_rows,
    manifest_problem,
    only,
    pinned_model_path,
    read_runtime,
    refuse,
    reward_shim,
    runtime_identity,
    to,
    with_owned_keys,
)

LAUNCH_FILE = "stateset_trl_launch.py"
METRICS_FILE = "trl_metrics.jsonl"
IDENTITY_FILE = "trl_identity.json"
CHECKPOINTS = "checkpoints"
CHECKPOINT_PREFIX = "checkpoint-"  # TRL's checkpoint-<optimizer step> folders
CHECKPOINT_STATE = "stateset_checkpoint.json"  # the update and retention state, per checkpoint
# the packages whose versions each checkpoint records: a resume under others is refused
RUNTIME_PACKAGES = ("torch", "transformers", "trl", "accelerate")
FINAL = "final"
BUILTIN_PREFIX = "builtin:"
STD_EPSILON = 1e-4  # GRPOTrainer: advantages / (std_rewards + 1e-4)
LAUNCH = "launch."  # settings the generated script honours itself (not GRPOConfig fields)
VALIDATION = LAUNCH + "validation."  # its validation callback's settings
SFT = "sft."  # SFTConfig fields, for objective sft (SFTTrainer)
SUPERVISED = "sft"
# canonical metric -> TRL's logged name
METRICS = {"reward/mean": "reward", "loss/policy": "loss", "kl": "kl", "entropy": "entropy",
           "grad_norm": "grad_norm", "lr": "learning_rate",
           "response_length/mean": "completions/mean_length"}
# SFTTrainer's logs: the native engine's names for an sft run
SFT_METRICS = {"loss/sft": "loss", "token_accuracy": "mean_token_accuracy", "entropy": "entropy",
               "grad_norm": "grad_norm", "lr": "learning_rate"}
CLIPPED = ("grpo", "dr_grpo", "dapo", "gspo")  # objectives TRL runs with its clipped surrogate
TOKEN_LOSS = {"token_mean": "bnpo", "seq_mean_token_mean": "grpo",
              "seq_mean_token_sum_norm": "dr_grpo"}
SEQUENCE_LOSS = {**TOKEN_LOSS, "seq_mean_token_sum": "luspo"}


class TRLKeys(DialectKeys):
    """GRPOConfig field names per release range, and switches every launch sets alike."""

    num_generations: str
    per_device_train_batch_size: str
    steps_per_generation: str
    gradient_accumulation_steps: str
    num_iterations: str
    max_steps: str
    loss_type: str
    scale_rewards: str
    importance_sampling_level: str
    epsilon: str
    epsilon_high: str
    delta: str
    beta: str
    entropy_coef: str
    temperature: str
    top_p: str
    top_k: str
    max_completion_length: str
    shuffle_dataset: str
    seed: str
    learning_rate: str
    adam_beta1: str
    adam_beta2: str
    adam_epsilon: str
    weight_decay: str
    max_grad_norm: str
    optim: str
    lr_scheduler_type: str
    lr_scheduler_kwargs: str
    warmup_steps: str
    bf16: str
    fp16: str
    model_init_kwargs: str
    save_strategy: str
    save_steps: str
    save_total_limit: str
    eval_strategy: str
    use_vllm: str
    use_cpu: str
    padding_free: str
    train_sampling_strategy: str
    dataloader_drop_last: str
    output_dir: str
    run_name: str
    logging_steps: str
    report_to: str
    fixed: dict[str, Any]  # features switched off (or to the spec's meaning) on every launch
    sft_fixed: dict[str, Any]  # the same for every SFTTrainer launch (SFTConfig fields)


def steps_per_update(spec: ExperimentSpec) -> int:
    """Optimizer steps per update: TRL's max_steps, save_steps and scheduler count these."""
    return spec.budget.ppo_epochs * spec.budget.mini_batches


def supervised(spec: ExperimentSpec) -> bool:
    """An sft spec runs on SFTTrainer, every other on GRPOTrainer."""
    return spec.algorithm.objective == SUPERVISED


@functools.cache
def grpo_config_fields() -> frozenset[str]:
    """GRPOConfig's field names, read from the supported TRL release's wheel (a test compares
    them with the installed TRL): an engine option is checked at plan time against them, as
    importing TRL to ask would take seconds."""
    return _fields("grpo_config_fields.json")


@functools.cache
def sft_config_fields() -> frozenset[str]:
    """SFTConfig's field names, likewise (engine options of an sft spec are ``sft.<field>``)."""
    return _fields("sft_config_fields.json")


def _fields(name: str) -> frozenset[str]:
    doc = json.loads(resources.files("stateset_trl_engine").joinpath(name).read_text(
        encoding="utf-8"))
    return frozenset(doc["fields"])


def for_trainer(rule: Any) -> Any:
    """``rule`` with its native keys named for the trainer that runs the spec: GRPOConfig
    fields as they are, SFTConfig fields as ``sft.<field>`` (``launch.*`` settings either way).
    Both configs share most TrainingArguments fields, but not their defaults (SFTConfig's
    learning rate, shuffle and loss_type differ), so the contract records each trainer's own."""

    def named(native: dict[str, Any]) -> dict[str, Any]:
        return {key if key.startswith((LAUNCH, SFT)) else SFT + key: value
                for key, value in native.items()}

    def wrapped(value: Any, spec: ExperimentSpec) -> Outcome:
        outcome = rule(value, spec)
        if supervised(spec) and isinstance(outcome, Pinned | Hardcoded) and outcome.native:
            return dataclasses.replace(outcome, native=named(outcome.native))
        return outcome

    return wrapped


def by_trainer(rl: Any, sft: Any) -> Any:
    """One rule for RL specs (GRPOTrainer), another for sft specs (SFTTrainer)."""
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return (sft if supervised(spec) else rl)(value, spec)

    return rule


def builtin_dir(model_path: str) -> Path | None:
    """The asset folder of a ``builtin:<name>`` model, shipped with stateset-backend."""
    if not model_path.startswith(BUILTIN_PREFIX):
        return None
    name = model_path.removeprefix(BUILTIN_PREFIX)
    root = Path(str(resources.files("stateset_backend"))) / "native" / "assets"
    directory = root / name
    if not name or "/" in name or not (directory / "config.json").is_file():
        known = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        raise InvalidInput(f"model.path: no built-in model {name!r} "
                           f"(built-in: {', '.join(known) or 'none'})")
    return directory


def directory_digest(root: Path) -> str:
    """``sha256:`` of the canonical JSON {relative path: file sha256} (the spec's local-model
    revision)."""
    import rfc8785

    files = {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(root.rglob("*")) if p.is_file()}
    return "sha256:" + hashlib.sha256(rfc8785.dumps(files)).hexdigest()


# -- rules, by section --------------------------------------------------------------------
def _algorithm_rules(f: TRLKeys) -> dict[str, Any]:
    def objective(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == SUPERVISED:
            return Pinned({f.loss_type: "nll"}, "TRL's SFTTrainer: the negative log-likelihood "
                          "of the answer tokens only (its completion-only loss on "
                          "prompt/completion rows; prompt tokens are labelled -100)")
        if value not in (*CLIPPED, "cispo"):
            return Refused(_objective_refusal(value))
        return Pinned({f.loss_type: loss_type(spec)}) if loss_type(spec) else Refused(
            _aggregation_refusal(spec))

    def sft_aggregation(value: Any, spec: ExperimentSpec) -> Outcome:
        if value != "token_mean":
            return Refused("TRL's SFTTrainer divides the summed answer-token loss by the "
                           "update's answer tokens (a token mean); it has no "
                           f"{value} aggregation")
        return Pinned({}, "SFTTrainer: the answer tokens' summed loss over their count in the "
                      "batch (num_items_in_batch), one optimizer step per update")

    def layout(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "packed":
            return Pinned({f.padding_free: True}, "TRL's padding-free batches: the update's rows "
                          "concatenated into one sequence, positions restarting at 0 for each "
                          "row and no attention mask, from which transformers builds a "
                          "block-diagonal causal mask (each row attends only to itself); the "
                          "spec's packed sequences of at most max_prompt_tokens + "
                          "max_response_tokens tokens group the same rows differently, which "
                          "changes memory, not the loss")
        return Pinned({f.padding_free: False}, "one row per sequence, right-padded to the "
                      "longest in the update, padding masked")

    def aggregation(value: Any, spec: ExperimentSpec) -> Outcome:
        name = loss_type(spec)
        return Pinned({f.loss_type: name}) if name else Refused(_aggregation_refusal(spec))

    def ratio_level(value: Any, spec: ExperimentSpec) -> Outcome:
        gspo = spec.algorithm.objective == "gspo"
        if (value == "sequence") != gspo:
            return Refused("TRL's sequence-level ratio is GSPO's; other objectives use token "
                           "ratios" if value == "sequence" else
                           "GSPO's ratio is per sequence (ratio_level sequence)")
        native = {f.importance_sampling_level: value}
        if steps_per_update(spec) > 1:
            return Hardcoded("ratio from the unclamped log-ratio", "log_ratio_unclamped", native)
        return Pinned(native, "one optimizer step per batch: TRL's ratio is exactly 1")

    def clip_low(value: Any, spec: ExperimentSpec) -> Outcome:
        if spec.algorithm.objective == "cispo":
            if value < 1.0:
                return Refused("TRL's CISPO weight has no lower clip: set clip.low to 1.0 or "
                               "more (the ratio is never below 1 - low)")
            return Pinned({f.epsilon: value}, "CISPO: TRL clips the weight from above only")
        return Pinned({f.epsilon: value})

    def clip_high(value: Any, spec: ExperimentSpec) -> Outcome:
        if spec.algorithm.objective == "cispo":  # TRL's epsilon_high is CISPO's weight cap
            return Pinned({f.epsilon_high: 1.0 + value})
        return Pinned({f.epsilon_high: value})

    def dual_clip(value: Any, spec: ExperimentSpec) -> Outcome:
        if value is None:
            return Pinned({f.delta: None})
        if spec.algorithm.objective == "cispo":
            return Refused("TRL's CISPO loss has no dual clip")
        if value <= 1.0 + spec.algorithm.clip.high:
            return Refused("TRL's two-sided clip (delta) equals dual-clip only above the upper "
                           "clip bound: set dual_clip above 1 + clip.high")
        return Pinned({f.delta: value}, "TRL's delta caps the ratio of negative-advantage "
                                        "tokens, which bounds their loss by -A * dual_clip")

    def kl_section(value: Any, spec: ExperimentSpec) -> Outcome:  # only reached when null
        return Pinned({f.beta: 0.0})

    def kl_coef(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned({f.beta: value})

    def kl_clamp(value: Any, spec: ExperimentSpec) -> Outcome:
        return Hardcoded("none", "k3_unclamped")

    def std_normalize(value: Any, spec: ExperimentSpec) -> Outcome:
        if not value:
            return Pinned({f.scale_rewards: "none"})
        if spec.algorithm.advantage.scope != "group":
            return Refused("TRL's batch scaling divides by the std of the raw rewards, not "
                           "the token-weighted whitening of advantage.scope batch")
        return Pinned({f.scale_rewards: "group"})

    def scope(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "group" or not spec.algorithm.advantage.std_normalize:
            return Pinned({}, "TRL centres by the group mean; scale_rewards says what divides")
        return Refused("TRL's batch scaling divides by the std of the raw rewards, not the "
                       "token-weighted whitening of advantage.scope batch")

    def zero_variance(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "exclude":
            return Refused("TRL keeps zero-variance groups (it has no dynamic sampling)")
        return Hardcoded("kept, centred by a float32 group mean", "zero_variance_float_mean")

    return {
        "algorithm.objective": objective,
        "algorithm.sft": refuse("this algorithm.sft setting is not translated for TRL"),
        "algorithm.sft.layout": layout,
        "algorithm.group_size": only(lambda v: v >= 2, "TRL needs at least 2 samples per "
                                     "prompt", to(f.num_generations)),
        "algorithm.clip.low": clip_low,
        "algorithm.clip.high": clip_high,
        "algorithm.clip.dual_clip": dual_clip,
        "algorithm.ratio_level": ratio_level,
        "algorithm.loss_aggregation": by_trainer(aggregation, sft_aggregation),
        "algorithm.kl": kl_section,
        "algorithm.kl.coef": kl_coef,
        "algorithm.kl.estimator": only(lambda v: v == "k3", "TRL's KL is the k3 estimator",
                                       carried("TRL's only estimator (k3)")),
        "algorithm.kl.placement": only(lambda v: v == "loss", "TRL adds the KL to the loss, "
                                       "never to the reward", carried("added to each token's "
                                                                      "loss, times beta")),
        "algorithm.kl.clamp": kl_clamp,
        "algorithm.advantage.std_normalize": std_normalize,
        "algorithm.advantage.std": lambda v, s: Hardcoded("unbiased", "group_std_unbiased"),
        "algorithm.advantage.epsilon": lambda v, s: Hardcoded(STD_EPSILON,
                                                              "group_std_plus_1e-4"),
        "algorithm.advantage.scope": scope,
        "algorithm.advantage.zero_variance_groups": zero_variance,
        "algorithm.dynamic_sampling": lambda v, s: Pinned(
            {}, "TRL never refills a batch") if v is None else
        Refused("TRL has no dynamic sampling"),
        "algorithm.dynamic_sampling.max_rounds": refuse("TRL has no dynamic sampling"),
        "algorithm.overlong": lambda v, s: Pinned(
            {}, "TRL shapes no reward by length") if v is None else
        Refused("TRL has no soft overlong penalty"),
        "algorithm.overlong.buffer_tokens": refuse("TRL has no soft overlong penalty"),
        "algorithm.overlong.penalty": refuse("TRL has no soft overlong penalty"),
        "algorithm.entropy_coef": to(f.entropy_coef),
        "algorithm.rollout_correction": lambda v, s: Pinned(
            {}, "transformers' generate samples: nothing to correct") if v is None else
        Refused("the TRL launch samples with transformers' generate and keeps no sampler "
                "log-probs to weight by"),
        "algorithm.gae": lambda v, s: Pinned({}, "no critic") if v is None else
        Refused(NO_CRITIC),
        "algorithm.gae.gamma": refuse(NO_CRITIC),
        "algorithm.gae.lam": refuse(NO_CRITIC),
    }


# TRL 1.16 ships no PPO trainer (trl.experimental has none either), and its GRPOTrainer and
# RLOOTrainer have no value model
NO_CRITIC = ("TRL 1.16 has no trainer with a critic: neither trl nor trl.experimental ships a "
             "PPO trainer or a value model, and its GRPOTrainer and RLOOTrainer estimate "
             "advantages from groups of samples, without GAE")


def _objective_refusal(value: str) -> str:
    if value == "ppo":
        return NO_CRITIC
    return f"TRL's GRPOTrainer has no {value} objective"


def loss_type(spec: ExperimentSpec) -> str | None:
    """TRL's loss_type for the spec's objective and aggregation, or None when it has none."""
    a, agg = spec.algorithm, spec.algorithm.loss_aggregation
    if a.objective == "cispo":
        # normalised by the batch's token count / steps_per_generation: a token mean only
        # when each batch is one optimizer step
        return "cispo" if agg == "token_mean" and spec.budget.mini_batches == 1 else None
    table = SEQUENCE_LOSS if a.ratio_level == "sequence" else TOKEN_LOSS
    return table.get(agg)


def _aggregation_refusal(spec: ExperimentSpec) -> str:
    a = spec.algorithm
    if a.objective == "cispo":
        return ("TRL's CISPO loss is a token mean over the whole batch: it needs "
                "loss_aggregation token_mean and budget.mini_batches 1")
    return (f"TRL sums tokens per sequence (luspo) only with sequence ratios; "
            f"{a.loss_aggregation} with {a.ratio_level} ratios has no TRL loss_type")


def _optim_rules(f: TRLKeys) -> dict[str, Any]:
    def weight_decay(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == 0:
            return Pinned({f.weight_decay: value})
        return Hardcoded("decay on every parameter except biases and norm weights",
                         "weight_decay_spares_bias_and_norm", {f.weight_decay: value})

    def schedule(value: Any, spec: ExperimentSpec) -> Outcome:
        ratio = spec.optim.min_lr_ratio
        name = {"constant": "constant_with_warmup", "cosine": "cosine_with_min_lr",
                "linear": "linear" if ratio == 0 else "polynomial"}[value]
        native = {f.lr_scheduler_type: name}
        if value != "constant" and steps_per_update(spec) > 1:
            return Hardcoded("decay advanced per optimizer step", "lr_decay_per_optimizer_step",
                             native)
        return Pinned(native)

    def min_lr_ratio(value: Any, spec: ExperimentSpec) -> Outcome:
        kind = spec.optim.schedule
        if kind == "cosine":
            return Pinned({f.lr_scheduler_kwargs: {"min_lr_rate": value}})
        if kind == "linear" and value > 0:  # a linear decay to a floor is power-1 polynomial
            return Pinned({f.lr_scheduler_kwargs: {"lr_end": value * spec.optim.lr,
                                                   "power": 1.0}})
        return Pinned({f.lr_scheduler_kwargs: {}}, f"a {kind} schedule has no floor")

    def warmup(value: Any, spec: ExperimentSpec) -> Outcome:
        k = steps_per_update(spec)
        native = {f.warmup_steps: value * k}
        if value > 0 and k > 1:
            return Hardcoded("warmup over warmup_steps * k optimizer steps",
                             "lr_warmup_per_optimizer_step", native)
        return Pinned(native)

    return {
        "optim.kind": only(lambda v: v == "adamw", "TRL is given torch's AdamW",
                           lambda v, s: Pinned({f.optim: "adamw_torch"})),
        "optim.lr": to(f.learning_rate),
        "optim.betas": lambda v, s: Pinned({f.adam_beta1: v[0], f.adam_beta2: v[1]}),
        "optim.eps": to(f.adam_epsilon),
        "optim.weight_decay": weight_decay,
        "optim.grad_clip": to(f.max_grad_norm),
        "optim.schedule": schedule,
        "optim.warmup_steps": warmup,
        "optim.min_lr_ratio": min_lr_ratio,
    }


def _budget_rules(f: TRLKeys) -> dict[str, Any]:
    def batch(spec: ExperimentSpec) -> Outcome:
        samples = spec.budget.prompts_per_update * spec.algorithm.group_size
        parts = spec.budget.mini_batches
        return even_split(samples, parts, "samples") or Pinned({
            f.per_device_train_batch_size: samples // parts, f.steps_per_generation: parts,
            f.gradient_accumulation_steps: 1})

    def mini_batches(value: Any, spec: ExperimentSpec) -> Outcome:
        outcome = batch(spec)
        if value > 1 and isinstance(outcome, Pinned):
            return Hardcoded("mini-batches of shuffled samples, the same split every epoch",
                             "mini_batches_of_shuffled_samples", outcome.native)
        return outcome

    def sft_batch(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned({f.per_device_train_batch_size: value, f.gradient_accumulation_steps: 1},
                      "prompt/answer rows per optimizer step, one step per update")

    return {
        "budget.total_updates": lambda v, s: Pinned({f.max_steps: v * steps_per_update(s)},
                                                    "max_steps counts optimizer steps: "
                                                    "total_updates * ppo_epochs * "
                                                    "mini_batches"),
        "budget.prompts_per_update": by_trainer(lambda v, s: batch(s), sft_batch),
        "budget.ppo_epochs": to(f.num_iterations),
        "budget.mini_batches": mini_batches,
        "budget.partial_batch": by_trainer(
            carried("TRL's sampler drops the prompts left at the end of a pass that cannot "
                    "fill a whole batch, and reshuffles the next pass"),
            lambda v, s: Pinned({f.dataloader_drop_last: True}, "the rows left at the end of "
                                "a pass that cannot fill a whole batch are dropped")),
    }


def _data_rules(f: TRLKeys) -> dict[str, Any]:
    def chat_template(value: Any, spec: ExperimentSpec) -> Outcome:
        if value and spec.model.path.startswith(BUILTIN_PREFIX):
            return Refused(f"{spec.model.path} ships no chat template: set data.chat_template "
                           "to false to tokenize prompts as plain text")
        return Pinned({LAUNCH + "chat_template": value}, "a prompt is one user message "
                      "(conversational dataset) or plain text")

    def overflow(value: Any, spec: ExperimentSpec) -> Outcome:
        if value not in ("drop", "error"):
            return Refused("TRL has no prompt truncation; the launch can drop over-long prompts "
                           "or stop with an error")
        return Pinned({LAUNCH + "prompt_overflow": value}, "the launch script measures each "
                      "prompt with the model's tokenizer before training")

    return {
        "data.train.uri": to(LAUNCH + "train_uri"),
        "data.train.prompt_field": to(LAUNCH + "prompt_field"),
        "data.train.answer_field": to(LAUNCH + "answer_field"),
        "data.validation": carried("no validation split"),
        "data.validation.uri": to(VALIDATION + "uri"),
        "data.validation.prompt_field": to(VALIDATION + "prompt_field"),
        "data.validation.answer_field": to(VALIDATION + "answer_field"),
        "data.max_prompt_tokens": to(LAUNCH + "max_prompt_tokens"),
        "data.max_response_tokens": by_trainer(to(f.max_completion_length), lambda v, s: Pinned(
            {LAUNCH + "max_response_tokens": v}, "the launch cuts each answer, ended by EOS, at "
            "max_response_tokens tokens (SFTConfig's max_length stays off)")),
        "data.max_total_tokens": refuse("TRL's GRPOTrainer gives every completion "
                                        "max_completion_length tokens whatever its prompt's "
                                        "length; it has no budget they share"),
        "optim.warmup_start_ratio": refuse("transformers' schedulers, which TRL's trainers "
                                           "use, warm up from 0"),
        "data.chat_template": chat_template,
        "data.prompt_overflow": overflow,
        "data.shuffle": by_trainer(to(f.shuffle_dataset), lambda v, s: Pinned(
            {f.train_sampling_strategy: "random" if v else "sequential"},
            "the trainer's sampler: a seeded shuffle of every pass, or the split's order")),
    }


def _model_rules(f: TRLKeys) -> dict[str, Any]:
    def dtype(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "float32":
            return Pinned({f.bf16: False, f.fp16: False})
        if value == "bfloat16":
            return Pinned({f.bf16: True, f.fp16: False}, "autocast over float32 weights")
        return Refused("the TRL launch computes in float32 or bfloat16")

    return {
        "model.path": lambda v, s: Pinned({LAUNCH + "model": pinned_model_path(s)}),
        "model.dtype": dtype,
        "model.param_dtype": only(lambda v: v == "float32", "the TRL launch keeps float32 "
                                  "weights and optimizer state",
                                  lambda v, s: Pinned({f.model_init_kwargs: {"dtype":
                                                                             "float32"}})),
        "model.lora": lambda v, s: Pinned({}, "full fine-tuning: no peft_config") if v is None
        else Refused("LoRA is not translated for TRL yet"),
        "model.lora.rank": refuse("LoRA is not translated for TRL yet"),
        "model.lora.alpha": refuse("LoRA is not translated for TRL yet"),
        "model.lora.dropout": refuse("LoRA is not translated for TRL yet"),
        "model.lora.target_modules": refuse("LoRA is not translated for TRL yet"),
        "model.from_run": lambda v, s: Pinned({}, "the weights are model.path's"),
        "model.from_run.run_id": carried(STAGED_HOW, hub=True),
        "model.from_run.checkpoint": carried(STAGED_HOW, hub=True),
        "model.from_run.sha256": lambda v, s: Pinned(
            {LAUNCH + "from_run_sha256": v}, "the launch checks the staged checkpoint's "
            "manifest against it and every file against the manifest, then loads its weights "
            "(a native or a TRL checkpoint) into model.path's architecture before the trainer "
            "starts; the KL reference is the same weights"),
    }


STAGED_HOW = (f"the hub finds the stored run's checkpoint, checks it and stages it in the "
              f"attempt folder ({STAGED_CHECKPOINT}/), where the launch reads it")


def _run_rules(f: TRLKeys) -> dict[str, Any]:
    def checkpoint_every(value: Any, spec: ExperimentSpec) -> Outcome:
        if value is None:
            return Pinned({f.save_strategy: "no", f.save_steps: 500})
        return Pinned({f.save_strategy: "steps", f.save_steps: value * steps_per_update(spec)})

    def gpus(value: Any, spec: ExperimentSpec) -> Outcome:
        if value > 1:
            return Refused(ONE_PROCESS)
        return Pinned({f.use_cpu: value == 0})

    def processes(value: Any, spec: ExperimentSpec) -> Outcome:
        if value is None or value == 1:
            return NotApplicable("the TRL launch is one process")
        return Refused(ONE_PROCESS)

    def environment_kind(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned({}, "single-turn rollout") if value == "single_turn" else \
            Refused(CONVERSATIONS)

    def max_turns(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned({}, "single-turn: one response per prompt") \
            if spec.environment.kind == "single_turn" else Refused(CONVERSATIONS)

    def reward_kind(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "environment":
            return Refused(CONVERSATIONS)
        if value != "python":
            return Refused("only python rewards are translated for TRL")
        return Pinned({}, "a python reward, through the generated reward shim", hub=True)

    return {
        "seed": to(f.seed),
        "reward.entrypoint": carried("a TRL reward function in the generated reward shim",
                                     hub=True),
        "rollout.backend": only(lambda v: v == "hf", "the TRL launch samples with "
                                "transformers' generate (rollout.backend hf); TRL's vLLM "
                                "rollout adds its own importance-sampling correction",
                                lambda v, s: Pinned({f.use_vllm: False})),
        "rollout.temperature": to(f.temperature),
        "rollout.top_p": to(f.top_p),
        "rollout.top_k": to(f.top_k, convert=lambda v: 0 if v is None else v),
        "checkpoint.every": checkpoint_every,
        # TRL's own rotation (save_total_limit) deletes the oldest checkpoints whatever their
        # validation; the launch's retention callback keeps the newest `keep` and the best so
        # far by evaluation.select_by, the checkpoint the hub will recommend
        "checkpoint.keep": lambda v, s: Pinned(
            {f.save_total_limit: None, LAUNCH + "keep": v},
            "the launch's retention callback: the newest checkpoint.keep checkpoints and the "
            "best so far by evaluation.select_by (TRL's save_total_limit stays off)"),
        "evaluation.every": lambda v, s: Pinned(
            {f.eval_strategy: "no", VALIDATION + "every": v},
            "TRL's own evaluation samples like its rollouts, so it stays off; the launch's "
            "callback runs the spec's validation at update 0 and every evaluation.every"),
        "evaluation.select_by": lambda v, s: Pinned(
            {LAUNCH + "select_by": v, LAUNCH + "lower_is_better": v in LOWER_IS_BETTER},
            "the hub ranks the launch's validation rows at the updates TRL checkpointed; the "
            "retention callback never deletes the best of them"),
        "evaluation.temperature": to(VALIDATION + "temperature"),
        "evaluation.top_p": to(VALIDATION + "top_p"),
        "evaluation.samples": to(VALIDATION + "samples"),
        "resources.nodes": only(lambda v: v == 1, "the TRL launch runs on one node",
                                carried("one node")),
        "resources.gpus_per_node": gpus,
        "resources.processes_per_node": processes,
        "environment": refuse(CONVERSATIONS),
        "environment.kind": environment_kind,
        "environment.max_turns": max_turns,
        "reward.kind": reward_kind,
    }


# What TRL 1.16 itself can do but this plugin does not translate yet
ONE_PROCESS = ("TRL trains data-parallel when started under accelerate launch or torchrun (one "
               "process per device), but this plugin starts one process on one device and does "
               "not translate several processes or GPUs yet")
CONVERSATIONS = ("TRL 1.16's GRPOTrainer can roll out conversations (its environment_factory, "
                 "tools and rollout_func arguments), but this plugin does not translate the "
                 "spec's multi-turn and tool-use environments to them yet")


def write_outputs(attempt: Path, ctx: LaunchContext, *, metrics: list[dict[str, Any]],
                  identity: bool, artifacts: bool, checkpoint_step: int | None,
                  resumed_from: int | None = None) -> None:
    """TRL's outputs as the generated launch leaves them, from canonical rows, for the
    conformance kit: the identity file (with the update a resumed attempt continued from),
    the metrics log, checkpoints and final weights."""
    name = ctx.run_name if identity else "other-run." + "0" * 64
    # TRL counts optimizer steps: the launch logs at every update's last one and names
    # checkpoints by it, and records how many an update takes
    steps = next((r["optimizer_step"] // r["step"] for r in metrics
                  if "optimizer_step" in r and r["step"]), 1)
    (attempt / IDENTITY_FILE).write_text(json.dumps({"run_name": name,
                                                     "steps_per_update": steps,
                                                     "resumed_from": resumed_from}))
    with (attempt / METRICS_FILE).open("w") as out:
        for row in metrics:
            logs = {raw: row[key] for key, raw in METRICS.items() if key in row}
            validation = {k: v for k, v in row.items() if k.startswith("val/")}
            if logs or not validation:
                out.write(json.dumps({"update": row["step"], "step": row["step"] * steps,
                                      "logs": logs}) + "\n")
            if validation:
                out.write(json.dumps({"update": row["step"], "validation": validation})
                          + "\n")
    if artifacts and checkpoint_step is not None:
        step_dir = attempt / CHECKPOINTS / f"{CHECKPOINT_PREFIX}{checkpoint_step * steps}"
        step_dir.mkdir(parents=True)
        (step_dir / "model.safetensors").write_bytes(b"weights")
        (step_dir / CHECKPOINT_STATE).write_text(json.dumps({"update": checkpoint_step,
                                                             "best": None}))
        files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                 for p in sorted(step_dir.iterdir())}
        (step_dir / MANIFEST).write_text(json.dumps({
            "experiment_digest": ctx.experiment_digest, "update": checkpoint_step,
            "files": files}))
        (attempt / FINAL).mkdir()
        (attempt / FINAL / "model.safetensors").write_bytes(b"final")


def cut_save(checkpoint_dir: Path) -> None:
    """A checkpoint as a crash during its save leaves it: TRL's files, without the manifest
    the launch writes last to seal it."""
    (checkpoint_dir / MANIFEST).unlink()


def resumes_from(argv: list[str], read: dict[str, Any], attempt: Path) -> Path | None:
    """The checkpoint folder a launch resumes from, as the launch script's ``resume_point``
    reads its command line: ``--resume-from CHECKPOINT`` right after the script, handed to
    ``Trainer.train(resume_from_checkpoint=...)``; anything else starts afresh."""
    at = next((i for i, a in enumerate(argv) if a.endswith(LAUNCH_FILE)), None)
    rest = argv[at + 1:] if at is not None else []
    if len(rest) != 2 or rest[0] != "--resume-from":
        return None
    return Path(rest[1]) if Path(rest[1]).is_absolute() else attempt / rest[1]


class TRLAdapter(EngineAdapter):
    name = "trl"
    contract_package = "stateset_trl_engine"
    contract_file = "contract.json"
    dialect_keys = TRLKeys

    def rules(self, dialect: Dialect) -> RuleSet:
        f: TRLKeys = self.keys(dialect)
        rules = {**external_rules("TRL"), **_algorithm_rules(f), **_optim_rules(f),
                 **_budget_rules(f), **_data_rules(f), **_model_rules(f), **_run_rules(f)}
        return {path: for_trainer(rule) for path, rule in rules.items()}

    def kit_support(self) -> KitSupport:
        # hub_model_id: free text GRPOConfig accepts and an offline run never uses
        from .kit_stub import STUB

        return KitSupport(write_outputs=write_outputs, option_key=lambda plan: (
            SFT if plan.spec["algorithm"]["objective"] == SUPERVISED else "") + "hub_model_id",
                          parse_launch=read_launch, surface=grpo_surface(), engine_stub=STUB,
                          quantities={"group_std_plus_1e-4": "group_std_epsilon"},
                          math_keys=MATH_KEYS, resumes_from=resumes_from,
                          cut_save=cut_save,
                          unsupported={
            "loss_agg:seq_mean_token_sum": "TRL sums tokens per sequence (luspo) only with "
                                           "GSPO's sequence ratios; the kit's sample uses "
                                           "token ratios"})

    def render(self, translation: Translation, spec: ExperimentSpec,
               ctx: LaunchContext) -> NativeLaunch:
        f: TRLKeys = self.keys(ctx.dialect)
        base = Path(ctx.base_dir or ".")
        sft = supervised(spec)
        for key in translation.native:
            if translation.sources.get(key, "").startswith("engine_options"):
                _check_option(key, sft)
        owned = {f.output_dir: CHECKPOINTS, f.run_name: ctx.run_name,
                 # no trackers: [] is what TRL makes of "none"
                 f.logging_steps: steps_per_update(spec), f.report_to: []}
        # speed knobs that never change the math, set alike on every launch
        knobs = {"gradient_checkpointing": False, "disable_tqdm": True,
                 "dataloader_num_workers": 0}
        own = {**(f.sft_fixed if sft else f.fixed), **knobs, **owned}
        native = with_owned_keys("trl", dict(translation.native),
                                 {SFT + k: v for k, v in own.items()} if sft else own)
        config = {k.removeprefix(SFT) if sft else k: v for k, v in native.items()
                  if not k.startswith(LAUNCH)}
        launch = {k.removeprefix(LAUNCH): v for k, v in native.items()
                  if k.startswith(LAUNCH) and not k.startswith(VALIDATION)}
        train = local_path(launch["train_uri"], base)
        if train is None:
            raise InvalidInput("data.train.uri: the TRL launch reads a local split")
        launch["train_uri"] = str(train.resolve())
        launch["validation"] = self._validation(native, spec, base)
        builtin = builtin_dir(spec.model.path)
        if builtin is not None:
            if spec.model.revision is not None and \
                    spec.model.revision != directory_digest(builtin):
                raise InvalidInput(f"model.revision: {spec.model.path} has content digest "
                                   f"{directory_digest(builtin)}, the spec pins "
                                   f"{spec.model.revision}")
            launch["model"], launch["init_from_seed"] = str(builtin), True
        else:
            model = local_path(launch["model"], base)
            if model is not None and model.is_dir():
                launch["model"] = str(model.resolve())
                revision = spec.model.revision or ""
                if revision.startswith("sha256:") and revision != directory_digest(model):
                    raise InvalidInput(f"model.revision: {model} has content digest "
                                       f"{directory_digest(model)}, the spec pins {revision}")
            launch["init_from_seed"] = False
        # the launch declares what the script is handed, resolved paths included
        native = {k: v for k, v in native.items() if not k.startswith(LAUNCH)}
        native.update(_launch_keys(launch))
        settings = {"run_id": ctx.run_id, "experiment_digest": ctx.experiment_digest,
                    "trainer": SUPERVISED if sft else "grpo",
                    "steps_per_update": steps_per_update(spec), "seed": spec.seed,
                    "launch": launch, "config": config,
                    # each checkpoint's runtime: the launch fills in the package versions
                    "runtime": runtime_identity(spec, 1, dict.fromkeys(RUNTIME_PACKAGES)),
                    "files": {"metrics": METRICS_FILE, "identity": IDENTITY_FILE,
                              "final": FINAL, "reward": REWARD_SHIM_FILE,
                              "manifest": MANIFEST, "runtime": RUNTIME_FILE,
                              "checkpoint_state": CHECKPOINT_STATE,
                              "staged": STAGED_CHECKPOINT}}
        # each trainer reads only its own config: the other's recorded defaults are unread
        other = "GRPOTrainer's GRPOConfig" if sft else "SFTTrainer's SFTConfig (objective sft)"
        unread = {key: f"{other}: this launch runs {'SFTTrainer' if sft else 'GRPOTrainer'}"
                  for key in ctx.dialect.defaults if key.startswith(SFT) != sft}
        return NativeLaunch(
            argv=[PYTHON, f"{RUN_DIR}/{LAUNCH_FILE}"],
            files={LAUNCH_FILE: launch_script(settings),
                   REWARD_SHIM_FILE: reward_shim(spec, ctx.base_dir, "TRL", REWARD_CALL)},
            set_env={"TRL_EXPERIMENTAL_SILENCE": "1", "TOKENIZERS_PARALLELISM": "false"},
            env=["CUDA_VISIBLE_DEVICES", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE"],
            native=native, unread_defaults=unread)

    # -- resume: each checkpoint TRL saves is sealed by the launch (a manifest of every file's
    # sha256 and the experiment digest, written last, and the runtime it was computed under);
    # a resume hands TRL the earlier attempt's folder, which it only reads
    def checkpoints(self, attempt_dir: Path) -> list[Checkpoint]:
        k = _steps_per_update(attempt_dir)
        steps = [(p, int(p.name.removeprefix(CHECKPOINT_PREFIX))) for p in
                 _checkpoint_dirs(attempt_dir)]
        # one saved within an update holds no update's state: no resume starts from it
        return [Checkpoint(p, step // k) for p, step in steps
                if step % k == 0 and (p / MANIFEST).is_file()]

    def latest_checkpoint(self, attempt_dir: Path) -> Checkpoint | None:
        found = self.checkpoints(attempt_dir)
        return found[-1] if found else None

    def checkpoint_problem(self, checkpoint: Checkpoint, experiment_digest: str) -> str | None:
        return manifest_problem(checkpoint.path, experiment_digest)

    def checkpoint_runtime(self, checkpoint: Checkpoint) -> dict[str, Any] | None:
        return read_runtime(checkpoint.path)

    def current_runtime(self, spec: ExperimentSpec, python: str | None = None) -> \
            dict[str, Any] | None:
        return runtime_identity(spec, 1, {name: distribution_version(name, python)
                                          for name in RUNTIME_PACKAGES})

    def resume_argv(self, checkpoint: Checkpoint, argv: list[str],
                    attempt_dir: Path) -> list[str]:
        return [*argv, "--resume-from", str(checkpoint.path)]

    def rehearse(self, plan: Any) -> Rehearsal:
        # TRL trains on a CPU as it is (its tests do): its rehearsal is its own launch
        return Rehearsal(argv=list(plan.argv), covers="TRL's own GRPOTrainer (SFTTrainer for "
                         "objective sft), as `run` launches it", gap_unmeasured="TRL logs no "
                         "comparison of its rollout's log-probs with the learner's recompute")

    @staticmethod
    def _validation(native: dict[str, Any], spec: ExperimentSpec,
                    base: Path) -> dict[str, Any] | None:
        """The validation callback's settings, or None when the spec validates nothing."""
        settings = {k.removeprefix(VALIDATION): v for k, v in native.items()
                    if k.startswith(VALIDATION)}
        if settings.get("every") is None or spec.data.validation is None:
            return None
        split = local_path(settings["uri"], base)
        if split is None:
            raise InvalidInput("data.validation.uri: the TRL launch reads a local split")
        return {**settings, "uri": str(split.resolve()),
                "max_new_tokens": spec.data.max_response_tokens}

    def named_checkpoint(self, attempt_dir: Path, name: str) -> Checkpoint | None:
        """``update-NNNNNN`` (the name ``model.from_run`` gives a checkpoint on every engine)
        is TRL's ``checkpoint-<update * steps per update>``, when sealed."""
        update = name.removeprefix("update-")
        if not name.startswith("update-") or not update.isdigit():
            return None
        found = [c for c in self.checkpoints(attempt_dir) if c.update == int(update)]
        return found[0] if found else None

    def collect(self, attempt_dir: Path, ctx: LaunchContext) -> Collected:
        sft = _identity(attempt_dir).get("trainer") == SUPERVISED
        names = SFT_METRICS if sft else METRICS
        out = Collected(raw_metric_names=dict(names))
        ident = attempt_dir / IDENTITY_FILE
        if ident.is_file():
            doc = json.loads(ident.read_text(encoding="utf-8"))
            # the identity TRL itself carried: GRPOConfig.run_name is "<run id>.<digest hex>"
            run_id, _, digest = str(doc.get("run_name", "")).partition(".")
            out.run_id, out.experiment_digest = run_id or None, (
                f"sha256:{digest}" if digest else None)
        metrics = attempt_dir / METRICS_FILE
        rows: dict[int, dict[str, Any]] = {}
        trained: set[int] = set()
        if metrics.is_file():
            for row in log_rows(metrics.read_text(encoding="utf-8")):
                canonical = rows.setdefault(int(row["update"]), {"step": int(row["update"])})
                if "validation" in row:  # the launch's validation of that update
                    canonical.update(row["validation"])
                    continue
                trained.add(int(row["update"]))
                canonical.update({name: row["logs"][raw] for name, raw in names.items()
                                  if raw in row["logs"]})
        out.metrics = [rows[step] for step in sorted(rows)]
        resumed = _identity(attempt_dir).get("resumed_from")
        out.resumed_from = resumed if isinstance(resumed, int) else None
        # a resumed attempt trains from its checkpoint's update on
        out.committed_updates = max(trained, default=out.resumed_from or 0)
        out.notes.append("loss/sft is SFTTrainer's logged loss: the mean negative "
                         "log-likelihood of the update's answer tokens" if sft else
                         "loss/policy is TRL's logged loss: the policy term plus beta * KL")
        k = _steps_per_update(attempt_dir)
        for step_dir in _checkpoint_dirs(attempt_dir):
            step = int(step_dir.name.removeprefix(CHECKPOINT_PREFIX))
            if step % k:  # saved within an update: no update's state, so none is collected
                out.notes.append(f"{step_dir.name} was saved within an update ({k} optimizer "
                                 "steps each), so it is no update's checkpoint")
                continue
            out.artifacts += [Artifact(str(p.relative_to(attempt_dir)), "checkpoint", step // k)
                              for p in sorted(step_dir.rglob("*")) if p.is_file()]
        final = attempt_dir / FINAL
        if final.is_dir():
            out.artifacts += [Artifact(str(p.relative_to(attempt_dir)), "model",
                                       out.committed_updates)
                              for p in sorted(final.rglob("*")) if p.is_file()]
        return out


def _check_option(key: str, sft: bool) -> None:
    """An engine option must be a field of the config the launch hands its trainer, written
    as the launch's native keys are: a GRPOConfig field, or ``sft.<SFTConfig field>``; TRL
    would stop only at launch on any other."""
    if sft:
        fields, known = sft_config_fields(), sorted(SFT + name for name in sft_config_fields())
        if key.startswith(SFT) and key.removeprefix(SFT) in fields:
            return
        what = "an sft spec runs SFTTrainer: not sft.<an SFTConfig field>"
        close = difflib.get_close_matches(key if key.startswith(SFT) else SFT + key, known, n=1)
    else:
        if key in grpo_config_fields():
            return
        what = "not a GRPOConfig field"
        close = difflib.get_close_matches(key, sorted(grpo_config_fields()), n=1)
    raise InvalidInput(f"engine_options.trl.{key}: {what}"
                       + (f" (did you mean {close[0]!r}?)" if close else "")
                       + "; TRL would stop at launch on it")


def _identity(attempt_dir: Path) -> dict[str, Any]:
    """The identity file the launch writes first (run name, steps per update, the update a
    resumed attempt continued from); empty when there is none."""
    ident = attempt_dir / IDENTITY_FILE
    if not ident.is_file():
        return {}
    doc = json.loads(ident.read_text(encoding="utf-8"))
    return doc if isinstance(doc, dict) else {}


def _steps_per_update(attempt_dir: Path) -> int:
    return max(1, int(_identity(attempt_dir).get("steps_per_update", 1)))


def _checkpoint_dirs(attempt_dir: Path) -> list[Path]:
    """TRL's ``checkpoint-<step>`` folders of an attempt, oldest first."""
    root = attempt_dir / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)
             and p.name.removeprefix(CHECKPOINT_PREFIX).isdigit()]
    return sorted(found, key=lambda p: int(p.name.removeprefix(CHECKPOINT_PREFIX)))


def launch_script(settings: dict[str, Any]) -> str:
    """The generated launch: the settings as one JSON string literal, then the fixed code."""
    body = resources.files("stateset_trl_engine").joinpath("launch_script.py").read_text(
        encoding="utf-8")
    literal = json.dumps(settings, indent=2, sort_keys=True)
    header = ('"""Generated by stateset-trl-engine: one stateset-backend run on TRL\'s '
              'GRPOTrainer."""\nimport json\n\n'
              f"SETTINGS = json.loads({literal!r})\n\n")
    return header + body


# TRL calls reward functions with the batch's prompts and completions and every other
# dataset column as a keyword list; the launch keeps the spec's prompt and answer in two.
REWARD_CALL = '''

def trl_reward(prompts, completions, stateset_prompt, stateset_answer, **kwargs):
    def text(completion):
        return completion[-1]["content"] if isinstance(completion, list) else completion

    return [float(score(p, text(c), a))
            for p, c, a in zip(stateset_prompt, completions, stateset_answer, strict=True)]
'''


@hookimpl
def register_adapters(register: Any) -> None:
    register(TRLAdapter())


def _launch_keys(launch: dict[str, Any]) -> dict[str, Any]:
    """The launch script's settings as native keys (``launch.``, ``launch.validation.``)."""
    out = {LAUNCH + k: v for k, v in launch.items() if k != "validation"}
    for k, v in (launch.get("validation") or {}).items():
        out[VALIDATION + k] = v
    return out


def read_launch(plan: Any) -> dict[str, Any]:
    """What a TRL launch hands TRL, for the conformance kit: the settings embedded in the
    generated script, its GRPOConfig part parsed by TRL's own HfArgumentParser (a field TRL
    does not have, or a value of the wrong type, is refused there as at launch)."""
    import ast

    from transformers import HfArgumentParser
    from trl import GRPOConfig, SFTConfig

    tree = ast.parse(plan.files[LAUNCH_FILE])
    literal = next(node.value.args[0].value for node in tree.body
                   if isinstance(node, ast.Assign) and
                   getattr(node.targets[0], "id", None) == "SETTINGS")
    settings = json.loads(literal)
    sft = settings["trainer"] == SUPERVISED
    # the config checks bf16 against this machine's hardware; parsed as on the CPU, with the
    # launch's own use_cpu (a plain bool the config keeps as given) reported as written
    given = settings["config"]
    (parsed,) = HfArgumentParser(SFTConfig if sft else GRPOConfig).parse_dict(
        {"output_dir": "unused", **given, "use_cpu": True}, allow_extra_keys=False)
    config = {key: getattr(parsed, key) for key in given}
    if "use_cpu" in given:
        config["use_cpu"] = given["use_cpu"]
    for key, value in config.items():
        if hasattr(value, "value"):  # an enum TRL parses a name into
            config[key] = value.value
    if sft:
        config = {SFT + key: value for key, value in config.items()}
    return {**config, **_launch_keys(settings["launch"])}


# GRPOConfig and TrainingArguments fields whose defaults change the experiment (read by
# GRPOTrainer's loss, sampling and advantages, and by Trainer's optimizer, scheduler and
# NEFTune hook), and SFTConfig's for SFTTrainer, which also runs Trainer's label smoother:
# the kit requires every launch of that trainer to set each one
_TRAINER_MATH = ("learning_rate", "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay",
                 "max_grad_norm", "lr_scheduler_type", "warmup_steps", "warmup_ratio",
                 "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps",
                 "seed", "neftune_noise_alpha")
_GRPO_MATH = ("num_generations", "max_completion_length", "temperature", "top_p", "top_k",
              "repetition_penalty", "beta", "epsilon", "epsilon_high", "loss_type",
              "scale_rewards", "importance_sampling_level", "num_iterations",
              "steps_per_generation", "mask_truncated_completions", "shuffle_dataset")
MATH_KEYS: tuple[Any, ...] = (
    *((key, "num_generations", ...) for key in (*_TRAINER_MATH, *_GRPO_MATH)),
    *((SFT + key, SFT + "completion_only_loss", ...)
      for key in (*_TRAINER_MATH, "label_smoothing_factor", "loss_type", "shuffle_dataset")),
)

# GRPOConfig's string settings whose values GRPOTrainer dispatches on
DISPATCHED = ("loss_type", "importance_sampling_level", "scale_rewards")


@functools.cache
def grpo_surface() -> dict[str, Any]:
    """The configuration surface of the installed TRL, for the conformance kit: every
    GRPOConfig field with its default (enums by value), and every SFTConfig field as
    ``sft.<field>``, read from the dataclasses themselves."""
    from trl import GRPOConfig, SFTConfig

    def plain(value: Any) -> Any:
        value = getattr(value, "value", value)
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        return value if value is None or isinstance(value, bool | int | float | str) \
            else str(value)

    options = {}
    for prefix, config in (("", GRPOConfig), (SFT, SFTConfig)):
        for f in dataclasses.fields(config):
            if f.default is not dataclasses.MISSING:
                default = plain(f.default)
            elif f.default_factory is not dataclasses.MISSING:
                default = plain(f.default_factory())
            else:
                default = None
            options[prefix + f.name] = {"default": default}
    # GRPOConfig types these str and checks none of them; the trainer dispatches on a few
    # values (an unknown loss type fails mid-update, an unknown scaling falls through), so
    # the values it implements are read from its own code, as the kit holds launches to them
    trainer = inspect.getsource(importlib.import_module(GRPOConfig.__module__.replace(
        "grpo_config", "grpo_trainer")))
    for name in DISPATCHED:
        values = compared_values(trainer, name)
        if options[name]["default"] in values:
            options[name]["values"] = sorted(values)
    # the generated launch script's own settings (data, prompt handling, validation): a
    # mapping it takes whole, beside GRPOConfig
    options[LAUNCH.rstrip(".")] = {"default": {}}
    # the epsilon GRPOTrainer adds to the group's reward std, written inline where it
    # normalises: what the group_std_plus_1e-4 deviation states is held to it
    epsilons = added_constants(trainer, "std_rewards")
    # one constant, or none measured: the kit then names the deviation unverified
    quantities = {"group_std_epsilon": {
        "value": next(iter(epsilons)), "how": "trl/trainer/grpo_trainer.py: the constant "
                                              "added to std_rewards where advantages are "
                                              "scaled"}} if len(epsilons) == 1 else {}
    return {"engine": "trl", "options": options, "quantities": quantities}
