"""The runs directory failing under a run: one line and a documented exit code, and no attempt
folder left without a result.json saying what happened."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from stateset_backend import __version__
from stateset_backend.adapters.native.adapter import NativeAdapter
from stateset_backend.common.errors import EngineFailed, InvalidInput
from stateset_backend.engines.registry import AdapterEntry, Registry
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.runs import runner, store
from stateset_backend.runs.store import RunStore
from stateset_backend.spec.files import load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def planned():
    entry = AdapterEntry(NativeAdapter(), "builtin", "stateset-backend", __version__)
    spec = load_spec(EXAMPLES / "support-routing.json")
    plan = make_plan(spec, entry, __version__, base_dir=EXAMPLES)
    return plan, Registry(adapters={"native": entry})


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_while_preparing_ends_in_a_failed_result(planned, tmp_path, monkeypatch):
    plan, registry = planned
    monkeypatch.setattr(runner, "atomic_write_bytes", _disk_full)
    with pytest.raises(EngineFailed, match="No space left on device") as err:
        runner.run_plan(plan, registry, RunStore(tmp_path / "runs"))
    assert err.value.exit_code == 4
    attempt = tmp_path / "runs" / plan.run_id / "attempts" / "1"
    result = json.loads((attempt / "result.json").read_text())
    assert result["status"] == "failed"
    assert result["checks"] == [{"name": "store", "ok": False, "detail":
                                 "could not write into the runs directory: No space left on "
                                 "device"}]


def test_when_not_even_the_result_fits_the_attempt_is_removed(planned, tmp_path, monkeypatch):
    plan, registry = planned
    real = store.atomic_write_json

    def plan_only(path, doc):
        if Path(path).name == "result.json":
            _disk_full()
        real(path, doc)

    monkeypatch.setattr(runner, "atomic_write_bytes", _disk_full)
    monkeypatch.setattr(store, "atomic_write_json", plan_only)
    with pytest.raises(EngineFailed, match="attempt removed"):
        runner.run_plan(plan, registry, RunStore(tmp_path / "runs"))
    assert not (tmp_path / "runs" / plan.run_id / "attempts" / "1").exists()


def test_a_runs_directory_below_a_file_is_invalid_input(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidInput, match="exists and is not a directory"):
        RunStore(tmp_path / "file" / "runs")


def test_a_runs_directory_that_cannot_be_created_is_invalid_input(planned, tmp_path,
                                                                  monkeypatch):
    plan, registry = planned

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(InvalidInput, match="cannot record the run there: Read-only"):
        runner.run_plan(plan, registry, RunStore(tmp_path / "runs"))


def test_atomic_writes_get_the_mode_of_a_plain_write(tmp_path):
    """A shared run store must stay readable to the team: not mkstemp's 0600."""
    import os

    from stateset_backend.common.jsonio import atomic_write_json

    previous = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "plan.json", {"a": 1})
        plain = tmp_path / "plain.json"
        plain.write_text("{}")
    finally:
        os.umask(previous)
    assert (tmp_path / "plan.json").stat().st_mode & 0o777 == plain.stat().st_mode & 0o777 \
        == 0o644


def test_an_output_that_is_not_a_regular_file_stays_what_it_was(tmp_path):
    """``-o /dev/null`` renamed over would leave a plain file where the device was, for every
    process on the machine: a named pipe stands in for the device here and must still be a
    pipe, with the plan read from it; a symlink stays a link and its file gets the plan."""
    import os
    import stat
    import threading

    from stateset_backend.common.jsonio import atomic_write_json

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(pipe.read_bytes()), daemon=True)
    reader.start()
    atomic_write_json(pipe, {"a": 1})
    reader.join(timeout=10)
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode)
    assert received == [b'{\n  "a": 1\n}\n']

    real, link = tmp_path / "real.json", tmp_path / "link.json"
    real.write_text("{}")
    link.symlink_to(real)
    atomic_write_json(link, {"b": 2})
    assert link.is_symlink() and json.loads(real.read_text()) == {"b": 2}
    with pytest.raises(IsADirectoryError):
        atomic_write_json(tmp_path, {"c": 3})


def test_a_relative_runs_dir_is_made_absolute(tmp_path, monkeypatch):
    """Engines run in their attempt folder: a relative store path would make every resume
    point at a checkpoint that is not there."""
    monkeypatch.chdir(tmp_path)
    assert store.RunStore(Path("runs")).root == tmp_path.resolve() / "runs"
