"""verl's keys, as its releases' own config and code read them."""

from __future__ import annotations

import math
import re
from typing import Any

from stateset_backend.conformance.expectations.common import (
    UNSET,
    AtLeast,
    Expect,
    Matching,
    OneOf,
    kl_at,
    resolved_path,
    sequence_tokens,
    single_turn,
)
from stateset_backend.conformance.expectations.matchers import UNBOUNDED, equal_split
from stateset_backend.engines.adapter import RUN_DIR
from stateset_backend.spec.digest import experiment_digest
from stateset_backend.spec.inputs import REWARD_SHIM_FILE
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.translate.overrides import slug

# verl's names for the estimators (core_algos.kl_penalty): k1 "kl"/"k1", k2 "mse"/"k2",
# k3 "low_var_kl"/"k3"
VERL_KL = {"k1": OneOf(("kl", "k1")), "k2": OneOf(("mse", "k2")),
           "k3": OneOf(("low_var_kl", "k3"))}
# verl's advantage estimators (core_algos.AdvantageEstimator)
VERL_ESTIMATOR = {"grpo": OneOf(("grpo",)), "dr_grpo": OneOf(("grpo",)),
                  "dapo": OneOf(("grpo",)), "gspo": OneOf(("grpo",)),
                  "cispo": OneOf(("grpo",)), "rloo": OneOf(("rloo",)),
                  "reinforce_pp": OneOf(("reinforce_plus_plus",
                                         "reinforce_plus_plus_baseline")),
                  "ppo": OneOf(("gae",))}
# verl.utils.torch_dtypes.PrecisionType.to_dtype: the spellings of one torch dtype
VERL_PRECISION = {"float32": OneOf(("fp32", "float32", 32, "32")),
                  "bfloat16": OneOf(("bf16", "bfloat16")),
                  "float16": OneOf(("fp16", "float16", 16, "16"))}
# the value null, checked (an expectation's None means "not checked for this spec")
NULL = OneOf((None,))
# compute_policy_loss clamps log(pi / pi_old) to [-20, 20]: the ratio never exceeds e^20, so a
# dual-clip constant above it never binds (no dual clip)
NO_DUAL_CLIP = AtLeast(math.exp(20))
A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"


def _ppo(expect: Expect) -> Expect:
    """A critic key: verl builds a critic only for GAE (ray_trainer.need_critic)."""
    return lambda s: expect(s) if s.algorithm.gae is not None else None


def _validating(expect: Expect) -> Expect:
    """A validation key: inert in a run that never validates (no evaluation.every)."""
    return lambda s: expect(s) if s.evaluation.every is not None else None


def _gae(s: ExperimentSpec) -> Any:
    return s.algorithm.gae


def _critic(s: ExperimentSpec) -> Any:
    return s.algorithm.gae.critic if s.algorithm.gae is not None else None


def _loss_mode(s: ExperimentSpec) -> str:
    """core_algos' registered policy losses: "cispo" (clipped, detached IS weight), "gspo"
    (sequence-level ratio from the length-normalised log-prob difference), else "vanilla"
    (token ratio, PPO clip and dual clip)."""
    if s.algorithm.objective == "cispo":
        return "cispo"
    return "gspo" if s.algorithm.ratio_level == "sequence" else "vanilla"


def _option(s: ExperimentSpec, key: str, otherwise: Any) -> Any:
    """The spec's own verl engine option for a key it leaves to the user, else ``otherwise``."""
    return s.engine_options.get("verl", {}).get(key, otherwise)


def _model_path(s: ExperimentSpec) -> Any:
    """What verl loads (copy_to_local, then from_pretrained of that folder): a hub id pinned
    to a commit is that commit's snapshot folder in the Hugging Face cache (verl has no
    revision key); otherwise the id, or the local folder resolved against the spec's."""
    m = s.model
    if m.revision is not None and not m.revision.startswith("sha256:"):
        return Matching("/.*/models--" + re.escape(m.path.replace("/", "--")) + "/snapshots/"
                        + re.escape(m.revision))
    return OneOf((m.path, resolved_path(m.path)))


def _split(s: ExperimentSpec, name: str) -> Any:
    if not single_turn(s):
        return f"{RUN_DIR}/data/{name}.jsonl"
    return resolved_path(getattr(s.data, name).uri)


def _run_name(s: ExperimentSpec) -> Matching:
    """"<run id>.<experiment digest hex>" (the run id and digest as the kit's reader
    normalizes them, or as planned)."""
    digest = experiment_digest(s).removeprefix("sha256:")
    return Matching(r"(<run-id>|[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8})\.(<digest>|"
                    + re.escape(digest) + ")")


# the optimizer settings verl's actor and critic each read from their own optim section
def _optim(prefix: str, lr: Expect, wrap: Any = lambda e: e) -> list[tuple[tuple[str, ...],
                                                                        Expect]]:
    o = f"{prefix}.optim"
    return [
        ((f"{o}.lr",), wrap(lr)),
        ((f"{o}.weight_decay",), wrap(lambda s: s.optim.weight_decay)),
        ((f"{o}.betas",), wrap(lambda s: list(s.optim.betas))),
        # OptimizerConfig.clip_grad (the engine workers' spelling of the grad clip)
        ((f"{o}.clip_grad",), wrap(lambda s: s.optim.grad_clip)),
        # FSDPOptimizerConfig: torch.optim.AdamW (decoupled weight decay), built by
        # workers/config/optimizer.build_optimizer; eps through override_optimizer_config
        ((f"{o}.optimizer",), wrap(lambda s: "AdamW")),
        ((f"{o}.optimizer_impl",), wrap(lambda s: "torch.optim")),
        ((f"{o}.override_optimizer_config.eps",), wrap(lambda s: s.optim.eps)),
        # lr_scheduler_type (warmup_style before 0.6, and still read after: it wins when set):
        # "constant" or "cosine" (FSDPOptimizerConfig.__post_init__)
        # (from 0.6 a null warmup_style defers to lr_scheduler_type: OptimizerConfig)
        ((f"{o}.warmup_style",), wrap(lambda s: OneOf((s.optim.schedule, None)))),
        ((f"{o}.lr_scheduler_type", f"{o}.warmup_style"), wrap(lambda s: s.optim.schedule)),
        # warmup in optimizer steps = updates (one scheduler step per update); the ratio is
        # read only when lr_warmup_steps <= 0 (fsdp_workers: num_warmup_steps =
        # int(ratio * total_steps)), so it is 0 and warmup comes from the steps alone
        ((f"{o}.lr_warmup_steps",),
         wrap(lambda s: s.optim.warmup_steps if s.optim.warmup_steps else OneOf((0, -1)))),
        ((f"{o}.lr_warmup_steps_ratio",), wrap(lambda s: 0.0)),
        # get_cosine_schedule_with_warmup: min_lr_ratio floor; num_cycles 0.5 is one half
        # cosine from lr at the end of warmup to the floor at total_training_steps
        ((f"{o}.min_lr_ratio",),
         wrap(lambda s: s.optim.min_lr_ratio if s.optim.schedule == "cosine" else None)),
        ((f"{o}.num_cycles",), wrap(lambda s: 0.5 if s.optim.schedule == "cosine" else None)),
        # torch_functional.get_*_schedule_with_warmup(zero_indexed_step=True): the first
        # update is step 0, so it runs at lr * 0 / W, as the spec's warmup says
        ((f"{o}.zero_indexed_step",), wrap(lambda s: True)),
    ]


# an FSDP model's precision (fsdp_workers._build_model_optimizer): the module is loaded in
# model_dtype (the master weights the optimizer updates: the spec's param_dtype), and
# MixedPrecision computes in param_dtype (the spec's dtype). The spec names no other
# precision: gradients are reduced and buffers kept in fp32, what verl itself uses whatever
# the other two are (its fallback without a mixed_precision section: reduce_dtype =
# buffer_dtype = torch.float32), so a sum over ranks is exact whatever the world size
def _precision(fsdp: str, wrap: Any = lambda e: e) -> list[tuple[tuple[str, ...], Expect]]:
    return [
        ((f"{fsdp}.model_dtype",), wrap(lambda s: VERL_PRECISION[s.model.param_dtype])),
        ((f"{fsdp}.mixed_precision.param_dtype",),
         wrap(lambda s: VERL_PRECISION[s.model.dtype])),
        ((f"{fsdp}.mixed_precision.reduce_dtype",), wrap(lambda s: VERL_PRECISION["float32"])),
        ((f"{fsdp}.mixed_precision.buffer_dtype",), wrap(lambda s: VERL_PRECISION["float32"])),
        # FSDPEngineConfig.dtype: the compute dtype only when no mixed_precision section is
        # given (fsdp_workers / engine/fsdp/transformer_impl read mixed_precision first), so
        # a launch that gives mixed_precision may leave it at the release's default
        ((f"{fsdp}.dtype",),
         wrap(lambda s: OneOf((*VERL_PRECISION[s.model.dtype], UNSET)))),
    ]


VERL: list[tuple[tuple[str, ...], Expect]] = [
    ((f"{R}.n",), lambda s: s.algorithm.group_size),
    ((f"{A}.clip_ratio_low",), lambda s: s.algorithm.clip.low),
    ((f"{A}.clip_ratio_high",), lambda s: s.algorithm.clip.high),
    (("data.max_prompt_length",), lambda s: s.data.max_prompt_tokens),
    # a conversation's whole response (every turn and observation) is what verl pads to:
    # the total limit less the opening (docs/environments.md)
    (("data.max_response_length",),
     lambda s: s.data.max_response_tokens if single_turn(s)
     else sequence_tokens(s) - s.data.max_prompt_tokens),
    (("data.train_batch_size",), lambda s: s.budget.prompts_per_update),
    # verl counts its mini-batch in prompts (it multiplies by rollout.n itself) and splits the
    # update into chunks of it (DataProto.split)
    ((f"{A}.ppo_mini_batch_size",),
     lambda s: equal_split(s.budget.prompts_per_update, s.budget.mini_batches, "prompts")),
    ((f"{A}.ppo_epochs",), lambda s: s.budget.ppo_epochs),
    ((f"{A}.optim.lr",), lambda s: s.optim.lr),
    ((f"{A}.optim.weight_decay",), lambda s: s.optim.weight_decay),
    ((f"{A}.grad_clip",), lambda s: s.optim.grad_clip),
    ((f"{R}.temperature",), lambda s: s.rollout.temperature),
    ((f"{R}.top_p",), lambda s: s.rollout.top_p),
    ((f"{A}.entropy_coeff",), lambda s: s.algorithm.entropy_coef),
    ((f"{A}.loss_agg_mode",), lambda s: s.algorithm.loss_aggregation.replace("_", "-")),
    (("algorithm.adv_estimator",), lambda s: VERL_ESTIMATOR[s.algorithm.objective]),
    ((f"{A}.use_kl_loss",), lambda s: kl_at(s, "loss") is not None),
    ((f"{A}.kl_loss_type",),
     lambda s: VERL_KL[k.estimator] if (k := kl_at(s, "loss")) is not None else None),
    ((f"{A}.kl_loss_coef",), lambda s: k.coef if (k := kl_at(s, "loss")) is not None else None),
    (("algorithm.use_kl_in_reward",), lambda s: kl_at(s, "reward") is not None),
    (("algorithm.kl_penalty",),
     lambda s: VERL_KL[k.estimator] if (k := kl_at(s, "reward")) is not None else None),
    (("algorithm.kl_ctrl.kl_coef",),
     lambda s: k.coef if (k := kl_at(s, "reward")) is not None else None),
    # a fixed coefficient (core_algos.get_kl_controller: "fixed" or "adaptive"); read only
    # with the KL in the reward
    (("algorithm.kl_ctrl.type",), lambda s: "fixed" if kl_at(s, "reward") is not None else None),

    # -- the policy loss ------------------------------------------------------------------------
    ((f"{A}.policy_loss.loss_mode",), lambda s: _loss_mode(s)),
    # compute_policy_loss(_vanilla): dual clip is always applied, min(-A * clip_ratio_c, ...)
    # for A < 0; no dual clip is a constant the clamped ratio never reaches (NO_DUAL_CLIP).
    # The gspo and cispo losses never read it
    ((f"{A}.clip_ratio_c",),
     lambda s: (s.algorithm.clip.dual_clip or NO_DUAL_CLIP) if _loss_mode(s) == "vanilla"
     else None),
    # agg_loss("seq-mean-token-sum-norm"): the constant divisor; null would be the padded
    # response width of the batch, not the spec's max_response_tokens
    ((f"{A}.loss_scale_factor",),
     lambda s: s.data.max_response_tokens
     if s.algorithm.loss_aggregation == "seq_mean_token_sum_norm" else None),
    # core_algos.compute_grpo_outcome_advantage divides by the group std when set; only the
    # grpo estimator reads it
    (("algorithm.norm_adv_by_std_in_grpo",),
     lambda s: s.algorithm.advantage.std_normalize
     if s.algorithm.objective in ("grpo", "dr_grpo", "dapo", "gspo", "cispo") else None),
    # core_algos.compute_gae_advantage_return(gamma, lam)
    (("algorithm.gamma",), _ppo(lambda s: _gae(s).gamma)),
    (("algorithm.lam",), _ppo(lambda s: _gae(s).lam)),
    # preference-feedback PPO reweights the batch (ray_trainer): not the spec's sampling
    (("algorithm.use_pf_ppo",), lambda s: False),
    # rollout correction (importance weights / rejection against the rollout's own log-probs,
    # bypass uses them as the old policy): none of it is the spec's ratio pi / pi_old with
    # pi_old recomputed by the trainer
    (("algorithm.rollout_is",), lambda s: False),
    (("algorithm.rollout_correction.rollout_is",), lambda s: NULL),
    (("algorithm.rollout_correction.rollout_rs",), lambda s: NULL),
    (("algorithm.rollout_correction.bypass_mode",), lambda s: False),
    # DAPO dynamic sampling (0.9: FilterGroupsConfig)
    (("algorithm.filter_groups.enable",), lambda s: s.algorithm.dynamic_sampling is not None),
    # the groups are compared on the reward the loss learns from, the overlong penalty
    # included (the spec's zero_variance_groups): 0.9.1's "reward" is the canonical pre-KL
    # reward (rm_scores, v1/replay_buffer); "acc" is DAPORewardManager's score before the
    # overlong penalty (reward_manager/dapo.py), the same values without the penalty, and
    # 0.9.0's only reward metric (the contract declares filter_on_score there)
    (("algorithm.filter_groups.metric",),
     lambda s: None if s.algorithm.dynamic_sampling is None else OneOf(("reward", "acc"))),
    # counted in generation batches, the first included (recipe/dapo: another batch while
    # num_gen_batches < max_num_gen_batches): the spec's extra rounds + 1. 0.9's V1
    # ReplayBuffer ignores it and refills without a limit (v1/trainer_base warns so; the
    # contract declares unbounded_refill), which a launch may state as 0, "no upper limit"
    (("algorithm.filter_groups.max_num_gen_batches",),
     lambda s: OneOf((s.algorithm.dynamic_sampling.max_rounds + 1, 0))
     if s.algorithm.dynamic_sampling is not None else None),
    # v1 ReplayBuffer: prompts in flight are max_inflight_gen_batches x train_batch_size, and
    # what is in flight when the batch fills is discarded: one update's prompts at a time
    # (read only when filtering: v1/trainer_base._create_sampler)
    (("algorithm.filter_groups.max_inflight_gen_batches",),
     lambda s: 1 if s.algorithm.dynamic_sampling is not None else None),
    # prompts fetched per generation batch: null is train_batch_size (v1/trainer_base); with
    # group filtering the v1 ReplayBuffer fetches one prompt at a time whatever it says
    (("data.gen_batch_size",),
     lambda s: OneOf((None, s.budget.prompts_per_update))
     if s.algorithm.dynamic_sampling is None else None),

    # -- the actor's data loop ------------------------------------------------------------------
    # mini-batches are consecutive slices of the update's batch, so each prompt's group stays
    # in one mini-batch as the spec's (whole-group) mini-batches do; shuffle=True would
    # shuffle single rows across them (make_iterator(dataloader_kwargs={"shuffle": ...}))
    ((f"{A}.shuffle",), lambda s: False),
    ((f"{A}.data_loader_seed",), lambda s: s.seed),
    # memory knobs: micro-batches packed by tokens (seqlen_balancing.rearrange_micro_batches)
    # within a per-GPU token budget, their gradients accumulated into the mini-batch's one
    # optimizer step: how a step is computed, not which (agg_loss normalizes by the global
    # batch; before 0.8 the per-micro-batch token means are the declared
    # micro_batch_token_mean). The budget is verl's default (actor.yaml: 16384), raised to
    # what verl's tuning guide asks for, "at least 2 x (max_prompt_length +
    # max_response_length)" (docs/perf/perf_tuning.rst; every sequence must fit it)
    ((f"{A}.use_dynamic_bsz",), lambda s: True),
    ((f"{A}.ppo_max_token_len_per_gpu",), lambda s: max(16384, 2 * sequence_tokens(s))),
    *_optim(A, lambda s: s.optim.lr),
    *_precision(f"{A}.fsdp_config"),
    # the reference computes the log-probs the KL compares with: the same weights in the same
    # precision as the actor's (KL is exactly 0 at update 1)
    *_precision(f"{REF}.fsdp_config"),

    # -- the model --------------------------------------------------------------------------
    (("actor_rollout_ref.model.path",), lambda s: _model_path(s)),
    # lora_rank 0 is no LoRA (fsdp_workers: self._is_lora = lora_rank > 0)
    (("actor_rollout_ref.model.lora_rank",),
     lambda s: s.model.lora.rank if s.model.lora is not None else 0),
    (("actor_rollout_ref.model.lora_alpha",),
     lambda s: s.model.lora.alpha if s.model.lora is not None else None),
    (("actor_rollout_ref.model.target_modules",),
     lambda s: s.model.lora.target_modules if s.model.lora is not None else None),

    # -- the rollout ------------------------------------------------------------------------
    ((f"{R}.name",), lambda s: s.rollout.backend),
    # "-1 for vLLM rollout" (rollout.yaml): no top-k filtering
    ((f"{R}.top_k",), lambda s: s.rollout.top_k if s.rollout.top_k is not None else -1),
    ((f"{R}.do_sample",), lambda s: True),
    ((f"{R}.ignore_eos",), lambda s: False),
    # rollout.yaml: "Rollout model parameters type. Align with actor model's FSDP/Megatron
    # type"; given to vLLM / SGLang as their dtype
    ((f"{R}.dtype",), lambda s: s.model.dtype),
    ((f"{R}.seed",), lambda s: s.seed),
    # over_sample_rate > 0 aborts the last requests of a batch: every sample is generated
    ((f"{R}.over_sample_rate",), lambda s: 0),
    # multi_turn configures verl's own tool agent loop (max turns, tool config); a
    # conversation runs the hub's agent loop (rollout.agent below), which reads none of it,
    # and 0.9.1 otherwise only copies enable into meta_info (ray_trainer._update_actor)
    ((f"{R}.multi_turn.enable",), lambda s: False),
    # a conversation's loop (docs/environments.md): the hub's shim, registered under this
    # name by the agent loop config file written into the run folder
    ((f"{R}.agent.default_agent_loop",),
     lambda s: None if single_turn(s) else "stateset_environment"),
    ((f"{R}.agent.agent_loop_config_path",),
     lambda s: None if single_turn(s) else f"{RUN_DIR}/stateset_agent_loops.yaml"),
    # validation decoding (ray_trainer._validate reads val_kwargs; do_sample False is greedy);
    # inert in a run that never validates. The spec's validation has no top-k: -1
    ((f"{R}.val_kwargs.temperature",), _validating(lambda s: s.evaluation.temperature)),
    ((f"{R}.val_kwargs.top_p",), _validating(lambda s: s.evaluation.top_p)),
    ((f"{R}.val_kwargs.n",), _validating(lambda s: s.evaluation.samples)),
    ((f"{R}.val_kwargs.do_sample",), _validating(lambda s: s.evaluation.temperature > 0)),
    ((f"{R}.val_kwargs.top_k",), _validating(lambda s: -1)),

    # -- the critic (PPO) -------------------------------------------------------------------
    # Critic: "a critic model initialised from model.path"
    (("critic.model.path",), _ppo(lambda s: _model_path(s))),
    # core_algos.compute_value_loss clips V to V_old +- cliprange_value always: unclipped is a
    # bound no value reaches
    (("critic.cliprange_value",), _ppo(lambda s: _critic(s).value_clip
                                       if _critic(s).value_clip is not None
                                       else AtLeast(UNBOUNDED))),
    (("critic.grad_clip",), _ppo(lambda s: s.optim.grad_clip)),
    *_optim("critic", lambda s: _critic(s).lr, _ppo),
    *[((spellings[0].replace("critic.model.fsdp_config", "critic.fsdp"), *spellings), expect)
      for spellings, expect in _precision("critic.model.fsdp_config", _ppo)],
    # ray_trainer.fit: the actor updates once critic_warmup <= global_steps (1 at the first
    # update): N critic-only updates is N + 1; none is 0 or 1
    (("trainer.critic_warmup",),
     lambda s: _critic(s).warmup_updates + 1 if _critic(s) is not None and
     _critic(s).warmup_updates else OneOf((0, 1))),

    # -- data -------------------------------------------------------------------------------
    # the spec's split as written, resolved against the spec's folder; a conversation's
    # tasks, converted by the shim's launcher half into the run folder (docs/environments.md)
    (("data.train_files",), lambda s: _split(s, "train")),
    # RayPPOTrainer builds its validation loader from val_files whatever test_freq says: the
    # validation split, else the train split (never validated: test_freq -1)
    (("data.val_files",),
     lambda s: _split(s, "validation" if s.data.validation is not None else "train")),
    # the split's prompt field; a conversation's converted tasks carry verl's default
    # field, "prompt" (legacy_data.yaml), whatever the spec's split calls it
    (("data.prompt_key",),
     lambda s: s.data.train.prompt_field if single_turn(s) else "prompt"),
    (("data.shuffle",), lambda s: s.data.shuffle),
    # create_rl_sampler seeds its generator with data.seed
    (("data.seed",), lambda s: s.seed),
    (("data.train_max_samples",), lambda s: -1),
    # RLHFDataset: filter_overlong_prompts drops them before training; truncation "left" /
    # "right" cuts, "error" raises
    # A conversation's opening comes from the environment's reset, not the data's prompt
    # field the filter measures: it fails when too long (docs/environments.md)
    (("data.filter_overlong_prompts",),
     lambda s: single_turn(s) and s.data.prompt_overflow == "drop"),
    # from 0.7 RLHFDataset keeps truncation and never uses it (0.9.1's agent loop
    # left-truncates at rollout.prompt_length: AgentLoopBase._cap_text_prompt_length)
    (("data.truncation",),
     lambda s: "right" if s.data.prompt_overflow == "truncate_right" else
     OneOf(("left" if s.data.prompt_overflow == "truncate_left" else "error", UNSET))),

    # -- the reward -------------------------------------------------------------------------
    # the reward the spec names, through the hub's shim in the run folder; verl calls the
    # function its config names with (data_source, solution_str, ground_truth, extra_info),
    # "compute_score" by default. A conversation's reward is the environment's: verl's reward
    # function is not called (docs/environments.md)
    (("reward.custom_reward_function.path", "custom_reward_function.path"),
     lambda s: f"{RUN_DIR}/{REWARD_SHIM_FILE}" if single_turn(s) else None),
    (("reward.custom_reward_function.name", "custom_reward_function.name"),
     lambda s: "compute_score" if single_turn(s) else None),
    # NaiveRewardManager scores each response; DAPORewardManager adds the overlong penalty
    (("reward.reward_manager.name", "reward_manager.name", "reward_model.reward_manager"),
     lambda s: "dapo" if s.algorithm.overlong is not None else "naive"),
    # DAPORewardManager's overlong buffer: a linear penalty up to penalty_factor over the
    # last len tokens before max_resp_len
    (("reward.reward_kwargs.overlong_buffer_cfg.enable",
      "reward_model.reward_kwargs.overlong_buffer_cfg.enable"),
     lambda s: s.algorithm.overlong is not None),
    (("reward.reward_kwargs.overlong_buffer_cfg.len",
      "reward_model.reward_kwargs.overlong_buffer_cfg.len"),
     lambda s: s.algorithm.overlong.buffer_tokens if s.algorithm.overlong else None),
    (("reward.reward_kwargs.overlong_buffer_cfg.penalty_factor",
      "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor"),
     lambda s: s.algorithm.overlong.penalty if s.algorithm.overlong else None),
    (("reward.reward_kwargs.overlong_buffer_cfg.log",
      "reward_model.reward_kwargs.overlong_buffer_cfg.log"),
     # logs the penalty as extra metrics only; verl's DAPO recipe default
     lambda s: False if s.algorithm.overlong else None),
    (("reward.reward_kwargs.max_resp_len", "reward_model.reward_kwargs.max_resp_len"),
     lambda s: s.data.max_response_tokens if s.algorithm.overlong else None),
    (("distillation.enabled",), lambda s: False),
    # workers/config/model.py: the trained model's config is read from hf_config_path (its
    # own path when null), updated with override_config, after external_lib is imported to
    # register architectures: the spec's model is the checkpoint as it is, nothing imported
    (("actor_rollout_ref.model.override_config", "critic.model.override_config"),
     lambda s: {}),
    (("actor_rollout_ref.model.hf_config_path", "critic.model.hf_config_path",
      "actor_rollout_ref.model.external_lib", "critic.model.external_lib"), lambda s: NULL),
    # handed to the rollout engine as arguments (vllm_async_server, async_sglang_server): a KV
    # cache in fp8 or a quantized load samples from another distribution than the spec's
    # model, as the rollout's own quantization does
    ((f"{R}.engine_kwargs.vllm", f"{R}.engine_kwargs.sglang", f"{R}.engine_kwargs.trtllm"),
     lambda s: {}),
    ((f"{R}.quantization", f"{R}.quantization_config_file"), lambda s: NULL),
    # the model's own tokenizer and chat template (hf_tokenizer of the model path)
    (("actor_rollout_ref.model.tokenizer_path", "actor_rollout_ref.model.custom_chat_template",
      "critic.model.custom_chat_template"), lambda s: NULL),

    # -- the trainer ------------------------------------------------------------------------
    (("trainer.total_training_steps",), lambda s: s.budget.total_updates),
    # passes over the train split: every pass holds at least one update, so total_updates
    # passes always reach total_training_steps, where fit() stops
    (("trainer.total_epochs",), lambda s: s.budget.total_updates),
    (("trainer.nnodes",), lambda s: s.resources.nodes),
    (("trainer.n_gpus_per_node",), lambda s: s.resources.gpus_per_node),
    # fit() saves every save_freq steps and at the last one; -1 never saves: "only at the
    # end" is the last update
    (("trainer.save_freq",), lambda s: s.checkpoint.every or s.budget.total_updates),
    (("trainer.test_freq",), lambda s: s.evaluation.every if s.evaluation.every else -1),
    # validation runs after every evaluation.every-th update (an engine may add one before
    # update 1: docs/rehearse.md); none without evaluation.every
    (("trainer.val_before_train",), lambda s: _option(s, "trainer.val_before_train", False)),
    # _save_checkpoint: max_ckpt_to_keep newest kept, null keeps every one
    (("trainer.max_actor_ckpt_to_keep",), lambda s: s.checkpoint.keep or NULL),
    (("trainer.max_critic_ckpt_to_keep",), lambda s: s.checkpoint.keep or NULL),
    # run plumbing: checkpoints inside the attempt's folder; the run name is the plan's run
    # id and the experiment digest (collect reads them back); the project name a safe path
    # component of the spec's name (verl builds folders from it); metrics to verl's file
    # logger (tensorboard before the file logger existed); a fresh attempt starts from the
    # model, never from a checkpoint found on disk
    (("trainer.default_local_dir",), lambda s: f"{RUN_DIR}/checkpoints"),
    (("trainer.experiment_name",), lambda s: _run_name(s)),
    (("trainer.project_name",), lambda s: slug(s.name, "") or None),
    (("trainer.logger",), lambda s: OneOf((["console", "file"], ["console", "tensorboard"]))),
    (("trainer.resume_mode",), lambda s: "disable"),
    # main_ppo: "auto" (the default) and "enable" both pick verl's FSDP workers
    (("trainer.use_legacy_worker_impl",), lambda s: OneOf(("auto", "enable", UNSET))),
    # 0.9: the v1 trainer (the release's default, the one with DAPO group filtering), in
    # sync mode: every update's samples come from the policy of that update (on-policy)
    (("trainer.use_v1",), lambda s: True),
    (("trainer.v1.trainer_mode",), lambda s: "sync"),
    # a failed group is not replaced by a fresh prompt (v1 ReplayBuffer); the spec refuses
    # an update with failed conversations (max_failed_share 0) instead
    (("trainer.v1.sampler.sync_refill_failed_groups",), lambda s: False),
    # the v1 ReplayBuffer hands samples over as they finish generating, so its mini-batches
    # change from run to run (verl 0.9.1 measured); the sampler in the run folder keeps the
    # order the prompts were drawn in (trainer_base._build_replay_buffer loads it)
    (("trainer.v1.sampler.custom_sampler.path",),
     lambda s: f"{RUN_DIR}/stateset_verl_sampler.py"),
    (("trainer.v1.sampler.custom_sampler.name",), lambda s: "OrderedReplayBuffer"),
]
