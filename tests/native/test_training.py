"""The native engine trains for real: end to end through the CLI, and its parts in process."""

from __future__ import annotations

import json
import math

import pytest
import torch

from stateset_backend.native import checkpoint
from stateset_backend.native.learner import NonFiniteUpdate, update

CANONICAL = {"reward/mean", "reward/std", "loss/policy", "kl", "entropy", "clip_fraction",
             "grad_norm", "lr", "response_length/mean", "tokens_per_second"}


def _attempt(runs):
    (result,) = runs.glob("*/result.json")
    doc = json.loads(result.read_text())
    return doc, result.parent / "attempts" / str(doc["attempt"])


def test_run_native_end_to_end(cli, tiny, spec_file, tmp_path):
    runs = tmp_path / "runs"
    proc = cli("run", "--engine", "native", "--runs-dir", runs, spec_file(tiny()))
    assert proc.returncode == 0, proc.stderr
    result, attempt = _attempt(runs)
    assert result["status"] == "succeeded" and result["committed_updates"] == 6
    rows = [json.loads(x) for x in (attempt / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in updates] == [1, 2, 3, 4, 5, 6]
    assert all(set(r) >= CANONICAL for r in updates)
    assert [r["step"] for r in rows if "val/reward/mean" in r] == [0, 3, 6]
    assert all(math.isfinite(v) for r in rows for v in r.values())
    receipts = [json.loads(x) for x in (attempt / "receipts.jsonl").read_text().splitlines()]
    assert [r["update"] for r in receipts] == [1, 2, 3, 4, 5, 6]
    assert [r["policy_version"] for r in receipts] == [0, 1, 2, 3, 4, 5]
    assert all(r["samples"] == 16 and len(r["groups"]) == 4 for r in receipts)
    assert sorted(p.name for p in (attempt / "checkpoints").iterdir()) == [
        "update-000002", "update-000004", "update-000006"]
    kinds = {a["kind"] for a in result["artifacts"]}
    assert kinds == {"checkpoint", "final"}
    assert "update 6/6" in proc.stderr  # progress reached the user


def test_the_test_split_is_never_touched(tiny, make_trainer):
    doc = tiny(**{"budget.total_updates": 2})
    doc["data"]["test"]["sha256"] = "0" * 64  # the engine would fail loudly if it read it
    trainer = make_trainer(doc)
    trainer.train()
    assert trainer.update_count == 2


def test_changed_training_data_is_refused_before_launch(cli, tiny, spec_file, tmp_path):
    doc = tiny()
    doc["data"]["train"]["sha256"] = "0" * 64
    proc = cli("run", "--engine", "native", "--runs-dir", tmp_path / "runs", spec_file(doc))
    assert proc.returncode == 2
    assert "data.train:" in proc.stderr and "the file changed" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_the_engine_itself_refuses_changed_data(tiny, make_trainer):
    from stateset_backend.native.data import DataError

    doc = tiny()
    doc["data"]["train"]["sha256"] = "0" * 64
    with pytest.raises(DataError, match="the data changed"):
        make_trainer(doc)


def test_a_nan_reward_fails_the_run(cli, tiny, spec_file, tmp_path):
    from stateset_backend.spec.content import sha256_file

    reward = tmp_path / "nan_reward.py"
    reward.write_text("def score(prompt, response, answer):\n    return float('nan')\n")
    doc = tiny()
    doc["reward"] = {"kind": "python", "entrypoint": f"{reward}:score",
                     "sha256": sha256_file(reward)}
    proc = cli("run", "--engine", "native", "--runs-dir", tmp_path / "runs", spec_file(doc))
    assert proc.returncode == 4 and "reward returned nan" in proc.stderr


def _weights(trainer):
    return checkpoint.trainable_state(trainer.model)


def test_exact_continuation_is_bitwise_identical(tiny, make_trainer):
    doc = tiny()
    straight = make_trainer(doc, "straight")
    straight.train()
    interrupted = make_trainer(doc, "interrupted")
    interrupted.train(until=2)
    assert interrupted.update_count == 2 and not interrupted.out.final.exists()
    resumed = make_trainer(doc, "resumed")
    resumed.resume(interrupted.out.checkpoints / "update-000002")
    resumed.train()
    a, b = _weights(straight), _weights(resumed)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (straight.out.metrics.read_text().splitlines()[-1].split('"tokens_per_second"')[0]
            == resumed.out.metrics.read_text().splitlines()[-1].split('"tokens_per_second"')[0])


def test_resume_refuses_another_experiments_checkpoint(tiny, make_trainer):
    first = make_trainer(tiny(), "first")
    first.train(until=2)
    other = make_trainer(tiny(seed=99), "other")
    with pytest.raises(checkpoint.CheckpointError, match="belongs to experiment"):
        other.resume(first.out.checkpoints / "update-000002")


def test_resume_refuses_a_corrupted_checkpoint(tiny, make_trainer):
    first = make_trainer(tiny(), "first")
    first.train(until=2)
    ckpt = first.out.checkpoints / "update-000002"
    with open(ckpt / "optimizer.pt", "r+b") as fh:
        fh.seek(100)
        fh.write(b"\x00\x01")
    again = make_trainer(tiny(), "again")
    with pytest.raises(checkpoint.CheckpointError, match="does not match the manifest"):
        again.resume(ckpt)


def test_an_interrupted_checkpoint_write_leaves_nothing_that_looks_complete(
        tiny, make_trainer, monkeypatch):
    trainer = make_trainer(tiny(**{"checkpoint.every": None}), "crash")
    trainer.train(until=1)
    real = checkpoint._fsync_write

    def crash_on_rng(path, data):
        if path.name == "rng.pt":
            raise OSError("disk full")
        real(path, data)

    monkeypatch.setattr(checkpoint, "_fsync_write", crash_on_rng)
    with pytest.raises(OSError, match="disk full"):
        trainer.save_checkpoint()
    assert checkpoint.complete_checkpoints(trainer.out.checkpoints) == []
    assert list(trainer.out.checkpoints.iterdir()) == []


def test_a_non_finite_loss_is_never_applied(tiny, make_trainer):
    trainer = make_trainer(tiny(), "nan")
    batch, _, _ = trainer.collect_batch()
    assert batch is not None
    before = {k: v.clone() for k, v in _weights(trainer).items()}
    advantages = torch.full((batch.size,), float("nan"))
    with pytest.raises(NonFiniteUpdate, match="not applied"):
        update(trainer.model, trainer.optimizer, trainer.scheduler, batch, advantages, None,
               trainer.learner_cfg, trainer.generator)
    after = _weights(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("objective", ["dr_grpo", "dapo", "gspo", "cispo", "rloo",
                                       "reinforce_pp"])
def test_every_objective_trains(tiny, make_trainer, objective):
    doc = tiny(**{"budget.total_updates": 2, "checkpoint.every": None,
                  "evaluation.every": None})
    doc["algorithm"] = {"objective": objective, "group_size": 4}
    if objective == "dapo":
        doc["algorithm"]["overlong"] = {"buffer_tokens": 1, "penalty": 0.5}
    if objective == "rloo":
        doc["algorithm"]["kl"] = {"coef": 0.01, "estimator": "k1", "placement": "reward"}
    trainer = make_trainer(doc, objective)
    trainer.train()
    rows = [json.loads(x) for x in trainer.out.metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(v) for r in rows for v in r.values())


def test_lora_trains_and_saves_only_adapters(tiny, make_trainer):
    doc = tiny(**{"budget.total_updates": 2, "checkpoint.every": 2, "evaluation.every": None})
    doc["model"]["lora"] = {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    trainer = make_trainer(doc, "lora")
    base_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()
                   if not p.requires_grad}
    trainer.train()
    saved = checkpoint.trainable_state(trainer.model)
    assert saved and all("lora_" in name for name in saved)
    assert all(torch.equal(p, base_before[n]) for n, p in trainer.model.named_parameters()
               if n in base_before)
    assert (trainer.out.final / "adapter_model.safetensors").is_file()


def test_trains_a_local_hugging_face_directory_pinned_by_content(tiny, make_trainer, tmp_path):
    from stateset_backend.native.model import ModelError
    from stateset_backend.spec.content import directory_digest

    seed_model = make_trainer(tiny(), "seed")
    local = tmp_path / "local-model"
    seed_model.model.save_pretrained(local)
    seed_model.tokenizer.save_pretrained(local)
    doc = tiny(**{"budget.total_updates": 1, "checkpoint.every": None,
                  "evaluation.every": None})
    doc["model"] = {"path": str(local), "revision": directory_digest(local), "dtype": "float32"}
    trainer = make_trainer(doc, "local")
    assert torch.equal(next(iter(_weights(trainer).values())),
                       next(iter(_weights(seed_model).values())))
    trainer.train()
    doc["model"]["revision"] = "sha256:" + "0" * 64
    with pytest.raises(ModelError, match="content digest"):
        make_trainer(doc, "tampered")


def test_run_prints_a_summary(cli, tiny, spec_file, tmp_path):
    proc = cli("run", "--engine", "native", "--runs-dir", tmp_path / "runs", "--quiet",
               spec_file(tiny(**{"budget.total_updates": 3})))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "3/3 updates committed" in lines[0]
    assert any(line.strip().startswith("reward/mean") for line in lines)
    # a metric that moved reads first -> last (the KL leaves 0 after the first step)
    assert any(line.strip().startswith("kl ") and "->" in line for line in lines)
    assert any(line.strip().startswith("val/reward/mean") for line in lines)
    assert any(line.strip().startswith("result: ") for line in lines)
    # it ends with what to do next, naming this run and its runs folder
    run_id = lines[0].split()[1]
    assert lines[lines.index("next:") + 1].strip() == \
        f"stateset-backend runs show {run_id} --runs-dir {tmp_path / 'runs'}"
