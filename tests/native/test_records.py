"""The background record writer: records land in order, are on disk before a checkpoint is
declared and at the end, and a failed write fails the run."""

from __future__ import annotations

import json
import threading

import pytest

from stateset_backend.native import records
from stateset_backend.native.records import RecordWriter


def test_jobs_run_in_submission_order_off_the_calling_thread():
    writer = RecordWriter()
    seen: list[tuple[int, str]] = []
    for n in range(200):
        writer.submit(lambda n=n: seen.append((n, threading.current_thread().name)))
    writer.flush()
    assert [n for n, _ in seen] == list(range(200))
    assert {name for _, name in seen} == {"records"}
    writer.close()


def test_flush_waits_for_a_slow_job(tmp_path):
    writer = RecordWriter()
    release = threading.Event()
    path = tmp_path / "rows.jsonl"

    def slow() -> None:
        release.wait()
        records.append_line(path, {"step": 1})

    writer.submit(slow)
    assert not path.exists()  # the training thread did not wait for it
    threading.Timer(0.05, release.set).start()
    writer.flush()
    assert json.loads(path.read_text()) == {"step": 1}
    writer.close()


def test_a_failed_job_is_raised_in_the_caller_and_nothing_after_it_is_written(tmp_path):
    writer = RecordWriter()
    path = tmp_path / "rows.jsonl"
    writer.submit(lambda: records.append_line(path, {"step": 1}))
    writer.submit(lambda: records.append_line(tmp_path / "missing" / "x.jsonl", {"step": 2}))
    writer.submit(lambda: records.append_line(path, {"step": 3}))
    with pytest.raises(FileNotFoundError):
        writer.flush()
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1]
    # raised once; what is submitted after it is written again
    writer.submit(lambda: records.append_line(path, {"step": 4}))
    writer.close()
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 4]


def test_a_failure_surfaces_at_the_next_submit_or_close():
    writer = RecordWriter()

    def fail() -> None:
        raise OSError("disk full")

    writer.submit(fail)
    with pytest.raises(OSError, match="disk full"):
        for _ in range(10_000):  # the thread fails while we go on submitting
            writer.submit(lambda: None)
            threading.Event().wait(0.001)
    writer.close()

    writer.submit(fail)
    with pytest.raises(OSError, match="disk full"):
        writer.close()


def test_close_writes_everything_and_a_later_job_starts_a_new_thread(tmp_path):
    writer = RecordWriter()
    path = tmp_path / "rows.jsonl"
    for step in range(50):
        writer.submit(lambda step=step: records.append_line(path, {"step": step}))
    writer.close()
    assert len(path.read_text().splitlines()) == 50
    writer.submit(lambda: records.append_line(path, {"step": 50}))
    writer.close()
    assert json.loads(path.read_text().splitlines()[-1]) == {"step": 50}


def test_a_checkpoint_is_declared_after_the_records_before_it(tiny, make_trainer, monkeypatch):
    from stateset_backend.native import checkpoint

    trainer = make_trainer(tiny(**{"budget.total_updates": 4, "checkpoint.every": 2,
                                   "evaluation.every": None}))
    seen: dict[int, list[int]] = {}
    real = checkpoint.save

    def save(*args, **kwargs):
        update = kwargs["state"].update
        seen[update] = [json.loads(x)["step"] for x in
                        trainer.out.metrics.read_text().splitlines()]
        assert (trainer.out.trajectories / f"update-{update:06d}.jsonl").is_file()
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint, "save", save)
    trainer.train()
    assert seen == {2: [1, 2], 4: [1, 2, 3, 4]}
    info = json.loads((trainer.out.root / "run_info.json").read_text())
    assert info["committed_updates"] == 4
    receipts = trainer.out.receipts.read_text().splitlines()
    assert [json.loads(x)["update"] for x in receipts] == [1, 2, 3, 4]


def test_a_failed_record_write_fails_the_run(tiny, make_trainer, monkeypatch):
    trainer = make_trainer(tiny(**{"budget.total_updates": 3, "checkpoint.every": None,
                                   "evaluation.every": None}))
    real = records.write_lines

    def full_disk(path, rows):
        if path.name == "update-000002.jsonl":
            raise OSError("No space left on device")
        real(path, rows)

    monkeypatch.setattr("stateset_backend.native.trainer.write_lines", full_disk)
    with pytest.raises(OSError, match="No space left"):
        trainer.train()
    assert not (trainer.out.trajectories / "update-000003.jsonl").exists()
    info = json.loads((trainer.out.root / "run_info.json").read_text())
    assert info["committed_updates"] < 3  # the end was never declared
