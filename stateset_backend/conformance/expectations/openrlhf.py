"""OpenRLHF's options, as its releases' own argparse and trainers read them.

Written from openrlhf/cli/train_ppo_ray.py and the trainers of each release (0.9.8 to 0.11.2),
never from the adapter. The first spelling is the flat one (before 0.10.2), the second the
dotted one (its own parser's from 0.10.2). Sources are cited as ``file:function`` of the
release named (``ppo_trainer`` is openrlhf/trainer/ppo_trainer.py, ``experience_maker``
openrlhf/trainer/ppo_utils/experience_maker.py, ``ppo_actor`` openrlhf/trainer/ray/ppo_actor.py).

Below the engine, the values the launch's plumbing must carry: paths inside the attempt's run
folder (``{run_dir}``, filled in at launch), the hub's own shim files and the run's name.
"""

from __future__ import annotations

from typing import Any

from stateset_backend.conformance.expectations.common import (
    Expect,
    OneOf,
    kl_at,
    response_tokens,
    sequence_tokens,
    single_turn,
)
from stateset_backend.conformance.expectations.matchers import (
    OFF,
    UNBOUNDED,
    AtLeast,
    AtMost,
    InRunDir,
    RunName,
    Satisfies,
    SplitPath,
    _Matcher,
    equal_split,
)
from stateset_backend.spec.environment_protocol import TASK_FIELD
from stateset_backend.spec.inputs import REWARD_SHIM_FILE
from stateset_backend.spec.model import Critic, ExperimentSpec


def _ppo(spec: ExperimentSpec) -> bool:
    return spec.algorithm.objective == "ppo"


def _world(spec: ExperimentSpec) -> int:
    """Training ranks: one actor process per GPU (RayActorGroup(num_nodes, gpus_per_node))."""
    return spec.resources.nodes * spec.resources.gpus_per_node


def _samples(spec: ExperimentSpec) -> int:
    """Samples per update: OpenRLHF's batches are counted in samples (prompts x n)."""
    return spec.budget.prompts_per_update * spec.algorithm.group_size


def _train_batch(spec: ExperimentSpec) -> int:
    """--train_batch_size: samples per optimizer step (replay_buffer: rollout_batch_size *
    n_samples_per_prompt // train_batch_size optimizer steps per epoch = mini_batches)."""
    return _samples(spec) // spec.budget.mini_batches


def _estimator(spec: ExperimentSpec) -> str | None:
    """experience_maker.compute_advantages_and_returns: group_norm = (r - group mean) /
    (group std + 1e-9); dr_grpo = r - group mean; rloo = leave-one-out baseline;
    reinforce_baseline = r - group mean, then whitened over the batch's tokens; reinforce = r
    whitened over the batch's tokens (no group); gae = critic + GAE, whitened over the batch."""
    a = spec.algorithm
    if a.objective == "ppo":
        return "gae"
    if a.objective == "rloo":
        return "rloo"
    if a.advantage.scope == "batch" or a.objective == "reinforce_pp":
        # a group of one has no baseline (the spec): reinforce_baseline would zero it
        return "reinforce_baseline" if a.group_size > 1 else "reinforce"
    return "group_norm" if a.advantage.std_normalize else "dr_grpo"


def _whitened(spec: ExperimentSpec) -> bool:
    """Only gae, reinforce and reinforce_baseline normalise over the batch and read
    --no_advantage_std_norm (experience_maker.compute_advantages_and_returns)."""
    return _estimator(spec) in ("gae", "reinforce", "reinforce_baseline")


class _WarmupRatio(_Matcher):
    """get_scheduler(num_warmup_steps=math.ceil(max_steps * lr_warmup_ratio)) (ppo_actor,
    utils/deepspeed in 0.11): any ratio the engine turns into the same count of warmup
    optimizer steps is the same setting."""

    def __init__(self, max_steps: int, warmup: int) -> None:
        self.max_steps, self.warmup = max_steps, warmup

    def __eq__(self, other: object) -> bool:
        import math

        return isinstance(other, int | float) and not isinstance(other, bool) and \
            math.ceil(self.max_steps * other) == self.warmup

    def __repr__(self) -> str:
        return f"<ceil({self.max_steps} * ratio) == {self.warmup} warmup optimizer steps>"


def _warmup_ratio(spec: ExperimentSpec) -> _WarmupRatio:
    """max_steps = prompts * n // train_batch_size * num_episodes * max_epochs
    (ppo_trainer.prepare_datasets) = total_updates * k optimizer steps, k = mini_batches *
    ppo_epochs; the scheduler advances per optimizer step, so the spec's W warmup updates are
    W * k of them (the warmup ends at the same update)."""
    k = spec.budget.mini_batches * spec.budget.ppo_epochs
    return _WarmupRatio(spec.budget.total_updates * k, spec.optim.warmup_steps * k)


def _scheduler(spec: ExperimentSpec) -> OneOf:
    """transformers' schedulers by name; constant_with_warmup is constant after warmup (and
    constant itself without one); cosine_with_min_lr decays to min_lr_ratio * lr."""
    o = spec.optim
    if o.schedule == "constant":
        return OneOf(("constant_with_warmup", "constant")) if o.warmup_steps == 0 \
            else OneOf(("constant_with_warmup",))
    return OneOf(("cosine_with_min_lr",)) if o.schedule == "cosine" else OneOf(("linear",))


def _split(spec: ExperimentSpec, split: Any) -> Any:
    """A data file as the engine opens it: the spec's own for single-turn prompts; for a
    conversation the shim's launcher converts every split into the run folder first
    (docs/environments.md: each row keeps the original as stateset_task)."""
    if split is None:
        return None
    return SplitPath(split.uri) if single_turn(spec) else InRunDir(suffix=".jsonl")


def _train_micro(spec: ExperimentSpec) -> Satisfies:
    share = _train_batch(spec) // _world(spec)
    return Satisfies(lambda m: m >= 1 and share % m == 0,
                     f"m >= 1 dividing a rank's {share} samples of an optimizer step")


def _rollout_micro(spec: ExperimentSpec) -> Satisfies:
    n, w = _samples(spec), _world(spec)
    return Satisfies(lambda m: m >= 1 and n // m >= w, f"m >= 1 with {n} // m >= {w} ranks")


def _lora(field: str) -> Expect:
    def expect(spec: ExperimentSpec) -> Any:
        lora = spec.model.lora
        if lora is None:
            return 0 if field == "rank" else None  # rank 0: no LoRA (models/actor.py)
        if field == "alpha":  # --lora_alpha is type=int
            return int(lora.alpha) if float(lora.alpha).is_integer() else None
        if field == "target_modules":  # nargs="*": a list of names, or ["all-linear"]
            t = lora.target_modules
            return [t] if isinstance(t, str) else list(t)
        return getattr(lora, field)
    return expect


def _critic_of(spec: ExperimentSpec) -> Critic:
    assert spec.algorithm.gae is not None  # ppo's (the spec refuses ppo without gae)
    return spec.algorithm.gae.critic


def _critic(expect: Expect) -> Expect:
    """A critic option: only gae creates the critic (train_ppo_ray: critic_pretrain = None
    unless the estimator is gae), so for other objectives nothing reads it."""
    return lambda s: expect(s) if _ppo(s) else None


def _evaluating(expect: Expect) -> Expect:
    return lambda s: expect(s) if s.evaluation.every is not None else None


def _correction(spec: ExperimentSpec, of: dict[str, str] | str | None = None) -> Any:
    """The rollout correction's value for one option: None while the spec has none (nothing
    reads the option), the [low, high] pair, or the mode's name in the option's choices."""
    rc = spec.algorithm.rollout_correction
    if rc is None or of is None:
        return rc
    return [rc.low, rc.high] if of == "bounds" else of[rc.mode]  # type: ignore[index]


DTYPES = {"bfloat16": "bf16", "float16": "fp16"}
LOSS_AGG = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean"}

# OpenRLHF: flat option strings before 0.10.2, dotted after (its own parser's)
OPENRLHF: list[tuple[tuple[str, ...], Expect]] = [
    # -- the algorithm ----------------------------------------------------------------------
    (("--n_samples_per_prompt", "--rollout.n_samples_per_prompt"),
     lambda s: s.algorithm.group_size),
    (("--eps_clip_low_high", "--actor.eps_clip_low_high"),
     lambda s: [s.algorithm.clip.low, s.algorithm.clip.high]),
    # loss.PolicyLoss: dual_clip None = no dual clip
    (("--dual_clip", "--actor.dual_clip"),
     lambda s: OFF if s.algorithm.clip.dual_clip is None else s.algorithm.clip.dual_clip),
    # PolicyLoss: "gspo" takes the length-normalised sequence ratio, "ppo" the token ratio
    (("--policy_loss_type", "--actor.policy_loss_type"),
     lambda s: "gspo" if s.algorithm.ratio_level == "sequence" else "ppo"),
    # 0.11.2 PolicyLoss(token_level_loss=loss_agg_mode == "token-mean")
    (("--actor.loss_agg_mode",), lambda s: LOSS_AGG.get(s.algorithm.loss_aggregation)),
    (("--advantage_estimator", "--algo.advantage.estimator"), _estimator),
    (("--no_advantage_std_norm", "--algo.advantage.no_std_norm"),
     lambda s: (OFF if s.algorithm.advantage.std_normalize else True) if _whitened(s)
     else None),
    # gae reads gamma and lambd; the reinforce family reads gamma for its cumulative return
    # (get_cumulative_returns), and the spec's reward sits on the last token undiscounted
    (("--gamma", "--algo.advantage.gamma"),
     lambda s: s.algorithm.gae.gamma if s.algorithm.gae is not None else 1.0),
    (("--lambd", "--algo.advantage.lambd"),
     lambda s: s.algorithm.gae.lam if s.algorithm.gae is not None else None),
    (("--entropy_loss_coef", "--actor.entropy_coef"), lambda s: s.algorithm.entropy_coef),
    # the MoE balancing loss: not part of the spec's loss
    (("--aux_loss_coef", "--actor.aux_loss_coef"), lambda s: 0.0),
    # KL: init_kl_coef > 0 creates the reference model (train_ppo_ray.train); the actor adds
    # kl * coef to the loss with use_kl_loss, else experience_maker subtracts it from the reward
    (("--init_kl_coef", "--algo.kl.init_coef"),
     lambda s: s.algorithm.kl.coef if s.algorithm.kl is not None else 0.0),
    (("--use_kl_loss", "--algo.kl.use_loss"),
     lambda s: True if kl_at(s, "loss") is not None else OFF),
    (("--kl_estimator", "--algo.kl.estimator"),
     lambda s: s.algorithm.kl.estimator if s.algorithm.kl is not None else None),
    # a kl_target makes the coefficient adaptive (AdaptiveKLController); the spec's is fixed
    (("--kl_target", "--algo.kl.target"), lambda s: OFF),
    # 0.11.x: on, the gradient is the true reverse KL's, not the estimator's
    (("--algo.kl.unbiased_gradient",), lambda s: OFF),
    # loss.PolicyLoss (ppo loss type only): the weight exp(old - rollout log-prob), detached,
    # multiplies the clipped surrogate per token before aggregation. Up to 0.11.1 a switch, a
    # type (tis: clamp(w, lo, hi); icepop: w inside [lo, hi] else 0; seq-mask-tis: w where the
    # sequence's exp(masked mean log w) is inside [lo, hi] else 0) and the pair [lo, hi]
    (("--enable_vllm_is_correction", "--algo.advantage.is_correction_enable"),
     lambda s: OFF if _correction(s) is None else True),
    (("--vllm_is_correction_type", "--algo.advantage.is_correction_type"),
     lambda s: _correction(s, {"truncate": "tis", "mask": "icepop",
                               "sequence_mask": "seq-mask-tis"})),
    (("--vllm_is_truncated_threshold",), lambda s: _correction(s, "bounds")),
    # 0.11.2: the statistic is gated per token or per sequence (its geometric mean), clip
    # clamps the token weight into [lo, hi] (token level only), mask zeroes a unit out of band
    # and keeps each surviving token's own weight; ratio gating reads the weight itself
    (("--algo.advantage.is_correction_level",),
     lambda s: _correction(s, {"truncate": "token", "mask": "token", "sequence_mask": "seq"})
     or "off"),
    (("--algo.advantage.is_correction_mode",),
     lambda s: _correction(s, {"truncate": "clip", "mask": "mask", "sequence_mask": "mask"})),
    (("--algo.advantage.is_correction_gating",), lambda s: _correction(s, {
        "truncate": "ratio", "mask": "ratio", "sequence_mask": "ratio"})),
    (("--algo.advantage.is_correction_threshold",), lambda s: _correction(s, "bounds")),
    # dynamic filtering keeps a group only if lo < mean score < hi and draws a new prompt for
    # each one dropped (experience_maker._generate_vllm)
    (("--dynamic_filtering", "--algo.dynamic_filtering_enable"),
     lambda s: True if s.algorithm.dynamic_sampling is not None else OFF),
    # (0, 1): a group of 0/1 scores is dropped exactly when all its scores are equal
    (("--dynamic_filtering_reward_range", "--algo.dynamic_filtering_range"),
     lambda s: [0.0, 1.0] if s.algorithm.dynamic_sampling is not None else None),
    # length_penalty.apply_overlong_penalty: -min(len - (max_new_tokens - buffer), buffer) /
    # buffer * factor, the spec's soft overlong punishment
    (("--overlong_buffer_len", "--reward.overlong_buffer_len"),
     lambda s: s.algorithm.overlong.buffer_tokens if s.algorithm.overlong is not None else OFF),
    (("--overlong_penalty_factor", "--reward.overlong_penalty_factor"),
     lambda s: s.algorithm.overlong.penalty if s.algorithm.overlong is not None else None),
    # apply_stop_properly_penalty: None skips it; 1.0 scales a truncated reward by 1
    (("--stop_properly_penalty_coef", "--reward.stop_properly_penalty_coef"),
     lambda s: OneOf((OFF, 1.0))),
    # compute_reward clamps the reward to the range: the spec's rewards are never clipped
    (("--reward_clip_range", "--reward.clip_range"),
     lambda s: [AtMost(-UNBOUNDED), AtLeast(UNBOUNDED)]),
    # running-moment reward normalisation (launcher.RewardModelActor): not in the spec
    (("--normalize_reward", "--reward.normalize_enable"), lambda s: OFF),
    # -- the critic (gae only) ----------------------------------------------------------------
    (("--critic_learning_rate", "--critic.adam.lr"),
     _critic(lambda s: _critic_of(s).lr)),
    # ValueLoss always clips at value_clip (type=float): unclipped is a bound no value reaches
    (("--value_clip", "--critic.value_clip"),
     _critic(lambda s: _critic_of(s).value_clip
             if _critic_of(s).value_clip is not None else AtLeast(UNBOUNDED))),
    # ppo_trainer.ppo_train: run_actor = global_steps > freezing_actor_steps, global_steps
    # counting updates from 0: the policy first trains at update index N (update N + 1)
    (("--freezing_actor_steps", "--critic.freezing_steps"),
     lambda s: _critic_of(s).warmup_updates - 1 if _ppo(s) else -1),
    # the critic's other optimizer settings are optim's (spec: algorithm.gae.critic.lr)
    (("--critic.optim",), _critic(lambda s: "adam")),
    (("--critic.adam.betas",), _critic(lambda s: list(s.optim.betas))),
    (("--critic.adam.eps",), _critic(lambda s: s.optim.eps)),
    (("--critic.adam.weight_decay",), _critic(lambda s: s.optim.weight_decay)),
    (("--critic.max_norm",), _critic(lambda s: s.optim.grad_clip)),
    (("--critic.lr_scheduler",), _critic(_scheduler)),
    (("--critic.lr_warmup_ratio",), _critic(_warmup_ratio)),
    (("--critic.min_lr_ratio",),
     _critic(lambda s: s.optim.min_lr_ratio if s.optim.schedule == "cosine" else None)),
    # -- the optimizer: DeepSpeed's AdamW (strategy.create_optimizer / prepare) ---------------
    (("--actor_learning_rate", "--actor.adam.lr"), lambda s: s.optim.lr),
    (("--l2", "--actor.adam.weight_decay"), lambda s: s.optim.weight_decay),
    (("--adam_betas", "--actor.adam.betas"), lambda s: list(s.optim.betas)),
    (("--actor.adam.eps",), lambda s: s.optim.eps),
    (("--actor.optim",), lambda s: "adam"),
    (("--max_norm", "--actor.max_norm"), lambda s: s.optim.grad_clip),
    (("--lr_scheduler", "--actor.lr_scheduler"), _scheduler),
    (("--lr_warmup_ratio", "--actor.lr_warmup_ratio"), _warmup_ratio),
    # 0.10.2+: cosine_with_min_lr's min_lr_rate; the other schedulers take none
    (("--actor.min_lr_ratio",),
     lambda s: s.optim.min_lr_ratio if s.optim.schedule == "cosine" else None),
    # -- sampling -----------------------------------------------------------------------------
    (("--temperature", "--rollout.temperature"), lambda s: s.rollout.temperature),
    (("--top_p", "--rollout.top_p"), lambda s: s.rollout.top_p),
    # SamplingParams(max_tokens=max_new_tokens): every vLLM request, so one turn's limit
    (("--max_new_tokens", "--rollout.max_new_tokens"), response_tokens),
    # the whole sequence, prompt and response (vllm_engine truncates at it)
    (("--max_len", "--data.max_len"), sequence_tokens),
    # -- the budget ---------------------------------------------------------------------------
    (("--rollout_batch_size", "--rollout.batch_size"), lambda s: s.budget.prompts_per_update),
    # OpenRLHF's train batch is counted in samples (prompts x samples per prompt)
    (("--train_batch_size", "--train.batch_size"),
     lambda s: equal_split(_samples(s), s.budget.mini_batches, "samples")),
    (("--max_epochs", "--train.max_epochs"), lambda s: s.budget.ppo_epochs),
    # ppo_trainer.fit: one pass (episode) over the dataset capped at max_samples prompts, an
    # update per rollout_batch_size prompts, a partial last batch dropped (is_exhausted):
    # exactly total_updates updates. With dynamic filtering a run draws more prompts than it
    # trains on, as many as the rewards make it: not fixed by the spec
    (("--num_episodes", "--train.num_episodes"), lambda s: 1),
    (("--max_samples", "--data.max_samples"),
     lambda s: s.budget.total_updates * s.budget.prompts_per_update
     if s.algorithm.dynamic_sampling is None else None),
    # the prompts one synchronous update generates (more needs --async_train: off-policy)
    (("--vllm_generate_batch_size", "--rollout.vllm_generate_batch_size"),
     lambda s: s.budget.prompts_per_update),
    # DeepSpeed's train_batch = micro x accumulation x ranks: a micro-batch divides a rank's
    # share of the optimizer step. From 0.11.1 the loss is normalised by the step's global
    # token count (models/loss.py batch_num_tokens) and this is a memory knob only; before it
    # the loss is a token mean per micro-batch (loss.PolicyLoss masked_mean) that DeepSpeed
    # averages, which the contract declares (token_mean_per_micro_batch) and
    # declared_deviations_run exercises
    (("--micro_train_batch_size", "--train.micro_batch_size"), _train_micro),
    # experience_maker.make_experience_batch: the samples of one forward pass for log-probs
    # and values, no effect on the math (the replay buffer re-batches by
    # micro_train_batch_size, losses are masked); train_ppo_ray asserts n_samples_per_prompt *
    # rollout_batch_size // micro_rollout_batch_size >= the actor ranks
    (("--micro_rollout_batch_size", "--rollout.micro_batch_size"), _rollout_micro),
    # dynamic batching re-splits micro-batches by tokens and rescales the loss
    (("--use_dynamic_batch", "--train.dynamic_batch_enable"), lambda s: OFF),
    # asynchronous training samples with stale weights: off-policy, not the spec's update
    (("--async_train", "--train.async_enable"), lambda s: OFF),
    (("--partial_rollout", "--train.partial_rollout_enable"), lambda s: OFF),
    # EMA weights would be the saved model instead of the trained one (ppo_actor.save_model)
    (("--enable_ema", "--train.enable_ema"), lambda s: OFF),
    (("--seed", "--train.seed"), lambda s: s.seed),
    # -- the model and its precision -----------------------------------------------------------
    # without a revision the hub id itself; with one the hub stages that snapshot (not checked)
    (("--pretrain", "--actor.model_name_or_path"),
     lambda s: s.model.path if s.model.revision is None else None),
    # --param_dtype is the compute dtype: DeepSpeed's bf16/fp16 mode keeps fp32 master
    # weights and optimizer state (deepspeed_utils.get_train_ds_config)
    (("--param_dtype", "--ds.param_dtype"), lambda s: DTYPES.get(s.model.dtype)),
    # DeepSpeed's data_types.grad_accum_dtype (None: DeepSpeed's own choice for its ZeRO
    # optimizer): what DeepSpeed accumulates micro-batch gradients in is DeepSpeed's code, not
    # OpenRLHF's, and is not checked here (with one micro-batch per step nothing accumulates)
    (("--grad_accum_dtype", "--ds.grad_accum_dtype"), lambda s: None),
    (("--load_in_4bit", "--ds.load_in_4bit"), lambda s: OFF),
    (("--lora_rank", "--ds.lora.rank"), _lora("rank")),
    (("--lora_alpha", "--ds.lora.alpha"), _lora("alpha")),
    (("--lora_dropout", "--ds.lora.dropout"), _lora("dropout")),
    (("--target_modules", "--ds.lora.target_modules"), _lora("target_modules")),
    # -- where it runs: layout knobs that do not change the update ------------------------------
    (("--actor_num_nodes", "--actor.num_nodes"), lambda s: s.resources.nodes),
    (("--actor_num_gpus_per_node", "--actor.num_gpus_per_node"),
     lambda s: s.resources.gpus_per_node),
    # vLLM engines generate on GPUs of their own (no --colocate_all_models), outside the
    # spec's training ranks; requests are independent, so the count only spreads them: one
    # engine (tensor parallel 1), the fewest GPUs beyond the training ones
    (("--vllm_num_engines", "--vllm.num_engines"), lambda s: 1),
    # ZeRO-2 shards optimizer state and gradients: the same AdamW update (OpenRLHF's default)
    (("--zero_stage", "--ds.zero_stage"), lambda s: 2),
    # no tensor or sequence (ring attention) parallelism: each rank holds whole sequences
    (("--ds_tensor_parallel_size", "--ds.tensor_parallel_size"), lambda s: 1),
    (("--ring_attn_size", "--ds.ring_attn_size"), lambda s: 1),
    # -- the data -----------------------------------------------------------------------------
    (("--prompt_data", "--data.prompt_dataset"), lambda s: _split(s, s.data.train)),
    # a .jsonl/.parquet file loads as the datasets library's single split "train"
    (("--prompt_split", "--data.prompt_split"), lambda s: "train"),
    (("--input_key", "--data.input_key"), lambda s: s.data.train.prompt_field),
    # the label the reward function (or the agent's reset) receives with each prompt
    (("--label_key", "--data.label_key"),
     lambda s: s.data.train.answer_field if single_turn(s) else TASK_FIELD),
    (("--apply_chat_template", "--data.apply_chat_template"),
     lambda s: True if s.data.chat_template else OFF),
    # prompts_dataset.preprocess_data: without the chat template the text is the prompt
    # itself (no template, or "{}")
    (("--input_template", "--data.input_template"),
     lambda s: None if s.data.chat_template else OneOf((OFF, "{}"))),
    # -- the reward: the hub's shim file, loaded by SingleTurnAgentExecutor (a .py url) --------
    (("--remote_rm_url", "--reward.remote_url"),
     lambda s: InRunDir(REWARD_SHIM_FILE) if s.reward.kind == "python" else None),
    # a conversation: the shim's agent module in the run folder (vllm_engine: a .py file)
    (("--agent_func_path", "--train.agent_func_path"),
     lambda s: None if single_turn(s) else InRunDir(suffix=".py")),
    # -- validation: ppo_trainer.fit evaluates when global_step % eval_steps == 0 --------------
    (("--eval_steps", "--eval.steps"),
     lambda s: s.evaluation.every if s.evaluation.every is not None else -1),
    (("--eval_dataset", "--eval.dataset"), _evaluating(lambda s: _split(s, s.data.validation))),
    (("--eval_split", "--eval.split"), _evaluating(lambda s: "train")),
    (("--eval_temperature", "--eval.temperature"),
     _evaluating(lambda s: s.evaluation.temperature)),
    (("--eval_n_samples_per_prompt", "--eval.n_samples_per_prompt"),
     _evaluating(lambda s: s.evaluation.samples)),
    # -- checkpoints: DeepSpeed's under ckpt_path/_actor every save_steps updates -----------
    (("--save_steps", "--ckpt.save_steps"),
     lambda s: s.checkpoint.every if s.checkpoint.every is not None else -1),
    # strategy.save_ckpt deletes the oldest until fewer than max_num remain, then saves: keeps
    # max_num; with "keep all" a bound above the checkpoints a run saves (one per update)
    (("--max_ckpt_num", "--ckpt.max_num"),
     lambda s: s.checkpoint.keep if s.checkpoint.keep is not None
     else AtLeast(s.budget.total_updates)),
    # and deletes by size (in GB) too: never, for the spec
    (("--max_ckpt_mem", "--ckpt.max_mem"), lambda s: AtLeast(1e6)),
    # 0.10.1+: an eval metric saves extra best_global_stepN checkpoints; the hub ranks
    # checkpoints by evaluation.select_by itself
    (("--best_metric_key", "--ckpt.best_metric_key"), lambda s: "none"),
    (("--ckpt_path", "--ckpt.path"), lambda s: InRunDir()),
    # ppo_trainer.save_logs_and_checkpoints logs when global_step % logging_steps == 0: every
    # update, so a resumed attempt's first logged update is the one after its checkpoint
    (("--logging_steps", "--logger.logging_steps"), lambda s: 1),
    (("--save_path", "--ckpt.output_dir"), lambda s: InRunDir()),
    # -- logging: TensorboardLogger writes <dir>/<wandb_run_name> --------------------------------
    (("--use_tensorboard", "--logger.tensorboard_dir"), lambda s: InRunDir()),
    (("--wandb_run_name", "--logger.wandb.run_name"), lambda s: RunName(s)),
]
