"""`rehearse`: the engine's own trainer runs a spec for a few updates on this machine's CPUs
with a shrunk model of the spec's architecture, and one screen says what held.

The native engine's rehearsal is its own launch cut to the asked updates; verl's runs verl's
``main_ppo`` through its extension points (slow: about a minute and a half, and verl's
environment, STATESET_TEST_VERL_PYTHON); OpenRLHF and NeMo RL cannot run here and say why, after
their plan is made. A rehearsal lives in the run store's ``.rehearsals/``, never in its index,
and never writes the spec.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from optional_installs import TRL_PLUGIN_MISSING, VERL_PYTHON_MISSING, trl_plugin_installed
from rehearsal_setup import VERL_PYTHON, tiny_llama, verl_python
from slurm_cluster import ON_ONE_WORKER

from stateset_backend.cli import main
from stateset_backend.engines.adapter import Rehearsal
from stateset_backend.runs.rehearsal import verdict
from stateset_backend.runs.rehearsal.model import shrunk_model
from stateset_backend.runs.results import Result
from stateset_backend.runs.store import RunStore
from stateset_backend.spec.content import directory_digest
from stateset_backend.spec.files import parse_spec
from stateset_backend.spec.inputs import rebase_spec_paths

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _verdict(out: str) -> dict[str, tuple[str, str]]:
    """The screen's check lines: check name -> (mark, detail)."""
    found = {}
    for line in out.splitlines():
        mark, _, rest = line.strip().partition(" ")
        if mark in ("ok", "FAILED", "--") and line.startswith("  "):
            check, detail = rest.strip().split("  ", 1)
            found[check] = (mark, detail.strip())
    return found


def test_the_native_engine_rehearses_the_main_job_in_two_updates(tmp_path, capsys):
    spec = EXAMPLES / "support-routing.json"
    before = spec.read_bytes()
    runs = tmp_path / "runs"
    assert main(["rehearse", "--engine", "native", "--updates", "2", "--runs-dir", str(runs),
                 str(spec)]) == 0
    out = capsys.readouterr().out
    assert "native 0.1.0, 2 updates on this machine's CPUs" in out
    assert "builtin:tiny-llama-support, used as is" in out
    checks = _verdict(out)
    assert list(checks) == ["launch", "identity", "metrics finite", "KL at update 1",
                            "rollout vs learner", "checkpoints", "updates"]
    assert {name for name, (mark, _) in checks.items() if mark == "ok"} == \
        set(checks) - {"rollout vs learner"}
    assert checks["KL at update 1"][1].startswith("exactly 0 (kl)")
    assert checks["rollout vs learner"] == ("--", "not measured: the native engine logs no "
                                                  "comparison of its rollout's log-probs with "
                                                  "the learner's recompute")
    # checkpoint.every 50: none by update 2; the final model is what the collector reads
    assert "no checkpoint and the final model" in checks["checkpoints"][1]
    assert "(none by update 2)" in checks["checkpoints"][1]
    assert checks["updates"][1] == "2 of 2 planned updates committed"
    assert "rehearsal passed: every check holds" in out

    # beside the run store, never in it; the spec file as it was
    assert spec.read_bytes() == before
    (folder,) = [p for p in (runs / ".rehearsals").iterdir() if p.name != "models"]
    stored = json.loads((folder / "verdict.json").read_text())
    assert stored["passed"] and stored["rehearsal"]["updates"] == 2
    assert json.loads((folder / "result.json").read_text())["status"] == "succeeded"
    assert [p.name for p in runs.iterdir()] == [".rehearsals"]
    assert RunStore(runs).reindex() == (0, [])  # no run of the store

    # what would have failed the same run: a reference that is not the policy's weights at
    # update 1, a rollout whose probabilities are not the learner's (exit 5)
    series = folder / "attempt" / "canonical_metrics.jsonl"
    rows = [json.loads(line) for line in series.read_text().splitlines()]
    series.write_text("".join(json.dumps({**r, "kl": 2e-5} if r["step"] == 1 else r) + "\n"
                              for r in rows))
    spec_used = parse_spec(json.loads((folder / "plan.json").read_text())["spec"], stored=True)
    result = Result.load(folder / "result.json")
    kl = verdict.first_update_kl(spec_used, result, folder / "attempt")
    assert (kl.state, kl.detail.split(";")[0]) == ("FAILED", "2e-05 (kl)")
    drifted = Rehearsal(argv=[], rollout_gap=lambda run_dir: {1: 3e-9, 2: 4e-3},
                        gap_metric="gap")
    gap = verdict.rollout_gap(drifted, folder / "attempt")
    assert gap.state == "FAILED" and "over the tolerance at update 2 (gap;" in gap.detail


def test_the_shrunk_model_keeps_the_class_vocabulary_tokenizer_and_chat_template(tmp_path):
    """A grouped-query model (14 query heads share 2 key-value heads, 24 layers of 896) keeps
    its class and tokenizer files; heads are scaled to divide the width, keeping the sharing."""
    from transformers import Qwen2Config

    source = tmp_path / "qwen"
    Qwen2Config(vocab_size=300, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                num_attention_heads=14, num_key_value_heads=2,
                layer_types=["full_attention"] * 24).save_pretrained(source)
    tokenizer = (ROOT / "stateset_backend/native/assets/tiny-llama-support/tokenizer.json")
    (source / "tokenizer.json").write_bytes(tokenizer.read_bytes())
    (source / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    (source / "model.safetensors").write_bytes(b"not read")
    doc = json.loads((EXAMPLES / "support-routing.json").read_text())
    doc["model"] = {"path": str(source), "dtype": "float32"}
    spec = parse_spec(doc)
    folder, made = shrunk_model(spec, tmp_path, tmp_path / "models")
    assert (made["class"], made["to"]) == ("Qwen2ForCausalLM", {
        "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 1, "intermediate": 128})
    config = json.loads((folder / "config.json").read_text())
    assert (config["vocab_size"], config["layer_types"]) == (300, ["full_attention"] * 2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (folder / name).read_bytes() == (source / name).read_bytes()
    # the same model again: the folder is reused, its content (and the plan's pin) the same
    digest = directory_digest(folder)
    assert shrunk_model(spec, tmp_path, tmp_path / "models") == (folder, made)
    assert directory_digest(folder) == digest


def _trl_rehearses() -> bool:
    if not trl_plugin_installed():
        pytest.skip(TRL_PLUGIN_MISSING)
    from stateset_trl_engine.plugin import TRLAdapter

    return TRLAdapter().declares("rehearse")


def test_the_trl_plugin_rehearses_with_its_own_launch(tmp_path, capsys):
    if not _trl_rehearses():
        pytest.skip("the installed TRL plugin predates rehearsal: pip install "
                    "examples/plugins/stateset-trl-engine")
    assert main(["rehearse", "--engine", "trl", "--runs-dir", str(tmp_path / "runs"),
                 str(EXAMPLES / "support-routing.json")]) == 0
    out = capsys.readouterr().out
    checks = _verdict(out)
    assert {name for name, (mark, _) in checks.items() if mark != "ok"} == \
        {"rollout vs learner"}, out
    assert checks["KL at update 1"][1].startswith("exactly 0 (kl)")


@pytest.mark.parametrize("engine, version, reason", [
    ("openrlhf", "0.11.2", "the flash-attn it pins builds only against a CUDA torch"),
    ("nemo-rl", "0.7.0", "its name on PyPI is a 0.0.0 placeholder"),
])
def test_an_engine_that_cannot_run_here_is_refused_after_its_plan_is_made(
        engine, version, reason, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["rehearse", "--engine", engine, "--engine-version", version, "--runs-dir",
                 str(runs), str(EXAMPLES / "external" / "grpo.json")]) == 3
    err = capsys.readouterr().err
    assert f"{engine} {version} cannot be rehearsed on this machine: " in err
    assert reason in err
    assert "What was checked instead: the plan was made" in err
    assert "and the launch reads back through" in err  # the engine's own parsing of it
    assert not runs.exists()  # nothing was built or run


def test_a_hub_id_model_is_refused_with_the_fix(tmp_path, capsys):
    doc = json.loads((EXAMPLES / "support-routing.json").read_text())
    doc = rebase_spec_paths(doc, EXAMPLES, tmp_path)
    doc["model"] = {"path": "Qwen/Qwen2.5-0.5B-Instruct", "dtype": "float32"}
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(doc))
    assert main(["rehearse", "--engine", "native", "--runs-dir", str(tmp_path / "runs"),
                 str(spec)]) == 2
    err = capsys.readouterr().err
    assert "model.path 'Qwen/Qwen2.5-0.5B-Instruct' names no folder on this machine" in err
    assert "download the model's config and tokenizer into a folder and name it in " \
           "model.path (the weights are not needed)" in err


@pytest.mark.slow
@pytest.mark.skipif(VERL_PYTHON is None, reason=VERL_PYTHON_MISSING)
@ON_ONE_WORKER  # Ray: the Ray provider's tests stop every Ray instance on the host
def test_verl_rehearses_the_main_job_with_its_own_trainer(tmp_path, capsys):
    python = verl_python()
    source = EXAMPLES / "external"
    doc = rebase_spec_paths(json.loads((source / "verl-rehearsal.json").read_text()), source,
                            tmp_path)
    tiny_llama(tmp_path / "models" / "tiny-llama-support", seed=1234)
    doc["model"]["path"] = "models/tiny-llama-support"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(doc, indent=2))
    code = main(["rehearse", "--engine", "verl", "--python", python, "--runs-dir",
                 str(tmp_path / "runs"), "--timeout", "500", str(spec)])
    out = capsys.readouterr().out
    print(out)
    assert code == 0, out
    assert "verl 0.9.1, 2 updates on this machine's CPUs" in out
    assert "LlamaForCausalLM shrunk from 2 layers x 64 to 2 x 64" in out
    assert "replaced   actor_rollout_ref.rollout.name: vllm -> hf" in out
    checks = _verdict(out)
    assert {mark for mark, _ in checks.values()} == {"ok"}, out
    assert checks["KL at update 1"][1].startswith("exactly 0 (actor/kl_loss)")
    gap = checks["rollout vs learner"][1]
    assert "at update 1" in gap and "at update 2" in gap
    assert "(training/rollout_probs_diff_max; tolerance 1e-06)" in gap
    assert checks["checkpoints"][1].startswith(
        "the collector read checkpoints of updates 1, 2")
    assert checks["updates"][1] == "2 of 2 planned updates committed"
    assert "rehearsal passed: every check holds" in out
