"""Reading an OpenRLHF attempt back: TensorBoard metrics, DeepSpeed checkpoints as
artifacts, and resuming, which OpenRLHF does only from its own checkpoint path.

It depends only on the folder layout the launch gave the run, so a finished run can be read
back (and resumed) without translating its spec again.
"""

from __future__ import annotations

from pathlib import Path

from stateset_backend.adapters.openrlhf.render import CHECKPOINTS, TENSORBOARD
from stateset_backend.plugin import (
    NEXT_LR,
    Checkpoint,
    Collected,
    LaunchContext,
    atomic_write_bytes,
    checkpoint_artifacts,
    resumed_from_steps,
    stage_checkpoint,
)

# canonical metric -> OpenRLHF's TensorBoard tag. actor_lr is read after the optimizer step
# (ppo_actor's training_step), whose DeepSpeed engine has stepped the scheduler: it is the
# rate of the next update. Evaluation logs each data source's pass@1 as eval_<source>_pass1
# (ppo_trainer's compute_eval_metrics), the source a row's "datasource", else "default": the
# hub's rows name none.
METRICS = {"reward/mean": "train/reward", "loss/policy": "train/policy_loss", "kl": "train/kl",
           "entropy": "train/entropy_loss", "grad_norm": "train/actor_grad_norm",
           NEXT_LR: "train/actor_lr", "response_length/mean": "train/response_length",
           "val/reward/mean": "eval/eval_default_pass1"}


def outputs(attempt_dir: Path, ctx: LaunchContext) -> Collected:
    from stateset_backend.plugin import canonical_rows, read_scalars

    out = Collected(raw_metric_names=dict(METRICS))
    # OpenRLHF writes TensorBoard events under <tensorboard_dir>/<run name>
    log_dir = attempt_dir / TENSORBOARD / ctx.run_name
    if log_dir.is_dir():
        out.run_id, out.experiment_digest = ctx.run_id, ctx.experiment_digest
        out.metrics = canonical_rows(read_scalars(log_dir), METRICS)
    trained = [int(r["step"]) for r in out.metrics if "loss/policy" in r]
    out.committed_updates = max(trained, default=0)
    # OpenRLHF restores its global step from the checkpoint's states (ppo_trainer.fit)
    out.resumed_from = resumed_from_steps(trained)
    for step_dir in sorted((attempt_dir / CHECKPOINTS / "_actor").glob("global_step*")):
        step = int(step_dir.name.removeprefix("global_step"))
        out.artifacts += checkpoint_artifacts(attempt_dir, step_dir, step)
    return out


def latest_checkpoint(attempt_dir: Path) -> Checkpoint | None:
    """The checkpoint DeepSpeed's ``latest`` tag names: its ``save_checkpoint`` writes the tag
    after the folder is whole (OpenRLHF's ``save_ckpt`` passes ``save_latest=True``), so a
    newer folder is a save cut short, which a resume would load half of."""
    actor = attempt_dir / CHECKPOINTS / "_actor"
    tag = (actor / "latest").read_text().strip() if (actor / "latest").is_file() else ""
    step = tag.removeprefix("global_step")
    if not step.isdigit() or not (actor / tag).is_dir():
        return None
    return Checkpoint(actor / tag, int(step))

def resume_argv(checkpoint: Checkpoint, argv: list[str], attempt_dir: Path) -> list[str]:
    """OpenRLHF reloads only from its own ckpt path (DeepSpeed's ``latest`` tag under
    ``_actor`` and, with a critic, ``_critic``): stage the checkpoint there and switch
    loading on. Without the staged tag OpenRLHF would warn and start from scratch."""
    root = checkpoint.path.parent.parent  # <ckpt path>/_actor/global_stepN
    tag = checkpoint.path.name
    for role in ("_actor", "_critic"):
        if (root / role / tag).is_dir():
            stage_checkpoint(root / role / tag, attempt_dir / CHECKPOINTS / role / tag)
            atomic_write_bytes(attempt_dir / CHECKPOINTS / role / "latest", tag.encode())
    flat = any(a == "--ckpt_path" or a.startswith("--ckpt_path=") for a in argv)
    load_flag = "--load_checkpoint" if flat else "--ckpt.load_enable"
    return [*argv, load_flag]
