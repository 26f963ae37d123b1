"""Every adapter we ship or exemplify passes the conformance kit third parties run, at the
first and last release of every dialect; each class is what an adapter author writes: the
adapter, the versions, what the engine reads, and a writer of the engine's native outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from stateset_backend.adapters.native import NativeAdapter
from stateset_backend.conformance import AdapterConformance, CannotWrite
from stateset_backend.core.adapter import LaunchContext
from stateset_backend.core.plan import LaunchPlan
from stateset_backend.native import layout

OTHER_RUN = "20990101T000000Z-ffffffff.someone-elses-run"

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


# -- native: run_info.json, metrics.jsonl, checkpoints with a manifest ---------------------------
def write_native(attempt: Path, ctx: LaunchContext, *, metrics: list[dict[str, Any]],
                 identity: bool, artifacts: bool, checkpoint_step: int | None) -> None:
    import hashlib

    info: dict[str, Any] = {"committed_updates": len(metrics)}
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


class TestNativeConformance(AdapterConformance):
    engine_versions = ["0.1.0"]
    base = {"model": {"path": "builtin:tiny-llama-support"}, "data": {"chat_template": False}}

    @pytest.fixture
    def adapter(self):
        return NativeAdapter()

    @pytest.fixture
    def write_outputs(self):
        return write_native


# -- the echo example plugin: identity.json, log.jsonl, weights.bin -----------------------------
def write_echo(attempt: Path, ctx: LaunchContext, *, metrics: list[dict[str, Any]],
               identity: bool, artifacts: bool, checkpoint_step: int | None) -> None:
    if identity:
        (attempt / "identity.json").write_text(json.dumps(
            {"run_id": ctx.run_id, "digest": ctx.experiment_digest}))
    (attempt / "log.jsonl").write_text("".join(
        json.dumps({"update": r["step"], "score": r["reward/mean"]}) + "\n" for r in metrics))
    if artifacts:
        (attempt / "weights.bin").write_bytes(b"\0" * 64)


class TestExamplePluginConformance(AdapterConformance):
    engine_versions = ["1.0.0", "1.2.0"]

    @pytest.fixture
    def adapter(self):
        from stateset_echo_engine.plugin import EchoAdapter

        return EchoAdapter()

    @pytest.fixture
    def write_outputs(self):
        return write_echo


# -- verl: the file logger's jsonl (>= 0.6) or TensorBoard, global_step_N checkpoints ------------
def write_verl(attempt: Path, ctx: LaunchContext, *, metrics: list[dict[str, Any]],
               identity: bool, artifacts: bool, checkpoint_step: int | None) -> None:
    from stateset_backend.adapters.verl import CHECKPOINTS, LOG_ROOT, METRICS, VerlAdapter

    name = ctx.run_name if identity else OTHER_RUN
    if VerlAdapter().keys(ctx.dialect).logger == "tensorboard":
        _tensorboard(attempt / LOG_ROOT / name, metrics, METRICS)
    else:  # FileLogger: one JSON object per step, {"step": n, "data": {tag: value}}
        log = attempt / LOG_ROOT / "conformance" / f"{name}.jsonl"
        log.parent.mkdir(parents=True)
        log.write_text("".join(json.dumps({"step": r["step"], "data": {
            METRICS[k]: v for k, v in r.items() if k in METRICS}}) + "\n" for r in metrics))
    if artifacts and checkpoint_step is not None:
        ckpt = attempt / CHECKPOINTS / f"global_step_{checkpoint_step}" / "actor"
        ckpt.mkdir(parents=True)
        (ckpt / "model_world_size_1_rank_0.pt").write_bytes(b"weights")
        (attempt / CHECKPOINTS / "latest_checkpointed_iteration.txt").write_text(
            str(checkpoint_step))


def _hydra_overrides(plan: LaunchPlan) -> dict[str, Any]:
    """The launch's overrides as Hydra's own override parser reads them, applied to an empty
    config and resolved (an interpolation that was not escaped would resolve here)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    overrides = [a for a in plan.argv if "=" in a and not a.startswith("-")]
    cfg = OmegaConf.create({})
    for override in OverridesParser.create().parse_overrides(overrides=overrides):
        OmegaConf.update(cfg, override.key_or_group, override.value(), force_add=True)
    out = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(out, dict)
    return out  # type: ignore[return-value]


VERL_RELEASES = ["0.4.1", "0.5.0", "0.6.0", "0.6.1", "0.7.0", "0.7.1", "0.8.0", "0.9.0",
                 "0.9.1"]


class TestVerlConformance(AdapterConformance):
    engine_versions = VERL_RELEASES
    data_format = "parquet"  # verl reads parquet only

    @pytest.fixture
    def adapter(self):
        from stateset_backend.adapters.verl import VerlAdapter

        return VerlAdapter()

    @pytest.fixture
    def write_outputs(self):
        return write_verl

    @pytest.fixture
    def parse_launch(self):
        return _hydra_overrides

    def option_key(self, plan):
        return "trainer.validation_data_dir"



# -- OpenRLHF: TensorBoard under the run name, DeepSpeed global_stepN checkpoints ----------------
def write_openrlhf(attempt: Path, ctx: LaunchContext, *, metrics: list[dict[str, Any]],
                   identity: bool, artifacts: bool, checkpoint_step: int | None) -> None:
    from stateset_backend.adapters.openrlhf import CHECKPOINTS, METRICS, TENSORBOARD

    name = ctx.run_name if identity else OTHER_RUN
    _tensorboard(attempt / TENSORBOARD / name, metrics, METRICS)
    if artifacts and checkpoint_step is not None:
        ckpt = attempt / CHECKPOINTS / "_actor" / f"global_step{checkpoint_step}"
        ckpt.mkdir(parents=True)
        (ckpt / "mp_rank_00_model_states.pt").write_bytes(b"weights")


class TestOpenRLHFConformance(AdapterConformance):
    engine_versions = ["0.9.8", "0.10.1", "0.10.2", "0.11.1", "0.11.2"]

    @pytest.fixture
    def adapter(self):
        from stateset_backend.adapters.openrlhf import OpenRLHFAdapter

        return OpenRLHFAdapter()

    @pytest.fixture
    def write_outputs(self):
        return write_openrlhf

    def option_key(self, plan):
        from packaging.version import Version

        flat = Version(plan.engine_version) < Version("0.10.2")  # flags renamed at 0.10.2
        return "--wandb_project" if flat else "--logger.wandb.project"



# -- NeMo RL: TensorBoard with the config as hparams, step_N checkpoints -----------------------
def write_nemo_rl(attempt: Path, ctx: LaunchContext, *, metrics: list[dict[str, Any]],
                  identity: bool, artifacts: bool, checkpoint_step: int | None) -> None:
    from stateset_backend.adapters.nemo_rl import CHECKPOINTS, LOGS, METRICS, RUN_NAME_KEY

    name = ctx.run_name if identity else OTHER_RUN
    _tensorboard(attempt / LOGS / "exp_001" / "tensorboard", metrics, METRICS,
                 hparams={RUN_NAME_KEY: name})
    if artifacts and checkpoint_step is not None:
        ckpt = attempt / CHECKPOINTS / f"step_{checkpoint_step}"
        (ckpt / "policy").mkdir(parents=True)
        (ckpt / "policy" / "weights.pt").write_bytes(b"weights")
        (ckpt / "training_info.json").write_text(json.dumps({"step": checkpoint_step}))


class TestNemoRLConformance(AdapterConformance):
    engine_versions = ["0.5.0", "0.6.0", "0.7.0"]
    data_format = "parquet"

    @pytest.fixture
    def adapter(self):
        from stateset_backend.adapters.nemo_rl import NemoRLAdapter

        return NemoRLAdapter()

    @pytest.fixture
    def write_outputs(self):
        return write_nemo_rl

    @pytest.fixture
    def parse_launch(self):
        return _hydra_overrides

    def option_key(self, plan):
        return "logger.wandb.project"


def test_writers_write_what_they_are_given(tmp_path):
    """The native writer keeps a NaN as NaN (the kit's cases depend on it)."""
    from packaging.version import Version

    adapter = NativeAdapter()
    ctx = LaunchContext("20260101T000000Z-00000000", "sha256:" + "0" * 64, "0.1.0",
                        adapter.contract.dialect(Version("0.1.0")))
    write_native(tmp_path, ctx, metrics=[{"step": 1, "reward/mean": math.nan}], identity=True,
                 artifacts=False, checkpoint_step=None)
    assert math.isnan(adapter.collect(tmp_path, ctx).metrics[0]["reward/mean"])
