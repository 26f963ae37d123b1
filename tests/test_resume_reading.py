"""The kit's own reading of where each engine resumes from (conformance.resumes), held to
the engines' rules: the mode or flag that switches loading on, the folder searched, the tag
file read; anything else is a fresh start."""

from __future__ import annotations

from pathlib import Path

from stateset_backend.conformance.resumes import native, nemo_rl, openrlhf, verl


def test_verl_loads_by_its_resume_mode(tmp_path: Path):
    ckpt = tmp_path / "checkpoints" / "global_step_3"
    ckpt.mkdir(parents=True)
    assert verl([], {"trainer.resume_mode": "disable",
                     "trainer.resume_from_path": str(ckpt)}, tmp_path) is None
    assert verl([], {"trainer.resume_mode": "resume_path",
                     "trainer.resume_from_path": str(ckpt)}, tmp_path) == ckpt
    # verl asserts a global_step_ folder: another path is no resume
    assert verl([], {"trainer.resume_mode": "resume_path",
                     "trainer.resume_from_path": str(tmp_path)}, tmp_path) is None
    auto = {"trainer.resume_mode": "auto", "trainer.default_local_dir": "{run_dir}/checkpoints"}
    assert verl([], auto, tmp_path) is None  # no tracker file: from scratch
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("3")
    assert verl([], auto, tmp_path) == ckpt
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("4")
    assert verl([], auto, tmp_path) is None  # the tracker names a folder that is not there


def test_openrlhf_loads_only_with_its_flag_and_a_latest_tag(tmp_path: Path):
    actor = tmp_path / "ckpt" / "_actor"
    (actor / "global_step3").mkdir(parents=True)
    dotted = {"--ckpt.path": str(tmp_path / "ckpt"), "--ckpt.load_enable": True}
    assert openrlhf([], dotted, tmp_path) is None  # DeepSpeed finds no latest tag
    (actor / "latest").write_text("global_step3")
    assert openrlhf([], dotted, tmp_path) == actor / "global_step3"
    assert openrlhf([], {**dotted, "--ckpt.load_enable": False}, tmp_path) is None
    flat = {"--ckpt_path": str(tmp_path / "ckpt"), "--load_checkpoint": True}
    assert openrlhf([], flat, tmp_path) == actor / "global_step3"


def test_nemo_rl_loads_its_newest_step_folder(tmp_path: Path):
    for name in ("step_2", "step_10", "step_x"):
        (tmp_path / "ckpt" / name).mkdir(parents=True)
    on = {"checkpointing.enabled": True, "checkpointing.checkpoint_dir": "ckpt"}
    assert nemo_rl([], on, tmp_path) == tmp_path / "ckpt" / "step_10"
    # setup looks for the newest checkpoint whether or not saving is on
    assert nemo_rl([], {**on, "checkpointing.enabled": False}, tmp_path) == \
        tmp_path / "ckpt" / "step_10"
    assert nemo_rl([], {**on, "checkpointing.checkpoint_dir": "none"}, tmp_path) is None


def test_the_native_engine_reads_its_own_command_line(tmp_path: Path):
    argv = ["python", "-m", "stateset_backend.native", "--config", "c.json", "--output", "."]
    assert native(argv, {}, tmp_path) is None
    assert native([*argv, "--resume-from", "ck/update-3"], {}, tmp_path) == \
        tmp_path / "ck" / "update-3"
