"""`rehearse`: the engine's own trainer runs a spec for a few updates on this machine's CPUs
with a shrunk model of the spec's architecture, and one screen says what held.

The native engine's rehearsal is its own launch cut to the asked updates; verl's runs verl's
``main_ppo`` through its extension points (slow: two starts of about a minute and a half each,
and verl's environment, STATESET_TEST_VERL_PYTHON); OpenRLHF and NeMo RL cannot run here and say
why, after their plan is made. Each engine that runs is started a second time from the
checkpoint of the update before the last, through the hub's resume path, and must continue
where the first run was. A rehearsal lives in the run store's ``.rehearsals/``, never in its
index, and never writes the spec.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
from optional_installs import TRL_PLUGIN_MISSING, VERL_PYTHON_MISSING, trl_plugin_installed
from rehearsal_setup import VERL_PYTHON, tiny_llama, verl_python
from slurm_cluster import ON_ONE_WORKER

from stateset_backend.adapters.native.adapter import NativeAdapter
from stateset_backend.cli import main
from stateset_backend.conformance.writers import logged
from stateset_backend.engines.adapter import Rehearsal
from stateset_backend.plan.launch_plan import load_plan
from stateset_backend.providers.local import Exit
from stateset_backend.runs.rehearsal import resume, verdict
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
    # a checkpoint of update 1 to resume from; every other setting as the spec has it
    assert "replaced   checkpoint.every: 50 -> 1 (for the resume check)" in out
    checks = _verdict(out)
    assert list(checks) == ["launch", "identity", "metrics finite", "KL at update 1",
                            "rollout vs learner", "reward calls", "validation",
                            "learning rate", "checkpoints", "updates", "resume"]
    assert {name for name, (mark, _) in checks.items() if mark == "ok"} == \
        set(checks) - {"rollout vs learner"}
    assert checks["KL at update 1"][1].startswith("exactly 0 (kl)")
    assert checks["rollout vs learner"] == ("--", "not measured: the native engine logs no "
                                                  "comparison of its rollout's log-probs with "
                                                  "the learner's recompute")
    assert checks["checkpoints"][1].startswith("the collector read checkpoints of updates "
                                               "1, 2 (14 files) and the final model")
    assert checks["updates"][1] == "2 of 2 planned updates committed"
    # what the engine did, seen through the hub's reward shim and its logged rate
    assert checks["reward calls"][1].startswith(
        "512 train completions scored, as the spec asks (2 updates x 16 prompts x 16 "
        "completions); the longest completion 2 tokens (limit 2)")
    assert checks["learning rate"][1] == ("0 for update 1, 0.0002 for update 2 (lr): the "
                                          "spec's schedule (constant, warmup 5)")
    # the second start continued at update 2 and computed what the first run computed there
    assert checks["resume"][1].startswith(
        "the second start, from the checkpoint of update 1, logged update 2 first, committed "
        "it alone and exited 0 after ")
    assert "update 2's 10 metrics equal the uninterrupted run's, largest difference " in \
        checks["resume"][1]
    assert "      | sampled (groups/kept, response_length/mean, reward/mean, reward/std): " \
           "largest difference 0, tolerance 1e-06 + 1e-06 x |value|" in out
    assert "      | not compared (wall-clock): time/update_s, tokens_per_second" in out
    assert "rehearsal passed: every check holds" in out

    # beside the run store, never in it; the spec file as it was
    assert spec.read_bytes() == before
    (folder,) = [p for p in (runs / ".rehearsals").iterdir() if p.name != "models"]
    stored = json.loads((folder / "verdict.json").read_text())
    assert stored["passed"] and stored["rehearsal"]["updates"] == 2
    assert stored["rehearsal"]["changed"] == {"checkpoint.every": ["50", "1"]}
    assert stored["rehearsal"]["resumed"]["from_update"] == 1
    numbers = stored["checks"][-1]["numbers"]
    print(f"native resume: largest difference {numbers['largest']}")
    assert numbers["largest"]["difference"] <= 1e-6
    assert json.loads((folder / "result.json").read_text())["status"] == "succeeded"
    resumed = json.loads((folder / "resumed.json").read_text())
    assert (resumed["status"], resumed["committed_updates"]) == ("succeeded", 2)
    assert {"name": "resume", "ok": True, "detail": "continued from update 1"} in \
        resumed["checks"]
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

    # what a resume that only looks like one leaves, read from the engine's own outputs: a
    # start from scratch (all of the first run's steps), an exit 0 having trained nothing, an
    # update 2 computed from other state
    plan, adapter = load_plan(folder / "plan.json"), NativeAdapter()
    done = Result.load(folder / "resumed.json")
    ran = resume.Resumed(folder / "resumed", adapter.checkpoints(folder / "attempt")[0],
                         Exit(0), 1.0)

    def judged(change) -> verdict.Line:
        fake = tmp_path / "fake"
        shutil.rmtree(fake, ignore_errors=True)
        shutil.copytree(folder / "resumed", fake)
        change(fake / "metrics.jsonl")
        return resume.judge(plan, adapter, folder / "attempt",
                            resume.Resumed(fake, ran.checkpoint, Exit(0), 1.0), done, 2)

    afresh = judged(lambda metrics: metrics.write_bytes(
        (folder / "attempt" / "metrics.jsonl").read_bytes()))
    assert (afresh.state, afresh.detail.split("; ", 1)[1]) == (
        "FAILED", "its first logged step is 0, not 2: it started afresh")
    nothing = judged(lambda metrics: metrics.write_text(""))
    assert (nothing.state, nothing.detail) == (
        "FAILED", "the second start, from the checkpoint of update 1, exited 0 having trained "
                  "nothing: it logged no update")

    def nudged(metrics: Path) -> None:
        row = json.loads(metrics.read_text())
        metrics.write_text(json.dumps({**row, "entropy": row["entropy"] + 1e-3}) + "\n")

    moved = judged(nudged)
    assert moved.state == "FAILED"
    assert "update 2's metrics differ from the uninterrupted run's: entropy " in moved.detail
    assert "(difference 0.001, tolerance 1e-06 + 1e-05 x |value|)" in moved.detail


def test_a_resume_that_starts_afresh_fails_the_rehearsal(tmp_path, capsys, monkeypatch):
    """The engine is told nothing about the checkpoint (a resume flag dropped on the way): it
    trains updates 1 and 2 again and exits 0, and only its own log says so."""
    monkeypatch.setattr(NativeAdapter, "resume_argv",
                        lambda self, checkpoint, argv, attempt_dir: list(argv))
    assert main(["rehearse", "--engine", "native", "--quiet", "--runs-dir",
                 str(tmp_path / "runs"), str(EXAMPLES / "support-routing.json")]) == 5
    captured = capsys.readouterr()
    mark, detail = _verdict(captured.out)["resume"]
    assert mark == "FAILED"
    assert detail == ("the second start, from the checkpoint of update 1, logged steps 0, 1, 2; "
                      "its first logged step is 0, not 2: it started afresh")
    assert ": resume failed (kept in " in captured.err


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
def test_verl_rehearses_the_main_job_with_its_own_trainer_and_resumes_it(tmp_path, capsys):
    """Two starts of verl's main_ppo: the 2-update run, then one from its checkpoint of update
    1 through the hub's resume path (``trainer.resume_mode=resume_path``). The main job as
    DAPO trains it: groups whose rewards are all equal excluded and the batch refilled by
    dynamic sampling (the kit's verl engine run watches plain GRPO over three mini-batches)."""
    python = verl_python()
    source = EXAMPLES / "external"
    doc = rebase_spec_paths(json.loads((source / "verl-rehearsal.json").read_text()), source,
                            tmp_path)
    tiny_llama(tmp_path / "models" / "tiny-llama-support", seed=1234)
    doc["model"]["path"] = "models/tiny-llama-support"
    doc["algorithm"].update(group_size=4, advantage={"zero_variance_groups": "exclude"},
                            dynamic_sampling={"max_rounds": 2})
    doc["budget"]["prompts_per_update"] = 4
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
    assert "(for the resume check)" not in out  # the spec checkpoints every update already
    checks = _verdict(out)
    assert {mark for mark, _ in checks.values()} == {"ok"}, out
    assert checks["KL at update 1"][1].startswith("exactly 0 (actor/kl_loss)")
    gap = checks["rollout vs learner"][1]
    assert "at update 1" in gap and "at update 2" in gap
    assert "(training/rollout_probs_diff_max; tolerance 1e-06)" in gap
    assert checks["checkpoints"][1].startswith(
        "the collector read checkpoints of updates 1, 2")
    assert checks["updates"][1] == "2 of 2 planned updates committed"
    # seen through the hub's reward shim, called from verl's reward loop workers: verl 0.9's
    # buffer refills until the batch is full, which the plan declares
    assert re.match(r"\d+ train completions scored, as the spec asks \(2 updates x 4 prompts "
                    r"x 4 completions, as many rounds of dynamic sampling as it takes: the plan "
                    r"declares unbounded_refill\)", checks["reward calls"][1])
    assert checks["validation"][1].startswith("1 passes once training began for 1 asked")
    assert checks["validation"][1].endswith("; 200 completions a pass")
    # verl's engine workers log the rate after stepping the scheduler: the next update's
    assert checks["learning rate"][1] == ("0.001 for update 2, 0.001 for update 3 (lr/next): "
                                          "the spec's schedule (constant, warmup 0)")
    assert checks["resume"][1].startswith(
        "the second start, from the checkpoint of update 1, logged update 2 first, committed "
        "it alone and exited 0 after ")
    assert "      | sampled (response_length/mean, reward/mean): largest difference " in out
    assert "rehearsal passed: every check holds" in out

    (folder,) = [p for p in (tmp_path / "runs" / ".rehearsals").iterdir() if p.name != "models"]
    stored = json.loads((folder / "verdict.json").read_text())
    numbers = stored["checks"][-1]["numbers"]
    print(f"verl resume: largest difference {numbers['largest']}")
    assert numbers["largest"]["difference"] <= 1e-6

    # verl's own file logger, beyond the canonical metrics the hub reads: every value finite,
    # the first update moved the policy off its reference, validation at evaluation.every
    plan = load_plan(folder / "plan.json")
    log = Path(plan.set_env["VERL_FILE_LOGGER_PATH"]).name
    steps = [json.loads(line) for line in (folder / "attempt" / log).read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]
    for step in steps:
        numbers = [v for v in step["data"].values() if isinstance(v, int | float)]
        assert numbers and all(math.isfinite(v) for v in numbers), step
    first, second = (s["data"] for s in steps)
    assert first["actor/kl_loss"] == 0.0 and second["actor/kl_loss"] > 0.0
    # the kit's verl writer logs these names for this release: verl's own trainer does too
    assert set(logged(plan).values()) <= set(first) & set(second)
    assert any(key.startswith("val-core/") for key in second)
    # the resumed start's log begins at update 2, and it validates there as the first did
    again = [json.loads(line) for line in (folder / "resumed" / log).read_text().splitlines()]
    assert [s["step"] for s in again] == [2]
    assert {k for k in again[0]["data"] if k.startswith("val-core/")} == \
        {k for k in second if k.startswith("val-core/")}

    # verl's checkpoint layout, every update (checkpoint.every 1, keep 2), one rank
    checkpoints = folder / "attempt" / "checkpoints"
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    for step in (1, 2):
        actor = checkpoints / f"global_step_{step}" / "actor"
        assert (actor / "model_world_size_1_rank_0.pt").is_file()
        assert (actor / "huggingface" / "config.json").is_file()
        assert (checkpoints / f"global_step_{step}" / "data.pt").is_file()
    assert (folder / "resumed" / "checkpoints" / "latest_checkpointed_iteration.txt"
            ).read_text().strip() == "2"
