"""verl: our overrides compose against the real verl's Hydra config, pass verl's own
validate_config, set every key the release defaults that changes the math, and mean exactly what
the spec meant; what verl hard-codes otherwise is declared (and refused under strict) or refused.

Needs a verl installation in another environment (verl pins its own dependency set):
STATESET_TEST_VERL_PYTHON names its interpreter (``.ci/run`` builds it with verl==0.9.1), and
STATESET_TEST_VERL_WHEELS a folder with the earlier release wheels (their configs and code are
read from the wheel, no install needed).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from golden import variant
from optional_installs import VERL_PYTHON_MISSING, VERL_WHEELS_MISSING
from packaging.version import Version

from stateset_backend.adapters.verl.adapter import VerlAdapter
from stateset_backend.common.errors import InvalidInput, Unsupported
from stateset_backend.engines.adapter import identity_name
from stateset_backend.engines.registry import AdapterEntry
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.files import parse_spec
from stateset_backend.translate.hub import hub_snapshot
from stateset_backend.translate.rules import translate

VERL_PYTHON = os.environ.get("STATESET_TEST_VERL_PYTHON")
VERL_WHEELS = os.environ.get("STATESET_TEST_VERL_WHEELS")
PROBE = Path(__file__).with_name("verl_compose.py")
COMMIT = "7ae557604adf67be50417f59c2c2f167def9a775"
ACTOR = "actor_rollout_ref.actor"

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


def _with(doc: dict[str, Any], **sections: dict[str, Any] | None) -> dict[str, Any]:
    for name, values in sections.items():
        doc[name] = None if values is None else {**doc.get(name, {}), **values}
    return doc


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
    "ppo_critic_warmup": golden({"objective": "ppo", "gae": {"critic": {
        "lr": 3e-6, "value_clip": None, "warmup_updates": 4}}}),
    "kl_in_loss": golden({"objective": "grpo", "kl": {"coef": 0.02, "estimator": "k3",
                                                      "placement": "loss"}}),
    "kl_in_reward": golden({"objective": "grpo", "kl": {"coef": 0.05, "estimator": "k1",
                                                        "placement": "reward"}}),
    "lora": golden({"objective": "grpo"}, lora={"rank": 16, "alpha": 32,
                                                "target_modules": ["q_proj", "v_proj"]}),
    # the v2 settings, away from verl's defaults
    "cosine_adam": _with(golden({"objective": "grpo", "clip": {"low": 0.2, "high": 0.28,
                                                               "dual_clip": 3.0},
                                 "entropy_coef": 0.01}, dtype="float16",
                                param_dtype="bfloat16"),
                         optim={"schedule": "cosine", "min_lr_ratio": 0.1,
                                "betas": [0.9, 0.95], "weight_decay": 0.1, "grad_clip": 0.5},
                         rollout={"top_k": 20, "top_p": 0.95},
                         evaluation={"temperature": 0.7, "top_p": 0.9, "samples": 4}),
    "no_checkpoints_kept_all": _with(golden({"objective": "grpo"}),
                                     checkpoint={"every": None, "keep": None},
                                     evaluation={"every": None}),
    "no_validation": _with(golden({"objective": "grpo"}), evaluation={"every": None}),
}
GOLDEN["no_validation"]["data"].pop("validation")
EPS = _with(golden({"objective": "grpo"}), optim={"eps": 1e-6})
UNKNOWN_KEY = {**golden({"objective": "grpo"}),
               "engine_options": {"verl": {"trainer.no_such_key": 1}}}
# What verl does with the key the hub refuses: the same launch, the key appended by hand.
UNREAD = "trainer.no_such_key=1"
TRUNCATE_LEFT = _with(golden({"objective": "grpo"}), data={"prompt_overflow": "truncate_left"})


def _plan(doc: dict[str, Any], version: str = "0.9.1"):
    adapter = VerlAdapter()
    entry = AdapterEntry(adapter, "builtin", "stateset-backend", "0.1.0")
    return make_plan(parse_spec(doc), entry, version, base_dir=Path("/"))


def _overrides(plan, run_dir: Path) -> list[str]:
    at = plan.argv.index("verl.trainer.main_ppo")
    assert plan.argv[:at + 1] == ["{python}", "-m", "verl.trainer.main_ppo"]
    return [a.replace("{run_dir}", str(run_dir)) for a in plan.argv[at + 1:]]


def _hub_cache(cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hugging Face cache holding the pinned snapshot, as a machine that pre-fetched it has
    (verl reads the model's config while validating); the weights are not needed for that."""
    import shutil

    from stateset_backend.native.tiny_model import ASSETS

    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    snapshot = Path(hub_snapshot("Qwen/Qwen2.5-0.5B-Instruct", COMMIT))
    shutil.copytree(ASSETS / "tiny-llama-support", snapshot)
    config = json.loads((snapshot / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]  # what a saved checkpoint records
    (snapshot / "config.json").write_text(json.dumps(config))
    return cache


@pytest.fixture(autouse=True)
def hub_cache(tmp_path, monkeypatch):
    return _hub_cache(tmp_path / "hub", monkeypatch)


@dataclass(frozen=True)
class Composed:
    """A spec's plan (made with ``cache`` as the Hugging Face cache), the folder that stands
    for its run directory, and what verl made of the launch (``error``: verl refused it)."""

    cache: Path
    plan: Any
    run_dir: Path
    probe: dict[str, Any]


@pytest.fixture(scope="module")
def composed(tmp_path_factory) -> dict[str, Composed]:
    """GOLDEN, EPS and UNKNOWN_KEY planned, and composed by one verl interpreter: importing
    verl is most of a composition's time. The tests that read it are one xdist_group, so one
    pytest-xdist worker builds it."""
    assert VERL_PYTHON is not None
    root = tmp_path_factory.mktemp("verl-composed")
    docs = {**GOLDEN, "eps": EPS, "unknown_key": {k: v for k, v in UNKNOWN_KEY.items()
                                                  if k != "engine_options"}}
    with pytest.MonkeyPatch.context() as mp:
        cache = _hub_cache(root / "hub", mp)
        plans = {name: _plan(doc) for name, doc in docs.items()}
    for name in plans:
        (root / name).mkdir()
    jobs = [_overrides(plan, root / name) + ([UNREAD] if name == "unknown_key" else [])
            for name, plan in plans.items()]
    proc = subprocess.run([VERL_PYTHON, str(PROBE)], input=json.dumps(jobs),
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    probes = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: Composed(cache, plan, root / name, probe)
            for (name, plan), probe in zip(plans.items(), probes, strict=True)}


def _composition(composed: dict[str, Composed], name: str,
                 monkeypatch: pytest.MonkeyPatch) -> Composed:
    """The spec's composition, with the cache it was planned against as this test's own."""
    got = composed[name]
    monkeypatch.setenv("HF_HUB_CACHE", str(got.cache))
    assert "error" not in got.probe, got.probe["error"][-3000:]
    return got


needs_verl = pytest.mark.skipif(VERL_PYTHON is None,
                                reason=VERL_PYTHON_MISSING)
needs_wheels = pytest.mark.skipif(VERL_WHEELS is None, reason="STATESET_TEST_VERL_WHEELS is "
                                                              "not set (see .ci/run)")


def _spec_lr(spec, update: int) -> float:
    """The spec's learning rate at update u (0-based)."""
    o, total = spec.optim, spec.budget.total_updates
    if update < o.warmup_steps:
        return o.lr * update / o.warmup_steps
    if o.schedule == "constant":
        return o.lr
    progress = (update - o.warmup_steps) / max(1, total - o.warmup_steps)
    m = o.min_lr_ratio
    return o.lr * (m + (1 - m) * (1 + math.cos(math.pi * progress)) / 2)


@needs_verl
@pytest.mark.xdist_group(__name__)
@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_spec_composes_and_means_what_the_spec_meant(name, composed, monkeypatch):
    doc = GOLDEN[name]
    spec = parse_spec(doc)
    got = _composition(composed, name, monkeypatch)
    plan, probe, run_dir = got.plan, got.probe, got.run_dir
    assert probe["verl_version"] == "0.9.1"
    cfg, engine = probe["config"], probe["engine"]
    actor, rollout, alg = (cfg["actor_rollout_ref"]["actor"], cfg["actor_rollout_ref"]["rollout"],
                           cfg["algorithm"])
    a = spec.algorithm
    # values verl never checks itself: they must be names verl knows
    assert alg["adv_estimator"] in probe["known_estimators"]
    assert actor["policy_loss"]["loss_mode"] in probe["known_loss_modes"]
    assert rollout["name"] in ("vllm", "sglang")
    assert set(cfg["trainer"]["logger"]) <= {"console", "file"}
    assert cfg["trainer"]["resume_mode"] == "disable"
    # the trainer and workers whose keys the dialect writes
    assert cfg["trainer"]["use_v1"] is True and cfg["trainer"]["v1"]["trainer_mode"] == "sync"
    # the experiment, as verl will run it
    assert rollout["n"] == a.group_size
    assert (actor["clip_ratio_low"], actor["clip_ratio_high"]) == (a.clip.low, a.clip.high)
    assert engine["clip_ratio_c"] == (a.clip.dual_clip or 1e9)
    if a.clip.dual_clip is None:  # no ratio reaches it: log-ratios are clamped to [-20, 20]
        assert engine["clip_ratio_c"] > math.exp(20)
    agg = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean",
           "seq_mean_token_sum_norm": "seq-mean-token-sum-norm"}
    assert actor["loss_agg_mode"] == agg[a.loss_aggregation]
    assert actor["loss_scale_factor"] == (spec.data.max_response_tokens if
                                          a.loss_aggregation == "seq_mean_token_sum_norm" else None)
    assert actor["policy_loss"]["loss_mode"] == {"gspo": "gspo", "cispo": "cispo"}.get(
        a.objective, "vanilla")
    kl = a.kl
    assert actor["use_kl_loss"] == (kl is not None and kl.placement == "loss")
    assert alg["use_kl_in_reward"] == (kl is not None and kl.placement == "reward")
    assert probe["need_reference_policy"] == (kl is not None)
    assert alg["kl_ctrl"]["type"] == "fixed"
    if kl is not None and kl.placement == "loss":
        assert actor["kl_loss_coef"] == kl.coef
        assert actor["kl_loss_type"] == {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}[
            kl.estimator]
    if kl is not None and kl.placement == "reward":
        assert alg["kl_ctrl"]["kl_coef"] == kl.coef and alg["kl_penalty"] == "kl"
    if a.objective in ("grpo", "dr_grpo", "dapo", "gspo", "cispo"):
        assert alg["norm_adv_by_std_in_grpo"] == a.advantage.std_normalize
    assert actor["entropy_coeff"] == a.entropy_coef
    fg = alg["filter_groups"]
    assert fg["enable"] == (a.dynamic_sampling is not None)
    if a.dynamic_sampling is not None:  # 'reward': the summed reward the advantage uses
        assert (fg["metric"], fg["max_num_gen_batches"]) == ("reward", 0)
        assert "unbounded_refill" in {d["deviation"] for d in plan.deviations}
    if a.overlong is not None:
        assert cfg["reward"]["reward_manager"]["name"] == "dapo"
        ob = cfg["reward"]["reward_kwargs"]["overlong_buffer_cfg"]
        assert (ob["enable"], ob["len"], ob["penalty_factor"]) == (True, 128, 1.0)
        assert cfg["reward"]["reward_kwargs"]["max_resp_len"] == 512
    else:
        assert cfg["reward"]["reward_manager"]["name"] == "naive"
    assert probe["need_critic"] == (a.objective == "ppo")
    if a.gae is not None:
        assert (alg["gamma"], alg["lam"]) == (a.gae.gamma, a.gae.lam)
        assert cfg["critic"]["model"]["path"] == hub_snapshot(spec.model.path, COMMIT)
        c = a.gae.critic
        assert cfg["critic"]["optim"]["lr"] == c.lr and actor["optim"]["lr"] == spec.optim.lr
        assert cfg["critic"]["cliprange_value"] == (c.value_clip or 1e9)
        # verl updates the actor at step s (from 1) once critic_warmup <= s
        frozen = [s for s in range(1, 10) if cfg["trainer"]["critic_warmup"] > s]
        assert len(frozen) == c.warmup_updates
        assert cfg["critic"]["optim"]["clip_grad"] == spec.optim.grad_clip
    lora = spec.model.lora
    model = cfg["actor_rollout_ref"]["model"]
    assert model["lora_rank"] == (lora.rank if lora else 0)
    if lora:
        assert (model["lora_alpha"], list(model["target_modules"])) == (32, ["q_proj", "v_proj"])
    assert model["path"] == hub_snapshot("Qwen/Qwen2.5-0.5B-Instruct", COMMIT)
    # seeds: verl 0.9 has three, all from the one spec seed
    assert cfg["data"]["seed"] == actor["data_loader_seed"] == rollout["seed"] == 1234
    assert cfg["data"]["shuffle"] is True and actor["shuffle"] is False
    # sampling
    r = spec.rollout
    assert (rollout["temperature"], rollout["top_p"]) == (r.temperature, r.top_p)
    assert rollout["top_k"] == (r.top_k or -1)
    assert (rollout["do_sample"], rollout["ignore_eos"], rollout["over_sample_rate"]) == \
        (True, False, 0)
    # the optimizer verl builds, and its learning rate at every update
    o = spec.optim
    assert engine["optimizer"] == "AdamW"
    assert engine["betas"] == list(o.betas) and engine["eps"] == o.eps
    assert engine["weight_decay"] == o.weight_decay and engine["clip_grad"] == o.grad_clip
    assert actor["grad_clip"] == o.grad_clip
    assert len(engine["lrs"]) == spec.budget.total_updates
    for u, lr in enumerate(engine["lrs"]):
        assert lr == pytest.approx(_spec_lr(spec, u), rel=1e-9, abs=1e-15), u
    # dtypes: FSDP compute dtype and master weights
    precision = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
    assert engine["mixed_precision"] == {"param_dtype": precision[spec.model.dtype],
                                         "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    assert engine["model_dtype"] == precision[spec.model.param_dtype]
    assert rollout["dtype"] == spec.model.dtype
    # the KL reference and the critic exactly as the actor (verl's default is bfloat16 params)
    for fsdp in (cfg["actor_rollout_ref"]["ref"]["fsdp_config"], cfg["critic"]["fsdp"]):
        assert fsdp["mixed_precision"] == engine["mixed_precision"]
        assert fsdp["model_dtype"] == engine["model_dtype"]
    # prompts
    d = spec.data
    assert (cfg["data"]["max_prompt_length"], cfg["data"]["max_response_length"]) == \
        (d.max_prompt_tokens, d.max_response_tokens)
    assert cfg["data"]["filter_overlong_prompts"] is True  # prompt_overflow: drop
    # budget: exactly total_updates updates, enough epochs never to stop earlier
    b = spec.budget
    assert cfg["trainer"]["total_training_steps"] == cfg["trainer"]["total_epochs"] == \
        b.total_updates
    assert (cfg["data"]["train_batch_size"], actor["ppo_mini_batch_size"]) == \
        (b.prompts_per_update, b.prompts_per_update // b.mini_batches)
    assert cfg["data"]["gen_batch_size"] is None
    # validation decoding, checkpoints
    e, c = spec.evaluation, spec.checkpoint
    val = rollout["val_kwargs"]
    assert cfg["trainer"]["test_freq"] == (e.every or -1)
    assert cfg["trainer"]["val_before_train"] is False
    assert (val["temperature"], val["top_p"], val["n"], val["top_k"], val["do_sample"]) == \
        (e.temperature, e.top_p, e.samples, -1, e.temperature > 0)
    assert cfg["trainer"]["save_freq"] == (c.every or b.total_updates)
    assert cfg["trainer"]["max_actor_ckpt_to_keep"] == \
        cfg["trainer"]["max_critic_ckpt_to_keep"] == c.keep
    if spec.data.validation is None:
        assert cfg["data"]["val_files"] == cfg["data"]["train_files"]
    else:
        assert cfg["data"]["val_files"] == "/data/val.parquet"
    assert cfg["data"]["train_files"] == "/data/train.parquet"
    # identity and outputs inside verl's own naming
    assert cfg["trainer"]["experiment_name"] == identity_name(plan.run_id,
                                                                plan.experiment_digest)
    assert cfg["trainer"]["default_local_dir"] == f"{run_dir}/checkpoints"
    reward_fn = cfg["reward"]["custom_reward_function"]
    assert (reward_fn["path"], reward_fn["name"]) == (f"{run_dir}/stateset_reward.py",
                                                      "compute_score")


@needs_verl
@pytest.mark.xdist_group(__name__)
def test_a_spec_eps_reaches_verls_adamw(composed, monkeypatch):
    probe = _composition(composed, "eps", monkeypatch).probe
    assert probe["engine"]["eps"] == 1e-6


@needs_verl
@pytest.mark.xdist_group(__name__)
def test_an_unknown_key_from_engine_options_is_refused_before_verl_would(composed):
    """The hub refuses a key the release's surface lacks at plan time (exit 2), and verl's
    own composition shows the surface is right: the same key, appended to the launch, is an
    error there too, found only after a queue wait."""
    with pytest.raises(InvalidInput, match=r"has no option 'trainer\.no_such_key'"):
        _plan(UNKNOWN_KEY)
    refused = composed["unknown_key"].probe
    assert "error" in refused and "no_such_key" in refused["error"]


# -- what verl cannot honour, or honours with a declared deviation --------------------------------
@pytest.mark.parametrize("version, change, missing", [
    ("0.6.0", {"objective": "cispo"}, "objective:cispo (available in verl >=0.7)"),
    ("0.5.0", {"objective": "gspo"}, "objective:gspo (available in verl >=0.6"),
    ("0.9.1", {"objective": "grpo", "advantage": {"std": "population"}},
     "advantage_std:population (not available in any verl version)"),
    ("0.8.0", {"objective": "dapo"}, "dynamic_sampling (available in verl >=0.9)"),
    ("0.6.1", {"objective": "dr_grpo"}, "loss_agg:seq_mean_token_sum_norm (available in "
                                        "verl >=0.7)"),
])
def test_what_a_verl_version_cannot_honour_is_refused_before_launch(version, change, missing):
    with pytest.raises(Unsupported, match=re.escape(missing)):
        _plan(golden(change), version)


def _refused(doc: dict[str, Any], version: str, setting: str) -> str:
    with pytest.raises(Unsupported) as info:
        _plan(doc, version)
    reasons = [r for r in info.value.details["refused"] if r.startswith(setting + ":")]
    assert reasons, info.value.details["refused"]
    return reasons[0]


@pytest.mark.parametrize("version, doc, setting, reason", [
    ("0.9.1", _with(golden({"objective": "grpo"}), optim={"schedule": "linear"}),
     "optim.schedule", "constant and cosine"),
    ("0.6.0", EPS, "optim.eps", "always uses 1e-08"),
    ("0.9.1", _with(golden({"objective": "grpo"}), data={"chat_template": False}),
     "data.chat_template", "always uses true"),
    ("0.9.1", golden({"objective": "grpo", "advantage": {"std_normalize": True,
                                                         "epsilon": 1e-5}}),
     "algorithm.advantage.epsilon", "always uses 1e-06"),
    ("0.9.1", golden({"objective": "rloo", "kl": {"coef": 0.01, "estimator": "k1",
                                                  "placement": "reward", "clamp": 5.0}}),
     "algorithm.kl.clamp", "does not clamp the k1"),
    ("0.9.1", golden({"objective": "gspo", "clip": {"low": 3e-4, "high": 4e-4,
                                                    "dual_clip": 3.0}}),
     "algorithm.clip.dual_clip", "no dual clip"),
    ("0.7.1", TRUNCATE_LEFT, "data.prompt_overflow", "neither truncates nor rejects"),
    ("0.9.1", _with(golden({"objective": "grpo"}), data={"prompt_overflow": "error"}),
     "data.prompt_overflow", "always truncates from the left"),
    ("0.9.1", golden({"objective": "grpo", "advantage": {"std_normalize": True,
                                                         "scope": "batch"}}),
     "algorithm.advantage.scope", "per group"),
    ("0.9.1", golden({"objective": "grpo"}, lora={"rank": 8, "alpha": 16, "dropout": 0.1}),
     "model.lora.dropout", "always uses 0.0"),
])
def test_verl_refusals_name_the_setting(version, doc, setting, reason):
    assert reason in _refused(doc, version, setting)


def test_verl_rejections_name_the_field():
    doc = golden({"objective": "grpo"})
    doc["data"]["train"]["uri"] = "/data/train.jsonl"
    assert "verl reads parquet" in _refused(doc, "0.9.1", "data.train.uri")
    doc = golden({"objective": "grpo"})
    doc["budget"]["mini_batches"] = 3
    assert "32 prompts per update do not split" in _refused(doc, "0.9.1", "budget.mini_batches")


DECLARED = [
    ("0.9.1", "dapo", GOLDEN["dapo"], {"unbounded_refill"}),
    ("0.9.0", "dapo", GOLDEN["dapo"], {"unbounded_refill", "filter_on_score"}),
    ("0.9.1", "reinforce_pp", GOLDEN["reinforce_pp"], {"whitening_epsilon"}),
    ("0.9.1", "ppo", GOLDEN["ppo_critic"], {"whitening_epsilon"}),
    ("0.7.1", "token_mean", golden({"objective": "rloo"}),
     {"micro_batch_token_mean", "zero_variance_float_mean"}),
    ("0.5.0", "cosine_floor", _with(golden({"objective": "grpo"}),
                                    optim={"schedule": "cosine", "min_lr_ratio": 0.1}),
     {"cosine_warmup_from_floor", "zero_variance_float_mean"}),
    ("0.9.1", "k3_unclamped", golden({"objective": "grpo", "kl": {"coef": 0.01, "clamp": None}}),
     {"k3_clamp", "zero_variance_float_mean"}),
]


@pytest.mark.parametrize("version, label, doc, names", DECLARED,
                         ids=[f"{v}-{label}" for v, label, _, _ in DECLARED])
def test_declared_deviations_are_recorded_and_refused_under_strict(version, label, doc, names):
    plan = _plan(doc, version)
    assert {d["deviation"] for d in plan.deviations} == names
    dialect = plan.resolved_dialect()
    for d in plan.deviations:
        assert dialect.deviations[d["deviation"]].setting == d["setting"]
        assert d["description"] == dialect.deviations[d["deviation"]].description
    strict = {**doc, "equivalence": "strict"}
    with pytest.raises(Unsupported, match="refused under equivalence: strict"):
        _plan(strict, version)


def _translation(version, doc=None):
    adapter = VerlAdapter()
    dialect = adapter.contract.dialect(Version(version))
    spec = parse_spec(doc or golden({"objective": "grpo"}))
    return translate(spec, adapter.rules(dialect), dialect, "verl", version)


def test_seed_keys_follow_the_dialect():
    def seeds(version):
        return {k for k, src in _translation(version).sources.items() if src == "seed"}

    rollout = "actor_rollout_ref.rollout.seed"
    assert seeds("0.5.0") == seeds("0.6.0") == {"+data.seed", f"+{rollout}"}
    assert seeds("0.6.1") == {"data.seed", f"+{rollout}"}
    assert seeds("0.7.0") == seeds("0.8.0") == {"data.seed", f"{ACTOR}.data_loader_seed",
                                                f"+{rollout}"}
    assert seeds("0.9.1") == {"data.seed", f"{ACTOR}.data_loader_seed", rollout}


def test_reward_key_moved_at_0_7_1():
    old = _translation("0.7.0").native
    new = _translation("0.7.1").native
    assert "custom_reward_function.path" in old and "reward.custom_reward_function.path" in new


def test_grad_clip_is_written_where_each_release_reads_it():
    clip = {k for k, src in _translation("0.5.0").sources.items() if src == "optim.grad_clip"}
    assert clip == {f"{ACTOR}.grad_clip", "critic.grad_clip"}
    clip = {k for k, src in _translation("0.9.1").sources.items() if src == "optim.grad_clip"}
    assert {f"{ACTOR}.optim.clip_grad", "critic.optim.clip_grad"} <= clip


def test_dual_clip_null_is_a_ratio_no_ratio_reaches():
    assert _translation("0.9.1").native[f"{ACTOR}.clip_ratio_c"] == 1e9
    dual = golden({"objective": "grpo", "clip": {"low": 0.2, "high": 0.2, "dual_clip": 3.0}})
    assert _translation("0.9.1", dual).native[f"{ACTOR}.clip_ratio_c"] == 3.0


def test_prompt_overflow_per_release():
    assert _translation("0.6.1", TRUNCATE_LEFT).native["data.truncation"] == "left"
    native = _translation("0.9.1", TRUNCATE_LEFT).native
    assert native["data.filter_overlong_prompts"] is False and "data.truncation" not in native


# -- every dialect against its releases' own config and code -------------------------------------
# the first and last release of each dialect (0.9.1 is installed in STATESET_TEST_VERL_PYTHON)
DIALECT_RELEASES = {"v0.4": ["0.4.1", "0.5.0"], "v0.6.0": ["0.6.0"], "v0.6.1": ["0.6.1"],
                    "v0.7.0": ["0.7.0"], "v0.7.1": ["0.7.1"], "v0.8": ["0.8.0"],
                    "v0.9.0": ["0.9.0"], "v0.9.1": ["0.9.1"]}
RELEASES = [v for vs in DIALECT_RELEASES.values() for v in vs]
DAPO_OVERLONG = golden({"objective": "dapo", "dynamic_sampling": None,
                        "advantage": {"zero_variance_groups": "keep"},
                        "overlong": {"buffer_tokens": 128, "penalty": 0.5}})


def _installed_verl_dir() -> Path:
    out = subprocess.run([VERL_PYTHON or "", "-c", "import importlib.util; print(importlib.util."
                          "find_spec('verl').submodule_search_locations[0])"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return Path(out.strip())


def _release(version: str, into: Path) -> tuple[Path, dict[str, str]]:
    """The release's trainer config folder and its python sources by path: from the wheel, or
    (0.9.1) from the installed package."""
    if version == "0.9.1":
        root = _installed_verl_dir()
        sources = {f"verl/{p.relative_to(root)}": p.read_text(encoding="utf-8")
                   for p in root.rglob("*.py")}
        return root / "trainer" / "config", sources
    assert VERL_WHEELS is not None
    wheel = next(Path(VERL_WHEELS).glob(f"verl-{version}-*.whl"))
    sources = {}
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("verl/trainer/config/"):
                archive.extract(name, into)
            elif name.startswith("verl/") and name.endswith(".py"):
                sources[name] = archive.read(name).decode("utf-8")
    return into / "verl" / "trainer" / "config", sources


def _compose_release(config_dir: Path, overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def _read_sections(sources: dict[str, str], pattern: str) -> set[str]:
    """The config sections verl's own code reads a key from (``config.reward.get(...)`` ->
    ``reward``), over every source file."""
    found = set()
    for text in sources.values():
        for match in re.finditer(pattern, text):
            found.add(match.group(1).removeprefix("config").lstrip("."))
    return found


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def _needs_release(version: str) -> Any:
    return pytest.mark.skipif((VERL_PYTHON if version == "0.9.1" else VERL_WHEELS) is None,
                              reason=VERL_PYTHON_MISSING if version == "0.9.1"
                              else VERL_WHEELS_MISSING)


@pytest.mark.parametrize("version", [pytest.param(v, marks=_needs_release(v))
                                     for v in RELEASES])
def test_recorded_defaults_are_the_releases_own(version, tmp_path):
    """Every recorded default equals the release's composed config; a key the dialect writes
    with '+' is absent from the config, and the release's code reads it with .get()."""
    from omegaconf import OmegaConf

    dialect = VerlAdapter().contract.dialect(Version(version))
    assert version in DIALECT_RELEASES[dialect.name]
    config_dir, sources = _release(version, tmp_path / "wheel")
    cfg = OmegaConf.to_container(_compose_release(config_dir, []), resolve=False)
    added = set(dialect.keys["added"])
    code = "\n".join(sources.values())
    for key, default in dialect.defaults.items():
        node: Any = cfg
        for part in key.split("."):
            node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
        if key in added:
            assert node is KeyError, f"{key} is in the {version} config: no '+'"
            assert re.search(rf'\.get\(\s*"{key.rsplit(".", 1)[1]}"', code), key
        else:
            assert node is not KeyError, f"{key} is not in the {version} config"
            assert _same(node, default), (key, node, default)
    for key in dialect.keys["fixed"]:
        assert key in dialect.defaults


@pytest.mark.parametrize("version", [pytest.param(v, marks=_needs_release(v))
                                     for v in RELEASES])
def test_every_dialect_composes_against_its_release_and_uses_the_keys_it_reads(version,
                                                                               tmp_path):
    """Struct-mode composition against the release's own ppo_trainer config (Hydra alone),
    every native key of the launch resolved to the value the launch set, and the keys that
    matter cross-checked against the release's code: a key that composes but is never read
    would be ignored silently."""
    from omegaconf import OmegaConf

    config_dir, sources = _release(version, tmp_path / "wheel")
    dialect = VerlAdapter().contract.dialect(Version(version))
    keys = dialect.keys
    # what this release's code reads
    reward_fn = _read_sections(sources, r'reward_fn_config = (config[\w.]*)\.get\('
                                        r'"custom_reward_function"\)')
    if reward_fn:  # 0.9 reads it through the reward loop
        assert reward_fn == {keys["reward_function"].removesuffix("custom_reward_function")
                             .rstrip(".")}
    managers = {f"{section}.reward_manager".lstrip(".") for section in _read_sections(
        sources, r'(config[\w.]*)\.get\("reward_manager"')}  # a name (before 0.7)
    managers |= {f"{section}.name" for section in _read_sections(
        sources, r'RewardManagerConfig = (config[\w.]*)')}  # a config section (0.7 on)
    if managers:
        assert keys["reward_manager"] in managers, managers
    tracking = sources["verl/utils/tracking.py"]
    assert ('"file"' in tracking) == (keys["logger"] == "file")
    code = "\n".join(sources.values())
    engine_workers = "verl/workers/engine_workers.py" in sources and \
        "verl/workers/fsdp_workers.py" not in sources
    assert (keys["token_mean"] == "global") == engine_workers
    if engine_workers:  # the FSDP engine clips with optim.clip_grad
        assert "self.optimizer_config.clip_grad" in code
        assert f"{ACTOR}.optim.clip_grad" in keys["grad_clip"]
    else:  # the legacy actor clips with actor.grad_clip
        assert re.search(r"max_norm=self\.config\.grad_clip", code)
        assert f"{ACTOR}.grad_clip" in keys["grad_clip"]
    if f"{ACTOR}.optim.override_optimizer_config" in dialect.defaults:
        assert "override_optimizer_config" in sources["verl/workers/config/optimizer.py"]
    if keys["filter_groups"]:
        assert "filter_groups" in sources["verl/trainer/ppo/v1/trainer_base.py"]

    composed = 0
    for name, doc in sorted({**GOLDEN, "dapo_overlong": DAPO_OVERLONG, "eps": EPS,
                             "truncate_left": TRUNCATE_LEFT}.items()):
        try:
            plan = _plan(doc, version)
        except Unsupported:
            continue  # refused before launch: nothing reaches verl
        spec = parse_spec(doc)
        cfg = _compose_release(config_dir, _overrides(plan, tmp_path))
        composed += 1
        for key, value in plan.native.items():  # every key resolves to what the launch set
            value = json.loads(json.dumps(value).replace("{run_dir}", str(tmp_path)))
            got = OmegaConf.select(cfg, key.lstrip("+"))
            got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
            assert _same(got, value), (name, key, got, value)
        assert cfg.data.seed == cfg.actor_rollout_ref.rollout.seed == spec.seed, name
        reward = OmegaConf.select(cfg, keys["reward_function"])
        assert (reward.path, reward.name) == (f"{tmp_path}/stateset_reward.py", "compute_score")
        assert list(cfg.trainer.logger) == ["console", keys["logger"]]
        assert cfg.trainer.experiment_name == identity_name(plan.run_id, plan.experiment_digest)
        assert cfg.trainer.total_epochs == cfg.trainer.total_training_steps == \
            spec.budget.total_updates
        if name == "dapo_overlong":
            assert OmegaConf.select(cfg, keys["reward_manager"]) == "dapo"
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


VERL_SURFACE_RELEASES = ["0.4.1", "0.5.0", "0.6.0", "0.6.1", "0.7.0", "0.7.1", "0.8.0", "0.9.0",
                         "0.9.1"]


@pytest.mark.parametrize("version", VERL_SURFACE_RELEASES)
def test_shipped_surfaces_are_the_releases_composed_configs(version):
    """The surface the kit reads launches against, regenerated from the release (its wheel, or
    the installed 0.9.1) by the command that wrote it, is byte for byte the one shipped."""
    import subprocess
    from importlib import resources

    from stateset_backend.conformance import surface_gen

    if version == "0.9.1":
        if VERL_PYTHON is None:
            pytest.skip(VERL_PYTHON_MISSING)
        found = subprocess.run([VERL_PYTHON, "-c", "import os, verl; print(os.path.join("
                                "os.path.dirname(verl.__file__), 'trainer', 'config'))"],
                               capture_output=True, text=True, check=True, timeout=120)
        source = Path(found.stdout.strip())
    else:
        if VERL_WHEELS is None:
            pytest.skip(VERL_WHEELS_MISSING)
        (source,) = Path(VERL_WHEELS).glob(f"verl-{version}-*.whl")
    shipped = resources.files("stateset_backend.contracts").joinpath(
        "surfaces", f"verl-{version}.json").read_text()
    generated = surface_gen.render(surface_gen.verl_surface(source, version))
    assert generated == shipped, "regenerate: python -m stateset_backend.conformance." \
        f"surface_gen verl {source} --version {version} -o stateset_backend/contracts/surfaces"


@pytest.mark.parametrize("version", VERL_SURFACE_RELEASES)
def test_each_value_domain_holds_the_releases_own_default(version):
    """A domain read from a release's registries and dispatch that lacks the release's own
    default was read incompletely (a dispatch site the generator does not know): the kit
    would then fail correct launches of that release."""
    from stateset_backend.contracts.surfaces import surface

    options = surface("verl", version)["options"]
    domains = {key: o for key, o in options.items() if "values" in o}
    assert {"algorithm.adv_estimator", "actor_rollout_ref.actor.loss_agg_mode",
            "actor_rollout_ref.actor.policy_loss.loss_mode"} <= set(domains)
    for key, option in domains.items():
        default = option["default"]
        assert default is None or default in option["values"], (key, default)


@pytest.mark.parametrize("version, ordered", [("0.8.0", False), ("0.9.0", True),
                                              ("0.9.1", True)])
def test_the_v1_trainer_gets_the_sampler_that_keeps_the_draw_order(version, ordered):
    """verl 0.9's v1 ReplayBuffer hands samples to the actor as they finish generating, so
    mini-batches changed from run to run and across a resume; the launch ships the sampler that
    orders them, and names it where verl looks for a custom one. Older releases have no v1."""
    plan = _plan(golden({"objective": "grpo"}), version)
    sampler = "stateset_verl_sampler.py"
    named = {a for a in plan.argv if a.startswith("trainer.v1.sampler.custom_sampler.")}
    if not ordered:
        assert sampler not in plan.files and not named
        return
    assert named == {f"trainer.v1.sampler.custom_sampler.path='{{run_dir}}/{sampler}'",
                     "trainer.v1.sampler.custom_sampler.name=OrderedReplayBuffer"}
    source = plan.files[sampler]
    assert "class OrderedReplayBuffer(ReplayBuffer):" in source
    compile(source, sampler, "exec")
