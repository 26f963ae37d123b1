"""The built-in engines' native output files, written from canonical values for the
conformance kit (``EngineAdapter.kit_support``): each writer lays out exactly what its engine
leaves in an attempt folder, so the kit can derive the cases that must be ``invalid`` (NaN,
a missing identity, an escaping artifact, ...) and check collection and resume against the
adapter's real collector. Imported only when the kit runs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..plugin import CannotWrite, LaunchContext

OTHER_RUN = "20990101T000000Z-ffffffff.someone-elses-run"  # outputs of an unrelated run


def _tensorboard(log_dir: Path, metrics: list[dict[str, Any]], names: dict[str, str],
                 hparams: dict[str, Any] | None = None) -> None:
    """Scalars as the engines' TensorBoard loggers write them (add_scalar per tag)."""
    from torch.utils.tensorboard import SummaryWriter

    for row in metrics:
        if any(isinstance(v, str) for k, v in row.items() if k != "step"):
            raise CannotWrite("TensorBoard scalars are numbers")
    writer = SummaryWriter(log_dir=str(log_dir))
    if hparams is not None:
        writer.add_hparams(hparams, {})
    for row in metrics:
        for name, value in row.items():
            if name != "step" and name in names:
                writer.add_scalar(names[name], value, row["step"])
    writer.close()


def write_native(attempt: Path, ctx: LaunchContext, *, metrics: list[dict[str, Any]],
                 identity: bool, artifacts: bool, checkpoint_step: int | None) -> None:
    """run_info.json, metrics.jsonl, checkpoints with a manifest, final weights."""
    from ..native import layout

    info: dict[str, Any] = {"committed_updates": max((r["step"] for r in metrics), default=0)}
    if identity:
        info.update(run_id=ctx.run_id, experiment_digest=ctx.experiment_digest)
    (attempt / layout.RUN_INFO_FILE).write_text(json.dumps(info))
    (attempt / layout.METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in metrics))
    if artifacts and checkpoint_step is not None:
        ckpt = attempt / layout.CHECKPOINTS_DIR / layout.checkpoint_name(checkpoint_step)
        ckpt.mkdir(parents=True)
        (ckpt / "model.safetensors").write_bytes(b"weights")
        files = {"model.safetensors": hashlib.sha256(b"weights").hexdigest()}
        (ckpt / layout.MANIFEST).write_text(json.dumps(
            {"experiment_digest": ctx.experiment_digest, "files": files}))
    if artifacts:
        (attempt / layout.FINAL_DIR).mkdir(exist_ok=True)
        (attempt / layout.FINAL_DIR / "model.safetensors").write_bytes(b"final")


def write_verl(attempt: Path, ctx: LaunchContext, *, metrics: list[dict[str, Any]],
               identity: bool, artifacts: bool, checkpoint_step: int | None) -> None:
    """The file logger's jsonl (>= 0.6) or TensorBoard, global_step_N checkpoints."""
    from .verl import CHECKPOINTS, LOG_ROOT, METRICS, VerlAdapter

    name = ctx.run_name if identity else OTHER_RUN
    if VerlAdapter().keys(ctx.dialect).logger == "tensorboard":
        _tensorboard(attempt / LOG_ROOT / name, metrics, METRICS)
    else:  # FileLogger at VERL_FILE_LOGGER_PATH: one {"step": n, "data": {tag: value}} a line
        log = attempt / f"{name}.jsonl"
        log.write_text("".join(json.dumps({"step": r["step"], "data": {
            METRICS[k]: v for k, v in r.items() if k in METRICS}}) + "\n" for r in metrics))
    if artifacts and checkpoint_step is not None:
        ckpt = attempt / CHECKPOINTS / f"global_step_{checkpoint_step}" / "actor"
        ckpt.mkdir(parents=True)
        (ckpt / "model_world_size_1_rank_0.pt").write_bytes(b"weights")
        (attempt / CHECKPOINTS / "latest_checkpointed_iteration.txt").write_text(
            str(checkpoint_step))


def write_openrlhf(attempt: Path, ctx: LaunchContext, *, metrics: list[dict[str, Any]],
                   identity: bool, artifacts: bool, checkpoint_step: int | None) -> None:
    """TensorBoard under the run name, DeepSpeed global_stepN checkpoints."""
    from .openrlhf import CHECKPOINTS, METRICS, TENSORBOARD

    name = ctx.run_name if identity else OTHER_RUN
    _tensorboard(attempt / TENSORBOARD / name, metrics, METRICS)
    if artifacts and checkpoint_step is not None:
        ckpt = attempt / CHECKPOINTS / "_actor" / f"global_step{checkpoint_step}"
        ckpt.mkdir(parents=True)
        (ckpt / "mp_rank_00_model_states.pt").write_bytes(b"weights")


def write_nemo_rl(attempt: Path, ctx: LaunchContext, *, metrics: list[dict[str, Any]],
                  identity: bool, artifacts: bool, checkpoint_step: int | None) -> None:
    """TensorBoard with the config as hparams, step_N checkpoints."""
    from .nemo_rl import CHECKPOINTS, LOGS, METRICS, RUN_NAME_KEY

    name = ctx.run_name if identity else OTHER_RUN
    _tensorboard(attempt / LOGS / "exp_001" / "tensorboard", metrics, METRICS,
                 hparams={RUN_NAME_KEY: name})
    if artifacts and checkpoint_step is not None:
        ckpt = attempt / CHECKPOINTS / f"step_{checkpoint_step}"
        (ckpt / "policy").mkdir(parents=True)
        (ckpt / "policy" / "weights.pt").write_bytes(b"weights")
        (ckpt / "training_info.json").write_text(json.dumps({"step": checkpoint_step}))


def openrlhf_option_key(plan: Any) -> str:
    from packaging.version import Version

    flat = Version(plan.engine_version) < Version("0.10.2")  # flags renamed at 0.10.2
    return "--wandb_project" if flat else "--logger.wandb.project"
