"""Reading a NeMo RL attempt back: TensorBoard metrics (matched to the run by the name
NeMo RL records as hparams), complete ``step_N`` checkpoints, and the checkpoint a retry
resumes from.

It depends only on the folder layout the launch gave the run, so a finished run can be read
back (and resumed) without translating its spec again.
"""

from __future__ import annotations

from pathlib import Path

from stateset_backend.adapters.nemo_rl.render import CHECKPOINTS, LOGS, RUN_NAME_KEY
from stateset_backend.plugin import (
    Checkpoint,
    Collected,
    LaunchContext,
    checkpoint_artifacts,
    resumed_from_steps,
    stage_checkpoint,
)

# canonical metric -> NeMo RL's TensorBoard tag (log_metrics(prefix="train"/"validation"))
METRICS = {"reward/mean": "train/reward", "loss/policy": "train/loss",
           "grad_norm": "train/grad_norm",
           "response_length/mean": "train/mean_gen_tokens_per_sample",
           "val/reward/mean": "validation/accuracy"}


def outputs(attempt_dir: Path, ctx: LaunchContext) -> Collected:
    """TensorBoard under ``logs/exp_NNN/tensorboard`` (run_grpo numbers each run), the
    run name from the config NeMo RL records as hparams, ``step_N`` checkpoints."""
    from stateset_backend.plugin import canonical_rows, read_hparams, read_scalars

    out = Collected(raw_metric_names=dict(METRICS))
    logs = attempt_dir / LOGS
    if logs.is_dir():
        if read_hparams(logs).get(RUN_NAME_KEY) == ctx.run_name:
            out.run_id, out.experiment_digest = ctx.run_id, ctx.experiment_digest
        out.metrics = canonical_rows(read_scalars(logs), METRICS)
    trained = [int(r["step"]) for r in out.metrics if "loss/policy" in r]
    out.committed_updates = max(trained, default=0)
    # NeMo RL restores its step count from the checkpoint's training_info (grpo_train)
    out.resumed_from = resumed_from_steps(trained)
    for step_dir in _complete_steps(attempt_dir):
        step = int(step_dir.name.removeprefix("step_"))
        out.artifacts += checkpoint_artifacts(attempt_dir, step_dir, step)
    return out


def _complete_steps(attempt_dir: Path) -> list[Path]:
    """``step_N`` folders (NeMo RL renames ``tmp_step_N`` once complete), oldest first."""
    steps = [p for p in (attempt_dir / CHECKPOINTS).glob("step_*")
             if (p / "training_info.json").is_file()]
    return sorted(steps, key=lambda p: int(p.name.removeprefix("step_")))

def latest_checkpoint(attempt_dir: Path) -> Checkpoint | None:
    """NeMo RL's complete checkpoints are ``step_N`` folders with ``training_info.json``."""
    steps = _complete_steps(attempt_dir)
    if not steps:
        return None
    return Checkpoint(steps[-1], int(steps[-1].name.removeprefix("step_")))

def resume_argv(checkpoint: Checkpoint, argv: list[str], attempt_dir: Path) -> list[str]:
    """NeMo RL resumes from the newest complete ``step_N`` in its own checkpoint_dir:
    stage the checkpoint there; the argv is unchanged."""
    stage_checkpoint(checkpoint.path, attempt_dir / CHECKPOINTS / checkpoint.path.name)
    return list(argv)
