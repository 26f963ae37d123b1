"""Adapter for NeMo RL: a source checkout run as ``examples/run_grpo.py --config <yaml>``
with Hydra-style overrides applied in struct mode, through a generated launcher
(``nemo_rl_launcher``) that registers the spec's python reward as a NeMo RL environment.

In struct mode an unknown key is an error unless it is added with ``+``; every override here
is a key of the release's own ``grpo_math_1B.yaml`` (checked against the pinned configs of each
supported tag), or explicitly added with ``+`` where NeMo RL documents an optional key.
"""

from __future__ import annotations

import ast
import json
from importlib import resources
from pathlib import Path
from typing import Any

from ..core import overrides
from ..core.adapter import (
    ENGINE_HOME,
    RUN_DIR,
    Artifact,
    Checkpoint,
    Collected,
    EngineAdapter,
    LaunchContext,
    NativeLaunch,
    stage_checkpoint,
)
from ..core.contracts import Dialect
from ..core.errors import InvalidInput
from ..core.hub import pinned_model_path, revision_outcome
from ..core.inputs import REWARD_SHIM_FILE, local_path, reward_shim
from ..core.rules import (
    Mapped,
    NotApplicable,
    Outcome,
    Rejected,
    RuleSet,
    Translation,
    na,
    only,
    reject,
    to,
    with_owned_keys,
    zero_variance_rule,
)
from ..core.spec import ExperimentSpec
from . import nemo_rl_launcher as launcher

LORA_TARGETS_ALL = "all-linear"


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


class NemoRLAdapter(EngineAdapter):
    name = "nemo-rl"
    contract_file = "nemo-rl.json"

    def rules(self, dialect: Dialect) -> RuleSet:
        k = dialect.keys

        def objective(value: Any, spec: ExperimentSpec) -> Outcome:
            native: dict[str, Any] = {
                "grpo.use_leave_one_out_baseline": value == "rloo",
                "loss_fn.sequence_level_importance_ratios": value == "gspo"}
            if k["adv_estimator"]:
                native[k["adv_estimator"]] = "reinforce_plus_plus" \
                    if value == "reinforce_pp" else "grpo"
            elif value == "reinforce_pp":
                return Rejected(f"NeMo RL {dialect.name} has no REINFORCE++ estimator")
            if k["cispo"]:
                native[k["cispo"]] = value == "cispo"
            elif value == "cispo":
                return Rejected(f"NeMo RL {dialect.name} has no CISPO loss")
            return Mapped(native)

        def ratio_level(value: Any, spec: ExperimentSpec) -> Outcome:
            if value == "sequence" and spec.algorithm.objective != "gspo":
                return Rejected("NeMo RL uses sequence-level ratios only for GSPO")
            return Mapped({"loss_fn.sequence_level_importance_ratios": value == "sequence"})

        def aggregation(value: Any, spec: ExperimentSpec) -> Outcome:
            levels = {"token_mean": True, "seq_mean_token_mean": False}
            return Mapped({"loss_fn.token_level_loss": levels[value]}) if value in levels else \
                Rejected(f"NeMo RL has no {value} aggregation")

        def kl_off(value: Any, spec: ExperimentSpec) -> Outcome:
            native: dict[str, Any] = {"loss_fn.reference_policy_kl_penalty": 0.0}
            if k["kl_in_reward"]:
                native[k["kl_in_reward"]] = False
            return Mapped(native)

        def kl_placement(value: Any, spec: ExperimentSpec) -> Outcome:
            if not k["kl_in_reward"]:
                return NotApplicable("KL is in the loss") if value == "loss" else \
                    Rejected(f"NeMo RL {dialect.name} puts KL only in the loss")
            return Mapped({k["kl_in_reward"]: value == "reward"})

        def mini_batches(value: Any, spec: ExperimentSpec) -> Outcome:
            samples = spec.budget.prompts_per_update * spec.algorithm.group_size
            if samples % value:
                return Rejected(f"{samples} samples per update do not split into {value} "
                                "equal mini-batches")
            return Mapped({"policy.train_global_batch_size": samples // value})

        def warmup(value: Any, spec: ExperimentSpec) -> Outcome:
            constant = {"name": "torch.optim.lr_scheduler.ConstantLR",
                        "kwargs": {"factor": 1.0, "total_iters": 10_000_000_000}}
            if value == 0:
                return Mapped({"policy.scheduler": [constant]})
            linear = {"name": "torch.optim.lr_scheduler.LinearLR",
                      "kwargs": {"start_factor": 1.0 / value, "end_factor": 1.0,
                                 "total_iters": value}}
            return Mapped({"policy.scheduler": [linear, constant, {"milestones": [value]}]})

        def lengths(value: Any, spec: ExperimentSpec) -> Outcome:
            return Mapped({"policy.max_total_sequence_length":
                           spec.data.max_prompt_tokens + spec.data.max_response_tokens})

        def split(name: str) -> Any:
            """The launcher converts each local split into ResponseDataset rows in the run
            directory (see ``nemo_rl_launcher``); NeMo RL reads those."""
            converted = f"{RUN_DIR}/{launcher.DATA_DIR}/{name}.jsonl"
            keys = {"input_key": launcher.INPUT, "output_key": launcher.OUTPUT}

            def rule(value: Any, spec: ExperimentSpec) -> Outcome:
                if "://" in value and not value.startswith("file://"):
                    return Rejected("the NeMo RL launch converts local split files only")
                if k["custom_data"] == "flat":  # one dataset section, train and validation paths
                    path = "train_data_path" if name == "train" else "val_data_path"
                    native = {f"+data.{path}": converted, **{f"+data.{key}": v
                                                             for key, v in keys.items()}}
                    return Mapped({"data.dataset_name": "ResponseDataset", **native})
                if name == "train":
                    return Mapped({"data.train.dataset_name": "ResponseDataset",
                                   "data.train.split_validation_size": 0.0,
                                   "+data.train.data_path": converted,
                                   **{f"+data.train.{key}": v for key, v in keys.items()}})
                return Mapped({"data.validation": {"dataset_name": "ResponseDataset",
                                                   "data_path": converted, **keys}})

            return rule

        def lora(sub: str) -> Any:
            if not k["lora"]:
                return reject(f"NeMo RL {dialect.name} has no LoRA")
            key = f"{k['lora']}.{sub}"
            if sub == "target_modules":
                def targets(value: Any, spec: ExperimentSpec) -> Outcome:
                    every = value == LORA_TARGETS_ALL
                    return Mapped({key: [] if every else list(value),
                                   f"{k['lora']}.match_all_linear": every})
                return targets
            if sub == "dim":  # the rank is always present when LoRA is on: it switches it on
                return lambda v, s: Mapped({key: v, f"{k['lora']}.enabled": True})
            return to(key)

        verified = na("checked against the file by stateset-backend before launch")
        converted_field = na("read by the launcher, which converts the split for NeMo RL")
        return {
            "name": na("the logger run names carry the run id and digest instead (identity)"),
            "seed": to("grpo.seed"),
            "algorithm.objective": objective,
            "algorithm.group_size": to("grpo.num_generations_per_prompt"),
            "algorithm.clip.low": to("loss_fn.ratio_clip_min"),
            "algorithm.clip.high": to("loss_fn.ratio_clip_max"),
            "algorithm.ratio_level": ratio_level,
            "algorithm.loss_aggregation": aggregation,
            "algorithm.kl": kl_off,
            "algorithm.kl.coef": to("loss_fn.reference_policy_kl_penalty"),
            "algorithm.kl.estimator": to("loss_fn.reference_policy_kl_type"),
            "algorithm.kl.placement": kl_placement,
            "algorithm.advantage.std_normalize": to("grpo.normalize_rewards"),
            "algorithm.advantage.std": only(lambda v: v == "unbiased", "NeMo RL divides by the "
                                            "unbiased std", na("unbiased std")),
            "algorithm.advantage.epsilon": only(lambda v: v == 1e-6, "NeMo RL's epsilon is "
                                                "fixed", na("NeMo RL's fixed epsilon")),
            "algorithm.advantage.zero_variance_groups": zero_variance_rule(
                "NeMo RL", "dynamic sampling", {"grpo.use_dynamic_sampling": True}),
            "algorithm.dynamic_sampling": to("grpo.use_dynamic_sampling", convert=lambda v: False),
            "algorithm.dynamic_sampling.max_rounds": lambda v, s: Mapped({
                "grpo.use_dynamic_sampling": True,
                "grpo.dynamic_sampling_max_gen_batches": v + 1}),
            "algorithm.overlong": to("grpo.reward_shaping.enabled", convert=lambda v: False),
            "algorithm.overlong.buffer_tokens": lambda v, s: Mapped({
                "grpo.reward_shaping.enabled": True,
                "grpo.reward_shaping.overlong_buffer_length": v,
                "grpo.reward_shaping.max_response_length": s.data.max_response_tokens}),
            "algorithm.overlong.penalty": to("grpo.reward_shaping.overlong_buffer_penalty"),
            "algorithm.entropy_coef": only(lambda v: v == 0, "NeMo RL's GRPO loss has no entropy "
                                           "bonus", na("no entropy bonus")),
            "algorithm.gae": na("no critic"),
            "algorithm.gae.gamma": reject("NeMo RL's GRPO has no critic"),
            "algorithm.gae.lam": reject("NeMo RL's GRPO has no critic"),
            "model.path": lambda v, s: Mapped({"policy.model_name": pinned_model_path(s)}),
            "model.revision": revision_outcome("NeMo RL"),
            "model.dtype": to("policy.precision"),
            "model.lora": (to(f"{k['lora']}.enabled", convert=lambda v: False) if k["lora"]
                           else na("no LoRA")),
            "model.lora.rank": lora("dim"),
            "model.lora.alpha": lora("alpha"),
            "model.lora.dropout": lora("dropout"),
            "model.lora.target_modules": lora("target_modules"),
            "data.train.uri": split("train"),
            "data.train.sha256": verified,
            "data.train.prompt_field": converted_field,
            "data.train.answer_field": converted_field,
            "data.validation": na("no validation split"),
            "data.validation.uri": split("validation"),
            "data.validation.sha256": verified,
            "data.validation.prompt_field": converted_field,
            "data.validation.answer_field": converted_field,
            "data.test": na("the test split is never used during training"),
            "data.max_prompt_tokens": lengths,
            "data.max_response_tokens": to("policy.generation.max_new_tokens"),
            "reward.kind": only(lambda v: v == "python", "only python rewards are translated "
                                "for NeMo RL", lambda v, s: Mapped({
                                    f"{k['data_defaults']}.env_name": launcher.ENV_NAME,
                                    f"{k['data_defaults']}.processor": launcher.PROCESSOR_NAME,
                                    f"{k['data_defaults']}.prompt_file": None})),
            "reward.entrypoint": lambda v, s: Mapped({f"+env.{launcher.ENV_NAME}": {
                "entrypoint": v, "sha256": s.reward.sha256}}),
            "reward.sha256": na("checked before launch, and again by the environment that "
                                "scores"),
            "environment.kind": only(lambda v: v == "single_turn", "multi-turn environments "
                                     "are not translated for NeMo RL", na("single-turn")),
            "environment.entrypoint": na("single-turn"),
            "environment.sha256": na("single-turn"),
            "environment.max_turns": to("grpo.max_rollout_turns"),
            "rollout.backend": only(lambda v: v == "vllm", "NeMo RL generates with vLLM here",
                                    to("policy.generation.backend")),
            "rollout.temperature": to("policy.generation.temperature"),
            "rollout.top_p": to("policy.generation.top_p"),
            "optim.lr": to("policy.optimizer.kwargs.lr"),
            "optim.weight_decay": to("policy.optimizer.kwargs.weight_decay"),
            "optim.grad_clip": to("policy.max_grad_norm"),
            "optim.warmup_steps": warmup,
            "budget.total_updates": to("grpo.max_num_steps"),
            "budget.prompts_per_update": to("grpo.num_prompts_per_step"),
            "budget.ppo_epochs": only(lambda v: v == 1, "NeMo RL's GRPO takes one pass per "
                                      "batch", na("one pass per batch")),
            "budget.mini_batches": mini_batches,
            "checkpoint.every": lambda v, s: Mapped({"checkpointing.enabled": False})
            if v is None else Mapped({"checkpointing.enabled": True,
                                      "checkpointing.save_period": v}),
            "checkpoint.keep": to("checkpointing.keep_top_k"),
            "evaluation.every": to("grpo.val_period", convert=lambda v: 0 if v is None else v),
            "evaluation.select_by": only(lambda v: v is None, "choosing checkpoints by a "
                                         "metric is not translated for NeMo RL",
                                         na("no selection")),
            "resources.nodes": to("cluster.num_nodes"),
            "resources.gpus_per_node": to("cluster.gpus_per_node"),
        }

    def render(self, translation: Translation, spec: ExperimentSpec,
               ctx: LaunchContext) -> NativeLaunch:
        owned = {"logger.log_dir": f"{RUN_DIR}/{LOGS}", "logger.tensorboard_enabled": True,
                 RUN_NAME_KEY: ctx.run_name,
                 CHECKPOINT_DIR: f"{RUN_DIR}/{CHECKPOINTS}"}
        config = f"{ENGINE_HOME}/{ctx.dialect.keys['config']}"
        splits = {}
        for name in ("train", "validation"):
            split = getattr(spec.data, name)
            if split is not None:
                splits[name] = {"source": str(local_path(split.uri, Path(ctx.base_dir or "."))),
                                "prompt_field": split.prompt_field,
                                "answer_field": split.answer_field}
        files = {
            LAUNCHER_FILE: resources.files(__package__).joinpath(
                "nemo_rl_launcher.py").read_text(encoding="utf-8"),
            launcher.CONFIG_FILE: json.dumps({"splits": splits}, indent=2, sort_keys=True),
            REWARD_SHIM_FILE: reward_shim(spec, ctx.base_dir, "NeMo RL")}
        return NativeLaunch(
            argv=["uv", "run", "--project", ENGINE_HOME, "python", f"{RUN_DIR}/{LAUNCHER_FILE}",
                  f"{ENGINE_HOME}/examples/run_grpo.py", "--config", config,
                  *overrides.render(with_owned_keys("nemo-rl", translation.native, owned))],
            files=files, env=["CUDA_VISIBLE_DEVICES", "HF_HOME", "WANDB_API_KEY"])

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
        from ..core.tensorboard import canonical_rows, read_hparams, read_scalars

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
