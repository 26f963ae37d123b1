"""Reading a verl attempt back: metrics from whichever logger the release has, checkpoint
files as artifacts, and the checkpoint a retry resumes from.

It depends only on the folder layout the launch gave the run, so a finished run can be read
back (and resumed) without translating its spec again.
"""

from __future__ import annotations

from pathlib import Path

from packaging.version import Version

from stateset_backend.adapters.verl.dialect import VerlKeys
from stateset_backend.adapters.verl.render import CHECKPOINTS, LOG_ROOT
from stateset_backend.plugin import (
    NEXT_LR,
    Checkpoint,
    Collected,
    LaunchContext,
    checkpoint_artifacts,
    log_rows,
    overrides,
    parse_version,
    resumed_from_steps,
)

# canonical metric -> verl's metric key (the same in its file and TensorBoard loggers)
METRICS = {"reward/mean": "critic/score/mean", "loss/policy": "actor/pg_loss",
           "kl": "actor/kl_loss", "entropy": "actor/entropy", "clip_fraction": "actor/pg_clipfrac",
           "grad_norm": "actor/grad_norm", "lr": "actor/lr",
           "response_length/mean": "response_length/mean", "tokens_per_second": "perf/throughput"}


# verl's engine workers (0.8 on) step the scheduler, then log its rate as actor/lr: the rate of
# the next update (the legacy workers before them logged the rate first, then stepped)
RATE_AFTER_STEP = Version("0.8.0")


def metric_names(engine_version: str) -> dict[str, str]:
    """Canonical metric -> verl's key, for the release that wrote the log."""
    if parse_version(engine_version) < RATE_AFTER_STEP:
        return dict(METRICS)
    return {(NEXT_LR if c == "lr" else c): r for c, r in METRICS.items()}


def outputs(attempt_dir: Path, ctx: LaunchContext, keys: VerlKeys) -> Collected:
    names = metric_names(ctx.engine_version)
    out = Collected(raw_metric_names=names)
    if keys.logger == "tensorboard":
        from stateset_backend.plugin import canonical_rows, read_scalars

        log_dir = attempt_dir / LOG_ROOT / ctx.run_name
        if log_dir.is_dir():
            out.run_id, out.experiment_digest = ctx.run_id, ctx.experiment_digest
            out.metrics = canonical_rows(read_scalars(log_dir), names)
    # the file logger writes the path the launch gave it (plans made before that:
    # <root>/<project>/<experiment_name>.jsonl)
    given = attempt_dir / f"{ctx.run_name}.jsonl"
    logs = [given] if given.is_file() else \
        sorted((attempt_dir / LOG_ROOT).glob(f"*/{ctx.run_name}.jsonl"))
    for log in logs:
        out.run_id, out.experiment_digest = ctx.run_id, ctx.experiment_digest
        for doc in log_rows(log.read_text(encoding="utf-8")):
            row = {"step": doc["step"]}
            row.update({c: doc["data"][r] for c, r in names.items() if r in doc["data"]})
            out.metrics.append(row)
    steps = [int(r["step"]) for r in out.metrics]
    out.committed_updates = max(steps, default=0)
    # verl numbers its steps from the global step it restored (validation before training is
    # pinned off)
    out.resumed_from = resumed_from_steps(steps)
    for step_dir in _step_dirs(attempt_dir):
        step = int(step_dir.name.removeprefix("global_step_"))
        if holds_weights(step_dir):
            out.artifacts += checkpoint_artifacts(attempt_dir, step_dir, step)
        else:
            out.notes.append(f"{step_dir.name} holds no weights: what verl's retention left "
                             "of a checkpoint, so no update's checkpoint")
    return out


def _step_dirs(attempt_dir: Path) -> list[Path]:
    """The ``global_step_N`` folders, in the order of N (as text 10 sorts before 9)."""
    root = attempt_dir / CHECKPOINTS
    found = [p for p in root.glob("global_step_*")
             if p.is_dir() and p.name.removeprefix("global_step_").isdigit()] \
        if root.is_dir() else []
    return sorted(found, key=lambda p: int(p.name.removeprefix("global_step_")))


def holds_weights(step_dir: Path) -> bool:
    """Whether ``global_step_N`` still holds a model: verl's retention (max_*_ckpt_to_keep)
    deletes a role's folder (``actor``, ``critic``) and leaves the step's ``data.pt`` (the
    dataloader's state) behind, which is no checkpoint to collect, resume or start from."""
    return any(any(role.iterdir()) for role in step_dir.iterdir() if role.is_dir())


def latest_checkpoint(attempt_dir: Path) -> Checkpoint | None:
    found = checkpoints(attempt_dir)
    return found[-1] if found else None


def checkpoints(attempt_dir: Path) -> list[Checkpoint]:
    """verl writes ``latest_checkpointed_iteration.txt`` after a step's folder is whole, so
    that folder and every older one it kept are complete; a newer one is a save cut short."""
    marker = attempt_dir / CHECKPOINTS / "latest_checkpointed_iteration.txt"
    if not marker.is_file():
        return []
    latest = int(marker.read_text().strip())
    found = [Checkpoint(path, int(path.name.removeprefix("global_step_")))
             for path in _step_dirs(attempt_dir)]
    found = [c for c in found if c.update <= latest]
    if not found or found[-1].update != latest or not holds_weights(found[-1].path):
        return []  # the newest is not whole: a resume must not fall back to an older one
    return [c for c in found if holds_weights(c.path)]


def resume_argv(checkpoint: Checkpoint, argv: list[str], attempt_dir: Path) -> list[str]:
    """verl loads from any path it is given and saves into this attempt's folder."""
    kept = [a for a in argv if not a.startswith("trainer.resume_mode=")]
    return [*kept, "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={overrides.value(str(checkpoint.path))}"]


