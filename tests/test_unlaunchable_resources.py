"""A resource setting no machine could launch is refused before launch (exit 3), on every
engine that places its training processes on GPUs: verl renders ``trainer.n_gpus_per_node=0``
as an empty placement group, OpenRLHF as an actor group of world size 0, NeMo RL as a virtual
cluster without a bundle. Each would cost a queue wait to learn; the native engine trains on
the CPU and keeps the spec's default of 0."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from stateset_backend.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ENGINES = {"verl": "0.9.1", "openrlhf": "0.11.2", "nemo-rl": "0.7.0"}


@pytest.fixture
def grpo(tmp_path: Path) -> dict[str, Any]:
    shutil.copytree(EXAMPLES / "external" / "data", tmp_path / "data")
    return json.loads((EXAMPLES / "external" / "grpo.json").read_text())


def _plan(capsys, tmp_path: Path, doc: dict[str, Any], engine: str,
          version: str | None) -> tuple[int, str]:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(doc), encoding="utf-8")
    pinned = ["--engine-version", version] if version else []
    code = main(["plan", "--engine", engine, *pinned, str(spec), "-o",
                 str(tmp_path / "p.json")])
    _, err = capsys.readouterr()
    return code, err.strip()


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_no_gpu_per_node_is_refused_before_launch(capsys, tmp_path, grpo, engine):
    grpo["resources"] = {"nodes": 1, "gpus_per_node": 0}
    code, line = _plan(capsys, tmp_path, grpo, engine, ENGINES[engine])
    assert code == 3, line
    assert "resources.gpus_per_node" in line and "placement group empty" in line, line
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_the_spec_default_is_refused_too(capsys, tmp_path, grpo, engine):
    """The defect as found: resources left at the spec's default rendered n_gpus_per_node=0."""
    grpo.pop("resources", None)
    code, line = _plan(capsys, tmp_path, grpo, engine, ENGINES[engine])
    assert code == 3 and "resources.gpus_per_node 0" in line, line


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_one_gpu_per_node_plans(capsys, tmp_path, grpo, engine):
    grpo["resources"] = {"nodes": 1, "gpus_per_node": 1}
    code, line = _plan(capsys, tmp_path, grpo, engine, ENGINES[engine])
    assert code == 0, line


def test_the_native_engine_trains_without_a_gpu(capsys, tmp_path):
    shutil.copytree(EXAMPLES / "support-routing", tmp_path / "support-routing")
    doc = json.loads((EXAMPLES / "support-routing.json").read_text())
    assert doc.get("resources", {}).get("gpus_per_node", 0) == 0
    code, line = _plan(capsys, tmp_path, doc, "native", None)
    assert code == 0, line
