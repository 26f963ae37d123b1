"""TRL's GRPOConfig and SFTConfig fields, as its release reads them.

Written from TRL 1.16.0's trl/trainer/grpo_config.py, grpo_trainer.py (_compute_loss) and
sft_config.py, and transformers' TrainingArguments, never from the plugin's rules. The
``launch.*`` keys are what the plugin's launch script receives beside the configs: the spec's
own data and validation settings, written here from the spec's meaning.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stateset_backend.conformance.expectations.common import Expect, OneOf, rl, sft, single_turn
from stateset_backend.conformance.expectations.matchers import (
    OFF,
    AtLeast,
    RunName,
    SplitPath,
    _Matcher,
)
from stateset_backend.spec.model import ExperimentSpec


class _InRunFolder(_Matcher):
    """A path the engine writes inside the attempt's run folder: ``{run_dir}/...``, or a
    relative path (the launch runs with the run folder as its working directory:
    runs/runner.py run_local(cwd=run_dir)) that does not climb out of it."""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, str) or not other:
            return False
        if other.startswith("{run_dir}/"):
            other = other.removeprefix("{run_dir}/")
        return not other.startswith("/") and ".." not in other.split("/")

    def __repr__(self) -> str:
        return "<a path inside the run folder>"


class _Model(_Matcher):
    """model.path as the launch loads it: a hub id or folder as given; a built-in model
    (``builtin:NAME``) is the hub's own folder of that name."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, str):
            return False
        if self.path.startswith("builtin:"):
            return other.rstrip("/").endswith("/" + self.path.removeprefix("builtin:"))
        return other == self.path

    def __repr__(self) -> str:
        return f"<the model {self.path!r}>"


def _k(spec: ExperimentSpec) -> int:
    """Optimizer steps per update: steps_per_generation mini-batches per pass over the
    generation batch, num_iterations passes (the HF Trainer's global_step counts them)."""
    return spec.budget.mini_batches * spec.budget.ppo_epochs


def _steps(spec: ExperimentSpec) -> int:
    return _k(spec) if spec.algorithm.objective != "sft" else 1


def _loss_type(spec: ExperimentSpec) -> Any:
    """_compute_loss: grpo = each sequence's token mean, then the mean; dr_grpo = the token
    sum over (sequences * max_completion_length); dapo = the token sum over the generation
    batch's tokens / steps_per_generation (the step's own token count only with one
    mini-batch); bnpo = over the local batch's tokens (the step's own on one process); cispo
    = CISPO's clipped, detached weight, aggregated as dapo."""
    a = spec.algorithm
    if a.objective == "cispo":
        return "cispo"
    if a.loss_aggregation == "seq_mean_token_mean":
        return "grpo"
    if a.loss_aggregation == "seq_mean_token_sum_norm":
        return "dr_grpo"
    if a.loss_aggregation == "token_mean":
        one = spec.resources.world_size == 1
        if spec.budget.mini_batches == 1:  # the step is the generation batch
            return OneOf(("dapo", "bnpo")) if one else "dapo"
        return "bnpo" if one else None
    return None


def _scheduler(spec: ExperimentSpec) -> OneOf:
    """transformers' schedulers by name: constant_with_warmup (constant without a warmup),
    cosine_with_min_lr to min_lr_rate * lr, linear to 0, and a linear decay to a floor as
    polynomial of power 1 (``get_polynomial_decay_schedule_with_warmup``, whose ``lr_end`` is
    the floor's rate itself, not a ratio)."""
    o = spec.optim
    if o.schedule == "constant":
        return OneOf(("constant_with_warmup", "constant")) if o.warmup_steps == 0 \
            else OneOf(("constant_with_warmup",))
    if o.schedule == "cosine":
        return OneOf(("cosine_with_min_lr",))
    return OneOf(("polynomial",)) if _linear_floor(spec) else OneOf(("linear",))


def _linear_floor(spec: ExperimentSpec) -> bool:
    return spec.optim.schedule == "linear" and spec.optim.min_lr_ratio > 0


def _scheduler_kwargs(spec: ExperimentSpec) -> dict[str, Any] | None:
    """The kwargs of a scheduler that takes none; None where they are checked one by one."""
    return None if spec.optim.schedule == "cosine" or _linear_floor(spec) else {}


def _precision(which: str) -> Expect:
    """The Trainer's autocast (bf16 / fp16 mixed precision): the spec's compute dtype."""
    return lambda s: s.model.dtype == which


def _both(field: str, expect: Expect, only: Callable[[Expect], Expect] | None = None
          ) -> list[tuple[tuple[str, ...], Expect]]:
    """A TrainingArguments field both configs have: GRPOConfig's (field) for RL specs, the
    SFTConfig's (sft.field) for sft specs."""
    return [((field,), rl(expect)), ((f"sft.{field}",), sft(expect))]


def _validation(expect: Callable[[ExperimentSpec, Any], Any]) -> Expect:
    def read(spec: ExperimentSpec) -> Any:
        split = spec.data.validation
        return expect(spec, split) if spec.evaluation.every is not None and split else None
    return read


# TRL: GRPOConfig's fields; an sft spec runs SFTTrainer, whose SFTConfig fields the TRL plugin
# names sft.<field>
TRL: list[tuple[tuple[str, ...], Expect]] = [
    (("num_generations",), rl(lambda s: s.algorithm.group_size)),
    # CISPO (grpo_trainer._compute_loss): the weight is clamp(ratio, max=epsilon_high), the
    # spec's 1 + clip.high; epsilon, its lower bound elsewhere, is read by no CISPO code
    (("epsilon",), rl(lambda s: None if s.algorithm.objective == "cispo"
                       else s.algorithm.clip.low)),
    (("epsilon_high",),
     rl(lambda s: 1.0 + s.algorithm.clip.high if s.algorithm.objective == "cispo"
        else s.algorithm.clip.high)),
    # two-sided clipping: coef_1 = clamp(ratio, max=delta) in the unclipped term, so a token
    # with A < 0 loses at most -A * delta (dual clip); None = none
    (("delta",), rl(lambda s: s.algorithm.clip.dual_clip
                    if s.algorithm.clip.dual_clip is not None else OFF)),
    (("importance_sampling_level",), rl(lambda s: s.algorithm.ratio_level)),
    (("loss_type",), rl(_loss_type)),
    # advantages (_generate_and_score_completions): r - group mean, divided by the group's
    # std ("group") or not ("none"); "batch" divides by the std of the batch's rewards, not
    # the spec's batch whitening of the advantages (no TRL value is: not checked)
    (("scale_rewards",),
     rl(lambda s: None if s.algorithm.advantage.scope == "batch"
        else ("group" if s.algorithm.advantage.std_normalize else "none"))),
    # one reward function, weight 1: summed then normalised, as the spec's single reward
    (("reward_weights",), rl(lambda s: OFF)),
    (("multi_objective_aggregation",), rl(lambda s: "sum_then_normalize")),
    # KL: beta * (exp(ref - logp) - (ref - logp) - 1), the k3 estimator, added to the loss;
    # beta 0 loads no reference model
    (("beta",), rl(lambda s: s.algorithm.kl.coef
                   if s.algorithm.kl is not None and s.algorithm.kl.placement == "loss"
                   else 0.0)),
    # on, the KL is multiplied by the importance ratio (the gradient of the true reverse KL),
    # not the spec's estimator's gradient
    (("use_bias_correction_kl",), rl(lambda s: False)),
    # the reference model stays the starting policy (TR-DPO's syncing moves it)
    (("sync_ref_model",), rl(lambda s: False)),
    # the entropy bonus: the mean per-token entropy times entropy_coef, fixed
    (("entropy_coef",), rl(lambda s: s.algorithm.entropy_coef)),
    (("use_adaptive_entropy",), rl(lambda s: False)),
    # every token and every completion in the loss, truncated ones too
    (("top_entropy_quantile",), rl(lambda s: 1.0)),
    (("mask_truncated_completions",), rl(lambda s: False)),
    (("off_policy_mask_threshold",), rl(lambda s: OFF)),
    (("learning_rate",), rl(lambda s: s.optim.lr)),
    (("weight_decay",), rl(lambda s: s.optim.weight_decay)),
    (("max_grad_norm",), rl(lambda s: s.optim.grad_clip)),
    (("num_iterations",), rl(lambda s: s.budget.ppo_epochs)),
    # the generation batch (per_device_train_batch_size * processes * steps_per_generation
    # completions) is one update's prompts x num_generations, trained in steps_per_generation
    # optimizer steps of per_device_train_batch_size completions per process
    (("steps_per_generation",), rl(lambda s: s.budget.mini_batches)),
    (("per_device_train_batch_size",),
     rl(lambda s: s.budget.prompts_per_update * s.algorithm.group_size
        // (s.budget.mini_batches * s.resources.world_size))),
    (("gradient_accumulation_steps",), rl(lambda s: 1)),
    # the Trainer stops at max_steps optimizer steps: total_updates updates
    (("max_steps",), rl(lambda s: s.budget.total_updates * _k(s))),
    (("temperature",), rl(lambda s: s.rollout.temperature)),
    (("top_p",), rl(lambda s: s.rollout.top_p)),
    (("top_k",), rl(lambda s: s.rollout.top_k if s.rollout.top_k is not None else 0)),
    (("min_p",), rl(lambda s: OFF)),
    (("repetition_penalty",), rl(lambda s: 1.0)),
    # nothing beyond the spec's sampling settings reaches GenerationConfig / SamplingParams
    (("generation_kwargs",), rl(lambda s: OFF)),
    (("chat_template_kwargs",), rl(lambda s: OFF)),
    (("max_completion_length",),
     rl(lambda s: s.data.max_response_tokens if single_turn(s) else None)),
    # vLLM generates only where the spec's backend is vLLM; transformers' generate otherwise
    (("use_vllm",), rl(lambda s: s.rollout.backend == "vllm")),
    (("use_transformers_continuous_batching",), rl(lambda s: False)),
    # the model's own dropout and head precision, as its config has them
    # NEFTune adds noise to the embeddings in every training forward: not the spec's model
    (("neftune_noise_alpha",), rl(lambda s: OFF)),
    (("disable_dropout",), rl(lambda s: False)),
    (("cast_lm_head_to_fp32",), rl(lambda s: False)),
    (("shuffle_dataset",), rl(lambda s: s.data.shuffle)),
    # the weights' dtype (from_pretrained): the spec's master weights
    (("model_init_kwargs.dtype",), rl(lambda s: s.model.param_dtype)),
    (("sft.model_init_kwargs.dtype",), sft(lambda s: s.model.param_dtype)),
    # -- SFTTrainer -------------------------------------------------------------------------
    (("sft.learning_rate",), sft(lambda s: s.optim.lr)),
    (("sft.weight_decay",), sft(lambda s: s.optim.weight_decay)),
    (("sft.max_grad_norm",), sft(lambda s: s.optim.grad_clip)),
    # one optimizer step per update, on the update's rows
    (("sft.per_device_train_batch_size",), sft(lambda s: s.budget.prompts_per_update)),
    (("sft.gradient_accumulation_steps",), sft(lambda s: 1)),
    (("sft.max_steps",), sft(lambda s: s.budget.total_updates)),
    # the loss on the answer (completion) tokens only
    (("sft.completion_only_loss",), sft(lambda s: True)),
    # prompt-completion rows, not conversations: the completion mask above is the one
    (("sft.assistant_only_loss",), sft(lambda s: False)),
    (("sft.loss_type",), sft(lambda s: "nll")),
    (("sft.label_smoothing_factor",), sft(lambda s: 0.0)),
    # NEFTune adds noise to the embeddings: not the spec's loss
    (("sft.neftune_noise_alpha",), sft(lambda s: OFF)),
    # TRL's packing regroups rows into max_length blocks, and a batch of
    # per_device_train_batch_size blocks holds another number of rows than the update's; the
    # spec's packed layout (rows side by side, each with its own positions, the padded loss)
    # is padding_free: the batch's rows flattened into one sequence (DataCollatorForLanguage
    # Modeling(padding_free=True) with position_ids restarting per row)
    (("sft.packing",), sft(lambda s: False)),
    (("sft.padding_free",),
     sft(lambda s: s.algorithm.sft is not None and s.algorithm.sft.layout == "packed")),
    # no truncation past the launch's own encoding (prompt and answer cut at their limits,
    # the answer ended by EOS; padding_free does not enforce max_length)
    (("sft.max_length",),
     sft(lambda s: OneOf((OFF, AtLeast(s.data.max_prompt_tokens + s.data.max_response_tokens
                                        + 1))))),
    # padding to the longest row: pad tokens are masked, a multiple would only add more
    (("sft.pad_to_multiple_of",), sft(lambda s: OFF)),
    (("sft.dataset_kwargs",), sft(lambda s: OFF)),
    # the model's own chat template
    (("sft.chat_template_path",), sft(lambda s: OFF)),
    # the Trainer's sampler shuffles each pass (seeded) or reads in order; no second,
    # one-off shuffle of the dataset beforehand
    (("sft.train_sampling_strategy",),
     sft(lambda s: "random" if s.data.shuffle else "sequential")),
    (("sft.shuffle_dataset",), sft(lambda s: False)),
    # budget.partial_batch "drop": a last partial batch of a pass is skipped
    (("sft.dataloader_drop_last",), sft(lambda s: True)),
    # memory knobs that leave the math alone: activations neither offloaded nor recomputed,
    # no Liger kernels (fused kernels round differently)
    (("sft.activation_offloading",), sft(lambda s: False)),
    (("sft.use_liger_kernel",), sft(lambda s: False)),
    (("sft.warmup_steps",), sft(lambda s: s.optim.warmup_steps)),
    # -- both trainers (transformers' TrainingArguments) -------------------------------------
    *_both("optim", lambda s: "adamw_torch"),
    *_both("adam_beta1", lambda s: s.optim.betas[0]),
    *_both("adam_beta2", lambda s: s.optim.betas[1]),
    *_both("adam_epsilon", lambda s: s.optim.eps),
    *_both("lr_scheduler_type", _scheduler),
    # cosine_with_min_lr's min_lr_rate, polynomial's rate at the end and power; the other
    # schedulers take no kwargs
    *_both("lr_scheduler_kwargs", _scheduler_kwargs),
    *_both("lr_scheduler_kwargs.min_lr_rate",
           lambda s: s.optim.min_lr_ratio if s.optim.schedule == "cosine" else None),
    *_both("lr_scheduler_kwargs.lr_end",
           lambda s: s.optim.min_lr_ratio * s.optim.lr if _linear_floor(s) else None),
    *_both("lr_scheduler_kwargs.power", lambda s: 1.0 if _linear_floor(s) else None),
    # the scheduler advances per optimizer step: the spec's W warmup updates are W * k steps
    (("warmup_steps",), rl(lambda s: s.optim.warmup_steps * _k(s))),
    *_both("bf16", _precision("bfloat16")),
    *_both("fp16", _precision("float16")),
    *_both("seed", lambda s: s.seed),
    # the MoE load-balancing loss is not the spec's: off (None on a model without experts,
    # where 0.0 fails)
    *_both("router_aux_loss_coef", lambda s: OneOf((OFF, 0.0))),
    *_both("gradient_checkpointing", lambda s: False),
    # data loading in the main process: the same batches
    *_both("dataloader_num_workers", lambda s: 0),
    *_both("use_cpu", lambda s: s.resources.gpus_per_node == 0),
    # checkpoints every checkpoint.every updates (global_step % save_steps), else none of
    # the Trainer's (the launch keeps the final weights)
    *_both("save_strategy", lambda s: "steps" if s.checkpoint.every is not None else "no"),
    *_both("save_steps", lambda s: s.checkpoint.every * _steps(s)
           if s.checkpoint.every is not None else None),
    # the Trainer's rotation keeps the newest save_total_limit only and would delete the
    # checkpoint evaluation.select_by recommends, which checkpoint.keep spares: retention is
    # the launch's (launch.keep), the Trainer deletes none
    *_both("save_total_limit", lambda s: OFF),
    # the launch validates as the spec asks (launch.validation); the Trainer's own evaluation
    # loop would only compute a loss on other batches
    *_both("eval_strategy", lambda s: "no"),
    # one log per update (the hub's metric rows are per update): the Trainer logs when
    # global_step % logging_steps == 0, TRL averaging its metrics over the steps since the
    # last log; no external tracker
    *_both("logging_steps", _steps),
    *_both("report_to", lambda s: []),
    *_both("disable_tqdm", lambda s: True),
    *_both("output_dir", lambda s: _InRunFolder()),
    *_both("run_name", lambda s: RunName(s)),
    # -- the launch script's own inputs: the spec's data and validation settings --------------
    (("launch.model",), lambda s: _Model(s.model.path) if s.model.from_run is None else None),
    (("launch.from_run_sha256",),
     lambda s: s.model.from_run.sha256 if s.model.from_run is not None else None),
    # a built-in model is a config and a tokenizer without weights
    # (stateset_backend/native/assets/<name>): the model is built with weights initialised
    # from the seed (a from_run start then loads the checkpoint's over them, docs/spec.md);
    # another folder's contents decide (not checked)
    (("launch.init_from_seed",),
     lambda s: True if s.model.path.startswith("builtin:") else None),
    (("launch.train_uri",), lambda s: SplitPath(s.data.train.uri)),
    (("launch.prompt_field",), lambda s: s.data.train.prompt_field),
    (("launch.answer_field",), lambda s: s.data.train.answer_field),
    (("launch.max_prompt_tokens",), lambda s: s.data.max_prompt_tokens),
    (("launch.max_response_tokens",), lambda s: s.data.max_response_tokens),
    (("launch.chat_template",), lambda s: s.data.chat_template),
    (("launch.prompt_overflow",), lambda s: s.data.prompt_overflow),
    (("launch.keep",), lambda s: s.checkpoint.keep),
    (("launch.validation.uri",), _validation(lambda s, v: SplitPath(v.uri))),
    (("launch.validation.prompt_field",), _validation(lambda s, v: v.prompt_field)),
    (("launch.validation.answer_field",), _validation(lambda s, v: v.answer_field)),
    (("launch.validation.every",), _validation(lambda s, v: s.evaluation.every)),
    (("launch.validation.samples",), _validation(lambda s, v: s.evaluation.samples)),
    (("launch.validation.temperature",), _validation(lambda s, v: s.evaluation.temperature)),
    (("launch.validation.top_p",), _validation(lambda s, v: s.evaluation.top_p)),
    (("launch.validation.max_new_tokens",),
     _validation(lambda s, v: s.data.max_response_tokens)),
]
