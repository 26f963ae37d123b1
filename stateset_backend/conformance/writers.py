"""The built-in external engines' output files, written by the kit from its own knowledge of
each engine: where the launch (as the engine reads it) tells the engine to write, in the
engine's own file formats and metric names. Nothing here comes from an adapter, so an adapter
that reads a wrong metric name, a wrong folder or a wrong file format fails collection instead
of agreeing with itself.

A writer is built per plan (``writer_for``): it needs the launch to know where the engine
writes. The native engine's writer follows the engine's own layout
(``stateset_backend.native.layout``); a plugin supplies its writer in
``KitSupport.write_outputs``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stateset_backend.conformance.resumes import openrlhf_runs_critic, verl_runs_critic
from stateset_backend.contracts.loader import parse_version
from stateset_backend.engines.adapter import CannotWrite, LaunchContext, identity_name
from stateset_backend.plan.launch_plan import LaunchPlan
from stateset_backend.spec.schedule import NEXT_LR

OTHER_RUN = "20990101T000000Z-ffffffff.someone-elses-run"  # outputs of an unrelated run

# canonical metric -> the name each engine logs it under (its trainer's own metric keys):
# every metric the hub reads from it, so that a collector reading one under another's name
# reads a wrong value
VERL_METRICS = {"reward/mean": "critic/score/mean", "loss/policy": "actor/pg_loss",
                "kl": "actor/kl_loss", "entropy": "actor/entropy",
                "clip_fraction": "actor/pg_clipfrac", "grad_norm": "actor/grad_norm",
                "lr": "actor/lr", "response_length/mean": "response_length/mean",
                "tokens_per_second": "perf/throughput"}
# verl 0.8's engine workers step the scheduler and then log its rate: from that release on,
# actor/lr at an update is the rate of the next one (the verl collector keeps the same
# boundary; the kit keeps its own, so that a collector that moves it is seen)
VERL_NEXT_RATE_FROM = parse_version("0.8.0")
# OpenRLHF (0.9.8 to 0.11.2): ppo_actor reads actor_lr after DeepSpeed's engine stepped the
# scheduler, so it is the next update's rate; compute_eval_metrics logs pass@1 per data source,
# eval_<source>_pass1, a row without a "datasource" being "default"
OPENRLHF_METRICS = {"reward/mean": "train/reward", "loss/policy": "train/policy_loss",
                    "kl": "train/kl", "entropy": "train/entropy_loss",
                    "grad_norm": "train/actor_grad_norm", NEXT_LR: "train/actor_lr",
                    "response_length/mean": "train/response_length",
                    "val/reward/mean": "eval/eval_default_pass1"}
NEMO_RL_METRICS = {"reward/mean": "train/reward", "loss/policy": "train/loss",
                   "grad_norm": "train/grad_norm",
                   "response_length/mean": "train/mean_gen_tokens_per_sample",
                   "val/reward/mean": "validation/accuracy"}
# the native engine logs canonical names: the rate each update ran at
NATIVE_METRICS = {name: name for name in (
    "reward/mean", "loss/policy", "kl", "entropy", "clip_fraction", "grad_norm", "lr",
    "response_length/mean", "tokens_per_second", "val/reward/mean")}


def logged(plan: LaunchPlan) -> dict[str, str] | None:
    """Canonical metric -> the engine's name, for each metric the kit's writer logs for
    ``plan``'s built-in engine at its release; None for a plugin's engine (its own writer
    logs the reward at least: every engine reports it)."""
    if plan.engine == "verl":
        if parse_version(plan.engine_version) >= VERL_NEXT_RATE_FROM:
            return {(NEXT_LR if c == "lr" else c): n for c, n in VERL_METRICS.items()}
        return dict(VERL_METRICS)
    names = {"openrlhf": OPENRLHF_METRICS, "nemo-rl": NEMO_RL_METRICS,
             "native": NATIVE_METRICS}.get(plan.engine)
    return None if names is None else dict(names)


def tensorboard(log_dir: Path, metrics: list[dict[str, Any]], names: dict[str, str],
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


def _in(attempt: Path, value: str) -> Path:
    return Path(value.replace("{run_dir}", str(attempt)))


def _named(value: str, plan: LaunchPlan, ctx: LaunchContext, identity: bool) -> str:
    """``value`` (a path or name the launch gives the run's outputs) as the run ``ctx`` names
    would leave it, or, without ``identity``, an unrelated run: the engine names its outputs
    by the run that launched it, which a collector must check is this one."""
    launched = identity_name(plan.run_id, plan.experiment_digest)
    return value.replace(launched, ctx.run_name if identity else OTHER_RUN)


def _other(path: Path, plan: LaunchPlan, ctx: LaunchContext, identity: bool) -> Path:
    return Path(_named(str(path), plan, ctx, identity))


Writer = Callable[..., None]


def critic_weights(update: int) -> bytes:
    """The critic's weights file of ``update``, as the kit's writers save it: a resume check
    tells from its bytes which update's critic an engine would load."""
    return f"critic weights of update {update}".encode()


def verl(plan: LaunchPlan, read: dict[str, Any]) -> Writer:
    """verl's loggers and checkpoints: FileLogger writes ``{"step", "data"}`` lines to
    VERL_FILE_LOGGER_PATH (else ``<root>/<project>/<experiment>.jsonl``); the TensorBoard
    logger writes to TENSORBOARD_DIR (else ``tensorboard_log/<project>/<experiment>``); the
    trainer saves ``<default_local_dir>/global_step_N/actor`` and records the step in
    ``latest_checkpointed_iteration.txt``; an older step's folder keeps only its ``data.pt``
    once retention has removed its weights."""
    loggers = read.get("trainer.logger") or []
    names = logged(plan) or {}

    def write(attempt: Path, ctx: LaunchContext, *, metrics: list[dict[str, Any]],
              identity: bool, artifacts: bool, checkpoint_step: int | None,
              resumed_from: int | None = None) -> None:
        project, experiment = read["trainer.project_name"], read["trainer.experiment_name"]
        if "file" in loggers:
            given = plan.set_env.get("VERL_FILE_LOGGER_PATH")
            root = _in(attempt, plan.set_env.get("VERL_FILE_LOGGER_ROOT", str(attempt)))
            log = _in(attempt, given) if given else root / project / f"{experiment}.jsonl"
            log = _other(log, plan, ctx, identity)
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("".join(json.dumps({"step": r["step"], "data": {
                names[k]: v for k, v in r.items() if k in names}}) + "\n" for r in metrics))
        elif "tensorboard" in loggers:
            given = plan.set_env.get("TENSORBOARD_DIR")
            folder = _in(attempt, given) if given else \
                attempt / "tensorboard_log" / project / experiment
            tensorboard(_other(folder, plan, ctx, identity), metrics, names)
        else:
            raise CannotWrite(f"the launch asks for no logger the kit writes ({loggers})")
        if artifacts and checkpoint_step is not None:
            root = _in(attempt, str(read["trainer.default_local_dir"]))
            ckpt = root / f"global_step_{checkpoint_step}" / "actor"
            ckpt.mkdir(parents=True)
            (ckpt / "model_world_size_1_rank_0.pt").write_bytes(b"weights")
            if verl_runs_critic(read):
                critic = ckpt.parent / "critic"
                critic.mkdir()
                (critic / "model_world_size_1_rank_0.pt").write_bytes(
                    critic_weights(checkpoint_step))
            (root / "latest_checkpointed_iteration.txt").write_text(str(checkpoint_step))
            if checkpoint_step > 1:
                # what verl's retention (max_actor_ckpt_to_keep) leaves of an older
                # checkpoint: it removes the role folders, not the trainer's data.pt
                older = root / "global_step_1"
                older.mkdir(exist_ok=True)
                (older / "data.pt").write_bytes(b"dataloader state")

    return write


def openrlhf(plan: LaunchPlan, read: dict[str, Any]) -> Writer:
    """OpenRLHF's TensorBoard logger writes under ``<tensorboard dir>/<run name>``; DeepSpeed
    saves ``<ckpt path>/_actor/global_stepN`` and then names it in ``_actor/latest``."""
    def flag(*names: str) -> Any:
        return next(read[n] for n in names if n in read)

    def write(attempt: Path, ctx: LaunchContext, *, metrics: list[dict[str, Any]],
              identity: bool, artifacts: bool, checkpoint_step: int | None,
              resumed_from: int | None = None) -> None:
        board = _in(attempt, str(flag("--use_tensorboard", "--logger.tensorboard_dir")))
        name = flag("--wandb_run_name", "--logger.wandb.run_name")
        tensorboard(_other(board / name, plan, ctx, identity), metrics, OPENRLHF_METRICS)
        if artifacts and checkpoint_step is not None:
            root = _in(attempt, str(flag("--ckpt_path", "--ckpt.path")))
            # the critic saves under _critic as the actor does under _actor
            critic = openrlhf_runs_critic(read)
            for role, weights in (("_actor", b"weights"),
                                  *([("_critic", critic_weights(checkpoint_step))] if critic
                                    else [])):
                ckpt = root / role / f"global_step{checkpoint_step}"
                ckpt.mkdir(parents=True)
                (ckpt / "mp_rank_00_model_states.pt").write_bytes(weights)
                # DeepSpeed's save_checkpoint names the whole checkpoint once it is written
                (root / role / "latest").write_text(ckpt.name)

    return write


def nemo_rl(plan: LaunchPlan, read: dict[str, Any]) -> Writer:
    """NeMo RL numbers each run's log folder (``<log_dir>/exp_NNN``), writes TensorBoard under
    it with the whole config as hparams, and saves ``<checkpoint_dir>/step_N`` with
    ``training_info.json`` once complete."""
    def write(attempt: Path, ctx: LaunchContext, *, metrics: list[dict[str, Any]],
              identity: bool, artifacts: bool, checkpoint_step: int | None,
              resumed_from: int | None = None) -> None:
        logs = _in(attempt, str(read["logger.log_dir"]))
        name = _named(str(read.get("logger.wandb.name")), plan, ctx, identity)
        tensorboard(logs / "exp_001" / "tensorboard", metrics, NEMO_RL_METRICS,
                    hparams={"logger.wandb.name": name})
        if artifacts and checkpoint_step is not None:
            ckpt = _in(attempt, str(read["checkpointing.checkpoint_dir"])) / \
                f"step_{checkpoint_step}"
            (ckpt / "policy").mkdir(parents=True)
            (ckpt / "policy" / "weights.pt").write_bytes(b"weights")
            (ckpt / "training_info.json").write_text(json.dumps({"step": checkpoint_step}))

    return write


def write_native(attempt: Path, ctx: LaunchContext, *, metrics: list[dict[str, Any]],
                 identity: bool, artifacts: bool, checkpoint_step: int | None,
              resumed_from: int | None = None) -> None:
    """run_info.json, metrics.jsonl, checkpoints with a manifest, final weights."""
    from stateset_backend.native import layout

    info: dict[str, Any] = {"committed_updates": max((r["step"] for r in metrics), default=0),
                            "resumed_from": resumed_from}
    if identity:
        info.update(run_id=ctx.run_id, experiment_digest=ctx.experiment_digest)
    (attempt / layout.RUN_INFO_FILE).write_text(json.dumps(info))
    # one row per update, whatever its optimizer steps: the row carries no optimizer step
    (attempt / layout.METRICS_FILE).write_text("".join(
        json.dumps({k: v for k, v in r.items() if k != "optimizer_step"}) + "\n"
        for r in metrics))
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


BUILTIN: dict[str, Callable[[LaunchPlan, dict[str, Any]], Writer]] = {
    "verl": verl, "openrlhf": openrlhf, "nemo-rl": nemo_rl,
    "native": lambda plan, read: write_native}


def writer_for(engine: str, plan: LaunchPlan, read: Callable[[LaunchPlan], dict[str, Any]],
               declared: Writer | None) -> Writer | None:
    """The kit's own writer for a built-in external engine, else the adapter's."""
    make = BUILTIN.get(engine)
    return make(plan, read(plan)) if make is not None else declared


__all__ = ["BUILTIN", "OTHER_RUN", "critic_weights", "logged", "tensorboard", "writer_for"]
