"""Collection: engine outputs written with the engines' own writers are read back into
canonical metrics and hashed artifacts, and a bad outcome is never a success."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from optional_installs import OPENRLHF_WHEELS_MISSING, VERL_WHEELS_MISSING
from packaging.version import Version
from test_openrlhf import golden as openrlhf_golden
from test_verl import VERL_PYTHON, VERL_WHEELS, needs_verl
from test_verl import golden as verl_golden

from stateset_backend.adapters.openrlhf.adapter import OpenRLHFAdapter
from stateset_backend.adapters.verl.adapter import VerlAdapter
from stateset_backend.engines.adapter import Checkpoint, LaunchContext, identity_name
from stateset_backend.engines.registry import AdapterEntry
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.providers.local import Exit
from stateset_backend.runs.results import evaluate
from stateset_backend.spec.files import parse_spec

RUN_ID = "20260101T000000Z-0000abcd"
DIGEST = "sha256:" + "1" * 64


def _ctx(adapter, version: str) -> LaunchContext:
    return LaunchContext(RUN_ID, DIGEST, version, adapter.contract.dialect(Version(version)))


def _plan_like(adapter, doc, version):
    entry = AdapterEntry(adapter, "builtin", "stateset-backend", "0.1.0")
    plan = make_plan(parse_spec(doc), entry, version, base_dir=Path("/"))
    return plan.model_copy(update={"run_id": RUN_ID, "experiment_digest": DIGEST})


def _budget(plan, updates: int):
    """The plan as if its budget were the ``updates`` these outputs hold: a run that commits
    fewer updates than planned is invalid however healthy each one looks."""
    spec = {**plan.spec, "budget": {**plan.spec["budget"], "total_updates": updates}}
    return plan.model_copy(update={"spec": spec})


# -- OpenRLHF: TensorBoard events, written as OpenRLHF's TensorboardLogger writes them ----------
def _write_openrlhf_run(attempt: Path, name: str, steps: int, nan_at: int | None = None) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(attempt / "tensorboard" / name))
    for step in range(1, steps + 1):
        logs = {"policy_loss": 0.1 / step, "reward": 0.2 * step, "kl": 0.01,
                "response_length": 100.0, "actor_lr": 1e-6, "actor_grad_norm": 0.5}
        if nan_at == step:
            logs["policy_loss"] = math.nan
        for key, value in logs.items():  # OpenRLHF: add_scalar(f"train/{k}", v, global_step)
            writer.add_scalar(f"train/{key}", value, step)
    writer.close()
    ckpt = attempt / "checkpoints" / "_actor" / f"global_step{steps}"
    ckpt.mkdir(parents=True)
    (ckpt / "mp_rank_00_model_states.pt").write_bytes(b"weights")
    (ckpt.parent / "latest").write_text(ckpt.name)  # DeepSpeed, once the folder is whole


def test_openrlhf_offers_only_the_checkpoint_deepspeed_named_whole(tmp_path):
    """A newer folder than the one ``latest`` names is a save cut short: never resumed from;
    without a ``latest`` tag nothing is whole."""
    adapter = OpenRLHFAdapter()
    _write_openrlhf_run(tmp_path, "run", 3)
    (tmp_path / "checkpoints" / "_actor" / "global_step4").mkdir()
    assert adapter.latest_checkpoint(tmp_path) == Checkpoint(
        tmp_path / "checkpoints" / "_actor" / "global_step3", 3)
    (tmp_path / "checkpoints" / "_actor" / "latest").unlink()
    assert adapter.latest_checkpoint(tmp_path) is None


def test_openrlhf_tensorboard_is_collected_and_checked(tmp_path):
    adapter = OpenRLHFAdapter()
    ctx = _ctx(adapter, "0.11.2")
    _write_openrlhf_run(tmp_path, ctx.run_name, 4)
    got = adapter.collect(tmp_path, ctx)
    assert (got.run_id, got.experiment_digest, got.committed_updates) == (RUN_ID, DIGEST, 4)
    assert got.metrics[-1]["reward/mean"] == pytest.approx(0.8)
    assert got.metrics[0]["loss/policy"] == pytest.approx(0.1)
    assert got.raw_metric_names["loss/policy"] == "train/policy_loss"
    plan = _plan_like(adapter, openrlhf_golden({"objective": "grpo"}), "0.11.2")
    status, checks, _ = evaluate(plan, Exit(0), got, tmp_path)
    assert status == "invalid"  # 4 of the golden spec's 300 updates
    status, checks, artifacts = evaluate(_budget(plan, 4), Exit(0), got, tmp_path)
    assert status == "succeeded", checks
    assert artifacts[0].path.endswith("global_step4/mp_rank_00_model_states.pt")


OPENRLHF_WHEELS = os.environ.get("STATESET_TEST_OPENRLHF_WHEELS")


def _openrlhf_logger(version: str, tmp_path: Path):
    """OpenRLHF's own logging module, from the release's wheel (it needs nothing the wheel
    cannot bring without CUDA)."""
    import importlib.util
    import zipfile

    (wheel,) = Path(OPENRLHF_WHEELS or "").glob(f"openrlhf-{version}-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith("openrlhf/utils/logging_utils.py")]
        path = tmp_path / f"openrlhf_logging_{version.replace('.', '_')}.py"
        path.write_bytes(archive.read(name))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(OPENRLHF_WHEELS is None, reason=OPENRLHF_WHEELS_MISSING)
@pytest.mark.parametrize("version", ["0.10.2", "0.11.2"])
def test_openrlhf_own_logger_is_read_back_with_its_rate_and_validation(version, tmp_path):
    """What OpenRLHF's TensorboardLogger writes, as ppo_trainer hands it the rows: training
    statuses after each update (actor_lr read after the optimizer step: the next update's
    rate) and compute_eval_metrics' pass@1 of the one data source the hub's rows make
    ("default"), which is the validation reward."""
    from types import SimpleNamespace

    adapter = OpenRLHFAdapter()
    ctx = _ctx(adapter, version)
    board = tmp_path / "tensorboard"
    logger = _openrlhf_logger(version, tmp_path).TensorboardLogger(SimpleNamespace(
        logger=SimpleNamespace(tensorboard_dir=str(board),
                               wandb=SimpleNamespace(run_name=ctx.run_name))))
    for step in (1, 2):
        logger.log_train(step, {"policy_loss": 0.1 * step, "reward": 0.2 * step,
                                "actor_lr": 1e-4 * (step + 1), "actor_grad_norm": 0.5})
    logger.log_eval(2, {"eval_default_pass1": 0.65, "eval_default_pass4": 0.9,
                        "eval_response_length_mean": 12.0})
    logger.close()
    got = adapter.collect(tmp_path, ctx)
    assert got.metrics[0]["lr/next"] == pytest.approx(2e-4) and "lr" not in got.metrics[0]
    assert [r["val/reward/mean"] for r in got.metrics if "val/reward/mean" in r] == \
        [pytest.approx(0.65)]


def test_openrlhf_nan_metric_makes_the_result_invalid(tmp_path):
    adapter = OpenRLHFAdapter()
    ctx = _ctx(adapter, "0.11.2")
    _write_openrlhf_run(tmp_path, ctx.run_name, 3, nan_at=2)
    plan = _plan_like(adapter, openrlhf_golden({"objective": "grpo"}), "0.11.2")
    status, checks, _ = evaluate(plan, Exit(0), adapter.collect(tmp_path, ctx), tmp_path)
    assert status == "invalid"
    assert not next(c for c in checks if c.name == "metrics_finite").ok


def test_openrlhf_run_under_another_name_loses_identity(tmp_path):
    adapter = OpenRLHFAdapter()
    ctx = _ctx(adapter, "0.11.2")
    _write_openrlhf_run(tmp_path, "someone-elses-run", 3)
    plan = _plan_like(adapter, openrlhf_golden({"objective": "grpo"}), "0.11.2")
    status, checks, _ = evaluate(plan, Exit(0), adapter.collect(tmp_path, ctx), tmp_path)
    assert status == "invalid"
    assert {c.name for c in checks if not c.ok} >= {"identity", "committed_updates"}


def test_openrlhf_resume_stages_the_checkpoint_in_the_new_attempt_and_loads_it(tmp_path):
    adapter = OpenRLHFAdapter()
    earlier, new = tmp_path / "attempts" / "1", tmp_path / "attempts" / "2"
    _write_openrlhf_run(earlier, "run", 3)
    critic = earlier / "checkpoints" / "_critic" / "global_step3"
    critic.mkdir(parents=True)
    (critic / "critic_states.pt").write_bytes(b"critic")
    before = sorted(p.relative_to(earlier) for p in earlier.rglob("*"))
    found = adapter.latest_checkpoint(earlier)
    assert found == Checkpoint(earlier / "checkpoints" / "_actor" / "global_step3", 3)
    for version, load_flag in (("0.11.2", "--ckpt.load_enable"), ("0.9.10", "--load_checkpoint")):
        plan = _plan_like(adapter, openrlhf_golden({"objective": "grpo"}), version)
        argv = [a.replace("{run_dir}", str(new)) for a in plan.argv]
        resumed = adapter.resume_argv(found, argv, new)
        assert resumed == [*argv, load_flag]  # the ckpt path stays this attempt's own
        for role, weights in (("_actor", "mp_rank_00_model_states.pt"),
                              ("_critic", "critic_states.pt")):
            staged = new / "checkpoints" / role
            # DeepSpeed reloads the tag named in ``latest`` from the ckpt path
            assert (staged / "latest").read_text() == "global_step3"
            assert (staged / "global_step3" / weights).read_bytes() == \
                (earlier / "checkpoints" / role / "global_step3" / weights).read_bytes()
    assert sorted(p.relative_to(earlier) for p in earlier.rglob("*")) == before
    assert adapter.latest_checkpoint(new) == Checkpoint(
        new / "checkpoints" / "_actor" / "global_step3", 3)


# -- verl: the file logger's jsonl, written by verl's own FileLogger ------------------------------
# each run: its environment, folder, project and experiment names (JSON on stdin), written in
# turn by one interpreter (importing verl is most of a run's time)
VERL_WRITER = """
import json, os, sys
from verl.utils.tracking import FileLogger
for run in json.loads(sys.stdin.read()):
    os.environ.clear()
    os.environ.update(run["env"])
    os.chdir(run["cwd"])
    logger = FileLogger(project_name=run["project"], experiment_name=run["experiment"])
    for step in range(1, 4):
        logger.log({"critic/score/mean": 0.1 * step, "actor/pg_loss": 0.5 / step,
                    "actor/kl_loss": 0.01, "actor/entropy": 1.2, "actor/pg_clipfrac": 0.0,
                    "actor/grad_norm": 0.3, "actor/lr": 1e-6, "response_length/mean": 40.0,
                    "perf/throughput": 1000.0}, step=step)
    logger.finish()
"""
HOSTILE_NAMES = ["../../escaped", "/abs/elsewhere", "a/b", "${oc.env:HOME}"]


@pytest.fixture(scope="module")
def verl_logged(tmp_path_factory) -> dict[str | None, tuple[Path, object]]:
    """verl's own FileLogger run for the golden run (None: logging under
    VERL_FILE_LOGGER_ROOT) and for a plan of each hostile name (given the plan's environment
    and project name, in its attempt folder): each run's folder, and its plan."""
    root = tmp_path_factory.mktemp("verl-logged")
    entry = AdapterEntry(VerlAdapter(), "builtin", "stateset-backend", "0.1.0")
    runs, out = [], {}
    folder = root / "golden"
    folder.mkdir()
    runs.append({"env": {**os.environ, "VERL_FILE_LOGGER_ROOT": str(folder / "logs")},
                 "cwd": os.getcwd(), "project": "golden",
                 "experiment": identity_name(RUN_ID, DIGEST)})
    out[None] = (folder, None)
    for i, name in enumerate(HOSTILE_NAMES):
        plan = make_plan(parse_spec({**verl_golden({"objective": "grpo"}), "name": name}), entry,
                         "0.9.1", base_dir=Path("/"))
        folder = root / f"hostile{i}"
        attempt = folder / "attempt"
        attempt.mkdir(parents=True)
        env = {**os.environ, **{k: v.replace("{run_dir}", str(attempt))
                                for k, v in plan.set_env.items()}}
        env.pop("VERL_FILE_LOGGER_ROOT", None)
        runs.append({"env": env, "cwd": str(attempt),
                     "project": plan.native["trainer.project_name"],
                     "experiment": plan.native["trainer.experiment_name"]})
        out[name] = (folder, plan)
    proc = subprocess.run([VERL_PYTHON or "", "-c", VERL_WRITER], input=json.dumps(runs),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@needs_verl
@pytest.mark.xdist_group(__name__)
def test_verl_file_logger_is_collected(verl_logged, tmp_path):
    adapter = VerlAdapter()
    ctx = _ctx(adapter, "0.9.1")
    logged, _ = verl_logged[None]
    shutil.copytree(logged / "logs", tmp_path / "logs")  # what verl wrote, in this attempt
    (tmp_path / "checkpoints" / "global_step_3" / "actor").mkdir(parents=True)
    (tmp_path / "checkpoints" / "global_step_3" / "actor" / "model.pt").write_bytes(b"w")
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("3")
    got = adapter.collect(tmp_path, ctx)
    assert (got.run_id, got.experiment_digest, got.committed_updates) == (RUN_ID, DIGEST, 3)
    assert got.metrics[-1]["reward/mean"] == pytest.approx(0.3)
    plan = _plan_like(adapter, verl_golden({"objective": "grpo"}), "0.9.1")
    status, checks, _ = evaluate(_budget(plan, 3), Exit(0), got, tmp_path)
    assert status == "succeeded", checks
    found = adapter.latest_checkpoint(tmp_path)
    assert found is not None and found.update == 3
    resumed = adapter.resume_argv(found, plan.argv, tmp_path / "next")
    assert "trainer.resume_mode=resume_path" in resumed
    assert "trainer.resume_mode=disable" not in resumed
    assert any(a.startswith("trainer.resume_from_path=") for a in resumed)


@needs_verl
@pytest.mark.xdist_group(__name__)
@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_hostile_name_never_chooses_where_verls_file_logger_writes(verl_logged, name):
    """verl's own FileLogger, given the plan's environment and project name: the metrics land
    at the one path the plan names inside the attempt folder, and collection finds them."""
    adapter = VerlAdapter()
    tmp_path, plan = verl_logged[name]
    attempt = tmp_path / "attempt"
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert written == [Path("attempt") / f"{plan.native['trainer.experiment_name']}.jsonl"]
    ctx = LaunchContext(plan.run_id, plan.experiment_digest, "0.9.1", plan.resolved_dialect())
    got = adapter.collect(attempt, ctx)
    assert (got.run_id, got.committed_updates) == (plan.run_id, 3)


def test_verl_zero_exit_without_updates_is_invalid(tmp_path):
    adapter = VerlAdapter()
    ctx = _ctx(adapter, "0.9.1")
    log = tmp_path / "logs" / "golden" / f"{identity_name(RUN_ID, DIGEST)}.jsonl"
    log.parent.mkdir(parents=True)
    log.write_text("")
    plan = _plan_like(adapter, verl_golden({"objective": "grpo"}), "0.9.1")
    status, checks, _ = evaluate(plan, Exit(0), adapter.collect(tmp_path, ctx), tmp_path)
    assert status == "invalid"
    assert not next(c for c in checks if c.name == "committed_updates").ok
    json.dumps([c.model_dump() for c in checks])


# -- verl before 0.6: its TensorBoard logger, run from the 0.5.0 release's own tracking module ----
@pytest.mark.skipif(VERL_WHEELS is None, reason=VERL_WHEELS_MISSING)
def test_verl_tensorboard_logger_is_collected_before_the_file_logger(tmp_path, monkeypatch):
    import importlib.util
    import zipfile

    adapter = VerlAdapter()
    entry = AdapterEntry(adapter, "builtin", "stateset-backend", "0.1.0")
    plan = make_plan(parse_spec(verl_golden({"objective": "grpo"})), entry, "0.5.0",
                     base_dir=Path("/"))
    ctx = LaunchContext(plan.run_id, plan.experiment_digest, "0.5.0",
                        adapter.contract.dialect(Version("0.5.0")))
    assert "trainer.logger=[console,tensorboard]" in plan.argv
    for key, value in plan.set_env.items():  # where the plan tells verl to write
        monkeypatch.setenv(key, value.replace("{run_dir}", str(tmp_path)))
    wheel = next(Path(VERL_WHEELS or "").glob("verl-0.5.0-*.whl"))
    source = tmp_path / "verl_tracking.py"
    source.write_bytes(zipfile.ZipFile(wheel).read("verl/utils/tracking.py"))
    spec = importlib.util.spec_from_file_location("verl_tracking", source)
    assert spec is not None and spec.loader is not None
    tracking = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tracking)
    logger = tracking.Tracking(project_name="golden", experiment_name=ctx.run_name,
                               default_backend=["tensorboard"])
    for step in (1, 2):
        logger.log({"critic/score/mean": 0.25 * step, "actor/pg_loss": 0.5 / step}, step=step)
    logger.logger["tensorboard"].finish()
    got = adapter.collect(tmp_path, ctx)
    assert (got.run_id, got.committed_updates) == (plan.run_id, 2)
    assert got.metrics[-1]["reward/mean"] == pytest.approx(0.5)
    status, checks, _ = evaluate(_budget(plan, 2), Exit(0), got, tmp_path)
    assert status == "invalid"
    assert {c.name for c in checks if not c.ok} == {"artifacts"}  # no checkpoint was written


# -- NeMo RL: TensorBoard with the config recorded as hparams, step_N checkpoints --------------
def test_nemo_rl_tensorboard_and_checkpoints_are_collected(tmp_path):
    from test_nemo_rl import golden as nemo_golden
    from torch.utils.tensorboard import SummaryWriter

    from stateset_backend.adapters.nemo_rl.adapter import NemoRLAdapter

    adapter = NemoRLAdapter()
    ctx = _ctx(adapter, "0.7.0")
    tb = tmp_path / "logs" / "exp_001" / "tensorboard"
    writer = SummaryWriter(log_dir=str(tb))  # as NeMo RL's TensorboardLogger does
    writer.add_hparams({"logger.wandb.name": f"{RUN_ID}.{DIGEST.removeprefix('sha256:')}",
                        "grpo.seed": 5}, {})
    for step in (1, 2):
        writer.add_scalar("train/loss", 0.3 / step, step)
        writer.add_scalar("train/reward", 0.4 * step, step)
    writer.add_scalar("validation/accuracy", 0.75, 2)
    writer.close()
    for step in (1, 2):
        ckpt = tmp_path / "checkpoints" / f"step_{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "training_info.json").write_text(json.dumps({"step": step}))
    (tmp_path / "checkpoints" / "tmp_step_3").mkdir()  # an unfinished one
    got = adapter.collect(tmp_path, ctx)
    assert (got.run_id, got.committed_updates) == (RUN_ID, 2)
    assert got.metrics[-1]["val/reward/mean"] == pytest.approx(0.75)
    plan = _plan_like_unchecked(adapter, nemo_golden({"objective": "grpo"}), "0.7.0")
    status, checks, artifacts = evaluate(_budget(plan, 2), Exit(0), got, tmp_path)
    assert status == "succeeded", checks
    assert {a.step for a in artifacts} == {1, 2}
    other = adapter.collect(tmp_path, LaunchContext("20990101T000000Z-ffffffff", DIGEST,
                                                    "0.7.0", ctx.dialect))
    assert other.run_id is None  # somebody else's run name is not this run


def _plan_like_unchecked(adapter, doc, version):
    """A plan document for checks only: NeMo RL refuses python rewards before launch."""
    from stateset_backend.plan.launch_plan import LaunchPlan

    spec = parse_spec(doc)
    return LaunchPlan.model_construct(run_id=RUN_ID, experiment_digest=DIGEST,
                                      spec=spec.model_dump(mode="json"))


def test_native_counts_a_sealed_checkpoint_its_progress_record_has_not_caught_up_with(tmp_path):
    """Killed between sealing update 2's checkpoint and rewriting its progress record, the
    attempt has committed update 2 (its records were flushed before the save), and that is
    the update a resume starts after: the result must not say 1."""
    from stateset_backend.adapters.native.adapter import NativeAdapter
    from stateset_backend.native import layout

    (tmp_path / layout.RUN_INFO_FILE).write_text(json.dumps(
        {"engine": "native", "run_id": RUN_ID, "experiment_digest": DIGEST,
         "committed_updates": 1, "resumed_from": None}))
    for update, sealed in ((1, True), (2, True), (3, False)):
        folder = tmp_path / layout.CHECKPOINTS_DIR / f"{layout.CHECKPOINT_PREFIX}{update:06d}"
        folder.mkdir(parents=True)
        if sealed:
            (folder / layout.MANIFEST).write_text("{}")
    adapter = NativeAdapter()
    assert adapter.collect(tmp_path, _ctx(adapter, "0.1.0")).committed_updates == 2
    (tmp_path / layout.CHECKPOINTS_DIR / "update-000002" / layout.MANIFEST).unlink()
    assert adapter.collect(tmp_path, _ctx(adapter, "0.1.0")).committed_updates == 1
