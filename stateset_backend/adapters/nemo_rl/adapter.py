"""Adapter for NeMo RL: a source checkout run as ``examples/run_grpo.py --config <yaml>``
with Hydra-style overrides applied in struct mode, through a generated launcher
(``launcher.py``) that converts the splits (dropping prompts over the limit) and registers
the spec's python reward as a NeMo RL environment.

Every override is a key of the release's own ``grpo_math_1B.yaml`` (checked against the pinned
configs of each supported tag), or added with ``+`` where NeMo RL reads an optional key. Every
key of that file that changes the math or the budget is in the dialect's ``defaults`` and set
by every launch, also where the spec has no name for the feature (it is then switched off).
"""

from __future__ import annotations

import ast
import json
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from stateset_backend.adapters.agent_shims import CONFIG_FILE as CONVERSATION_FILE
from stateset_backend.adapters.agent_shims import NEMO_RL_ENV as CONVERSATION_ENV
from stateset_backend.adapters.agent_shims import NEMO_RL_PROCESSOR as CONVERSATION_PROCESSOR
from stateset_backend.adapters.agent_shims import shim_files
from stateset_backend.adapters.nemo_rl import launcher as launcher
from stateset_backend.plugin import (
    ENGINE_HOME,
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
    InvalidInput,
    KitSupport,
    LaunchContext,
    NativeLaunch,
    Outcome,
    Pinned,
    Refused,
    Rule,
    RuleSet,
    Translation,
    Uncountable,
    carried,
    conversation_rules,
    conversation_settings,
    environment_file,
    external_rules,
    hardcoded,
    is_conversation,
    local_splits,
    only,
    overrides,
    pinned_model_path,
    refuse,
    reward_shim,
    rl_objective,
    split_rows,
    stage_checkpoint,
    to,
    total_limit,
    turn_limit,
    with_owned_keys,
    zero_variance_rule,
)

LORA_TARGETS_ALL = "all-linear"
OPENING_OVER_LIMIT = ("the launcher renders every task's opening with the chat template and the "
                      "environment's tools; one over data.max_prompt_tokens fails its "
                      "conversation, which stops the run")
LAUNCHER_FILE = "stateset_nemo_rl.py"  # its module name is how NeMo RL finds the environment
CHECKPOINTS = "checkpoints"
LOGS = "logs"
CHECKPOINT_DIR = "checkpointing.checkpoint_dir"
RUN_NAME_KEY = "logger.wandb.name"  # NeMo RL records its whole config as hparams
# canonical metric -> NeMo RL's TensorBoard tag (log_metrics(prefix="train"/"validation"))
METRICS = {"reward/mean": "train/reward", "loss/policy": "train/loss",
           "grad_norm": "train/grad_norm",
           "response_length/mean": "train/mean_gen_tokens_per_sample",
           "val/reward/mean": "validation/accuracy"}

# torch's LinearLR needs a start factor in (0, 1]: warmup starts at this fraction of lr
# instead of 0 (the dialects declare it as ``warmup_start_factor``)
WARMUP_START = 1e-8
NEVER = 10_000_000_000  # NeMo RL's own "never" for periods (ConstantLR total_iters)
CONSTANT = {"name": "torch.optim.lr_scheduler.ConstantLR",
            "kwargs": {"factor": 1.0, "total_iters": NEVER}}

# Features the spec has no name for, with the value that turns each off; a release sets those
# its ``defaults`` list (keys it does not have are skipped).
SWITCHED_OFF: dict[str, Any] = {
    "grpo.overlong_filtering": False,
    "grpo.advantage_clip_low": None,
    "grpo.advantage_clip_high": None,
    "grpo.batch_multiplier": 1,
    "grpo.reward_shaping.stop_properly_penalty_coef": None,
    "grpo.adv_estimator.minus_baseline": True,  # REINFORCE++ subtracts the group mean
    "grpo.reward_scaling.enabled": False,
    "grpo.seq_logprob_error_threshold": None,
    "grpo.invalid_tool_call_advantage": None,
    "grpo.malformed_thinking_advantage": None,
    "grpo.async_grpo.enabled": False,
    "loss_fn.use_on_policy_kl_approximation": False,
    "loss_fn.use_importance_sampling_correction": False,
    "loss_fn.truncated_importance_sampling_type": None,
    "loss_fn.truncated_importance_sampling_ratio": None,
    "loss_fn.truncated_importance_sampling_ratio_min": None,
    "loss_fn.force_on_policy_ratio": False,
    "loss_fn.disable_ppo_ratio": False,
    "loss_fn.positive_example_nll_weight": 0.0,
    "policy.hf_config_overrides": {},
    "policy.dtensor_cfg._v2": True,  # the DTensor v2 worker: scheduler steps once per update
    "policy.dtensor_cfg.enabled": True,
    "policy.megatron_cfg.enabled": False,
    "policy.draft.enabled": False,
    "policy.generation.stop_token_ids": None,  # stop at the tokenizer's eos
    "policy.generation.stop_strings": None,
    "policy.generation.vllm_cfg.kv_cache_dtype": "auto",
    "policy.generation.vllm_cfg.num_first_layers_in_bf16": 0,
    "policy.generation.vllm_cfg.num_last_layers_in_bf16": 0,
    "policy.generation.vllm_kwargs": {},
    "data.use_multiple_dataloader": False,
    "data_plane.enabled": False,
}


class NemoRLKeys(DialectKeys):
    """What differs between NeMo RL releases, as the adapter reads it."""

    config: str  # the recipe whose keys the overrides change
    custom_data: Literal["flat", "nested"]  # one data section (v0.5) or train/validation
    data_defaults: str  # where prompt_file / processor / env_name live
    kl_in_reward: str | None = None  # switch that moves KL from the loss into the reward
    kl_reward: bool = False  # whether that switch computes what the spec means (R++ only)
    kl_gradient: Literal["plain", "score_function"] = "plain"
    adv_estimator: str | None = None
    cispo: str | None = None
    lora: str | None = None
    val_at_end: str | None = None
    save_optimizer: str | None = None
    min_top_k: int | None = None  # vLLM refuses smaller top_k (and top_p) at this release
    min_top_p: float | None = None


class NemoRLAdapter(EngineAdapter):
    name = "nemo-rl"
    contract_file = "nemo-rl.json"
    dialect_keys = NemoRLKeys
    cluster_launch = "ray"  # its launch is a Ray driver: a cluster's nodes join a Ray cluster

    def rules(self, dialect: Dialect) -> RuleSet:
        k: NemoRLKeys = self.keys(dialect)
        label = f"NeMo RL {dialect.name}"

        def objective(value: Any, spec: ExperimentSpec) -> Outcome:
            native: dict[str, Any] = {
                key: off for key, off in SWITCHED_OFF.items() if key in dialect.defaults}
            native["grpo.use_leave_one_out_baseline"] = value == "rloo"
            if k.adv_estimator:
                native[k.adv_estimator] = "reinforce_plus_plus" \
                    if value == "reinforce_pp" else "grpo"
            elif value == "reinforce_pp":
                return Refused(f"{label} has no REINFORCE++ estimator")
            if k.cispo:
                native[k.cispo] = value == "cispo"
            elif value == "cispo":
                return Refused(f"{label} has no CISPO loss")
            return Pinned(native)

        converted = carried("read by the launcher, which converts the split", hub=True)
        return {
            **external_rules("NeMo RL"),
            "seed": to("grpo.seed"),
            "algorithm.objective": rl_objective("NeMo RL", objective),
            "algorithm.group_size": to("grpo.num_generations_per_prompt"),
            "algorithm.clip.low": to("loss_fn.ratio_clip_min"),
            "algorithm.clip.high": to("loss_fn.ratio_clip_max"),
            "algorithm.clip.dual_clip": to("loss_fn.ratio_clip_c"),
            "algorithm.ratio_level": _ratio_level,
            "algorithm.loss_aggregation": _aggregation,
            **_kl_rules(k, label),
            **_advantage_rules(),
            "algorithm.dynamic_sampling": lambda v, s: Pinned({
                "grpo.use_dynamic_sampling": False,
                "grpo.dynamic_sampling_max_gen_batches": 1}),
            # NeMo RL generates up to max_gen_batches + 1 batches for one update
            "algorithm.dynamic_sampling.max_rounds": lambda v, s: Pinned({
                "grpo.use_dynamic_sampling": True,
                "grpo.dynamic_sampling_max_gen_batches": v}),
            "algorithm.overlong": lambda v, s: Pinned(_overlong(s)),
            "algorithm.overlong.buffer_tokens": lambda v, s: Pinned(_overlong(s)),
            "algorithm.overlong.penalty": lambda v, s: Pinned(_overlong(s)),
            "algorithm.entropy_coef": hardcoded(0.0, "entropy_bonus"),
            "algorithm.gae": carried("no critic: group-relative advantages"),
            "algorithm.gae.gamma": refuse("NeMo RL's GRPO has no critic"),
            "algorithm.gae.lam": refuse("NeMo RL's GRPO has no critic"),
            "model.path": lambda v, s: Pinned({"policy.model_name": pinned_model_path(s)}),
            "model.dtype": to("policy.precision"),
            # DTensor v2 loads float32 master weights and keeps fp32 optimizer state; the FSDP2
            # mixed-precision policy computes in policy.precision
            "model.param_dtype": hardcoded("float32", "param_dtype"),
            **_lora_rules(k, label),
            "data.train.uri": _split("train", k),
            "data.train.prompt_field": converted,
            "data.train.answer_field": converted,
            "data.validation": _split("validation", k),
            "data.validation.uri": _split("validation", k),
            "data.validation.prompt_field": carried("read by the launcher", hub=True),
            "data.validation.answer_field": carried("read by the launcher", hub=True),
            "data.test": carried("never read during training"),
            # the launcher drops longer prompts, so NeMo RL's own limit (length >= limit ->
            # a zero-loss stub) never fires: it is set one above the spec's
            "data.max_prompt_tokens": lambda v, s: Pinned({
                **_lengths(s), "data.max_input_seq_length": v + 1}),
            "data.max_response_tokens": lambda v, s: Pinned(_lengths(s)),
            "data.chat_template": only(lambda v: v is True, "the NeMo RL launch renders every "
                                       "prompt with the model's chat template",
                                       to("policy.tokenizer.chat_template_kwargs",
                                          convert=lambda v: None)),
            "data.prompt_overflow": only(
                lambda v: v in ("drop", "error"), "the NeMo RL launch drops prompts over "
                "data.max_prompt_tokens (or stops on them); it does not truncate them",
                lambda v, s: Pinned({}, OPENING_OVER_LIMIT) if is_conversation(s) else
                Pinned({}, "the launcher counts each prompt's tokens with the model's "
                       "tokenizer and chat template and drops (or stops on) those over the "
                       "limit")),
            "data.shuffle": to("data.shuffle"),
            "reward.entrypoint": lambda v, s: Pinned({f"+env.{launcher.ENV_NAME}": {
                "entrypoint": v, "sha256": s.reward.sha256}}),
            **conversation_rules(
                "NeMo RL", switch=lambda s: _environment_keys(k, s),
                turns=lambda s: {"grpo.max_rollout_turns": s.environment.max_turns},
                turn_tokens=lambda s: {"policy.generation.max_new_tokens": turn_limit(s)},
                total_tokens=lambda s: {"policy.max_total_sequence_length": total_limit(s)},
                cuts_turns_at_total=True),
            "reward.kind": lambda v, s: Pinned(_environment_keys(k, s)) if v == "python" or
            (v == "environment" and is_conversation(s)) else
            Refused("only python and environment rewards are translated for NeMo RL"),
            "rollout.backend": only(lambda v: v == "vllm", "NeMo RL generates with vLLM here",
                                    to("policy.generation.backend")),
            "rollout.temperature": to("policy.generation.temperature"),
            "rollout.top_p": only(lambda v: k.min_top_p is None or v >= k.min_top_p,
                                  f"{label}'s vLLM generation refuses top_p below "
                                  f"{k.min_top_p}", to("policy.generation.top_p")),
            "rollout.top_k": only(lambda v: v is None or k.min_top_k is None
                                  or v >= k.min_top_k, f"{label}'s vLLM generation refuses "
                                  f"top_k below {k.min_top_k}", to("policy.generation.top_k")),
            **_optim_rules(),
            **_budget_rules(),
            **_checkpoint_rules(k),
            **_evaluation_rules(k),
            "resources.nodes": to("cluster.num_nodes"),
            "resources.gpus_per_node": to("cluster.gpus_per_node"),
        }

    def kit_support(self) -> KitSupport:
        # the kit reads NeMo RL's launches and writes its outputs with its own knowledge
        return KitSupport(option_key=lambda plan: "logger.wandb.project")

    def render(self, translation: Translation, spec: ExperimentSpec,
               ctx: LaunchContext) -> NativeLaunch:
        owned = {"logger.log_dir": f"{RUN_DIR}/{LOGS}", "logger.tensorboard_enabled": True,
                 RUN_NAME_KEY: ctx.run_name,
                 CHECKPOINT_DIR: f"{RUN_DIR}/{CHECKPOINTS}"}
        base = Path(ctx.base_dir or ".")
        # validation reads max_val_samples // val_batch_size batches: every row, in one batch
        rows = 1 if spec.data.validation is None else \
            _row_count(spec.data.validation.uri, base, "data.validation.uri")
        owned.update({"grpo.max_val_samples": rows, "grpo.val_batch_size": rows})
        native = with_owned_keys("nemo-rl", translation.native, owned)
        keys: NemoRLKeys = self.keys(ctx.dialect)
        config = f"{ENGINE_HOME}/{keys.config}"
        splits = local_splits(spec, base, "NeMo RL", "prompt_field", "answer_field")
        ds = spec.algorithm.dynamic_sampling
        rounds = 1 + (ds.max_rounds if ds is not None else 0)
        prepare = {"splits": splits, "model": pinned_model_path(spec),
                   "max_prompt_tokens": spec.data.max_prompt_tokens,
                   "prompt_overflow": spec.data.prompt_overflow,
                   # every pass must hold the batches of at least one whole update
                   "min_train_rows": spec.budget.prompts_per_update * rounds}
        files = {
            LAUNCHER_FILE: resources.files(__package__).joinpath(
                "launcher.py").read_text(encoding="utf-8"),
            launcher.CONFIG_FILE: json.dumps(prepare, indent=2, sort_keys=True)}
        if is_conversation(spec):
            prepare["conversation"] = True
            files[launcher.CONFIG_FILE] = json.dumps(prepare, indent=2, sort_keys=True)
            files[CONVERSATION_FILE] = json.dumps(conversation_settings(
                spec, environment_file(spec, base), pinned_model_path(spec), splits),
                indent=2, sort_keys=True)
            files.update(shim_files("nemo_rl_environment.py"))
        else:
            files[REWARD_SHIM_FILE] = reward_shim(spec, ctx.base_dir, "NeMo RL")
        return NativeLaunch(
            argv=["uv", "run", "--project", ENGINE_HOME, "python", f"{RUN_DIR}/{LAUNCHER_FILE}",
                  f"{ENGINE_HOME}/examples/run_grpo.py", "--config", config,
                  *overrides.render(native)],
            files=files, env=["CUDA_VISIBLE_DEVICES", "HF_HOME", "WANDB_API_KEY"],
            native=native)

    def installed_version(self, python: str | None = None,
                          home: str | None = None) -> str | None:
        """A NeMo RL checkout states its version in ``nemo_rl/package_info.py``."""
        if home is None:
            return None
        info = Path(home) / "nemo_rl" / "package_info.py"
        if not info.is_file():
            raise InvalidInput(f"--engine-home {home}: not a NeMo RL checkout (no {info.name})")
        values: dict[str, Any] = {}
        for node in ast.parse(info.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                try:
                    values[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    continue
        try:
            return (f"{values['MAJOR']}.{values['MINOR']}.{values['PATCH']}"
                    f"{values.get('PRE_RELEASE', '')}")
        except KeyError:
            raise InvalidInput(f"{info}: no MAJOR/MINOR/PATCH version") from None

    def collect(self, attempt_dir: Path, ctx: LaunchContext) -> Collected:
        """TensorBoard under ``logs/exp_NNN/tensorboard`` (run_grpo numbers each run), the
        run name from the config NeMo RL records as hparams, ``step_N`` checkpoints."""
        from stateset_backend.plugin import canonical_rows, read_hparams, read_scalars

        out = Collected(raw_metric_names=dict(METRICS))
        logs = attempt_dir / LOGS
        if logs.is_dir():
            if read_hparams(logs).get(RUN_NAME_KEY) == ctx.run_name:
                out.run_id, out.experiment_digest = ctx.run_id, ctx.experiment_digest
            out.metrics = canonical_rows(read_scalars(logs), METRICS)
        out.committed_updates = max((int(r["step"]) for r in out.metrics
                                     if "loss/policy" in r), default=0)
        for step_dir in self._complete_steps(attempt_dir):
            step = int(step_dir.name.removeprefix("step_"))
            out.artifacts += [Artifact(str(p.relative_to(attempt_dir)), "checkpoint", step)
                              for p in sorted(step_dir.rglob("*")) if p.is_file()]
        return out

    @staticmethod
    def _complete_steps(attempt_dir: Path) -> list[Path]:
        """``step_N`` folders (NeMo RL renames ``tmp_step_N`` once complete), oldest first."""
        steps = [p for p in (attempt_dir / CHECKPOINTS).glob("step_*")
                 if (p / "training_info.json").is_file()]
        return sorted(steps, key=lambda p: int(p.name.removeprefix("step_")))

    def latest_checkpoint(self, attempt_dir: Path) -> Checkpoint | None:
        """NeMo RL's complete checkpoints are ``step_N`` folders with ``training_info.json``."""
        steps = self._complete_steps(attempt_dir)
        if not steps:
            return None
        return Checkpoint(steps[-1], int(steps[-1].name.removeprefix("step_")))

    def resume_argv(self, checkpoint: Checkpoint, argv: list[str],
                    attempt_dir: Path) -> list[str]:
        """NeMo RL resumes from the newest complete ``step_N`` in its own checkpoint_dir:
        stage the checkpoint there; the argv is unchanged."""
        stage_checkpoint(checkpoint.path, attempt_dir / CHECKPOINTS / checkpoint.path.name)
        return list(argv)


# -- per-setting rules -----------------------------------------------------------------------
def _lengths(spec: ExperimentSpec) -> dict[str, Any]:
    """NeMo RL's sequence limit and per-generation limit: one response, or a conversation's
    total and turn limits."""
    if is_conversation(spec):
        return {"policy.max_total_sequence_length": total_limit(spec),
                "policy.generation.max_new_tokens": turn_limit(spec)}
    data = spec.data
    return {"policy.max_total_sequence_length": data.max_prompt_tokens + data.max_response_tokens,
            "policy.generation.max_new_tokens": data.max_response_tokens}


def _environment_keys(k: NemoRLKeys, spec: ExperimentSpec) -> dict[str, Any]:
    """The environment and processor NeMo RL's data setup names: the python reward's, or the
    conversation shim's (registered by the launcher under these names)."""
    keys = {f"{k.data_defaults}.prompt_file": None, f"{k.data_defaults}.system_prompt_file": None}
    if not is_conversation(spec):
        return {**keys, f"{k.data_defaults}.env_name": launcher.ENV_NAME,
                f"{k.data_defaults}.processor": launcher.PROCESSOR_NAME}
    env = spec.environment
    return {**keys, f"{k.data_defaults}.env_name": CONVERSATION_ENV,
            f"{k.data_defaults}.processor": CONVERSATION_PROCESSOR,
            f"+env.{CONVERSATION_ENV}": {"entrypoint": env.entrypoint, "sha256": env.sha256}}



def _ratio_level(value: Any, spec: ExperimentSpec) -> Outcome:
    if value == "sequence" and spec.algorithm.objective != "gspo":
        return Refused("NeMo RL uses sequence-level ratios only for GSPO")
    return Pinned({"loss_fn.sequence_level_importance_ratios": value == "sequence"})


def _aggregation(value: Any, spec: ExperimentSpec) -> Outcome:
    levels = {"token_mean": True, "seq_mean_token_mean": False}
    if value not in levels:
        return Refused(f"NeMo RL has no {value} aggregation")
    return Pinned({"loss_fn.token_level_loss": levels[value]})


def _kl_rules(k: NemoRLKeys, label: str) -> dict[str, Rule]:
    """KL in the loss: coefficient, estimator and both of NeMo RL's clamps (the log-ratio clamp
    at +-20 belongs to k3 only; the estimate's clamp is the spec's)."""
    in_reward = {k.kl_in_reward: False} if k.kl_in_reward else {}

    def off(value: Any, spec: ExperimentSpec) -> Outcome:
        return Pinned({"loss_fn.reference_policy_kl_penalty": 0.0,
                       "loss_fn.reference_policy_kl_type": "k3",  # unused at coefficient 0
                       "loss_fn.kl_input_clamp_value": None,
                       "loss_fn.kl_output_clamp_value": None, **in_reward})

    def estimator(value: Any, spec: ExperimentSpec) -> Outcome:
        native = {"loss_fn.reference_policy_kl_type": value,
                  "loss_fn.kl_input_clamp_value": 20.0 if value == "k3" else None}
        if k.kl_gradient == "score_function" and spec.algorithm.kl is not None and \
                spec.algorithm.kl.placement == "loss":
            return Hardcoded(f"{value}, gradient with the score-function term",
                             "kl_score_function_gradient", native)
        return Pinned(native)

    def placement(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "loss":
            return Pinned(dict(in_reward), "" if in_reward else
                          f"{label} adds the KL only to the loss")
        if not k.kl_reward or not k.kl_in_reward:
            return Refused(f"{label} puts KL into the reward only in ways that differ from "
                           "the spec (none before 0.6; 0.6 also keeps it in the loss)")
        if spec.algorithm.objective != "reinforce_pp":
            return Refused(f"{label} puts KL into the reward only with REINFORCE++ (other "
                           "estimators would drop it)")
        return Hardcoded("per token, after the baseline", "kl_reward_per_token",
                         {k.kl_in_reward: True})

    def clamp(value: Any, spec: ExperimentSpec) -> Outcome:
        kl = spec.algorithm.kl
        if kl is not None and kl.placement == "reward":  # NeMo RL's calculate_kl defaults
            return Hardcoded(10.0, "kl_reward_clamp",
                             {"loss_fn.kl_output_clamp_value": value})
        return Pinned({"loss_fn.kl_output_clamp_value": value})

    return {"algorithm.kl": off,
            "algorithm.kl.coef": to("loss_fn.reference_policy_kl_penalty"),
            "algorithm.kl.estimator": estimator,
            "algorithm.kl.placement": placement,
            "algorithm.kl.clamp": clamp}


def _advantage_rules() -> dict[str, Rule]:
    """GRPO estimator: r - group mean (leave-one-out for rloo) over (unbiased std + 1e-6),
    applied only where std > 0. REINFORCE++: r - group mean, then token-weighted whitening
    over the batch with a population variance floored at 1e-8."""

    def std(value: Any, spec: ExperimentSpec) -> Outcome:
        if spec.algorithm.objective == "reinforce_pp":
            return hardcoded("population", "reinforce_pp_std")(value, spec)
        return hardcoded("unbiased", "advantage_std")(value, spec)

    def epsilon(value: Any, spec: ExperimentSpec) -> Outcome:
        if spec.algorithm.objective == "reinforce_pp":
            return Hardcoded("variance floor 1e-8", "reinforce_pp_variance_floor")
        return Hardcoded(1e-6, "advantage_epsilon")

    def scope(value: Any, spec: ExperimentSpec) -> Outcome:
        objective = spec.algorithm.objective
        if objective == "reinforce_pp":
            if value != "batch":
                return Refused("NeMo RL's REINFORCE++ always whitens over the batch")
            return Hardcoded("batch, token-weighted", "reinforce_pp_token_whitening")
        if value != "group":
            return Refused("NeMo RL whitens over the batch only with REINFORCE++")
        if objective == "rloo" and spec.algorithm.advantage.std_normalize:
            return Hardcoded("leave-one-out std", "rloo_leave_one_out_std")
        return Pinned({}, "NeMo RL's GRPO estimator normalises within each group")

    def normalize(value: Any, spec: ExperimentSpec) -> Outcome:
        if spec.algorithm.objective == "reinforce_pp" and not value:
            return Refused("NeMo RL's REINFORCE++ always whitens the advantages")
        return Pinned({"grpo.normalize_rewards": value})

    excluded = zero_variance_rule("NeMo RL", "dynamic sampling",
                                  {"grpo.use_dynamic_sampling": True})

    def zero_variance(value: Any, spec: ExperimentSpec) -> Outcome:
        if value == "exclude" and spec.algorithm.objective == "rloo":
            return Refused("with a leave-one-out baseline NeMo RL's dynamic sampling filters "
                           "single samples by their leave-one-out std, not whole groups")
        return excluded(value, spec)

    return {"algorithm.advantage.std_normalize": normalize,
            "algorithm.advantage.std": std,
            "algorithm.advantage.epsilon": epsilon,
            "algorithm.advantage.scope": scope,
            "algorithm.advantage.zero_variance_groups": zero_variance}


def _overlong(spec: ExperimentSpec) -> dict[str, Any]:
    """DAPO's soft overlong punishment over the response budget, or the shaping off."""
    ov = spec.algorithm.overlong
    return {"grpo.reward_shaping.enabled": ov is not None,
            "grpo.reward_shaping.overlong_buffer_length": ov.buffer_tokens if ov else 128,
            "grpo.reward_shaping.overlong_buffer_penalty": ov.penalty if ov else 1.0,
            "grpo.reward_shaping.max_response_length": spec.data.max_response_tokens}


def _lora_rules(k: NemoRLKeys, label: str) -> dict[str, Rule]:
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


def _split(name: str, k: NemoRLKeys) -> Rule:
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


def _optim_rules() -> dict[str, Rule]:
    def schedule(value: Any, spec: ExperimentSpec) -> Outcome:
        native = {"policy.scheduler": _scheduler(spec)}
        if spec.optim.warmup_steps:
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
            "optim.warmup_steps": schedule}


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
            "kwargs": {"start_factor": WARMUP_START, "end_factor": 1.0, "total_iters": warmup}}
    return [ramp, after, {"milestones": [warmup]}]


def _budget_rules() -> dict[str, Rule]:
    def mini_batches(value: Any, spec: ExperimentSpec) -> Outcome:
        samples = spec.budget.prompts_per_update * spec.algorithm.group_size
        if samples % value:
            return Refused(f"{samples} samples per update do not split into {value} equal "
                           "mini-batches")
        return Pinned({"policy.train_global_batch_size": samples // value})

    # NeMo RL stops at max_num_steps or after max_num_epochs passes, whichever comes first;
    # the launcher checks that one pass holds at least one update, so T passes hold T updates
    return {"budget.total_updates": to("grpo.max_num_steps", "grpo.max_num_epochs"),
            "budget.prompts_per_update": to("grpo.num_prompts_per_step"),
            "budget.ppo_epochs": hardcoded(1, "ppo_epochs"),
            "budget.mini_batches": mini_batches,
            "budget.partial_batch": hardcoded("drop", "partial_batch")}


def _checkpoint_rules(k: NemoRLKeys) -> dict[str, Rule]:
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


def _evaluation_rules(k: NemoRLKeys) -> dict[str, Rule]:
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


def _row_count(uri: str, base_dir: Path, field: str) -> int:
    """Rows of a local split (NeMo RL sizes the validation batch by it)."""
    try:
        return split_rows(uri, base_dir, field)
    except Uncountable as exc:
        raise InvalidInput(f"the NeMo RL launch sizes validation by the split's rows: {exc}") \
            from None

