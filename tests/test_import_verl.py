"""`import verl`: a verl script or overrides file becomes a spec whose plan verl reads back as
the input, every other setting named with its reason."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

import pytest

from stateset_backend.engines.registry import build_registry
from stateset_backend.importing.launch import PLACEHOLDER_SHA256, import_file
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.files import load_spec

ROOT = Path(__file__).parent.parent
RECIPE = ROOT / "examples" / "recipes" / "verl-grpo-qwen2-7b-math.json"
# the hub names each run itself (its run id and experiment digest)
HUB_NAMES = {"trainer.experiment_name"}


def _script_of(plan_argv: list[str]) -> str:
    words = [shlex.quote(w) for w in plan_argv[plan_argv.index("verl.trainer.main_ppo") + 1:]]
    return "#!/bin/bash\nset -x\npython3 -m verl.trainer.main_ppo \\\n  " + \
        " \\\n  ".join(words) + ' "$@"\n'


def test_the_recipe_round_trips_through_its_own_launch(tmp_path):
    """The recipe's plan, written as a verl script, imports back to the recipe's experiment,
    and the imported spec's plan reproduces every setting but the run's own name."""
    registry = build_registry()
    recipe = load_spec(RECIPE)
    plan = make_plan(recipe, registry.get("verl"), "0.7.0", base_dir=RECIPE.parent)
    script = tmp_path / "run.sh"
    script.write_text(_script_of(plan.argv))
    imported = import_file(registry, "verl", script, "0.7.0")
    doc = imported.to_json()
    missed = {s["key"] for s in doc["settings"] if not s["reproduced"]}
    assert missed == HUB_NAMES
    assert doc["round_trip"]["percent"] >= 95.0
    assert doc["round_trip"]["plan_changes_defaults"] == []
    whole = doc["round_trip"]["whole_configuration"]  # every key verl reads, defaults too
    assert whole["keys"] > 500 and whole["keys"] - whole["same"] == 1
    spec = imported.spec
    want = recipe.model_dump(mode="json")
    for section in ("algorithm", "optim", "budget", "rollout", "checkpoint", "evaluation",
                    "resources", "seed"):
        assert spec[section] == want[section], section
    assert {k: v for k, v in spec["model"].items()} == want["model"]
    assert spec["data"]["train"]["sha256"] == want["data"]["train"]["sha256"]
    assert spec["data"]["validation"]["sha256"] == want["data"]["validation"]["sha256"]
    assert spec["engine_options"] == {}
    assert spec["name"] == want["name"]  # verl's project name is the experiment's name
    assert any("$@" in note for note in doc["notes"])


SCRIPT = """#!/bin/bash
set -x
export VLLM_ATTENTION_BACKEND=XFORMERS
train=data/train.parquet
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
STAMP=$(date +%s)

python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files=$train \\
    data.val_files=$HOME/data/test.parquet \\
    data.train_batch_size=64 \\
    data.max_prompt_length=512 \\
    data.max_response_length=256 \\
    reward.custom_reward_function.path=reward.py \\
    reward.custom_reward_function.name=score \\
    actor_rollout_ref.model.path=$MODEL \\
    actor_rollout_ref.actor.optim.lr=3e-6 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \\
    actor_rollout_ref.actor.use_kl_loss=True \\
    actor_rollout_ref.actor.kl_loss_coef=0.01 \\
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \\
    actor_rollout_ref.actor.clip_ratio_high=0.28 \\
    actor_rollout_ref.rollout.n=8 \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.55 \\
    trainer.experiment_name=run_$STAMP \\
    trainer.total_training_steps=100 \\
    trainer.total_epochs=100 \\
    trainer.n_gpus_per_node=4 $@
"""


def test_a_script_with_shell_variables(tmp_path, cli_in_process):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.parquet").write_bytes(b"rows")
    (tmp_path / "reward.py").write_text("def score(*a, **k):\n    return 0.0\n")
    script = tmp_path / "run.sh"
    script.write_text(SCRIPT)
    out = tmp_path / "out" / "spec.json"
    out.parent.mkdir()
    proc = cli_in_process("import", "verl", script, "--engine-version", "0.9.1", "-o", out,
                          "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    spec = json.loads(out.read_text())
    assert spec["algorithm"]["group_size"] == 8
    assert spec["algorithm"]["clip"]["high"] == 0.28
    assert spec["algorithm"]["kl"] == {"coef": 0.01, "estimator": "k3", "placement": "loss",
                                       "clamp": 10.0}
    assert spec["budget"]["total_updates"] == 100
    assert spec["budget"]["mini_batches"] == 4  # 64 prompts, 16 per mini-batch
    assert spec["optim"]["lr"] == 3e-6
    assert spec["model"]["path"] == "Qwen/Qwen2.5-0.5B-Instruct"
    # a file that is here is pinned by its digest, one that is not gets a placeholder
    assert spec["data"]["train"]["sha256"] == hashlib.sha256(b"rows").hexdigest()
    assert spec["data"]["validation"]["sha256"] == PLACEHOLDER_SHA256
    assert spec["reward"]["entrypoint"].endswith("reward.py:score")
    assert spec["reward"]["sha256"] == hashlib.sha256(
        (tmp_path / "reward.py").read_bytes()).hexdigest()
    assert (out.parent / spec["data"]["train"]["uri"]).resolve() == \
        (tmp_path / "data" / "train.parquet").resolve() or \
        Path(spec["data"]["train"]["uri"]) == (tmp_path / "data" / "train.parquet").resolve()
    assert spec["engine_options"] == {
        "verl": {"actor_rollout_ref.rollout.gpu_memory_utilization": 0.55}}
    fates = {s["key"]: s for s in doc["settings"]}
    assert fates["actor_rollout_ref.rollout.n"]["spec_field"] == "algorithm.group_size"
    assert fates["trainer.experiment_name"]["fate"] == "not_expressible"
    # nothing of the shell ran: what only the shell would know is reported
    notes = "\n".join(doc["notes"])
    assert "$HOME" in notes and "$(date +%s)" in notes and "$@" in notes
    assert any("placeholder" in line for line in doc["inputs"])
    # every setting of the input is accounted for
    assert doc["round_trip"]["settings"] == len(doc["settings"]) + len(doc["refused"])


def test_an_overrides_file_reads_like_the_script(tmp_path, cli_in_process):
    overrides = tmp_path / "overrides.txt"
    overrides.write_text("# one override per line\nalgorithm.adv_estimator=grpo\n"
                         "actor_rollout_ref.rollout.n=4\ndata.train_batch_size=32\n")
    proc = cli_in_process("import", "verl", overrides, "--engine-version", "0.9.1", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["spec"]["algorithm"]["group_size"] == 4
    assert doc["spec"]["budget"]["prompts_per_update"] == 32
    assert doc["round_trip"]["reproduced"] == doc["round_trip"]["settings"] == 3


def test_the_screen_names_every_fate(tmp_path, cli_in_process):
    script = tmp_path / "run.sh"
    script.write_text(SCRIPT)
    proc = cli_in_process("import", "verl", script, "--engine-version", "0.9.1")
    assert proc.returncode == 0, proc.stderr
    for title in ("mapped to the spec", "kept in engine_options", "not expressible",
                  "refused", "inputs:", "notes:", "add -o spec.json"):
        assert title in proc.stdout


def test_bad_input_is_one_line_and_exit_2(tmp_path, cli_in_process):
    no_engine = tmp_path / "train.sh"
    no_engine.write_text("#!/bin/bash\npython3 train.py --lr 1e-6\n")
    unknown = tmp_path / "unknown.sh"
    unknown.write_text("python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.lrr=1\n")
    grammar = tmp_path / "grammar.txt"
    grammar.write_text("data.train_batch_size=[1,\n")
    unclosed = tmp_path / "unclosed.sh"
    unclosed.write_text("python3 -m verl.trainer.main_ppo data.train_batch_size='8\n")
    for path, words in ((no_engine, "no verl command"), (unknown, "no such key"),
                        (grammar, ""), (unclosed, "No closing quotation")):
        proc = cli_in_process("import", "verl", path, "--engine-version", "0.9.1")
        assert proc.returncode == 2, (path, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
        assert words in proc.stderr
    missing = cli_in_process("import", "verl", tmp_path / "nothing.sh")
    assert missing.returncode == 2
    unsupported = cli_in_process("import", "verl", unknown, "--engine-version", "0.1.0")
    assert unsupported.returncode == 3
    unknown_release = cli_in_process("import", "verl", unknown, "--engine-version", "9.9.9")
    assert unknown_release.returncode == 2 and "known: 0.4.1" in unknown_release.stderr
    not_engine = cli_in_process("import", "trl-nope", unknown)
    assert not_engine.returncode == 2


def test_nothing_is_written_when_the_import_fails(tmp_path, cli_in_process):
    bad = tmp_path / "bad.sh"
    bad.write_text("echo nothing here\n")
    out = tmp_path / "spec.json"
    assert cli_in_process("import", "verl", bad, "-o", out).returncode == 2
    assert not out.exists()


def test_bash_arrays_and_conditions_read_as_the_shell_splits_them(tmp_path, cli_in_process):
    """The words of `ARGS=( ... )` arrive where `${ARGS[@]}` stands; nothing runs."""
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\nN=4\nif [ -n \"$X\" ]; then echo x; fi\n"
                      "ALGO=(\n  algorithm.adv_estimator=grpo  # the objective\n"
                      "  actor_rollout_ref.rollout.n=$N\n)\n"
                      "python3 -m verl.trainer.main_ppo ${ALGO[@]} data.train_batch_size=8 "
                      "&& echo done\n")
    proc = cli_in_process("import", "verl", script, "--engine-version", "0.9.1", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["spec"]["algorithm"]["group_size"] == 4
    assert {s["key"] for s in doc["settings"]} == {
        "algorithm.adv_estimator", "actor_rollout_ref.rollout.n", "data.train_batch_size"}


def test_a_quote_inside_a_comment_opens_nothing(tmp_path, cli_in_process):
    """``# it's`` is a comment to the shell, apostrophe and all."""
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\noffload=false # it's a small model\n"
                      "python3 -m verl.trainer.main_ppo \\\n"
                      "  trainer.project_name='its' \\\n"
                      "  actor_rollout_ref.actor.fsdp_config.param_offload=$offload  # why's\n")
    proc = cli_in_process("import", "verl", script, "--engine-version", "0.9.1", "--json")
    assert proc.returncode == 0, proc.stderr
    settings = {s["key"]: s["value"] for s in json.loads(proc.stdout)["settings"]}
    assert settings["trainer.project_name"] == "its"
    assert settings["actor_rollout_ref.actor.fsdp_config.param_offload"] is False


def _held_mapping_import(tmp_path, cli_in_process, lines: str, version: str = "0.9.1"):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.parquet").write_bytes(b"rows")
    (tmp_path / "reward.py").write_text("def score(*a, **k):\n    return 0.0\n")
    script = tmp_path / "run.sh"
    text = SCRIPT.replace("    trainer.n_gpus_per_node=4 $@",
                          lines + "    trainer.n_gpus_per_node=4")
    if version < "0.7":  # the reward function's section before verl moved it under reward
        text = text.replace("reward.custom_reward_function.", "custom_reward_function.")
    script.write_text(text)
    out = tmp_path / "spec.json"
    proc = cli_in_process("import", "verl", script, "--engine-version", version, "-o", out,
                          "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["round_trip"].get("error") is None
    return {s["key"]: s for s in doc["settings"]}, json.loads(out.read_text())


KERNEL = "actor_rollout_ref.model.override_config.attn_implementation"
THETA = "actor_rollout_ref.model.override_config.rope_theta"


@pytest.mark.parametrize("lines, says", [
    # a kernel verl has no code for, alone and beside an override
    (f"    +{KERNEL}=flex \\\n    actor_rollout_ref.model.use_remove_padding=False \\\n",
     "which the launch holds"),
    (f"    +{KERNEL}=flex \\\n    +{THETA}=5000 \\\n"
     "    actor_rollout_ref.model.use_remove_padding=False \\\n", "which the launch holds"),
    # a kernel whose requirement the launch does not meet (verl's default is padding-free)
    (f"    +{KERNEL}=sdpa \\\n    +{THETA}=5000 \\\n",
     "use_remove_padding to be False (it is True, the release's default)"),
])
def test_a_held_mapping_whose_allowed_part_is_refused_leaves_whole(tmp_path, cli_in_process,
                                                                  lines, says):
    """The part a held mapping lets in is still refused at a value the guard refuses: the
    mapping then leaves the spec whole, each of its keys named not expressible with the
    guard's reason, and the rest of the launch still plans and reads back."""
    fates, spec = _held_mapping_import(tmp_path, cli_in_process, lines)
    assert fates[KERNEL]["fate"] == "not_expressible" and says in fates[KERNEL]["reason"]
    if THETA in fates:
        assert fates[THETA]["fate"] == "not_expressible"
    assert "actor_rollout_ref.model.override_config" not in spec["engine_options"]["verl"]


def test_a_held_mapping_keeps_the_part_it_lets_in(tmp_path, cli_in_process):
    """verl's model config overrides are held, but for the attention kernel: a launch that
    gives the kernel beside an override keeps its kernel in engine_options, and only the
    override is named not expressible, on its own key."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.parquet").write_bytes(b"rows")
    (tmp_path / "reward.py").write_text("def score(*a, **k):\n    return 0.0\n")
    script = tmp_path / "run.sh"
    script.write_text(SCRIPT.replace("    trainer.n_gpus_per_node=4 $@", (
        "    +actor_rollout_ref.model.override_config.attn_implementation=sdpa \\\n"
        "    +actor_rollout_ref.model.override_config.rope_theta=5000 \\\n"
        "    actor_rollout_ref.model.use_remove_padding=False \\\n"
        "    trainer.n_gpus_per_node=4")))
    out = tmp_path / "spec.json"
    proc = cli_in_process("import", "verl", script, "--engine-version", "0.9.1", "-o", out,
                          "--json")
    assert proc.returncode == 0, proc.stderr
    fates = {s["key"]: s for s in json.loads(proc.stdout)["settings"]}
    kernel = fates["actor_rollout_ref.model.override_config.attn_implementation"]
    assert (kernel["fate"], kernel["reproduced"]) == ("engine_option", True)
    theta = fates["actor_rollout_ref.model.override_config.rope_theta"]
    assert (theta["fate"], theta["reproduced"]) == ("not_expressible", False)
    assert "only actor_rollout_ref.model.override_config.attn_implementation" in theta["reason"]
    options = json.loads(out.read_text())["engine_options"]["verl"]
    assert options["actor_rollout_ref.model.override_config"] == {"attn_implementation": "sdpa"}


def test_a_kernel_whose_requirement_the_release_default_meets_is_kept(tmp_path, cli_in_process):
    """verl 0.6.1 pads its rows by default: a launch that says so too (a default, which the
    import leaves out) keeps its attention kernel, read as the release reads it."""
    fates, spec = _held_mapping_import(
        tmp_path, cli_in_process,
        f"    +{KERNEL}=sdpa \\\n    actor_rollout_ref.model.use_remove_padding=False \\\n",
        "0.6.1")
    assert (fates[KERNEL]["fate"], fates[KERNEL]["reproduced"]) == ("engine_option", True)
    assert spec["engine_options"]["verl"]["actor_rollout_ref.model.override_config"] == \
        {"attn_implementation": "sdpa"}
