"""Adapter for verl: ``python -m verl.trainer.main_ppo`` with Hydra overrides.

verl accepts several values it never checks (an unknown ``adv_estimator``, ``loss_mode``,
rollout name, logger, ``resume_mode`` or ``kl_loss_type`` is carried along until something
fails far into a run, or never), so every value written here comes from a closed mapping,
and anything verl cannot honour is rejected before launch with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core import overrides
from ..core.adapter import (
    PYTHON,
    RUN_DIR,
    Artifact,
    Checkpoint,
    Collected,
    EngineAdapter,
    LaunchContext,
    NativeLaunch,
)
from ..core.contracts import Dialect
from ..core.hub import pinned_model_path, revision_outcome
from ..core.inputs import REWARD_SHIM_FILE, reward_shim
from ..core.rules import (
    Mapped,
    NotApplicable,
    Outcome,
    Rejected,
    RuleSet,
    Translation,
    na,
    only,
    to,
    with_owned_keys,
    zero_variance_rule,
)
from ..core.spec import ExperimentSpec

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
MODEL = "actor_rollout_ref.model"
LOG_ROOT = "logs"
CHECKPOINTS = "checkpoints"

ESTIMATOR = {"grpo": "grpo", "dr_grpo": "grpo", "dapo": "grpo", "gspo": "grpo",
             "cispo": "grpo", "rloo": "rloo", "reinforce_pp": "reinforce_plus_plus_baseline",
             "ppo": "gae"}
LOSS_MODE = {"gspo": "gspo", "cispo": "cispo"}  # everything else: "vanilla"
AGGREGATION = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean",
               "seq_mean_token_sum": "seq-mean-token-sum",
               "seq_mean_token_sum_norm": "seq-mean-token-sum-norm"}
KL_TYPE = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}  # names every release accepts
VERL_STD_EPSILON = 1e-6

# canonical metric -> verl's metric key (the same in its file and TensorBoard loggers)
METRICS = {"reward/mean": "critic/score/mean", "loss/policy": "actor/pg_loss",
           "kl": "actor/kl_loss", "entropy": "actor/entropy", "clip_fraction": "actor/pg_clipfrac",
           "grad_norm": "actor/grad_norm", "lr": "actor/lr",
           "response_length/mean": "response_length/mean", "tokens_per_second": "perf/throughput"}


def loss_mode(spec: ExperimentSpec) -> str:
    return LOSS_MODE.get(spec.algorithm.objective, "vanilla")


# -- rules that need more than one field ---------------------------------------------------
def _objective(value: Any, spec: ExperimentSpec) -> Outcome:
    return Mapped({"algorithm.adv_estimator": ESTIMATOR[value],
                   f"{ACTOR}.policy_loss.loss_mode": loss_mode(spec)})


def _ratio_level(value: Any, spec: ExperimentSpec) -> Outcome:
    if value == "sequence" and spec.algorithm.objective != "gspo":
        return Rejected("verl computes a sequence-level ratio only in its gspo loss mode")
    return Mapped({f"{ACTOR}.policy_loss.loss_mode": loss_mode(spec)})


def _kl_off(value: Any, spec: ExperimentSpec) -> Outcome:
    return Mapped({f"{ACTOR}.use_kl_loss": False, "algorithm.use_kl_in_reward": False})


def _kl_coef(value: Any, spec: ExperimentSpec) -> Outcome:
    assert spec.algorithm.kl is not None
    key = f"{ACTOR}.kl_loss_coef" if spec.algorithm.kl.placement == "loss" \
        else "algorithm.kl_ctrl.kl_coef"
    return Mapped({key: value})


def _kl_estimator(value: Any, spec: ExperimentSpec) -> Outcome:
    assert spec.algorithm.kl is not None
    key = f"{ACTOR}.kl_loss_type" if spec.algorithm.kl.placement == "loss" \
        else "algorithm.kl_penalty"
    return Mapped({key: KL_TYPE[value]})


def _kl_placement(value: Any, spec: ExperimentSpec) -> Outcome:
    return Mapped({f"{ACTOR}.use_kl_loss": value == "loss",
                   "algorithm.use_kl_in_reward": value == "reward"})


def _std_normalize(value: Any, spec: ExperimentSpec) -> Outcome:
    objective = spec.algorithm.objective
    if objective == "rloo":
        return NotApplicable("verl's RLOO does not divide by a std") if not value \
            else Rejected("verl's RLOO cannot divide advantages by a std")
    if objective in ("reinforce_pp", "ppo"):
        return NotApplicable("verl always whitens these advantages") if value \
            else Rejected(f"verl always whitens {objective} advantages")
    return Mapped({"algorithm.norm_adv_by_std_in_grpo": value})


def _max_rounds(value: Any, spec: ExperimentSpec) -> Outcome:
    return Mapped({"algorithm.filter_groups.enable": True,
                   "algorithm.filter_groups.metric": "score",
                   "algorithm.filter_groups.max_num_gen_batches": value + 1})


def _mini_batches(value: Any, spec: ExperimentSpec) -> Outcome:
    prompts = spec.budget.prompts_per_update
    if prompts % value:
        return Rejected(f"verl's mini-batch size is in prompts: {prompts} prompts do not split "
                        f"into {value} equal mini-batches")
    return Mapped({f"{ACTOR}.ppo_mini_batch_size": prompts // value})


def _model_path(value: Any, spec: ExperimentSpec) -> Outcome:
    path = pinned_model_path(spec)
    keys = [f"{MODEL}.path"] + (["critic.model.path"] if spec.algorithm.gae else [])
    return Mapped({k: path for k in keys})


def _overlong_buffer(keys: dict[str, str]) -> Any:
    """The DAPO reward manager with its overlong buffer (reward_kwargs are not in the base
    config, hence Hydra's ``+`` append, which the dialect's key carries)."""

    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        kw = keys["reward_kwargs"]
        return Mapped({keys["reward_manager"]: "dapo",
                       f"{kw}.overlong_buffer_cfg.enable": True,
                       f"{kw}.overlong_buffer_cfg.len": value,
                       f"{kw}.overlong_buffer_cfg.log": False,
                       f"{kw}.max_resp_len": spec.data.max_response_tokens})

    return rule


def _data_file(key: str) -> Any:
    def rule(value: Any, spec: ExperimentSpec) -> Outcome:
        if not str(value).endswith(".parquet"):
            return Rejected("verl reads parquet files in its own row format (prompt messages, "
                            "reward_model.ground_truth); convert the split first")
        return Mapped({key: value})

    return rule


class VerlAdapter(EngineAdapter):
    name = "verl"
    contract_file = "verl.json"

    def rules(self, dialect: Dialect) -> RuleSet:
        keys = dialect.keys
        reward_fn = keys["reward_function"]
        seed_keys = keys["seed"].split(",")
        verified = na("checked against the file by stateset-backend before launch")
        return {
            "name": to("trainer.project_name"),
            "seed": to(*seed_keys),
            "algorithm.objective": _objective,
            "algorithm.group_size": to(f"{ROLLOUT}.n"),
            "algorithm.clip.low": to(f"{ACTOR}.clip_ratio_low"),
            "algorithm.clip.high": to(f"{ACTOR}.clip_ratio_high"),
            "algorithm.ratio_level": _ratio_level,
            "algorithm.loss_aggregation": to(f"{ACTOR}.loss_agg_mode",
                                             convert=AGGREGATION.__getitem__),
            "algorithm.kl": _kl_off,
            "algorithm.kl.coef": _kl_coef,
            "algorithm.kl.estimator": _kl_estimator,
            "algorithm.kl.placement": _kl_placement,
            "algorithm.advantage.std_normalize": _std_normalize,
            "algorithm.advantage.std": only(lambda v: v == "unbiased", "verl's advantage std "
                                            "is torch.std (unbiased, n-1); population std is "
                                            "not available", na("verl uses the unbiased std")),
            "algorithm.advantage.epsilon": only(lambda v: v == VERL_STD_EPSILON,
                                                f"verl's epsilon is fixed at {VERL_STD_EPSILON}",
                                                na(f"verl's fixed {VERL_STD_EPSILON}")),
            "algorithm.advantage.zero_variance_groups": zero_variance_rule(
                "verl", "dynamic sampling", {"algorithm.filter_groups.enable": True}),
            "algorithm.dynamic_sampling": to(f"{keys['filter_groups']}.enable",
                                             convert=lambda v: False)
            if keys["filter_groups"] else na(f"verl {dialect.name} has no dynamic sampling"),
            "algorithm.dynamic_sampling.max_rounds": _max_rounds,
            "algorithm.overlong": na("no overlong penalty (verl's default reward manager)"),
            "algorithm.overlong.buffer_tokens": _overlong_buffer(keys),
            "algorithm.overlong.penalty": to(
                f"{keys['reward_kwargs']}.overlong_buffer_cfg.penalty_factor"),
            "algorithm.entropy_coef": to(f"{ACTOR}.entropy_coeff"),
            "algorithm.gae": na("no critic"),
            "algorithm.gae.gamma": to("algorithm.gamma"),
            "algorithm.gae.lam": to("algorithm.lam"),
            "model.path": _model_path,
            "model.revision": revision_outcome("verl"),
            "model.dtype": to(f"{ROLLOUT}.dtype"),
            "model.lora": to(f"{MODEL}.lora_rank", convert=lambda v: 0),
            "model.lora.rank": to(f"{MODEL}.lora_rank"),
            "model.lora.alpha": to(f"{MODEL}.lora_alpha"),
            "model.lora.target_modules": to(f"{MODEL}.target_modules"),
            "model.lora.dropout": only(lambda v: v == 0.0, "verl has no LoRA dropout setting",
                                       na("verl applies no LoRA dropout")),
            "data.train.uri": _data_file("data.train_files"),
            "data.train.sha256": verified,
            "data.train.prompt_field": to("data.prompt_key"),
            "data.train.answer_field": na("verl reads the ground truth from "
                                          "reward_model.ground_truth in its parquet rows"),
            "data.validation": na("no validation split"),
            "data.validation.uri": _data_file("data.val_files"),
            "data.validation.sha256": verified,
            "data.validation.prompt_field": to("data.prompt_key"),
            "data.validation.answer_field": na("verl reads the ground truth from "
                                               "reward_model.ground_truth in its parquet rows"),
            "data.test": na("the test split is never used during training"),
            "data.max_prompt_tokens": to("data.max_prompt_length"),
            "data.max_response_tokens": to("data.max_response_length"),
            "reward.kind": only(lambda v: v == "python", "only python rewards are translated "
                                "for verl", na("a custom reward function")),
            "reward.entrypoint": lambda v, s: Mapped({
                f"{reward_fn}.path": f"{RUN_DIR}/{REWARD_SHIM_FILE}",
                f"{reward_fn}.name": "compute_score"}),
            "reward.sha256": verified,
            "environment.kind": only(lambda v: v == "single_turn", "multi-turn environments "
                                     "are not translated for verl", na("single-turn rollout")),
            "environment.entrypoint": na("single-turn: the reward function is the environment"),
            "environment.sha256": na("single-turn: the reward function is the environment"),
            "environment.max_turns": na("single-turn"),
            "rollout.backend": only(lambda v: v in ("vllm", "sglang"), "verl rolls out with "
                                    "vllm or sglang", to(f"{ROLLOUT}.name")),
            "rollout.temperature": to(f"{ROLLOUT}.temperature"),
            "rollout.top_p": to(f"{ROLLOUT}.top_p"),
            "optim.lr": to(f"{ACTOR}.optim.lr"),
            "optim.weight_decay": to(f"{ACTOR}.optim.weight_decay"),
            "optim.grad_clip": to(f"{ACTOR}.grad_clip"),
            "optim.warmup_steps": to(f"{ACTOR}.optim.lr_warmup_steps"),
            "budget.total_updates": to("trainer.total_training_steps"),
            "budget.prompts_per_update": to("data.train_batch_size"),
            "budget.ppo_epochs": to(f"{ACTOR}.ppo_epochs"),
            "budget.mini_batches": _mini_batches,
            "checkpoint.every": to("trainer.save_freq", convert=lambda v: -1 if v is None else v),
            "checkpoint.keep": to("trainer.max_actor_ckpt_to_keep"),
            "evaluation.every": to("trainer.test_freq", convert=lambda v: -1 if v is None else v),
            "evaluation.select_by": only(lambda v: v is None, "verl does not pick a checkpoint "
                                         "by a validation metric", na("no selection")),
            "resources.nodes": to("trainer.nnodes"),
            "resources.gpus_per_node": to("trainer.n_gpus_per_node"),
        }

    def render(self, translation: Translation, spec: ExperimentSpec,
               ctx: LaunchContext) -> NativeLaunch:
        # Memory/speed knobs the spec does not describe (they do not change the math):
        # token-budget micro-batching, which verl requires some setting of.
        tokens = spec.data.max_prompt_tokens + spec.data.max_response_tokens
        native = {f"{ACTOR}.use_dynamic_bsz": True,
                  f"{ACTOR}.ppo_max_token_len_per_gpu": max(16384, 2 * tokens),
                  **translation.native}
        # Identity and outputs: the run id and digest name the run inside verl's own outputs.
        owned = {
            "trainer.experiment_name": ctx.run_name,
            "trainer.default_local_dir": f"{RUN_DIR}/{CHECKPOINTS}",
            "trainer.logger": ["console", ctx.dialect.keys["logger"]],
            "trainer.resume_mode": "disable",
        }
        native = with_owned_keys("verl", native, owned)
        return NativeLaunch(
            argv=[PYTHON, "-m", "verl.trainer.main_ppo", *overrides.render(native)],
            files={REWARD_SHIM_FILE: reward_shim(spec, ctx.base_dir, "verl", REWARD_CALL)},
            set_env=self._logger_env(ctx),
            env=["CUDA_VISIBLE_DEVICES", "HF_HOME", "HF_HUB_CACHE", "WANDB_API_KEY"])

    @staticmethod
    def _logger_env(ctx: LaunchContext) -> dict[str, str]:
        """Where verl's metrics logger writes: the file logger (>=0.6) under a root it names
        ``<project>/<experiment_name>.jsonl``; before it, the TensorBoard logger, given a
        folder named by the run."""
        if ctx.dialect.keys["logger"] == "file":
            return {"VERL_FILE_LOGGER_ROOT": f"{RUN_DIR}/{LOG_ROOT}"}
        return {"TENSORBOARD_DIR": f"{RUN_DIR}/{LOG_ROOT}/{ctx.run_name}"}

    def collect(self, attempt_dir: Path, ctx: LaunchContext) -> Collected:
        out = Collected(raw_metric_names=dict(METRICS))
        if ctx.dialect.keys["logger"] == "tensorboard":
            from ..core.tensorboard import canonical_rows, read_scalars

            log_dir = attempt_dir / LOG_ROOT / ctx.run_name
            if log_dir.is_dir():
                out.run_id, out.experiment_digest = ctx.run_id, ctx.experiment_digest
                out.metrics = canonical_rows(read_scalars(log_dir), METRICS)
        # the file logger writes <root>/<project>/<experiment_name>.jsonl
        for log in sorted((attempt_dir / LOG_ROOT).glob(f"*/{ctx.run_name}.jsonl")):
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


def _artifact(path: Path, attempt_dir: Path, step: int) -> Artifact:
    return Artifact(str(path.relative_to(attempt_dir)), "checkpoint", step)


REWARD_CALL = '''

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    prompt = (extra_info or {}).get("prompt", "")
    return float(score(prompt, solution_str, ground_truth))
'''
