"""RL from an SFT checkpoint: the link is identity, the hub refuses a bad link before launch
(exit 2; a damaged checkpoint exit 6), the RL run starts from exactly the SFT weights, and the
external engines without them (verl, OpenRLHF, NeMo RL) refuse both SFT and the link."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from stateset_backend.native import checkpoint
from stateset_backend.runs import lineage
from stateset_backend.spec.content import sha256_file
from stateset_backend.spec.digest import experiment_digest, identity_document
from stateset_backend.spec.files import parse_spec

from .conftest import EXAMPLES, tiny_spec

# the tests share what the module-scoped fixtures build: one pytest-xdist worker runs them all
pytestmark = pytest.mark.xdist_group(__name__)

FROM = {"run_id": "20260101T000000Z-00000000", "checkpoint": "update-000002",
        "sha256": "e" * 64}
# TRL runs both (SFTTrainer, and a model loaded from the run): tests/test_trl_sft.py
EXTERNAL = [("verl", "0.9.1"), ("openrlhf", "0.11.2"), ("nemo-rl", "0.7.0")]


def _sft(tiny):
    doc = tiny()
    doc["algorithm"] = {"objective": "sft"}
    doc["budget"] = {"total_updates": 2, "prompts_per_update": 8}
    doc["checkpoint"] = {"every": 2, "keep": None}
    doc["evaluation"] = {"every": None, "select_by": None}
    return doc


def _rl_from(tiny, ref):
    doc = tiny()
    doc["model"]["from_run"] = ref
    doc["budget"] = {"total_updates": 1, "prompts_per_update": 4}
    doc["evaluation"] = {"every": None, "select_by": None}
    doc["checkpoint"] = {"every": None, "keep": None}
    return doc


def test_the_link_is_part_of_the_experiment(tiny):
    plain = parse_spec(tiny())
    linked = parse_spec(_rl_from(tiny, FROM))
    other = parse_spec(_rl_from(tiny, {**FROM, "sha256": "f" * 64}))
    assert len({experiment_digest(s) for s in (plain, linked, other)}) == 3
    # a spec without the link keeps the digest it had before the link existed
    assert "from_run" not in identity_document(plain)["experiment"]["model"]
    assert "sft" not in identity_document(plain)["experiment"]["algorithm"]


@pytest.mark.parametrize("engine, version", EXTERNAL)
@pytest.mark.parametrize("what", ["sft", "from_run"])
def test_external_engines_refuse_sft_and_the_link(cli, tiny, spec_file, tmp_path, engine,
                                                 version, what):
    doc = _sft(tiny) if what == "sft" else _rl_from(tiny, FROM)
    proc = cli("plan", "--engine", engine, "--engine-version", version, spec_file(doc),
               "-o", tmp_path / "plan.json")
    assert proc.returncode == 3, proc.stderr
    assert ("objective:sft" if what == "sft" else "init:from_run") in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("engine, version", EXTERNAL)
def test_external_rules_refuse_the_new_leaves(engine, version):
    """Past the contract check too: every new leaf has a rule, and it refuses."""
    from stateset_backend.conformance.specs import FULL_SFT
    from stateset_backend.contracts.loader import parse_version
    from stateset_backend.engines.registry import build_registry
    from stateset_backend.translate.rules import explain_rows

    adapter = build_registry().get(engine).adapter
    dialect = adapter.contract.dialect(parse_version(version))
    doc = copy.deepcopy(FULL_SFT)
    doc["resources"] = {"nodes": 1, "gpus_per_node": 1}
    rows = {r.path: r for r in explain_rows(parse_spec(doc), adapter.rules(dialect), dialect,
                                            engine)}
    for path in ("algorithm.sft.layout", "model.from_run.run_id", "model.from_run.sha256"):
        assert rows[path].state == "refused", (path, rows[path])
    assert rows["algorithm.group_size"].state == "inert"


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """One SFT run in a run store, through the CLI."""
    root = tmp_path_factory.mktemp("sft-store")
    spec = root / "sft.json"
    spec.write_text(json.dumps(_sft(tiny_spec)))
    proc = subprocess.run([sys.executable, "-m", "stateset_backend", "run", "--engine", "native",
                           "--runs-dir", str(root / "runs"), "--json", str(spec)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout)["run_id"]
    ckpt = root / "runs" / run_id / "attempts" / "1" / "checkpoints" / "update-000002"
    return root / "runs", run_id, ckpt


@pytest.mark.slow
def test_runs_from_run_names_the_checkpoint_by_its_manifest(cli, sft_run):
    runs, run_id, ckpt = sft_run
    proc = cli("runs", "from-run", run_id, "--runs-dir", runs, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"run_id": run_id, "checkpoint": "update-000002",
                                       "sha256": sha256_file(ckpt / "manifest.json")}


@pytest.mark.slow
@pytest.mark.parametrize("change, code, words", [
    ({"run_id": "20990101T000000Z-00000000"}, 2, "is not in"),
    ({"checkpoint": "update-000009"}, 2, "has no checkpoint update-000009"),
    ({"sha256": "0" * 64}, 2, "model.from_run.sha256"),
])
def test_a_bad_link_is_refused_before_launch(cli, tiny, spec_file, sft_run, change, code,
                                             words):
    runs, run_id, ckpt = sft_run
    ref = {"run_id": run_id, "checkpoint": "update-000002",
           "sha256": sha256_file(ckpt / "manifest.json"), **change}
    before = sorted(p.name for p in runs.iterdir())
    proc = cli("run", "--engine", "native", "--runs-dir", runs, spec_file(_rl_from(tiny, ref)))
    assert proc.returncode == code, proc.stderr
    assert words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in runs.iterdir()) == before  # nothing launched


@pytest.mark.slow
def test_the_rl_run_starts_from_the_sft_weights(cli, tiny, spec_file, sft_run, tmp_path):
    runs, run_id, ckpt = sft_run
    ref = {"run_id": run_id, "checkpoint": "update-000002",
           "sha256": sha256_file(ckpt / "manifest.json")}
    doc = _rl_from(tiny, ref)
    proc = cli("run", "--engine", "native", "--runs-dir", runs, "--json", spec_file(doc))
    assert proc.returncode == 0, proc.stderr
    attempt = runs / json.loads(proc.stdout)["run_id"] / "attempts" / "1"
    assert sha256_file(attempt / lineage.STAGED_CHECKPOINT / "manifest.json") == ref["sha256"]
    # in process: the policy and its KL reference are the SFT weights before any update
    from stateset_backend.native.trainer import RunSettings, Trainer

    spec = parse_spec(doc)
    out = tmp_path / "rl"
    lineage.stage(ckpt, out)
    trainer = Trainer(RunSettings("r", experiment_digest(spec), spec, EXAMPLES), out)
    sft = load_file(str(ckpt / "weights.safetensors"))
    mine = checkpoint.trainable_state(trainer.model)
    assert mine.keys() == sft.keys() and all(torch.equal(mine[k], sft[k]) for k in sft)
    reference = trainer.reference.state_dict()
    assert all(torch.equal(reference[k], sft[k]) for k in sft)
    fresh = Trainer(RunSettings("r", experiment_digest(parse_spec(tiny())), parse_spec(tiny()),
                                EXAMPLES), tmp_path / "fresh")
    assert not all(torch.equal(checkpoint.trainable_state(fresh.model)[k], sft[k]) for k in sft)


@pytest.mark.slow
def test_a_damaged_checkpoint_is_exit_6(cli, tiny, spec_file, sft_run, tmp_path):
    import shutil

    runs, run_id, ckpt = sft_run
    ref = {"run_id": run_id, "checkpoint": "update-000002",
           "sha256": sha256_file(ckpt / "manifest.json")}
    damaged_runs = tmp_path / "runs"
    shutil.copytree(runs, damaged_runs)
    weights = damaged_runs / ckpt.relative_to(runs) / "weights.safetensors"
    with open(weights, "r+b") as fh:
        fh.seek(200)
        fh.write(b"\x00\x01\x02")
    proc = cli("run", "--engine", "native", "--runs-dir", damaged_runs,
               spec_file(_rl_from(tiny, ref)))
    assert proc.returncode == 6, proc.stderr
    assert "is damaged" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_spec_written_elsewhere_still_names_the_same_files(tmp_path):
    """`runs from-run --spec S --output O`: O's relative paths are read from O's folder."""
    from stateset_backend.spec.files import parse_spec
    from stateset_backend.spec.inputs import pinned_files, rebase_spec_paths

    src = tmp_path / "project"
    (src / "data").mkdir(parents=True)
    doc = json.loads((EXAMPLES / "support-routing.json").read_text())
    for split in ("train", "validation", "test"):
        name = Path(doc["data"][split]["uri"]).name
        (src / "data" / name).write_bytes((EXAMPLES / doc["data"][split]["uri"]).read_bytes())
        doc["data"][split]["uri"] = f"data/{name}"
    reward_file = doc["reward"]["entrypoint"].rpartition(":")[0]
    (src / "reward.py").write_bytes((EXAMPLES / reward_file).read_bytes())
    doc["reward"]["entrypoint"] = "reward.py:" + doc["reward"]["entrypoint"].rpartition(":")[2]
    doc["data"]["test"]["uri"] = "file://" + doc["data"]["test"]["uri"]
    elsewhere = tmp_path / "other" / "place"
    moved = rebase_spec_paths(doc, src, elsewhere)
    assert moved["data"]["train"]["uri"].startswith("../../project/")
    assert moved["data"]["test"]["uri"].startswith("file://../../project/")
    before = pinned_files(parse_spec(doc), src)
    after = pinned_files(parse_spec(moved), elsewhere)
    assert [(f, p.resolve(), h) for f, p, h in before] == \
        [(f, p.resolve(), h) for f, p, h in after]
    assert len(before) == 4  # three splits and the reward file
