"""`import openrlhf`: an OpenRLHF command line or script, parsed by the release's own argparse,
becomes a spec whose plan that parser reads back as the input."""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

import pytest

from stateset_backend.engines.registry import build_registry
from stateset_backend.importing.launch import import_file
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.files import load_spec

RECIPES = Path(__file__).parent.parent / "examples" / "recipes"
ENTRY = "openrlhf.cli.train_ppo_ray"


@pytest.mark.parametrize("recipe", ["openrlhf-ppo", "openrlhf-reinforce-baseline"])
def test_the_recipes_round_trip_through_their_own_launch(tmp_path, recipe):
    """The recipe's plan, written as a `ray job submit` script, imports back to the recipe's
    experiment; the plan reproduces every setting but the run name the hub owns."""
    registry = build_registry()
    spec = load_spec(RECIPES / f"{recipe}.json")
    plan = make_plan(spec, registry.get("openrlhf"), "0.11.1", base_dir=RECIPES)
    words = " \\\n  ".join(shlex.quote(w) for w in plan.argv[plan.argv.index(ENTRY) + 1:])
    script = tmp_path / "train.sh"
    script.write_text("set -x\nray job submit --address=http://127.0.0.1:8265 "
                      "--runtime-env-json='{\"working_dir\": \"/openrlhf\"}' \\\n  -- python3 -m "
                      f"{ENTRY} \\\n  {words}\n")
    imported = import_file(registry, "openrlhf", script, "0.11.1")
    doc = imported.to_json()
    assert {s["key"] for s in doc["settings"] if not s["reproduced"]} == \
        {"--logger.wandb.run_name"}
    assert doc["round_trip"]["percent"] >= 95.0
    want = spec.model_dump(mode="json")
    for section in ("algorithm", "optim", "budget", "rollout", "checkpoint", "resources",
                    "seed", "model"):
        assert imported.spec[section] == want[section], section
    assert imported.spec["data"]["max_prompt_tokens"] == want["data"]["max_prompt_tokens"]
    assert imported.spec["data"]["max_response_tokens"] == want["data"]["max_response_tokens"]


SCRIPT = """#!/bin/bash
set -x
python3 -m openrlhf.cli.train_ppo_ray \\
   --actor.model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \\
   --actor.num_nodes 1 --actor.num_gpus_per_node 4 \\
   --data.prompt_dataset data/train.jsonl \\
   --data.input_key prompt --data.label_key answer --data.apply_chat_template \\
   --reward.remote_url reward.py \\
   --algo.advantage.estimator group_norm \\
   --rollout.n_samples_per_prompt 8 --rollout.batch_size 32 \\
   --train.batch_size 128 --train.micro_batch_size 4 --rollout.micro_batch_size 8 \\
   --actor.adam.lr 1e-6 --actor.eps_clip_low_high 0.2 0.28 \\
   --ds.zero_stage 3 --ds.packing_samples \\
   --vllm.gpu_memory_utilization 0.6 \\
   --logger.wandb.key $WANDB_KEY
"""


def test_a_script_with_its_own_flags(tmp_path, cli_in_process):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"prompt": "x", "answer": "y"}\n' * 64)
    (tmp_path / "reward.py").write_text("def reward_func(queries, prompts, labels):\n"
                                        "    return []\n")
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT)
    proc = cli_in_process("import", "openrlhf", script, "--engine-version", "0.11.1", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    spec = doc["spec"]
    assert spec["algorithm"]["group_size"] == 8
    assert spec["algorithm"]["clip"] == {"low": 0.2, "high": 0.28, "dual_clip": None}
    assert spec["budget"]["prompts_per_update"] == 32
    assert spec["budget"]["mini_batches"] == 2  # 32 prompts x 8 samples, 128 per step
    assert spec["optim"]["lr"] == 1e-6
    assert spec["reward"]["entrypoint"].endswith("reward.py:reward_func")
    assert spec["reward"]["sha256"] == hashlib.sha256(
        (tmp_path / "reward.py").read_bytes()).hexdigest()
    options = spec["engine_options"]["openrlhf"]
    assert options["--vllm.gpu_memory_utilization"] == 0.6
    assert spec["budget"]["total_updates"] == 2  # one pass over 64 rows, 32 per update
    fates = {s["key"]: s for s in doc["settings"]}
    assert fates["--rollout.n_samples_per_prompt"]["spec_field"] == "algorithm.group_size"
    # DeepSpeed's ZeRO stage is an execution default: kept in engine_options, read back
    assert fates["--ds.zero_stage"]["fate"] == "engine_option"
    assert fates["--ds.zero_stage"]["reproduced"] is True
    assert options["--ds.zero_stage"] == fates["--ds.zero_stage"]["value"]
    assert "$WANDB_KEY" in "\n".join(doc["notes"])
    assert doc["round_trip"]["settings"] == len(doc["settings"]) + len(doc["refused"])


def test_an_abbreviated_flag_reads_as_argparse_reads_it(tmp_path, cli_in_process):
    script = tmp_path / "train.sh"
    script.write_text("python3 -m openrlhf.cli.train_ppo_ray --rollout.n_samples 4 "
                      "--actor.adam.lr 2e-6\n")
    proc = cli_in_process("import", "openrlhf", script, "--engine-version", "0.11.1", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["spec"]["algorithm"]["group_size"] == 4
    fates = {s["key"]: s for s in doc["settings"]}
    assert fates["--rollout.n_samples_per_prompt"]["given_as"] == "--rollout.n_samples"


def test_the_release_decides_which_flags_exist(tmp_path, cli_in_process):
    """0.9.8's flat flags are unknown to 0.11.1's parser: one line, exit 2."""
    script = tmp_path / "train.sh"
    script.write_text("python3 -m openrlhf.cli.train_ppo_ray --n_samples_per_prompt 4\n")
    ok = cli_in_process("import", "openrlhf", script, "--engine-version", "0.9.8", "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["spec"]["algorithm"]["group_size"] == 4
    bad = cli_in_process("import", "openrlhf", script, "--engine-version", "0.11.1")
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1 and "n_samples_per_prompt" in bad.stderr
    none = tmp_path / "none.sh"
    none.write_text("deepspeed train_sft.py --lr 1\n")
    missing = cli_in_process("import", "openrlhf", none, "--engine-version", "0.11.1")
    assert missing.returncode == 2 and "no OpenRLHF command" in missing.stderr
