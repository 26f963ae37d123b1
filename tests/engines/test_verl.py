"""verl: our overrides compose against the real verl's Hydra config, pass verl's own
validate_config, and mean exactly what the spec meant.

Needs a verl installation in another environment (verl pins its own dependency set):
STATESET_TEST_VERL_PYTHON names its interpreter (``.ci/run`` builds it with verl==0.9.1).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from golden import variant

from stateset_backend.adapters.verl import VerlAdapter
from stateset_backend.core.adapter import identity_name
from stateset_backend.core.errors import Unsupported
from stateset_backend.core.hub import hub_snapshot
from stateset_backend.core.plan import make_plan
from stateset_backend.core.registry import AdapterEntry
from stateset_backend.core.specfile import parse_spec

VERL_PYTHON = os.environ.get("STATESET_TEST_VERL_PYTHON")
PROBE = Path(__file__).with_name("verl_compose.py")
COMMIT = "7ae557604adf67be50417f59c2c2f167def9a775"

BASE: dict[str, Any] = {
    "name": "golden", "seed": 1234,
    "algorithm": {"objective": "grpo", "group_size": 8},
    "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct", "revision": COMMIT},
    "data": {"train": {"uri": "/data/train.parquet", "sha256": "a" * 64},
             "validation": {"uri": "/data/val.parquet", "sha256": "b" * 64},
             "max_prompt_tokens": 256, "max_response_tokens": 512},
    "reward": {"entrypoint": "/rewards/math.py:score", "sha256": "c" * 64},
    "rollout": {"backend": "vllm", "temperature": 0.9},
    "optim": {"lr": 2e-6, "warmup_steps": 3},
    "budget": {"total_updates": 50, "prompts_per_update": 32, "mini_batches": 2},
    "checkpoint": {"every": 10, "keep": 2},
    "evaluation": {"every": 5},
    "resources": {"nodes": 1, "gpus_per_node": 8},
}


def golden(algorithm: dict[str, Any], **model: Any) -> dict[str, Any]:
    return variant(BASE, algorithm, **model)


GOLDEN = {
    "grpo": golden({"objective": "grpo", "group_size": 8}),
    "dr_grpo": golden({"objective": "dr_grpo"}),
    "dapo": golden({"objective": "dapo", "overlong": {"buffer_tokens": 128, "penalty": 1.0},
                    "dynamic_sampling": {"max_rounds": 5}}),
    "gspo": golden({"objective": "gspo"}),
    "cispo": golden({"objective": "cispo"}),
    "rloo": golden({"objective": "rloo"}),
    "reinforce_pp": golden({"objective": "reinforce_pp"}),
    "ppo_critic": golden({"objective": "ppo"}),
    "kl_in_loss": golden({"objective": "grpo", "kl": {"coef": 0.02, "estimator": "k3",
                                                      "placement": "loss"}}),
    "kl_in_reward": golden({"objective": "grpo", "kl": {"coef": 0.05, "estimator": "k1",
                                                        "placement": "reward"}}),
    "lora": golden({"objective": "grpo"}, lora={"rank": 16, "alpha": 32,
                                                "target_modules": ["q_proj", "v_proj"]}),
}


def _plan(doc: dict[str, Any], version: str = "0.9.1"):
    adapter = VerlAdapter()
    entry = AdapterEntry(adapter, "builtin", "stateset-backend", "0.1.0")
    return make_plan(parse_spec(doc), entry, version, base_dir=Path("/"))


def _compose(plan, run_dir: Path) -> dict[str, Any]:
    assert VERL_PYTHON is not None
    module_at = plan.argv.index("verl.trainer.main_ppo")
    assert plan.argv[:module_at + 1] == ["{python}", "-m", "verl.trainer.main_ppo"]
    overrides = [a.replace("{run_dir}", str(run_dir)) for a in plan.argv[module_at + 1:]]
    proc = subprocess.run([VERL_PYTHON, str(PROBE)], input=json.dumps(overrides),
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(autouse=True)
def hub_cache(tmp_path, monkeypatch):
    """A Hugging Face cache holding the pinned snapshot, as a machine that pre-fetched it has
    (verl reads the model's config while validating); the weights are not needed for that."""
    import shutil

    from stateset_backend.native.tiny_model import ASSETS

    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    snapshot = Path(hub_snapshot("Qwen/Qwen2.5-0.5B-Instruct", COMMIT))
    shutil.copytree(ASSETS / "tiny-llama-support", snapshot)
    config = json.loads((snapshot / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]  # what a saved checkpoint records
    (snapshot / "config.json").write_text(json.dumps(config))
    return cache


needs_verl = pytest.mark.skipif(VERL_PYTHON is None,
                                reason="STATESET_TEST_VERL_PYTHON is not set (see .ci/run)")


@needs_verl
@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_spec_composes_and_means_what_the_spec_meant(name, tmp_path):
    doc = GOLDEN[name]
    spec = parse_spec(doc)
    plan = _plan(doc)
    probe = _compose(plan, tmp_path)
    assert probe["verl_version"] == "0.9.1"
    cfg = probe["config"]
    actor, rollout, alg = (cfg["actor_rollout_ref"]["actor"], cfg["actor_rollout_ref"]["rollout"],
                           cfg["algorithm"])
    a = spec.algorithm
    # values verl never checks itself: they must be names verl knows
    assert alg["adv_estimator"] in probe["known_estimators"]
    assert actor["policy_loss"]["loss_mode"] in probe["known_loss_modes"]
    assert rollout["name"] in ("vllm", "sglang")
    assert set(cfg["trainer"]["logger"]) <= {"console", "file"}
    assert cfg["trainer"]["resume_mode"] == "disable"
    # the experiment, as verl will run it
    assert rollout["n"] == a.group_size
    assert (actor["clip_ratio_low"], actor["clip_ratio_high"]) == (a.clip.low, a.clip.high)
    agg = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean",
           "seq_mean_token_sum_norm": "seq-mean-token-sum-norm"}
    assert actor["loss_agg_mode"] == agg[a.loss_aggregation]
    assert actor["policy_loss"]["loss_mode"] == {"gspo": "gspo", "cispo": "cispo"}.get(
        a.objective, "vanilla")
    kl = a.kl
    assert actor["use_kl_loss"] == (kl is not None and kl.placement == "loss")
    assert alg["use_kl_in_reward"] == (kl is not None and kl.placement == "reward")
    assert probe["need_reference_policy"] == (kl is not None)
    if kl is not None and kl.placement == "loss":
        assert actor["kl_loss_coef"] == kl.coef
        assert actor["kl_loss_type"] == {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}[
            kl.estimator]
    if kl is not None and kl.placement == "reward":
        assert alg["kl_ctrl"]["kl_coef"] == kl.coef and alg["kl_penalty"] == "kl"
    if a.objective in ("grpo", "dr_grpo", "dapo", "gspo", "cispo"):
        assert alg["norm_adv_by_std_in_grpo"] == a.advantage.std_normalize
    assert alg["filter_groups"]["enable"] == (a.dynamic_sampling is not None)
    if a.dynamic_sampling is not None:
        assert alg["filter_groups"]["max_num_gen_batches"] == a.dynamic_sampling.max_rounds + 1
    if a.overlong is not None:
        assert cfg["reward"]["reward_manager"]["name"] == "dapo"
        ob = cfg["reward"]["reward_kwargs"]["overlong_buffer_cfg"]
        assert (ob["enable"], ob["len"], ob["penalty_factor"]) == (True, 128, 1.0)
        assert cfg["reward"]["reward_kwargs"]["max_resp_len"] == 512
    assert probe["need_critic"] == (a.objective == "ppo")
    if a.gae is not None:
        assert (alg["gamma"], alg["lam"]) == (a.gae.gamma, a.gae.lam)
        assert cfg["critic"]["model"]["path"] == hub_snapshot(spec.model.path, COMMIT)
    lora = spec.model.lora
    model = cfg["actor_rollout_ref"]["model"]
    assert model["lora_rank"] == (lora.rank if lora else 0)
    if lora:
        assert (model["lora_alpha"], list(model["target_modules"])) == (32, ["q_proj", "v_proj"])
    assert model["path"] == hub_snapshot("Qwen/Qwen2.5-0.5B-Instruct", COMMIT)
    # seeds: verl 0.9 has three, all from the one spec seed
    assert cfg["data"]["seed"] == actor["data_loader_seed"] == rollout["seed"] == 1234
    assert (rollout["temperature"], actor["optim"]["lr"]) == (0.9, 2e-6)
    assert actor["optim"]["lr_warmup_steps"] == 3
    assert (cfg["data"]["train_batch_size"], actor["ppo_mini_batch_size"]) == (32, 16)
    assert cfg["trainer"]["total_training_steps"] == 50
    assert (cfg["trainer"]["save_freq"], cfg["trainer"]["test_freq"]) == (10, 5)
    assert cfg["data"]["train_files"] == "/data/train.parquet"
    # identity and outputs inside verl's own naming
    assert cfg["trainer"]["experiment_name"] == identity_name(plan.run_id,
                                                                plan.experiment_digest)
    assert cfg["trainer"]["default_local_dir"] == f"{tmp_path}/checkpoints"
    reward_fn = cfg["reward"]["custom_reward_function"]
    assert (reward_fn["path"], reward_fn["name"]) == (f"{tmp_path}/stateset_reward.py",
                                                      "compute_score")


@needs_verl
def test_an_unknown_key_from_engine_options_is_refused_by_verl(tmp_path):
    doc = golden({"objective": "grpo"})
    doc["engine_options"] = {"verl": {"trainer.no_such_key": 1}}
    plan = _plan(doc)
    overrides = [a.replace("{run_dir}", str(tmp_path)) for a in plan.argv[3:]]
    proc = subprocess.run([VERL_PYTHON or "", str(PROBE)], input=json.dumps(overrides),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "no_such_key" in proc.stderr


@pytest.mark.parametrize("version, change, missing", [
    ("0.6.0", {"objective": "cispo"}, "objective:cispo (available in verl >=0.7)"),
    ("0.5.0", {"objective": "gspo"}, "objective:gspo (available in verl >=0.6"),
    ("0.9.1", {"objective": "grpo", "advantage": {"std": "population"}},
     "advantage_std:population (not available in any verl version)"),
    ("0.7.0", {"objective": "dapo"}, "dynamic_sampling (available in verl >=0.9.1)"),
])
def test_what_a_verl_version_cannot_honour_is_refused_before_launch(version, change, missing):
    with pytest.raises(Unsupported, match=missing.replace("(", r"\(").replace(")", r"\)")):
        _plan(golden(change), version)


def test_verl_rejections_name_the_field():
    doc = golden({"objective": "grpo"})
    doc["data"]["train"]["uri"] = "/data/train.jsonl"
    with pytest.raises(Unsupported, match=r"data\.train\.uri: verl reads parquet"):
        _plan(doc)
    doc = golden({"objective": "grpo"})
    doc["budget"]["mini_batches"] = 3
    with pytest.raises(Unsupported, match=r"budget\.mini_batches: .* 32 prompts do not split"):
        _plan(doc)


def test_seed_keys_follow_the_dialect():
    def seeds(version):
        return {k for k, src in _translation(version).sources.items() if src == "seed"}

    rollout = "actor_rollout_ref.rollout.seed"
    assert seeds("0.5.0") == seeds("0.6.0") == {"+data.seed", f"+{rollout}"}
    assert seeds("0.7.0") == {"data.seed", "actor_rollout_ref.actor.data_loader_seed",
                              f"+{rollout}"}
    assert seeds("0.9.1") == {"data.seed", "actor_rollout_ref.actor.data_loader_seed", rollout}


def _translation(version):
    from packaging.version import Version

    from stateset_backend.core.rules import translate

    adapter = VerlAdapter()
    rules = adapter.rules(adapter.contract.dialect(Version(version)))
    return translate(parse_spec(golden({"objective": "grpo"})), rules, "verl", version)


def test_reward_key_moved_at_0_7_1():
    old = _translation("0.7.0").native
    new = _translation("0.7.1").native
    assert "custom_reward_function.path" in old and "reward.custom_reward_function.path" in new


# -- every dialect against the release that starts it -------------------------------------------
VERL_WHEELS = os.environ.get("STATESET_TEST_VERL_WHEELS")
# the first and last release of each dialect (0.9.1, the last, is installed for the tests above)
RELEASES = ["0.4.1", "0.5.0", "0.6.0", "0.6.1", "0.7.0", "0.7.1", "0.8.0", "0.9.0"]
DAPO_OVERLONG = golden({"objective": "dapo", "dynamic_sampling": None,
                        "advantage": {"zero_variance_groups": "keep"},
                        "overlong": {"buffer_tokens": 128, "penalty": 0.5}})


def _release_sources(version: str, into: Path) -> dict[str, str]:
    """The release's python sources by path; its trainer config is extracted into ``into``."""
    import zipfile

    assert VERL_WHEELS is not None
    wheel = next(Path(VERL_WHEELS).glob(f"verl-{version}-*.whl"))
    sources = {}
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("verl/trainer/config/"):
                archive.extract(name, into)
            elif name.startswith("verl/") and name.endswith(".py"):
                sources[name] = archive.read(name).decode("utf-8")
    return sources


def _read_sections(sources: dict[str, str], pattern: str) -> set[str]:
    """The config sections verl's own code reads a key from (``config.reward.get(...)`` ->
    ``reward``), over every source file."""
    import re

    found = set()
    for text in sources.values():
        for match in re.finditer(pattern, text):
            found.add(match.group(1).removeprefix("config").lstrip("."))
    return found


@pytest.mark.skipif(VERL_WHEELS is None, reason="STATESET_TEST_VERL_WHEELS is not set "
                                                "(see .ci/run)")
@pytest.mark.parametrize("version", RELEASES)
def test_every_dialect_composes_against_its_release_and_uses_the_keys_it_reads(version,
                                                                               tmp_path):
    """Struct-mode composition against the release's own ppo_trainer config (no verl import
    needed: Hydra alone), and the keys that matter cross-checked against the release's code:
    a key that composes but is never read would be ignored silently."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from packaging.version import Version

    sources = _release_sources(version, tmp_path / "wheel")
    keys = VerlAdapter().contract.dialect(Version(version)).keys
    # what this release's code reads
    reward_fn = _read_sections(sources, r'reward_fn_config = (config[\w.]*)\.get\('
                                        r'"custom_reward_function"\)')
    assert reward_fn == {keys["reward_function"].removesuffix("custom_reward_function")
                         .rstrip(".")}
    managers = {f"{section}.reward_manager".lstrip(".") for section in _read_sections(
        sources, r'(config[\w.]*)\.get\("reward_manager"')}  # a name (before 0.7)
    managers |= {f"{section}.name" for section in _read_sections(
        sources, r'RewardManagerConfig = (config[\w.]*)')}  # a config section (0.7 on)
    assert keys["reward_manager"] in managers, managers
    kwargs = _read_sections(sources, r'(config[\w.]*)\.get\("reward_kwargs"')
    assert keys["reward_kwargs"].lstrip("+").removesuffix(".reward_kwargs") in kwargs, kwargs
    tracking = sources["verl/utils/tracking.py"]
    assert ('"file"' in tracking) == (keys["logger"] == "file")
    assert '"tensorboard"' in tracking

    composed = 0
    for name, doc in sorted({**GOLDEN, "dapo_overlong": DAPO_OVERLONG}.items()):
        try:
            plan = _plan(doc, version)
        except Unsupported:
            continue  # refused before launch: nothing reaches verl
        spec = parse_spec(doc)
        at = plan.argv.index("verl.trainer.main_ppo")
        overrides = [a.replace("{run_dir}", str(tmp_path)) for a in plan.argv[at + 1:]]
        config_dir = tmp_path / "wheel" / "verl" / "trainer" / "config"
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            cfg = compose(config_name="ppo_trainer", overrides=overrides)
        composed += 1
        assert cfg.data.seed == cfg.actor_rollout_ref.rollout.seed == spec.seed, name
        reward = OmegaConf.select(cfg, keys["reward_function"])
        assert (reward.path, reward.name) == (f"{tmp_path}/stateset_reward.py", "compute_score")
        assert list(cfg.trainer.logger) == ["console", keys["logger"]]
        assert cfg.trainer.experiment_name == identity_name(plan.run_id, plan.experiment_digest)
        if name == "dapo_overlong":
            manager_value = OmegaConf.select(cfg, keys["reward_manager"])
            assert manager_value == "dapo"
            buffer = OmegaConf.select(cfg, keys["reward_kwargs"].lstrip("+")).overlong_buffer_cfg
            assert (buffer.enable, buffer.len, buffer.penalty_factor) == (True, 128, 0.5)
    assert composed >= 8


@needs_verl
def test_the_installed_version_is_detected_in_another_interpreter(cli, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(golden({"objective": "grpo"})))
    proc = cli("check", "--engine", "verl", "--python", VERL_PYTHON, "--json", spec)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["engine_version"] == "0.9.1"
    engines = json.loads(cli("engines", "--json", "--python", VERL_PYTHON).stdout)["engines"]
    assert next(e for e in engines if e["engine"] == "verl")["installed"] == "0.9.1"
