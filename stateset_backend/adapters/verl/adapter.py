"""Adapter for verl: ``python -m verl.trainer.main_ppo`` with Hydra overrides.

verl accepts several values it never checks (an unknown ``adv_estimator``, ``loss_mode``,
rollout name, logger, ``resume_mode`` or ``kl_loss_type`` is carried along until something
fails far into a run, or never), so every value written here comes from a closed mapping.
Every key a release reads that changes the math or the budget is recorded with its default in
the dialect and written by every launch; what a release hard-codes differently is declared
there, quantified, or refused here with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from stateset_backend.adapters.agent_shims import CONFIG_FILE as CONVERSATION_FILE
from stateset_backend.adapters.agent_shims import VERL_AGENT_NAME, VERL_AGENT_TARGET, shim_files
from stateset_backend.plugin import (
    PYTHON,
    REWARD_SHIM_FILE,
    RUN_DIR,
    Artifact,
    Checkpoint,
    Collected,
    Dialect,
    DialectKeys,
    EngineAdapter,
    ExperimentSpec,
    Hardcoded,
    KitSupport,
    LaunchContext,
    NativeLaunch,
    Outcome,
    Pinned,
    Refused,
    Rule,
    RuleSet,
    Translation,
    by_conversation,
    carried,
    conversation_rules,
    conversation_settings,
    environment_file,
    even_split,
    external_rules,
    hardcoded,
    is_conversation,
    local_path,
    local_splits,
    only,
    overrides,
    pinned_model_path,
    resolved,
    reward_shim,
    rl_objective,
    to,
    total_limit,
    with_owned_keys,
)

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
MODEL = "actor_rollout_ref.model"
VAL = f"{ROLLOUT}.val_kwargs"
FILTER = "algorithm.filter_groups"
LOG_ROOT = "logs"
CHECKPOINTS = "checkpoints"

ESTIMATOR = {"grpo": "grpo", "dr_grpo": "grpo", "dapo": "grpo", "gspo": "grpo",
             "cispo": "grpo", "rloo": "rloo", "reinforce_pp": "reinforce_plus_plus_baseline",
             "ppo": "gae"}
GROUP_NORMALISED = frozenset({"grpo", "dr_grpo", "dapo", "gspo", "cispo"})
WHITENED = frozenset({"reinforce_pp", "ppo"})  # verl whitens these over the batch
LOSS_MODE = {"gspo": "gspo", "cispo": "cispo"}  # everything else: "vanilla"
AGGREGATION = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean",
               "seq_mean_token_sum": "seq-mean-token-sum",
               "seq_mean_token_sum_norm": "seq-mean-token-sum-norm"}
KL_TYPE = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}  # names every release accepts
PRECISION = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
GRPO_EPSILON = 1e-6  # compute_grpo_outcome_advantage's default; no caller passes another
K3_CLAMP = 10.0  # kl_penalty_forward clamps low_var_kl to [-10, 10]
NO_DUAL_CLIP = 1e9  # above exp(20) >= any ratio verl computes: min() never picks -A * c
NO_VALUE_CLIP = 1e9  # cliprange_value for an unclipped value loss
# What verl does with a launch's strings: Hydra's override parser, then main_ppo's
# OmegaConf.resolve(config) in place (every release), then reads that interpolate again, and
# hydra.utils.instantiate resolving a copy of each _target_ section once more.
READ_PATH = "main_ppo resolves its config in place and Hydra's instantiate resolves again"
ADAM_EPS = 1e-8  # torch.optim.AdamW's default, which verl passes on before 0.6.1

# canonical metric -> verl's metric key (the same in its file and TensorBoard loggers)
METRICS = {"reward/mean": "critic/score/mean", "loss/policy": "actor/pg_loss",
           "kl": "actor/kl_loss", "entropy": "actor/entropy", "clip_fraction": "actor/pg_clipfrac",
           "grad_norm": "actor/grad_norm", "lr": "actor/lr",
           "response_length/mean": "response_length/mean", "tokens_per_second": "perf/throughput"}


class VerlKeys(DialectKeys):
    reward_function: str  # the custom reward function section
    reward_manager: str  # the reward manager's name key
    reward_kwargs: str  # the reward manager's kwargs (with '+': not in the base config)
    seed: list[str]  # every seed the release reads
    logger: Literal["file", "tensorboard"]
    filter_groups: str | None  # dynamic sampling (the V1 trainer only)
    filter_metric: str | None  # what filter_groups compares within a group
    grad_clip: list[str]  # the actor keys the release clips with
    critic_grad_clip: list[str]
    prompt_truncation: Literal["dataset", "none", "left"]  # what happens to a long prompt
    token_mean: Literal["global", "micro_batch"]  # what token-mean averages over
    cosine_warmup_from_floor: bool  # cosine warmup starts at min_lr_ratio (0.4, 0.5)
    added: list[str]  # keys read with .get() but absent from the config: written with '+'
    fixed: list[str]  # keys pinned at the recorded default, which is what the spec means
    agent_loop: bool = False  # the agent loop the conversation shim implements (0.9.1)


def loss_mode(spec: ExperimentSpec) -> str:
    return LOSS_MODE.get(spec.algorithm.objective, "vanilla")


class _Keys:
    """Native key names for one dialect: '+' where the release reads a key it does not
    declare, and only keys the release has (by its recorded defaults)."""

    def __init__(self, dialect: Dialect, keys: VerlKeys) -> None:
        self.defaults = dialect.defaults
        self.added = set(keys.added)
        self.keys = keys

    def __call__(self, key: str) -> str:
        return f"+{key}" if key in self.added else key

    def has(self, key: str) -> bool:
        return key in self.defaults

    def optim(self, suffix: str, value: Any) -> dict[str, Any]:
        """The same optimizer setting for the actor and (for PPO) the critic, where the
        release reads it."""
        return {self(k): value for k in (f"{ACTOR}.optim.{suffix}", f"critic.optim.{suffix}")
                if self.has(k)}

    def optim_rule(self, suffix: str) -> Rule:
        def rule(value: Any, spec: ExperimentSpec) -> Outcome:
            return Pinned(self.optim(suffix, value))

        return rule


# -- rules ---------------------------------------------------------------------------------
def _objective(k: _Keys) -> Rule:
    fixed = {k(key): k.defaults[key] for key in k.keys.fixed}

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned({"algorithm.adv_estimator": ESTIMATOR[value],
                       f"{ACTOR}.policy_loss.loss_mode": loss_mode(spec), **fixed})

    return rule


def _ratio_level(value: Any, spec: ExperimentSpec) -> Outcome:
    if value == "sequence" and spec.algorithm.objective != "gspo":
        return Refused("verl computes a sequence-level ratio only in its gspo loss mode")
    return Pinned({f"{ACTOR}.policy_loss.loss_mode": loss_mode(spec)})


def _dual_clip(value: Any, spec: ExperimentSpec) -> Outcome:
    key = f"{ACTOR}.clip_ratio_c"
    if spec.algorithm.objective in LOSS_MODE:
        if value is not None:
            return Refused(f"verl's {loss_mode(spec)} loss has no dual clip")
        return Pinned({key: NO_DUAL_CLIP}, f"verl's {loss_mode(spec)} loss has no dual clip")
    if value is None:
        return Pinned({key: NO_DUAL_CLIP}, "clip_ratio_c = 1e9: verl clamps the log-ratio to "
                      "[-20, 20], so every ratio is below exp(20) < 1e9 and the dual clip never "
                      "binds (verl's default 3.0 would dual-clip)")
    return Pinned({key: value})


def _aggregation(k: _Keys) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        native: dict[str, Any] = {f"{ACTOR}.loss_agg_mode": AGGREGATION[value]}
        scale = f"{ACTOR}.loss_scale_factor"
        if value == "seq_mean_token_sum_norm":
            if not k.has(scale):
                return Refused("verl before 0.7 divides the token sums by the micro-batch's "
                               "padded width and not by the number of sequences")
            native[scale] = spec.data.max_response_tokens
        elif k.has(scale):
            native[scale] = None
        if value == "token_mean" and k.keys.token_mean == "micro_batch":
            return Hardcoded("micro-batch token means", "micro_batch_token_mean", native)
        return Pinned(native)

    return rule


def _kl_off(k: _Keys) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned({f"{ACTOR}.use_kl_loss": False, "algorithm.use_kl_in_reward": False,
                       f"{ACTOR}.kl_loss_coef": 0.0, f"{ACTOR}.kl_loss_type": "low_var_kl",
                       "algorithm.kl_ctrl.kl_coef": 0.0, "algorithm.kl_penalty": "kl"},
                      "no KL: both of verl's KL switches off, their coefficients 0")

    return rule


def _in_loss(spec: ExperimentSpec) -> bool:
    return spec.algorithm.kl is not None and spec.algorithm.kl.placement == "loss"


def _kl_coef(value: Any, spec: ExperimentSpec) -> Outcome:
    key = f"{ACTOR}.kl_loss_coef" if _in_loss(spec) else "algorithm.kl_ctrl.kl_coef"
    return Pinned({key: value})


def _kl_estimator(value: Any, spec: ExperimentSpec) -> Outcome:
    key = f"{ACTOR}.kl_loss_type" if _in_loss(spec) else "algorithm.kl_penalty"
    return Pinned({key: KL_TYPE[value]})


def _kl_placement(value: Any, spec: ExperimentSpec) -> Outcome:
    """The switches, and the unused placement's coefficient at 0 (its estimator at verl's
    default name), so no KL term is left to a default."""
    loss = value == "loss"
    unused = {"algorithm.kl_ctrl.kl_coef": 0.0, "algorithm.kl_penalty": "kl"} if loss else \
        {f"{ACTOR}.kl_loss_coef": 0.0, f"{ACTOR}.kl_loss_type": "low_var_kl"}
    return Pinned({f"{ACTOR}.use_kl_loss": loss, "algorithm.use_kl_in_reward": not loss,
                   **unused})


def _kl_clamp(value: Any, spec: ExperimentSpec) -> Outcome:
    assert spec.algorithm.kl is not None
    if spec.algorithm.kl.estimator == "k3":
        return Hardcoded(K3_CLAMP, "k3_clamp")
    if value is not None:
        return Refused(f"verl does not clamp the {spec.algorithm.kl.estimator} estimate")
    return Pinned({}, f"verl does not clamp the {spec.algorithm.kl.estimator} estimate")


def _std_normalize(value: Any, spec: ExperimentSpec) -> Outcome:
    objective = spec.algorithm.objective
    if objective == "rloo" and value:
        return Refused("verl's RLOO cannot divide advantages by a std")
    if objective in WHITENED and not value:
        return Refused(f"verl always whitens {objective} advantages")
    return Pinned({"algorithm.norm_adv_by_std_in_grpo": value},
                  "" if objective in GROUP_NORMALISED else f"unused by verl's {objective}")


def _std(value: Any, spec: ExperimentSpec) -> Outcome:
    # GRPO: torch.std of the group; whitening: masked_var, Bessel-corrected over tokens
    return Hardcoded("unbiased", "advantage_std")


def _epsilon(value: Any, spec: ExperimentSpec) -> Outcome:
    if spec.algorithm.objective in WHITENED:
        return Hardcoded("1e-8 added to the variance", "whitening_epsilon")
    return Hardcoded(GRPO_EPSILON, "grpo_epsilon")


def _scope(value: Any, spec: ExperimentSpec) -> Outcome:
    objective = spec.algorithm.objective
    if objective in WHITENED:
        return Pinned({}, "verl's masked_whiten: over the batch's response tokens, each "
                          "sample weighted by its token count") if value == "batch" \
            else Refused(f"verl whitens {objective} advantages over the batch, not per group")
    if value == "batch":
        return Refused(f"verl's {ESTIMATOR[objective]} advantages are per group")
    return Pinned({}, "verl groups responses by prompt (uid)")


def _zero_variance(k: _Keys) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "keep" and spec.algorithm.objective in WHITENED:
            return Pinned({}, f"verl whitens {spec.algorithm.objective} advantages over the "
                              "batch: no group is centred on its own")
        if value == "keep":
            return Hardcoded("kept, centred by a float32 group mean", "zero_variance_float_mean",
                             {})
        if spec.algorithm.dynamic_sampling is None or k.keys.filter_groups is None:
            return Refused("verl excludes zero-variance groups only with dynamic sampling "
                           "(verl >= 0.9)")
        native = {f"{FILTER}.enable": True, f"{FILTER}.metric": k.keys.filter_metric}
        if k.keys.filter_metric == "acc" and spec.algorithm.overlong is not None:
            return Hardcoded("exclude by score before the overlong penalty", "filter_on_score",
                             native)
        return Pinned(native, f"groups compared on {k.keys.filter_metric!r}: the reward the "
                              "advantage uses")

    return rule


def _no_dynamic_sampling(k: _Keys) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        if k.keys.filter_groups is None:
            return Pinned({}, "this release's trainer has no dynamic sampling")
        return Pinned({f"{FILTER}.enable": False, f"{FILTER}.metric": k.defaults[
            f"{FILTER}.metric"], f"{FILTER}.max_num_gen_batches": 0})

    return rule


def _max_rounds(value: Any, spec: ExperimentSpec) -> Outcome:
    return Hardcoded(None, "unbounded_refill", {f"{FILTER}.enable": True,
                                                f"{FILTER}.max_num_gen_batches": 0})


def _overlong(keys: VerlKeys) -> Rule:
    """The DAPO reward manager with its overlong buffer (reward_kwargs are not in the base
    config, hence Hydra's ``+`` append, which the dialect's key carries)."""

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        kw = keys.reward_kwargs
        return Pinned({keys.reward_manager: "dapo",
                       f"{kw}.overlong_buffer_cfg.enable": True,
                       f"{kw}.overlong_buffer_cfg.len": value,
                       f"{kw}.overlong_buffer_cfg.log": False,
                       f"{kw}.max_resp_len": spec.data.max_response_tokens})

    return rule


def _gae_off(k: _Keys) -> Rule:
    """No critic: the critic's keys a release records are pinned at their recorded values."""
    idle = {key: k.defaults[key] for key in ("critic.optim.lr", "trainer.critic_warmup")
            if k.has(key)}

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned(idle, "no critic")

    return rule


def _critic_warmup(value: Any, spec: ExperimentSpec) -> Outcome:
    """verl updates the actor at step s (from 1) once critic_warmup <= s: N critic-only
    updates is critic_warmup N + 1."""
    return Pinned({"trainer.critic_warmup": value + 1 if value else 0})


def _value_clip(value: Any, spec: ExperimentSpec) -> Outcome:
    """verl always clips the value; a range no value moves by in one update is no clip (the
    clamp returns V itself)."""
    return Pinned({"critic.cliprange_value": NO_VALUE_CLIP if value is None else value})


def _model_path(value: Any, spec: ExperimentSpec) -> Outcome:
    path = pinned_model_path(spec)
    keys = [f"{MODEL}.path"] + (["critic.model.path"] if spec.algorithm.gae else [])
    return Pinned({k: path for k in keys})


def _compute_dtype(k: _Keys) -> Rule:
    mixed = f"{ACTOR}.fsdp_config.mixed_precision"

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        if spec.algorithm.gae is not None and value != "bfloat16":
            return Refused("verl's critic computes in bfloat16 (its FSDP default, which this "
                           "launch does not set): PPO runs only with model.dtype bfloat16")
        return Pinned({f"{ROLLOUT}.dtype": value,
                       k(f"{mixed}.param_dtype"): PRECISION[value],
                       k(f"{mixed}.reduce_dtype"): "fp32", k(f"{mixed}.buffer_dtype"): "fp32"})

    return rule


def _data_file(key: str) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        if not str(value).endswith(".parquet"):
            return Refused("verl reads parquet files in its own row format (prompt messages, "
                           "reward_model.ground_truth); convert the split first")
        return Pinned({key: value})

    return rule


def _no_validation(value: Any, spec: ExperimentSpec) -> Outcome:
    """verl always builds a validation dataset: it is the train split, never evaluated."""
    return Pinned({"data.val_files": spec.data.train.uri}, "no validation split: verl's "
                  "validation set is the train split, never evaluated (test_freq -1, no "
                  "validation before training)")


def _prompt_overflow(k: _Keys) -> Rule:
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


def _top_k(value: Any, spec: ExperimentSpec) -> Outcome:
    return Pinned({f"{ROLLOUT}.top_k": -1 if value is None else value})


def _eval_every(k: _Keys) -> Rule:
    greedy = {f"{VAL}.temperature": 0.0, f"{VAL}.top_p": 1.0, f"{VAL}.n": 1,
              f"{VAL}.do_sample": False, f"{VAL}.top_k": -1}

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        native = {"trainer.test_freq": -1 if value is None else value,
                  "trainer.val_before_train": False}
        return Pinned({**native, **greedy} if value is None else native)

    return rule


def _eval_temperature(value: Any, spec: ExperimentSpec) -> Outcome:
    return Pinned({f"{VAL}.temperature": value, f"{VAL}.do_sample": value > 0,
                   f"{VAL}.top_k": -1})


def _schedule(k: _Keys) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "linear":
            return Refused("verl's FSDP optimizer has constant and cosine schedules only")
        native = {**k.optim("num_cycles", 0.5), **k.optim("zero_indexed_step", True)}
        if k.has(f"{ACTOR}.optim.lr_scheduler_type"):
            return Pinned({**native, **k.optim("lr_scheduler_type", value),
                           **k.optim("warmup_style", None)})
        return Pinned({**native, **k.optim("warmup_style", value)})

    return rule


def _warmup(k: _Keys) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned({**k.optim("lr_warmup_steps", value),
                       **k.optim("lr_warmup_steps_ratio", 0.0)},
                      "verl steps its scheduler once per update; update u < W runs at lr * u / W")

    return rule


def _min_lr_ratio(k: _Keys) -> Rule:
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


def _optimizer(k: _Keys) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        native = {**k.optim("optimizer", "AdamW"), **k.optim("optimizer_impl", "torch.optim")}
        return Pinned(native) if native else Hardcoded("adamw", "adamw")

    return rule


def _eps(k: _Keys) -> Rule:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        native = k.optim("override_optimizer_config", {"eps": value})
        return Pinned(native) if native else Hardcoded(ADAM_EPS, "adam_eps")

    return rule


def _budget(value: Any, spec: ExperimentSpec) -> Outcome:
    return Pinned({"trainer.total_training_steps": value, "trainer.total_epochs": value},
                  "verl stops after total_training_steps updates; total_epochs = the same number "
                  "is enough passes, since every pass has at least one update")


def _mini_batches(value: Any, spec: ExperimentSpec) -> Outcome:
    prompts = spec.budget.prompts_per_update
    return even_split(prompts, value, "prompts") or \
        Pinned({f"{ACTOR}.ppo_mini_batch_size": prompts // value},
               "verl's mini-batch size is in prompts")


def _checkpoint_every(value: Any, spec: ExperimentSpec) -> Outcome:
    if value is None:
        return Pinned({"trainer.save_freq": spec.budget.total_updates},
                      "only at the end: save_freq = total_updates")
    return Pinned({"trainer.save_freq": value}, "and at the last update, as verl always does")


class VerlAdapter(EngineAdapter):
    name = "verl"
    contract_file = "verl.json"
    dialect_keys = VerlKeys
    cluster_launch = "ray"  # its launch is a Ray driver: a cluster's nodes join a Ray cluster

    def rules(self, dialect: Dialect) -> RuleSet:
        keys: VerlKeys = self.keys(dialect)
        k = _Keys(dialect, keys)
        fn = keys.reward_function
        return {
            **external_rules("verl"),
            "seed": to(*(k(key) for key in keys.seed)),
            "algorithm.objective": rl_objective("verl", _objective(k)),
            "algorithm.group_size": to(f"{ROLLOUT}.n"),
            "algorithm.clip.low": to(f"{ACTOR}.clip_ratio_low"),
            "algorithm.clip.high": to(f"{ACTOR}.clip_ratio_high"),
            "algorithm.clip.dual_clip": _dual_clip,
            "algorithm.ratio_level": _ratio_level,
            "algorithm.loss_aggregation": _aggregation(k),
            "algorithm.kl": _kl_off(k),
            "algorithm.kl.coef": _kl_coef,
            "algorithm.kl.estimator": _kl_estimator,
            "algorithm.kl.placement": _kl_placement,
            "algorithm.kl.clamp": _kl_clamp,
            "algorithm.advantage.std_normalize": _std_normalize,
            "algorithm.advantage.std": _std,
            "algorithm.advantage.epsilon": _epsilon,
            "algorithm.advantage.scope": _scope,
            "algorithm.advantage.zero_variance_groups": _zero_variance(k),
            "algorithm.dynamic_sampling": _no_dynamic_sampling(k),
            "algorithm.dynamic_sampling.max_rounds": _max_rounds,
            "algorithm.overlong": lambda v, s: Pinned({keys.reward_manager: "naive"}),
            "algorithm.overlong.buffer_tokens": _overlong(keys),
            "algorithm.overlong.penalty": to(
                f"{keys.reward_kwargs}.overlong_buffer_cfg.penalty_factor"),
            "algorithm.entropy_coef": to(f"{ACTOR}.entropy_coeff"),
            "algorithm.gae": _gae_off(k),
            "algorithm.gae.gamma": to("algorithm.gamma"),
            "algorithm.gae.lam": to("algorithm.lam"),
            "algorithm.gae.critic.model": only(
                lambda v: v == "separate", "verl's critic is a separate value model "
                "(critic.model.path), never a head on the actor", carried(
                    "verl's critic: a separate value model loaded from model.path")),
            "algorithm.gae.critic.lr": to(k("critic.optim.lr")),
            "algorithm.gae.critic.value_clip": _value_clip,
            "algorithm.gae.critic.warmup_updates": _critic_warmup,
            "model.path": _model_path,
            "model.dtype": _compute_dtype(k),
            "model.param_dtype": lambda v, s: Refused(
                "verl's critic keeps float32 master weights (its default, which this launch "
                "does not set): PPO runs only with model.param_dtype float32")
            if s.algorithm.gae is not None and v != "float32" else
            Pinned({k(f"{ACTOR}.fsdp_config.model_dtype"): PRECISION[v]}),
            "model.lora": to(f"{MODEL}.lora_rank", convert=lambda v: 0),
            "model.lora.rank": to(f"{MODEL}.lora_rank"),
            "model.lora.alpha": to(f"{MODEL}.lora_alpha"),
            "model.lora.target_modules": to(f"{MODEL}.target_modules"),
            "model.lora.dropout": hardcoded(0.0, "lora_dropout"),
            "data.train.uri": _data_file("data.train_files"),
            "data.train.prompt_field": to("data.prompt_key"),
            "data.train.answer_field": carried("verl hands the reward the row's "
                                               "reward_model.ground_truth"),
            "data.validation": _no_validation,
            "data.validation.uri": _data_file("data.val_files"),
            "data.validation.prompt_field": to("data.prompt_key"),
            "data.validation.answer_field": carried("verl hands the reward the row's "
                                                    "reward_model.ground_truth"),
            "data.max_prompt_tokens": to("data.max_prompt_length"),
            "data.max_response_tokens": to("data.max_response_length"),
            "data.chat_template": hardcoded(True, "chat_template"),
            "data.prompt_overflow": _prompt_overflow(k),
            "data.shuffle": to("data.shuffle"),
            "reward.entrypoint": lambda v, s: Pinned({
                f"{fn}.path": f"{RUN_DIR}/{REWARD_SHIM_FILE}", f"{fn}.name": "compute_score"}),
            "rollout.backend": only(lambda v: v in ("vllm", "sglang"), "verl rolls out with "
                                    "vllm or sglang", to(f"{ROLLOUT}.name")),
            "rollout.temperature": to(f"{ROLLOUT}.temperature"),
            "rollout.top_p": to(f"{ROLLOUT}.top_p"),
            "rollout.top_k": _top_k,
            "optim.kind": _optimizer(k),
            "optim.lr": to(k(f"{ACTOR}.optim.lr")),  # the critic's is algorithm.gae.critic.lr
            "optim.betas": lambda v, s: Pinned(k.optim("betas", list(v))),
            "optim.eps": _eps(k),
            "optim.weight_decay": k.optim_rule("weight_decay"),
            "optim.grad_clip": to(*keys.grad_clip, *keys.critic_grad_clip),
            "optim.schedule": _schedule(k),
            "optim.warmup_steps": _warmup(k),
            "optim.min_lr_ratio": _min_lr_ratio(k),
            "budget.total_updates": _budget,
            "budget.prompts_per_update": to("data.train_batch_size"),
            "budget.ppo_epochs": to(f"{ACTOR}.ppo_epochs"),
            "budget.mini_batches": _mini_batches,
            "budget.partial_batch": hardcoded("drop", "partial_batch"),
            "checkpoint.every": _checkpoint_every,
            "checkpoint.keep": to("trainer.max_actor_ckpt_to_keep",
                                  "trainer.max_critic_ckpt_to_keep"),
            "evaluation.every": _eval_every(k),
            "evaluation.temperature": _eval_temperature,
            "evaluation.top_p": to(f"{VAL}.top_p"),
            "evaluation.samples": to(f"{VAL}.n"),
            "resources.nodes": to("trainer.nnodes"),
            "resources.gpus_per_node": to("trainer.n_gpus_per_node"),
            **_conversation_rules(k),
        }

    def kit_support(self) -> KitSupport:
        # the kit reads verl's launches and writes its outputs with its own knowledge
        return KitSupport(option_key=lambda plan: "trainer.validation_data_dir")

    def render(self, translation: Translation, spec: ExperimentSpec,
               ctx: LaunchContext) -> NativeLaunch:
        keys: VerlKeys = self.keys(ctx.dialect)
        # Memory/speed knobs the spec does not describe (they do not change the math):
        # token-budget micro-batching, which verl requires some setting of.
        tokens = spec.data.max_prompt_tokens + spec.data.max_response_tokens
        native = {f"{ACTOR}.use_dynamic_bsz": True,
                  f"{ACTOR}.ppo_max_token_len_per_gpu": max(16384, 2 * tokens),
                  **translation.native}
        # verl runs in the run folder: a split named relative to the spec is made absolute
        for key in ("data.train_files", "data.val_files"):
            if str(native[key]).startswith(RUN_DIR):
                continue  # converted by the conversation launcher
            path = local_path(native[key], Path(ctx.base_dir or "."))
            if path is not None:
                native[key] = str(resolved(translation.sources.get(key, key), path))
        # Identity and outputs: the run id and digest name the run inside verl's own outputs.
        # The project name is a folder name to verl's loggers and dumps: never the user's text.
        owned = {
            "trainer.project_name": overrides.slug(spec.name, "stateset"),
            "trainer.experiment_name": ctx.run_name,
            "trainer.default_local_dir": f"{RUN_DIR}/{CHECKPOINTS}",
            "trainer.logger": ["console", keys.logger],
            "trainer.resume_mode": "disable",
        }
        native = with_owned_keys("verl", native, owned)
        overrides.refuse_interpolations(native, translation.sources, "verl", READ_PATH)
        if is_conversation(spec):
            return NativeLaunch(
                argv=[PYTHON, f"{RUN_DIR}/{AGENT_LAUNCHER}", *overrides.render(native)],
                files=_conversation_files(spec, ctx), set_env=self._logger_env(keys, ctx),
                env=["CUDA_VISIBLE_DEVICES", "HF_HOME", "HF_HUB_CACHE", "WANDB_API_KEY"],
                native=native)
        return NativeLaunch(
            argv=[PYTHON, "-m", "verl.trainer.main_ppo", *overrides.render(native)],
            files={REWARD_SHIM_FILE: reward_shim(spec, ctx.base_dir, "verl", REWARD_CALL)},
            set_env=self._logger_env(keys, ctx),
            env=["CUDA_VISIBLE_DEVICES", "HF_HOME", "HF_HUB_CACHE", "WANDB_API_KEY"],
            native=native)

    @staticmethod
    def _logger_env(keys: VerlKeys, ctx: LaunchContext) -> dict[str, str]:
        """Where verl's metrics logger writes, named by the run and nothing of the user's: the
        file logger's (>=0.6) whole path, which it then takes as given; before it, the
        TensorBoard logger's folder."""
        if keys.logger == "file":
            # the attempt folder itself: verl opens the path without creating its folder
            return {"VERL_FILE_LOGGER_PATH": f"{RUN_DIR}/{ctx.run_name}.jsonl"}
        return {"TENSORBOARD_DIR": f"{RUN_DIR}/{LOG_ROOT}/{ctx.run_name}"}

    def collect(self, attempt_dir: Path, ctx: LaunchContext) -> Collected:
        out = Collected(raw_metric_names=dict(METRICS))
        if self.keys(ctx.dialect).logger == "tensorboard":
            from stateset_backend.plugin import canonical_rows, read_scalars

            log_dir = attempt_dir / LOG_ROOT / ctx.run_name
            if log_dir.is_dir():
                out.run_id, out.experiment_digest = ctx.run_id, ctx.experiment_digest
                out.metrics = canonical_rows(read_scalars(log_dir), METRICS)
        # the file logger writes the path the launch gave it (plans made before that:
        # <root>/<project>/<experiment_name>.jsonl)
        given = attempt_dir / f"{ctx.run_name}.jsonl"
        logs = [given] if given.is_file() else \
            sorted((attempt_dir / LOG_ROOT).glob(f"*/{ctx.run_name}.jsonl"))
        for log in logs:
            out.run_id, out.experiment_digest = ctx.run_id, ctx.experiment_digest
            for line in log.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    doc = json.loads(line)
                    row = {"step": doc["step"]}
                    row.update({c: doc["data"][r] for c, r in METRICS.items() if r in doc["data"]})
                    out.metrics.append(row)
        out.committed_updates = max((int(r["step"]) for r in out.metrics), default=0)
        root = attempt_dir / CHECKPOINTS
        if root.is_dir():
            for step_dir in sorted(root.glob("global_step_*")):
                step = int(step_dir.name.rsplit("_", 1)[1])
                out.artifacts.extend(
                    _artifact(p, attempt_dir, step) for p in sorted(step_dir.rglob("*"))
                    if p.is_file())
        return out

    def latest_checkpoint(self, attempt_dir: Path) -> Checkpoint | None:
        marker = attempt_dir / CHECKPOINTS / "latest_checkpointed_iteration.txt"
        if not marker.is_file():
            return None
        step = int(marker.read_text().strip())
        path = attempt_dir / CHECKPOINTS / f"global_step_{step}"
        return Checkpoint(path, step) if path.is_dir() else None

    def resume_argv(self, checkpoint: Checkpoint, argv: list[str],
                    attempt_dir: Path) -> list[str]:
        """verl loads from any path it is given and saves into this attempt's folder."""
        kept = [a for a in argv if not a.startswith("trainer.resume_mode=")]
        return [*kept, "trainer.resume_mode=resume_path",
                f"trainer.resume_from_path={overrides.value(str(checkpoint.path))}"]


# -- conversations: verl's agent loop runs the spec's environment through the shim ----------
AGENT_LAUNCHER = "stateset_verl_agent.py"  # agent_shims/verl_agent_loop.py in the run folder
AGENT_LOOPS_FILE = "stateset_agent_loops.yaml"
CONVERTED = f"{RUN_DIR}/data"  # the launcher's converted splits (JSON lines, prompt messages)


def _conversation_rules(k: _Keys) -> dict[str, Rule]:
    """The environment leaves, and the data leaves whose meaning a conversation changes (the
    launcher converts the splits; the agent loop checks each opening against the prompt limit;
    the response region holds every turn and observation after the opening)."""

    def switch(spec: ExperimentSpec) -> dict[str, Any]:
        return {f"{ROLLOUT}.agent.default_agent_loop": VERL_AGENT_NAME,
                f"{ROLLOUT}.agent.agent_loop_config_path": f"{RUN_DIR}/{AGENT_LOOPS_FILE}"}

    rules = conversation_rules(
        "verl", switch,
        total_tokens=lambda s: {"data.max_response_length": total_limit(s)
                                - s.data.max_prompt_tokens})
    if not k.keys.agent_loop:
        refuse_kind = rules["environment.kind"]

        def kind(value: Any, spec: ExperimentSpec) -> Outcome:
            if value == "single_turn":
                return refuse_kind(value, spec)
            return Refused("the conversation shim implements verl 0.9.1's agent loop "
                           "interface; earlier releases' agent loops are not translated")

        rules["environment.kind"] = kind
    single = {path: rule for path, rule in _data_rules_single(k).items()}
    for path, conversation in _data_rules_conversation().items():
        rules[path] = by_conversation(single[path], conversation)
    return rules


def _data_rules_single(k: _Keys) -> dict[str, Rule]:
    return {"data.train.uri": _data_file("data.train_files"),
            "data.validation": _no_validation,
            "data.validation.uri": _data_file("data.val_files"),
            "data.train.prompt_field": to("data.prompt_key"),
            "data.validation.prompt_field": to("data.prompt_key"),
            "data.max_response_tokens": to("data.max_response_length"),
            "data.prompt_overflow": _prompt_overflow(k)}


def _data_rules_conversation() -> dict[str, Rule]:
    def split(name: str, key: str) -> Rule:
        def rule(value: Any, spec: ExperimentSpec) -> Outcome:
            return Pinned({key: f"{CONVERTED}/{name}.jsonl"}, "converted by the launcher: the "
                          "original row (what reset receives) and the prompt field as chat "
                          "messages")

        return rule

    converted = Pinned({"data.prompt_key": "prompt"}, "read by the launcher, which converts "
                       "the split")
    return {"data.train.uri": split("train", "data.train_files"),
            "data.validation": lambda v, s: Pinned({"data.val_files": f"{CONVERTED}/train.jsonl"},
                                                   "no validation split: the converted train "
                                                   "split, never evaluated"),
            "data.validation.uri": split("validation", "data.val_files"),
            "data.train.prompt_field": lambda v, s: converted,
            "data.validation.prompt_field": lambda v, s: converted,
            "data.max_response_tokens": lambda v, s: Pinned({
                "data.max_response_length": total_limit(s) - s.data.max_prompt_tokens},
                "the turn limit when environment.max_turn_tokens is null; verl's response "
                "region holds every turn and observation after the opening"),
            "data.prompt_overflow": lambda v, s: Pinned(
                {"data.filter_overlong_prompts": False}, "the agent loop renders each task's "
                "opening with the chat template and the environment's tools; one over "
                "data.max_prompt_tokens fails its conversation, which stops the run")}



def _conversation_files(spec: ExperimentSpec, ctx: LaunchContext) -> dict[str, str]:
    """The shim, its settings (JSON) and the agent-loop registration verl reads (YAML of two
    fixed names: nothing from the spec)."""
    import json as _json

    base = Path(ctx.base_dir or ".")
    settings = conversation_settings(spec, environment_file(spec, base), pinned_model_path(spec),
                                     local_splits(spec, base, "verl conversation",
                                                  "prompt_field"))
    return {**shim_files("verl_agent_loop.py"),
            CONVERSATION_FILE: _json.dumps(settings, indent=2, sort_keys=True),
            AGENT_LOOPS_FILE: f"- name: {VERL_AGENT_NAME}\n  _target_: {VERL_AGENT_TARGET}\n"}


def _artifact(path: Path, attempt_dir: Path, step: int) -> Artifact:
    return Artifact(str(path.relative_to(attempt_dir)), "checkpoint", step)


REWARD_CALL = '''

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    prompt = (extra_info or {}).get("prompt", "")
    return float(score(prompt, solution_str, ground_truth))
'''
