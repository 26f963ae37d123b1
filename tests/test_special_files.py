"""Every file a spec names is a regular file before anything reads it, and what the hub reads
whole is bounded: a data split, reward or environment file that is a FIFO, a link to a device,
a socket or a folder, a model folder holding one, or a file over its stated limit is refused by
``validate``, ``check``, ``plan`` and ``run`` with exit 2 on one line naming the field, where
before a FIFO blocked them forever and ``/dev/zero`` was read until memory ran out.

A regression here would hang rather than fail, so every test runs under an alarm."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stateset_backend.cli import main
from stateset_backend.common.jsonio import MAX_JSON_BYTES
from stateset_backend.common.reading import NotRegularFile
from stateset_backend.spec.content import sha256_file
from stateset_backend.spec.inputs import MAX_SOURCE_BYTES, MAX_WHOLE_SPLIT_BYTES

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


class Hung(Exception):
    pass


@pytest.fixture(autouse=True)
def alarm() -> Iterator[None]:
    def hung(signum: int, frame: Any) -> None:
        raise Hung("the command blocked on a file a spec names")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def routing(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """The README's job beside a copy of its data and reward."""
    shutil.copytree(EXAMPLES / "support-routing", tmp_path / "support-routing")
    return tmp_path, json.loads((EXAMPLES / "support-routing.json").read_text())


def _cli(capsys, *args: Any) -> tuple[int, str]:
    code = main([str(a) for a in args])
    _, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) <= 1 and "Traceback" not in err, err
    return code, lines[0] if lines else ""


def _spec(folder: Path, doc: dict[str, Any]) -> Path:
    path = folder / "spec.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def _every_command(capsys, spec: Path, field: str, fragment: str) -> None:
    commands = [("validate",), ("check", "--engine", "native"),
                ("plan", "--engine", "native", "-o", spec.parent / "p.json")]
    for command in commands:
        code, line = _cli(capsys, *command, spec)
        assert code == 2, (command, line)
        assert field in line and fragment in line, (command, line)
    assert not (spec.parent / "p.json").exists()


def _replace(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "dir":
        path.mkdir()
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.close()


FRAGMENTS = {"fifo": "is a FIFO (named pipe), not a regular file",
             "zero": "is a character device, not a regular file",
             "socket": "is a socket, not a regular file",
             "dir": "is a directory, not a file"}


@pytest.mark.parametrize("kind", sorted(FRAGMENTS))
def test_a_data_split_that_is_not_a_regular_file_is_refused(capsys, routing, kind):
    folder, doc = routing
    _replace(folder / "support-routing" / "data" / "train.jsonl", kind)
    _every_command(capsys, _spec(folder, doc), "data.train.uri", FRAGMENTS[kind])


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_a_reward_file_that_is_not_a_regular_file_is_refused(capsys, routing, kind):
    folder, doc = routing
    _replace(folder / "support-routing" / "reward.py", kind)
    _every_command(capsys, _spec(folder, doc), "reward.entrypoint", FRAGMENTS[kind])


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_run_refuses_a_reward_that_became_a_fifo_after_the_plan(capsys, routing, kind,
                                                                 tmp_path):
    folder, doc = routing
    plan = folder / "plan.json"
    code, line = _cli(capsys, "plan", "--engine", "native", _spec(folder, doc), "-o", plan)
    assert code == 0, line
    _replace(folder / "support-routing" / "reward.py", kind)
    code, line = _cli(capsys, "run", "--runs-dir", tmp_path / "runs", plan)
    assert code == 2 and "reward.entrypoint" in line and FRAGMENTS[kind] in line, line


def test_a_model_folder_holding_a_fifo_is_refused(capsys, tmp_path):
    shutil.copytree(EXAMPLES / "external" / "data", tmp_path / "data")
    doc = json.loads((EXAMPLES / "external" / "grpo.json").read_text())
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    os.mkfifo(model / "model.safetensors")
    doc["model"] = {"path": str(model), "dtype": "bfloat16"}
    spec = _spec(tmp_path, doc)
    for command in (("validate",), ("plan", "--engine", "verl", "--engine-version", "0.9.1",
                                    "-o", tmp_path / "p.json")):
        code, line = _cli(capsys, *command, spec)
        assert code == 2 and "model.path:" in line and "model.safetensors" in line and \
            "FIFO" in line, line


def test_a_file_over_what_the_hub_reads_whole_is_refused(capsys, routing):
    folder, doc = routing
    reward = folder / "support-routing" / "reward.py"
    with reward.open("r+b") as file:  # sparse: no disk is used
        file.truncate(MAX_SOURCE_BYTES + 1)
    code, line = _cli(capsys, "validate", _spec(folder, doc))
    assert code == 2 and "reward.entrypoint" in line and \
        f"over the {MAX_SOURCE_BYTES:,} bytes" in line, line


def test_a_json_split_over_its_limit_is_refused(capsys, tmp_path):
    shutil.copytree(EXAMPLES / "external" / "data", tmp_path / "data")
    doc = json.loads((EXAMPLES / "external" / "grpo.json").read_text())
    split = tmp_path / "data" / "huge.json"
    with split.open("wb") as file:
        file.truncate(MAX_WHOLE_SPLIT_BYTES + 1)
    doc["data"]["train"]["uri"] = "data/huge.json"
    code, line = _cli(capsys, "validate", _spec(tmp_path, doc))
    assert code == 2 and "data.train.uri" in line and "over the" in line, line


@pytest.mark.parametrize("kind", ["fifo", "zero", "huge"])
def test_a_spec_file_that_is_not_a_regular_file_is_refused(capsys, tmp_path, kind):
    spec = tmp_path / "spec.json"
    if kind == "fifo":
        os.mkfifo(spec)
    elif kind == "zero":
        spec.symlink_to("/dev/zero")
    else:
        with spec.open("wb") as file:
            file.truncate(MAX_JSON_BYTES + 1)
    code, line = _cli(capsys, "validate", spec)
    assert code == 2 and str(spec) in line and "cannot read" in line, line


def test_hashing_reads_a_file_no_further_than_its_size_when_opened(tmp_path):
    """A device never ends: hashing one is refused at once, not read forever."""
    link = tmp_path / "zero"
    link.symlink_to("/dev/zero")
    with pytest.raises(NotRegularFile, match="character device"):
        sha256_file(link)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFile, match="FIFO"):
        sha256_file(fifo)
