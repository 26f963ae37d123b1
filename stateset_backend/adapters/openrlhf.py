"""Adapter for OpenRLHF: ``python -m openrlhf.cli.train_ppo_ray`` with argparse flags.

OpenRLHF renamed every flag into a dotted hierarchy at 0.10.2, and argparse accepts any
unambiguous abbreviation of a flag, so a stale or shortened flag can silently land on another
option. Every flag here is an exact option string taken from the contract's dialect for the
installed version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.adapter import (
    PYTHON,
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
from ..core.hub import pinned_model_path, revision_outcome
from ..core.inputs import REWARD_SHIM_FILE, reward_shim
from ..core.jsonio import atomic_write_bytes
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

TENSORBOARD = "tensorboard"
CHECKPOINTS = "checkpoints"
# canonical metric -> OpenRLHF's TensorBoard tag
METRICS = {"reward/mean": "train/reward", "loss/policy": "train/policy_loss", "kl": "train/kl",
           "entropy": "train/entropy_loss", "grad_norm": "train/actor_grad_norm",
           "lr": "train/actor_lr", "response_length/mean": "train/response_length",
           "val/reward/mean": "eval/reward"}
ESTIMATOR = {"grpo": "group_norm", "dr_grpo": "dr_grpo", "dapo": "group_norm",
             "gspo": "group_norm", "rloo": "rloo", "reinforce_pp": "reinforce_baseline",
             "ppo": "gae"}
DTYPE = {"bfloat16": "bf16", "float16": "fp16"}


def render_flags(native: dict[str, Any]) -> list[str]:
    """argparse argv: True -> bare flag, False/None -> omitted, lists -> several values."""
    argv: list[str] = []
    for flag, value in sorted(native.items()):
        if value is False or value is None:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, list | tuple):
            argv += [flag, *(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    return argv


class OpenRLHFAdapter(EngineAdapter):
    name = "openrlhf"
    contract_file = "openrlhf.json"

    def rules(self, dialect: Dialect) -> RuleSet:
        f = dialect.keys

        def objective(value: Any, spec: ExperimentSpec) -> Outcome:
            native: dict[str, Any] = {f["estimator"]: ESTIMATOR[value]} if value in ESTIMATOR \
                else {}
            if not native:
                return Rejected(f"OpenRLHF has no {value} objective")
            native[f["policy_loss_type"]] = "gspo" if value == "gspo" else "ppo"
            return Mapped(native)

        def ratio_level(value: Any, spec: ExperimentSpec) -> Outcome:
            if value == "sequence" and spec.algorithm.objective != "gspo":
                return Rejected("OpenRLHF computes sequence-level ratios only for gspo")
            return Mapped({f["policy_loss_type"]: "gspo" if value == "sequence" else "ppo"})

        def aggregation(value: Any, spec: ExperimentSpec) -> Outcome:
            if spec.algorithm.objective == "gspo" and value != "seq_mean_token_mean":
                return Rejected("OpenRLHF's GSPO loss is always the mean over sequences of "
                                "token means, whatever the aggregation flag says")
            if not f.get("loss_agg_mode"):
                return NotApplicable("OpenRLHF before 0.11.2 always averages over tokens") \
                    if value == "token_mean" else Rejected("loss aggregation is configurable "
                                                           "only from OpenRLHF 0.11.2")
            modes = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean"}
            return Mapped({f["loss_agg_mode"]: modes[value]}) if value in modes else \
                Rejected(f"OpenRLHF has no {value} aggregation")

        def clip(value: Any, spec: ExperimentSpec) -> Outcome:
            return Mapped({f["eps_clip_low_high"]: [spec.algorithm.clip.low,
                                                    spec.algorithm.clip.high]})

        def kl_off(value: Any, spec: ExperimentSpec) -> Outcome:
            return Mapped({f["kl_coef"]: 0.0, f["kl_use_loss"]: False})

        def std_normalize(value: Any, spec: ExperimentSpec) -> Outcome:
            if spec.algorithm.objective == "rloo":
                return NotApplicable("OpenRLHF's RLOO does not divide by a std") if not value \
                    else Rejected("OpenRLHF's RLOO cannot divide advantages by a std")
            return Mapped({f["no_std_norm"]: not value})

        def mini_batches(value: Any, spec: ExperimentSpec) -> Outcome:
            samples = spec.budget.prompts_per_update * spec.algorithm.group_size
            if samples % value:
                return Rejected(f"{samples} samples per update do not split into {value} "
                                "equal mini-batches")
            return Mapped({f["train_batch_size"]: samples // value})

        def warmup(value: Any, spec: ExperimentSpec) -> Outcome:
            return Mapped({f["warmup_ratio"]: value / spec.budget.total_updates})

        def total_updates(value: Any, spec: ExperimentSpec) -> Outcome:
            # one pass, limited to exactly the prompts the planned updates consume
            return Mapped({f["num_episodes"]: 1,
                           f["max_samples"]: value * spec.budget.prompts_per_update})

        def data_file(slot: str) -> Any:
            return to(f[slot])

        verified = na("checked against the file by stateset-backend before launch")
        return {
            "name": na("the run name carries the run id and digest instead (identity)"),
            "seed": to(f["seed"]),
            "algorithm.objective": objective,
            "algorithm.group_size": to(f["group_size"]),
            "algorithm.clip.low": clip,
            "algorithm.clip.high": clip,
            "algorithm.ratio_level": ratio_level,
            "algorithm.loss_aggregation": aggregation,
            "algorithm.kl": kl_off,
            "algorithm.kl.coef": to(f["kl_coef"]),
            "algorithm.kl.estimator": to(f["kl_estimator"]),
            "algorithm.kl.placement": to(f["kl_use_loss"], convert=lambda v: v == "loss"),
            "algorithm.advantage.std_normalize": std_normalize,
            "algorithm.advantage.std": only(lambda v: v == "unbiased", "OpenRLHF divides by "
                                            "torch.std (unbiased)", na("unbiased std")),
            "algorithm.advantage.epsilon": only(lambda v: v == 1e-6, "OpenRLHF's epsilon is "
                                                "fixed", na("OpenRLHF's fixed epsilon")),
            "algorithm.advantage.zero_variance_groups": zero_variance_rule(
                "OpenRLHF", "dynamic filtering", {f["dynamic_filtering"]: True}),
            "algorithm.dynamic_sampling": to(f["dynamic_filtering"], convert=lambda v: False),
            "algorithm.dynamic_sampling.max_rounds": na("OpenRLHF refills the batch without a "
                                                        "round limit"),
            "algorithm.overlong": na("no overlong penalty"),
            "algorithm.overlong.buffer_tokens": to(f["overlong_buffer_len"]),
            "algorithm.overlong.penalty": to(f["overlong_penalty_factor"]),
            "algorithm.entropy_coef": to(f["entropy_coef"]),
            "algorithm.gae": na("no critic"),
            "algorithm.gae.gamma": to(f["gamma"]),
            "algorithm.gae.lam": to(f["lambd"]),
            "model.path": lambda v, s: Mapped({f["model"]: pinned_model_path(s)}),
            "model.revision": revision_outcome("OpenRLHF"),
            "model.dtype": only(lambda v: v in DTYPE, "OpenRLHF trains in bf16 or fp16",
                                to(f["param_dtype"], convert=lambda v: DTYPE[v])),
            "model.lora": to(f["lora_rank"], convert=lambda v: 0),
            "model.lora.rank": to(f["lora_rank"]),
            "model.lora.alpha": only(lambda v: float(v).is_integer(), "OpenRLHF takes an "
                                     "integer LoRA alpha", to(f["lora_alpha"], convert=int)),
            "model.lora.dropout": to(f["lora_dropout"]),
            "model.lora.target_modules": to(f["target_modules"],
                                            convert=lambda v: [v] if isinstance(v, str) else v),
            "data.train.uri": data_file("prompt_data"),
            "data.train.sha256": verified,
            "data.train.prompt_field": to(f["input_key"]),
            "data.train.answer_field": to(f["label_key"]),
            "data.validation": na("no validation split"),
            "data.validation.uri": data_file("eval_data"),
            "data.validation.sha256": verified,
            "data.validation.prompt_field": to(f["input_key"]),
            "data.validation.answer_field": to(f["label_key"]),
            "data.test": na("the test split is never used during training"),
            "data.max_prompt_tokens": lambda v, s: Mapped(
                {f["max_len"]: v + s.data.max_response_tokens}),
            "data.max_response_tokens": to(f["max_new_tokens"]),
            "reward.kind": only(lambda v: v == "python", "only python rewards are translated "
                                "for OpenRLHF", na("a python reward function")),
            "reward.entrypoint": lambda v, s: Mapped({
                f["reward_url"]: f"{RUN_DIR}/{REWARD_SHIM_FILE}"}),
            "reward.sha256": verified,
            "environment.kind": only(lambda v: v == "single_turn", "multi-turn environments "
                                     "are not translated for OpenRLHF", na("single-turn")),
            "environment.entrypoint": na("single-turn"),
            "environment.sha256": na("single-turn"),
            "environment.max_turns": na("single-turn"),
            "rollout.backend": only(lambda v: v == "vllm", "OpenRLHF rolls out with vLLM",
                                    to(f["vllm_engines"], convert=lambda v: 1)),
            "rollout.temperature": to(f["temperature"]),
            "rollout.top_p": to(f["top_p"]),
            "optim.lr": to(f["lr"]),
            "optim.weight_decay": to(f["weight_decay"]),
            "optim.grad_clip": to(f["max_norm"]),
            "optim.warmup_steps": warmup,
            "budget.total_updates": total_updates,
            "budget.prompts_per_update": to(f["rollout_batch_size"]),
            "budget.ppo_epochs": to(f["max_epochs"]),
            "budget.mini_batches": mini_batches,
            "checkpoint.every": to(f["save_steps"], convert=lambda v: -1 if v is None else v),
            "checkpoint.keep": lambda v, s: NotApplicable("keeps every checkpoint") if v is None
            else Mapped({f["max_ckpt_num"]: v}),
            "evaluation.every": to(f["eval_steps"], convert=lambda v: -1 if v is None else v),
            "evaluation.select_by": only(lambda v: v is None, "OpenRLHF does not pick a "
                                         "checkpoint by a validation metric",
                                         na("no selection")),
            "resources.nodes": to(f["nodes"]),
            "resources.gpus_per_node": to(f["gpus_per_node"]),
        }

    def render(self, translation: Translation, spec: ExperimentSpec,
               ctx: LaunchContext) -> NativeLaunch:
        f = ctx.dialect.keys
        owned = {f["run_name"]: ctx.run_name,
                 f["tensorboard"]: f"{RUN_DIR}/{TENSORBOARD}",
                 f["ckpt_path"]: f"{RUN_DIR}/{CHECKPOINTS}",
                 f["save_path"]: f"{RUN_DIR}/final"}
        # Micro-batch sizes only trade memory for speed; OpenRLHF requires at least one
        # micro-batch per actor process, so pick the largest size (<= 8) that gives that.
        processes = max(1, spec.resources.nodes * max(spec.resources.gpus_per_node, 1))
        samples = spec.budget.prompts_per_update * spec.algorithm.group_size
        micro = max(1, min(8, samples // processes))
        defaults = {f["micro_rollout_batch_size"]: micro, f["micro_train_batch_size"]: micro}
        return NativeLaunch(
            argv=[PYTHON, "-m", "openrlhf.cli.train_ppo_ray",
                  *render_flags(with_owned_keys("openrlhf", {**defaults, **translation.native},
                                                owned))],
            files={REWARD_SHIM_FILE: reward_shim(spec, ctx.base_dir, "OpenRLHF", REWARD_CALL)},
            env=["CUDA_VISIBLE_DEVICES", "HF_HOME", "WANDB_API_KEY"])

    def collect(self, attempt_dir: Path, ctx: LaunchContext) -> Collected:
        from ..core.tensorboard import canonical_rows, read_scalars

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
        load_flag = "--load_checkpoint" if "--ckpt_path" in argv else "--ckpt.load_enable"
        return [*argv, load_flag]


REWARD_CALL = '''

def reward_func(queries, prompts, labels, **kwargs):
    import torch

    scores = [float(score(p, q[len(p):], a)) for q, p, a in zip(queries, prompts, labels)]
    rewards = torch.tensor(scores)
    return {"rewards": rewards, "scores": rewards, "extra_logs": {}}
'''
