"""NeMo RL's keys, as its releases' own master configs and code read them.

Written from each tag's examples/configs/grpo_math_1B.yaml (../shared/engines/nemo-rl) and its
code (nemo_rl/algorithms/grpo.py, advantage_estimator.py, loss functions, reward_functions.py,
utils/checkpoint.py, models/automodel/setup.py), never from the adapter. 0.5.0 names its data
keys flat (data.train_data_path, data.processor); 0.6.0 and 0.7.0 under data.train /
data.validation / data.default: each entry lists the later spelling first.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from stateset_backend.conformance.expectations.common import (
    Expect,
    kl_at,
    response_tokens,
    sequence_tokens,
    single_turn,
)
from stateset_backend.conformance.expectations.matchers import (
    OFF,
    AtLeast,
    InRunDir,
    RunName,
    _Matcher,
    equal_split,
)
from stateset_backend.spec.model import ExperimentSpec, LoRA, Overlong


class _Schedule(_Matcher):
    """policy.scheduler as NeMo builds it (models/automodel/setup.py: one scheduler, or a
    SequentialLR of several with their milestones) and steps it once per GRPO step, after the
    step's optimizer steps (dtensor_policy_worker_v2.train): the learning rate of every update
    is the spec's (optim: warmup W updates at lr * (s + (1 - s) * u / W), s the warmup's
    start ratio or 0, then constant, or a cosine / linear decay to min_lr_ratio * lr at
    total_updates). torch's LinearLR needs a start factor above 0, so with s = 0 the first
    warmup update may run at any rate below the second's."""

    def __init__(self, spec: ExperimentSpec) -> None:
        self.spec = spec

    def want(self, u: int) -> float:
        o, total = self.spec.optim, self.spec.budget.total_updates
        if u < o.warmup_steps:
            start = o.warmup_start_ratio or 0.0
            return o.lr * (start + (1 - start) * u / o.warmup_steps)
        floor = o.lr * o.min_lr_ratio
        span = max(total - o.warmup_steps, 1)
        t = (u - o.warmup_steps) / span
        if o.schedule == "cosine":
            return floor + (o.lr - floor) * (1 + math.cos(math.pi * t)) / 2
        if o.schedule == "linear":
            return o.lr - (o.lr - floor) * t
        return o.lr

    def got(self, read: Any) -> list[float] | None:
        import warnings

        import torch

        try:
            param = torch.nn.Parameter(torch.zeros(1))
            optimizer = torch.optim.AdamW([param], lr=self.spec.optim.lr)
            configs = read if isinstance(read, list) else [read]
            schedulers, milestones = [], []
            for cfg in configs:
                if "name" in cfg:
                    cls = getattr(torch.optim.lr_scheduler, cfg["name"].rsplit(".", 1)[-1])
                    schedulers.append(cls(optimizer, **(cfg.get("kwargs") or {})))
                else:
                    milestones = list(cfg["milestones"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                scheduler = schedulers[0] if len(configs) == 1 else \
                    torch.optim.lr_scheduler.SequentialLR(optimizer, schedulers, milestones)
                out = []
                for _ in range(self.spec.budget.total_updates):
                    out.append(float(optimizer.param_groups[0]["lr"]))
                    optimizer.step()
                    scheduler.step()
            return out
        except Exception:  # not a schedule torch builds: never the spec's
            return None

    def __eq__(self, other: object) -> bool:
        got = self.got(other)
        if got is None:
            return False
        lr, warmup = self.spec.optim.lr, self.spec.optim.warmup_steps
        for u, value in enumerate(got):
            want = self.want(u)
            if u == 0 and warmup > 0 and not self.spec.optim.warmup_start_ratio:
                if not 0 <= value < lr / warmup:
                    return False
            elif not math.isclose(value, want, rel_tol=1e-6, abs_tol=1e-12 * lr):
                return False
        return True

    def __repr__(self) -> str:
        return ("<a schedule of per-update rates "
                f"{[round(self.want(u), 12) for u in range(self.spec.budget.total_updates)]}>")


def _env_name(spec: ExperimentSpec) -> str:
    """The env config the launch adds (+env.<name>): create_env looks the data's env_name up
    among the env configs, so they must be one name."""
    return "stateset_reward" if single_turn(spec) else "stateset_environment"


class _HubName(_Matcher):
    """A name the hub's launcher shim registers with NeMo RL (its processor): never one of
    NeMo's own processors, which add their prompt templates and verifiers."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and other.startswith("stateset_")

    def __repr__(self) -> str:
        return "<a processor the hub's shim registers (stateset_...)>"


def _validating(expect: Expect) -> Expect:
    return lambda s: expect(s) if s.evaluation.every is not None else None


def _reward_shaping(expect: Expect) -> Expect:
    """reward_functions.apply_reward_shaping reads these only when reward_shaping.enabled."""
    return lambda s: expect(s) if s.algorithm.overlong is not None else None


def _lora(expect: Callable[[LoRA], Any]) -> Expect:
    return lambda s: expect(s.model.lora) if s.model.lora is not None else None


def _reward_shaping_of(expect: Callable[[Overlong], Any]) -> Expect:
    """reward_functions.apply_reward_shaping reads these only when reward_shaping.enabled."""
    return lambda s: expect(s.algorithm.overlong) if s.algorithm.overlong is not None else None


# NeMo RL: its GRPO master config (examples/configs/grpo_math_1B.yaml)
NEMO_RL: list[tuple[tuple[str, ...], Expect]] = [
    # -- the algorithm ----------------------------------------------------------------------
    (("grpo.num_generations_per_prompt",), lambda s: s.algorithm.group_size),
    (("grpo.num_prompts_per_step",), lambda s: s.budget.prompts_per_update),
    (("loss_fn.ratio_clip_min",), lambda s: s.algorithm.clip.low),
    (("loss_fn.ratio_clip_max",), lambda s: s.algorithm.clip.high),
    # ClippedPGLoss: the dual-clip bound c for negative advantages; null = none
    (("loss_fn.ratio_clip_c",),
     lambda s: s.algorithm.clip.dual_clip if s.algorithm.clip.dual_clip is not None else OFF),
    # the ratio of the length-normalised log-prob difference (GSPO)
    (("loss_fn.sequence_level_importance_ratios",),
     lambda s: s.algorithm.ratio_level == "sequence"),
    # token_level_loss: a mean over every token of the batch; false: each sequence's token
    # mean, then the mean over sequences
    (("loss_fn.token_level_loss",),
     lambda s: {"token_mean": True, "seq_mean_token_mean": False}.get(
         s.algorithm.loss_aggregation)),
    # 0.7: CISPO's clipped, detached IS weight
    (("loss_fn.use_cispo",), lambda s: s.algorithm.objective == "cispo"),
    # 0.7: REINFORCE-style surrogate without the ratio; VAPO's NLL on positive samples
    (("loss_fn.disable_ppo_ratio",), lambda s: False),
    (("loss_fn.positive_example_nll_weight",), lambda s: 0.0),
    # ratio forced to 1: the spec's clipped ratio is the real one
    (("loss_fn.force_on_policy_ratio",), lambda s: False),
    # rollout/train log-prob mismatch corrections change the loss; the spec has none
    (("loss_fn.use_importance_sampling_correction",), lambda s: False),
    (("loss_fn.truncated_importance_sampling_ratio",), lambda s: OFF),
    (("loss_fn.truncated_importance_sampling_ratio_min",), lambda s: OFF),
    (("loss_fn.truncated_importance_sampling_type",), lambda s: OFF),
    (("grpo.seq_logprob_error_threshold",), lambda s: OFF),
    # KL (utils.calculate_kl): logr = log pi_ref - log pi, clamped to +-input_clamp, then the
    # estimate clamped to +-output_clamp; the coefficient 0 turns it off
    (("loss_fn.reference_policy_kl_penalty",),
     lambda s: s.algorithm.kl.coef if s.algorithm.kl is not None else 0.0),
    (("loss_fn.reference_policy_kl_type",),
     lambda s: s.algorithm.kl.estimator if s.algorithm.kl is not None else None),
    # the spec clamps k3's log-ratio to [-20, 20] before exp (docs/spec.md), k1's and k2's not
    (("loss_fn.kl_input_clamp_value",),
     lambda s: None if s.algorithm.kl is None else
     (20.0 if s.algorithm.kl.estimator == "k3" else OFF)),
    (("loss_fn.kl_output_clamp_value",),
     lambda s: None if s.algorithm.kl is None else
     (s.algorithm.kl.clamp if s.algorithm.kl.clamp is not None else OFF)),
    # the KL weighted by the importance ratio: not the spec's estimator
    (("loss_fn.use_on_policy_kl_approximation",), lambda s: False),
    # 0.6+: Reinforce++'s KL subtracted from the reward (advantage_estimator)
    (("loss_fn.use_kl_in_reward",),
     lambda s: kl_at(s, "reward") is not None),
    # advantages (advantage_estimator): grpo = (r - group mean, leave-one-out if asked) /
    # (unbiased group std + 1e-6) if normalize_rewards; reinforce_plus_plus = r - group mean
    # (minus_baseline), then whitened over the batch's tokens
    (("grpo.adv_estimator.name",),
     lambda s: "reinforce_plus_plus" if s.algorithm.objective == "reinforce_pp" else "grpo"),
    (("grpo.adv_estimator.minus_baseline",),
     lambda s: s.algorithm.group_size > 1 if s.algorithm.objective == "reinforce_pp"
     else None),
    (("grpo.normalize_rewards",),
     lambda s: None if s.algorithm.objective == "reinforce_pp"
     else s.algorithm.advantage.std_normalize),
    # RLOO's baseline leaves the sample out (utils.calculate_baseline_and_std_per_prompt)
    (("grpo.use_leave_one_out_baseline",),
     lambda s: None if s.algorithm.objective == "reinforce_pp"
     else s.algorithm.objective == "rloo"),
    # 0.7: advantage clipping and the advantages forced on bad tool calls or <think> tags
    (("grpo.advantage_clip_low",), lambda s: OFF),
    (("grpo.advantage_clip_high",), lambda s: OFF),
    (("grpo.invalid_tool_call_advantage",), lambda s: OFF),
    (("grpo.malformed_thinking_advantage",), lambda s: OFF),
    # dynamic sampling keeps groups with std != 0 and, while short, generates the next batch
    # as long as the batches so far are <= dynamic_sampling_max_gen_batches: the first batch
    # and max_gen_batches more (grpo.dynamic_sampling), the spec's max_rounds extra rounds
    (("grpo.use_dynamic_sampling",),
     lambda s: s.algorithm.dynamic_sampling is not None),
    (("grpo.dynamic_sampling_max_gen_batches",),
     lambda s: s.algorithm.dynamic_sampling.max_rounds
     if s.algorithm.dynamic_sampling is not None else None),
    # each generation round is one update's prompts (>1 only with dynamic sampling)
    (("grpo.batch_multiplier",), lambda s: 1),
    # truncated responses left out of the loss: not in the spec
    (("grpo.overlong_filtering",), lambda s: False),
    (("grpo.reward_scaling.enabled",), lambda s: False),
    # reward_functions: r + min(-(len - (max_response_length - buffer)) / buffer * penalty, 0)
    (("grpo.reward_shaping.enabled",),
     lambda s: s.algorithm.overlong is not None),
    (("grpo.reward_shaping.max_response_length",),
     _reward_shaping(lambda s: s.data.max_response_tokens)),
    (("grpo.reward_shaping.overlong_buffer_length",),
     _reward_shaping_of(lambda o: o.buffer_tokens)),
    (("grpo.reward_shaping.overlong_buffer_penalty",),
     _reward_shaping_of(lambda o: o.penalty)),
    # set, it replaces the overlong shaping with a truncation penalty
    (("grpo.reward_shaping.stop_properly_penalty_coef",), lambda s: OFF),
    # asynchronous GRPO trains on stale trajectories; the data plane only moves them
    (("grpo.async_grpo.enabled",), lambda s: False),
    (("data_plane.enabled",), lambda s: False),
    (("grpo.max_rollout_turns",), lambda s: s.environment.max_turns),
    (("grpo.seed",), lambda s: s.seed),
    # -- the budget: grpo_train stops at max_num_steps or after max_num_epochs passes ----------
    (("grpo.max_num_steps",), lambda s: s.budget.total_updates),
    # every pass has at least one step (drop_last batches of num_prompts_per_step, the split
    # holding at least one update's prompts): a cap of total_updates passes never stops the
    # run first. With dynamic sampling a step draws up to 1 + max_rounds batches, and how
    # many passes those take depends on the split's row count (not checked then)
    (("grpo.max_num_epochs",),
     lambda s: AtLeast(s.budget.total_updates) if s.algorithm.dynamic_sampling is None
     else None),
    # samples per optimizer step (policy.train: the step's samples in gbs-sized batches)
    (("policy.train_global_batch_size",),
     lambda s: equal_split(s.budget.prompts_per_update * s.algorithm.group_size,
                           s.budget.mini_batches, "samples")),
    # -- the optimizer ------------------------------------------------------------------------
    (("policy.optimizer.name",), lambda s: "torch.optim.AdamW"),
    (("policy.optimizer.kwargs.lr",), lambda s: s.optim.lr),
    (("policy.optimizer.kwargs.weight_decay",), lambda s: s.optim.weight_decay),
    (("policy.optimizer.kwargs.betas",), lambda s: list(s.optim.betas)),
    (("policy.optimizer.kwargs.eps",), lambda s: s.optim.eps),
    (("policy.max_grad_norm",), lambda s: s.optim.grad_clip),
    (("policy.scheduler",), lambda s: _Schedule(s)),
    # -- the model and its precision ------------------------------------------------------------
    (("policy.model_name",), lambda s: s.model.path if s.model.revision is None else None),
    # the compute dtype (FSDP2 MixedPrecisionPolicy param_dtype); weights load in float32 as
    # the optimizer's master copy (models/automodel/setup.py)
    (("policy.precision",), lambda s: s.model.dtype),
    # the DTensor (automodel) path, each release's default; not Megatron
    (("policy.dtensor_cfg.enabled",), lambda s: True),
    (("policy.dtensor_cfg._v2",), lambda s: True),
    (("policy.megatron_cfg.enabled",), lambda s: False),
    # a speculative draft model trained beside the policy adds its loss
    (("policy.draft.enabled",), lambda s: False),
    # the model's own config and chat template, unchanged
    (("policy.hf_config_overrides",), lambda s: {}),
    # models/automodel/setup.py hands these to from_pretrained: nothing changes the model
    (("policy.dtensor_cfg.automodel_kwargs",), lambda s: {}),
    (("policy.tokenizer.chat_template_kwargs",), lambda s: OFF),
    (("policy.dtensor_cfg.lora_cfg.enabled",),
     lambda s: s.model.lora is not None),
    (("policy.dtensor_cfg.lora_cfg.dim",), _lora(lambda lora: lora.rank)),
    (("policy.dtensor_cfg.lora_cfg.alpha",), _lora(lambda lora: lora.alpha)),
    (("policy.dtensor_cfg.lora_cfg.dropout",), _lora(lambda lora: lora.dropout)),
    # match_all_linear applies LoRA to every linear layer and overrides target_modules
    (("policy.dtensor_cfg.lora_cfg.match_all_linear",),
     _lora(lambda lora: lora.target_modules == "all-linear")),
    (("policy.dtensor_cfg.lora_cfg.target_modules",),
     _lora(lambda lora: None if lora.target_modules == "all-linear"
           else list(lora.target_modules))),
    # -- sampling -----------------------------------------------------------------------------
    (("policy.generation.backend",),
     lambda s: "vllm" if s.rollout.backend == "vllm" else None),
    (("policy.generation.temperature",), lambda s: s.rollout.temperature),
    (("policy.generation.top_p",), lambda s: s.rollout.top_p),
    (("policy.generation.top_k",),
     lambda s: s.rollout.top_k if s.rollout.top_k is not None else OFF),
    # each generation (a turn in a conversation) stops at EOS or its token limit only
    (("policy.generation.max_new_tokens",), response_tokens),
    (("policy.generation.stop_strings",), lambda s: OFF),
    (("policy.generation.stop_token_ids",), lambda s: OFF),
    # prompt and response (vLLM's max_model_len)
    (("policy.max_total_sequence_length",), sequence_tokens),
    # the KV cache in the model's dtype, no layers kept apart for fp8: vLLM samples the
    # policy as trained (fp8 would change the sampled distribution)
    (("policy.generation.vllm_cfg.kv_cache_dtype",), lambda s: "auto"),
    (("policy.generation.vllm_cfg.num_first_layers_in_bf16",), lambda s: 0),
    (("policy.generation.vllm_cfg.num_last_layers_in_bf16",), lambda s: 0),
    (("policy.generation.vllm_kwargs",), lambda s: {}),
    # -- the data -----------------------------------------------------------------------------
    (("data.shuffle",), lambda s: s.data.shuffle),
    # the hub's launcher writes each split into the run folder (as for every external engine)
    (("data.train.data_path", "data.train_data_path"), lambda s: InRunDir(suffix=".jsonl")),
    # NeMo RL's dataset for a local file of prompt/answer rows
    (("data.train.dataset_name", "data.dataset_name"), lambda s: "ResponseDataset"),
    # the fields of the file the launcher writes: the hub's own, not checked here
    (("data.train.input_key", "data.input_key"), lambda s: None),
    (("data.train.output_key", "data.output_key"), lambda s: None),
    # no part of the train split held out for validation (0.6+)
    (("data.train.split_validation_size",), lambda s: 0.0),
    (("data.use_multiple_dataloader",), lambda s: False),
    # 0.6+: the validation split, or none
    (("data.validation",), lambda s: OFF if s.evaluation.every is None else None),
    (("data.validation.data_path", "data.val_data_path"),
     _validating(lambda s: InRunDir(suffix=".jsonl"))),
    (("data.validation.dataset_name",), _validating(lambda s: "ResponseDataset")),
    (("data.validation.input_key",), lambda s: None),
    (("data.validation.output_key",), lambda s: None),
    # no prompt template or system prompt of NeMo's: the prompt is the spec's
    (("data.default.prompt_file", "data.prompt_file"), lambda s: OFF),
    (("data.default.system_prompt_file", "data.system_prompt_file"), lambda s: OFF),
    (("data.default.processor", "data.processor"), lambda s: _HubName()),
    (("data.default.env_name", "data.env_name"), _env_name),
    # handed to the processor (the hub's shim, on NeMo's convention: data/processors.py
    # treats a prompt with length >= max_seq_length as too long): one more than the longest
    # prompt the spec admits. A conversation's opening is the shim's own (not checked)
    (("data.max_input_seq_length",),
     lambda s: s.data.max_prompt_tokens + 1 if single_turn(s) else None),
    # -- the reward and the environment: the hub's shims, pinned by content -------------------
    (("env.stateset_reward.entrypoint",),
     lambda s: s.reward.entrypoint if single_turn(s) else None),
    (("env.stateset_reward.sha256",), lambda s: s.reward.sha256 if single_turn(s) else None),
    (("env.stateset_environment.entrypoint",),
     lambda s: None if single_turn(s) else s.environment.entrypoint),
    (("env.stateset_environment.sha256",),
     lambda s: None if single_turn(s) else s.environment.sha256),
    # -- validation: after step t when t % val_period == 0 (0: never) ---------------------------
    (("grpo.val_period",),
     lambda s: s.evaluation.every if s.evaluation.every is not None else 0),
    (("grpo.val_at_start",), lambda s: False),
    (("grpo.val_at_end",), lambda s: False),
    # validate() runs max_val_samples // val_batch_size batches: whether that covers the
    # split depends on its row count, which the spec names by hash only (not checked here)
    (("grpo.val_batch_size",), lambda s: None),
    (("grpo.max_val_samples",), lambda s: None),
    # -- checkpoints: saved at the last step and every save_period steps (grpo_train) ---------
    (("checkpointing.enabled",), lambda s: True),
    (("checkpointing.save_period",),
     lambda s: s.checkpoint.every if s.checkpoint.every is not None
     else AtLeast(s.budget.total_updates)),
    # CheckpointManager.remove_old_checkpoints keeps the keep_top_k newest (no metric_name):
    # None keeps all; a metric would rank them by NeMo's metric, the hub ranks by select_by
    (("checkpointing.keep_top_k",),
     lambda s: s.checkpoint.keep if s.checkpoint.keep is not None else OFF),
    (("checkpointing.metric_name",), lambda s: OFF),
    (("checkpointing.higher_is_better",), lambda s: None),  # read only with a metric_name
    # no extra checkpoints on a wall-clock deadline
    (("checkpointing.checkpoint_must_save_by",), lambda s: OFF),
    # the optimizer state too: a resumed run continues the same AdamW
    (("checkpointing.save_optimizer",), lambda s: True),
    (("checkpointing.checkpoint_dir",), lambda s: InRunDir()),
    # -- where it runs and what it logs -------------------------------------------------------
    (("cluster.num_nodes",), lambda s: s.resources.nodes),
    (("cluster.gpus_per_node",), lambda s: s.resources.gpus_per_node),
    (("logger.log_dir",), lambda s: InRunDir()),
    (("logger.tensorboard_enabled",), lambda s: True),
    (("logger.wandb.name",), lambda s: RunName(s)),
]
