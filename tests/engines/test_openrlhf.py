"""OpenRLHF: the real parser of each release wheel accepts our argv (exact option strings),
its post-parse checks pass, and the values parse back to what the spec meant.

STATESET_TEST_OPENRLHF_WHEELS names a folder holding the release wheels: the first and last
release of every dialect (``.ci/run`` downloads them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from golden import variant

from stateset_backend.adapters.openrlhf import OpenRLHFAdapter
from stateset_backend.core.errors import Unsupported
from stateset_backend.core.plan import make_plan
from stateset_backend.core.registry import AdapterEntry
from stateset_backend.core.specfile import parse_spec

WHEELS = os.environ.get("STATESET_TEST_OPENRLHF_WHEELS")
PARSER = Path(__file__).with_name("openrlhf_parse.py")

BASE: dict[str, Any] = {
    "name": "golden", "seed": 99,
    "algorithm": {"objective": "grpo", "group_size": 8},
    "model": {"path": "/models/qwen2.5-0.5b", "dtype": "bfloat16"},
    "data": {"train": {"uri": "/data/train.jsonl", "sha256": "a" * 64, "prompt_field": "q",
                       "answer_field": "a"},
             "validation": {"uri": "/data/val.jsonl", "sha256": "b" * 64, "prompt_field": "q",
                            "answer_field": "a"},
             "max_prompt_tokens": 256, "max_response_tokens": 512},
    "reward": {"entrypoint": "/rewards/math.py:score", "sha256": "c" * 64},
    "rollout": {"backend": "vllm", "temperature": 0.8, "top_p": 0.95},
    "optim": {"lr": 1e-6, "weight_decay": 0.01, "grad_clip": 0.5, "warmup_steps": 5},
    "budget": {"total_updates": 100, "prompts_per_update": 16, "mini_batches": 2},
    "checkpoint": {"every": 20, "keep": 3},
    "evaluation": {"every": 10},
    "resources": {"nodes": 1, "gpus_per_node": 8},
}


def golden(algorithm: dict[str, Any], **model: Any) -> dict[str, Any]:
    """Token-mean aggregation unless asked: the only one every release has."""
    return variant(BASE, algorithm, algorithm_defaults={"loss_aggregation": "token_mean"}, **model)


GOLDEN = {
    "grpo": golden({"objective": "grpo"}),
    "grpo_kl_k2_loss": golden({"objective": "grpo", "kl": {"coef": 0.01, "estimator": "k2",
                                                           "placement": "loss"}}),
    # OpenRLHF's GSPO loss is always the sequence mean of token means
    "gspo": golden({"objective": "gspo", "loss_aggregation": "seq_mean_token_mean"}),
    "dapo_like": golden({"objective": "dapo", "loss_aggregation": "token_mean",
                         "overlong": {"buffer_tokens": 64, "penalty": 1.0}}),
    "rloo": golden({"objective": "rloo"}),
    "reinforce_pp": golden({"objective": "reinforce_pp"}),
    "ppo": golden({"objective": "ppo", "gae": {"gamma": 0.99, "lam": 0.95}}),
    "lora": golden({"objective": "grpo"}, lora={"rank": 16, "alpha": 32, "dropout": 0.05,
                                                "target_modules": ["q_proj", "v_proj"]}),
}


def _plan(doc: dict[str, Any], version: str):
    entry = AdapterEntry(OpenRLHFAdapter(), "builtin", "stateset-backend", "0.1.0")
    return make_plan(parse_spec(doc), entry, version, base_dir=Path("/"))


def _parse(plan, version: str, run_dir: Path) -> dict[str, Any]:
    assert WHEELS is not None
    (wheel,) = Path(WHEELS).glob(f"openrlhf-{version}-*.whl")
    argv = [a.replace("{run_dir}", str(run_dir)) for a in plan.argv[3:]]
    proc = subprocess.run([sys.executable, str(PARSER), str(wheel), "--", *argv],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


needs_wheels = pytest.mark.skipif(WHEELS is None, reason="STATESET_TEST_OPENRLHF_WHEELS unset")

FLAT = {"model": "pretrain", "estimator": "advantage_estimator", "n": "n_samples_per_prompt",
        "kl": "init_kl_coef", "kl_est": "kl_estimator", "kl_loss": "use_kl_loss",
        "clip": "eps_clip_low_high", "loss": "policy_loss_type", "seed": "seed",
        "lr": "actor_learning_rate", "rollout": "rollout_batch_size",
        "train": "train_batch_size", "max_samples": "max_samples", "lora": "lora_rank",
        "data": "prompt_data", "input": "input_key", "label": "label_key", "temp": "temperature",
        "new": "max_new_tokens", "max_len": "max_len", "run": "wandb_run_name",
        "ckpt": "ckpt_path", "no_std": "no_advantage_std_norm", "rm": "remote_rm_url",
        "overlong": "overlong_buffer_len", "gamma": "gamma"}
DOTTED = {"model": "actor.model_name_or_path", "estimator": "algo.advantage.estimator",
          "n": "rollout.n_samples_per_prompt", "kl": "algo.kl.init_coef",
          "kl_est": "algo.kl.estimator", "kl_loss": "algo.kl.use_loss",
          "clip": "actor.eps_clip_low_high", "loss": "actor.policy_loss_type",
          "seed": "train.seed", "lr": "actor.adam.lr", "rollout": "rollout.batch_size",
          "train": "train.batch_size", "max_samples": "data.max_samples",
          "lora": "ds.lora.rank", "data": "data.prompt_dataset", "input": "data.input_key",
          "label": "data.label_key", "temp": "rollout.temperature",
          "new": "rollout.max_new_tokens", "max_len": "data.max_len",
          "run": "logger.wandb.run_name", "ckpt": "ckpt.path",
          "no_std": "algo.advantage.no_std_norm", "rm": "reward.remote_url",
          "overlong": "reward.overlong_buffer_len", "gamma": "algo.advantage.gamma"}


# the first and last release of each dialect
RELEASES = {"0.9.8": FLAT, "0.10.1": FLAT, "0.10.2": DOTTED, "0.11.1": DOTTED, "0.11.2": DOTTED}


@needs_wheels
@pytest.mark.parametrize("version", sorted(RELEASES))
@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_real_parser_accepts_our_argv_and_parses_back(name, version, tmp_path):
    doc = GOLDEN[name]
    spec = parse_spec(doc)
    names = RELEASES[version]
    try:
        plan = _plan(doc, version)
    except Unsupported as exc:
        pytest.skip(f"refused before launch: {exc}")
    got = _parse(plan, version, tmp_path)

    def v(key: str) -> Any:
        return got[names[key]]

    a = spec.algorithm
    estimator = {"grpo": "group_norm", "gspo": "group_norm", "dapo": "group_norm",
                 "rloo": "rloo", "reinforce_pp": "reinforce_baseline", "ppo": "gae"}
    assert v("model") == "/models/qwen2.5-0.5b"
    assert v("estimator") == estimator[a.objective]
    assert v("n") == a.group_size and v("seed") == 99
    assert list(v("clip")) == [a.clip.low, a.clip.high]
    assert v("loss") == ("gspo" if a.objective == "gspo" else "ppo")
    assert v("kl") == (a.kl.coef if a.kl else 0.0)
    assert v("kl_loss") == (a.kl is not None and a.kl.placement == "loss")
    if a.kl is not None:
        assert v("kl_est") == a.kl.estimator
    assert v("no_std") == (not a.advantage.std_normalize and a.objective != "rloo")
    assert v("lr") == 1e-6 and v("temp") == 0.8
    assert (v("rollout"), v("train")) == (16, 16 * a.group_size // 2)
    assert v("max_samples") == 100 * 16
    assert (v("new"), v("max_len")) == (512, 768)
    assert (v("data"), v("input"), v("label")) == ("/data/train.jsonl", "q", "a")
    assert v("lora") == (16 if spec.model.lora else 0)
    assert v("run") == f"{plan.run_id}.{plan.experiment_digest.removeprefix('sha256:')}"
    assert v("ckpt") == f"{tmp_path}/checkpoints"
    rm = v("rm")
    assert (rm if isinstance(rm, str) else rm[0]) == f"{tmp_path}/stateset_reward.py"
    if a.overlong is not None:
        assert v("overlong") == 64
    if a.gae is not None:
        assert v("gamma") == 0.99


@needs_wheels
def test_every_flag_is_an_exact_option_string(tmp_path):
    """argparse would accept an abbreviation; ours must be the option strings themselves."""
    for version in RELEASES:
        (wheel,) = Path(WHEELS or "").glob(f"openrlhf-{version}-*.whl")
        import zipfile

        with zipfile.ZipFile(wheel) as zf:
            text = zf.read(next(n for n in zf.namelist()
                                if n.endswith("openrlhf/cli/train_ppo_ray.py"))).decode()
        for name, doc in GOLDEN.items():
            try:
                flags = [a for a in _plan(doc, version).argv if a.startswith("--")]
            except Unsupported:
                continue
            missing = [f for f in flags if f'"{f}"' not in text and f".{f[2:].split('.')[-1]}"
                       not in text]
            assert not missing, (version, name, missing)


@pytest.mark.parametrize("version, change, missing", [
    ("0.11.2", {"objective": "gspo", "loss_aggregation": "token_mean"},
     "algorithm.loss_aggregation: OpenRLHF's GSPO loss is always the mean over sequences"),
    ("0.10.2", {"objective": "grpo", "loss_aggregation": "seq_mean_token_mean"},
     "loss_agg:seq_mean_token_mean (available in openrlhf >=0.11.2)"),
    # older releases name generation and precision flags differently (--generate_max_len)
    ("0.9.7", {"objective": "grpo"}, "openrlhf 0.9.7 is not supported (supported: openrlhf "
                                     ">=0.9.8)"),
])
def test_what_an_openrlhf_version_cannot_honour_is_refused(version, change, missing):
    with pytest.raises(Unsupported, match=missing.replace("(", r"\(").replace(")", r"\)")):
        _plan(golden(change), version)


def test_flags_follow_the_dialect():
    old = _plan(golden({"objective": "grpo"}), "0.10.1").argv
    new = _plan(golden({"objective": "grpo"}), "0.10.2").argv
    assert "--pretrain" in old and "--actor.model_name_or_path" not in old
    assert "--actor.model_name_or_path" in new and "--pretrain" not in new
