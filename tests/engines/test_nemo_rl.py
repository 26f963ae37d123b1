"""NeMo RL: every launch pins every key of the release's own ``grpo_math_1B.yaml`` that changes
the math or the budget, the overrides apply in struct mode to the real v0.5.0, v0.6.0 and v0.7.0
configs (pinned copies in ../shared/engines/nemo-rl) with the base config's types, and the
resolved config means what the spec says. What NeMo RL hard-codes differently is declared (and
refused under ``equivalence: strict``) or refused."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from golden import variant
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from optional_installs import NEMO_RL_CONFIGS, NEMO_RL_CONFIGS_MISSING
from packaging.version import Version

from stateset_backend.adapters.nemo_rl.adapter import NemoRLAdapter
from stateset_backend.adapters.nemo_rl.training_rules import WARMUP_START
from stateset_backend.common.errors import Unsupported
from stateset_backend.engines.registry import AdapterEntry
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.files import parse_spec

CONFIGS = NEMO_RL_CONFIGS
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "external"
pytestmark = pytest.mark.skipif(not CONFIGS.is_dir(), reason=NEMO_RL_CONFIGS_MISSING)
VERSIONS = ["0.5.0", "0.6.0", "0.7.0"]
VALIDATION_ROWS = 200  # examples/external/data/validation.parquet

BASE: dict[str, Any] = {
    "name": "golden", "seed": 5,
    "algorithm": {"objective": "grpo", "group_size": 16, "loss_aggregation": "token_mean"},
    "model": {"path": "/models/qwen2.5-1.5b", "dtype": "bfloat16"},
    "data": {"train": {"uri": "data/train.parquet",
                       "sha256": "3d1b7fce7fd775e3492fbba18f2f32913b0bf691da76d96fff7ba87dea614dba",
                       "prompt_field": "q", "answer_field": "a"},
             "validation": {"uri": "data/validation.parquet",
                            "sha256": "54f01d5e5bc189190468bd70ac5ef2c0"
                                      "fb757fc654fc0765e1e166c1f3f29507"},
             "max_prompt_tokens": 256, "max_response_tokens": 768},
    "reward": {"entrypoint": "/rewards/math.py:score", "sha256": "c" * 64},
    "rollout": {"backend": "vllm", "temperature": 0.7},
    "optim": {"lr": 3e-6, "warmup_steps": 20, "betas": [0.9, 0.95], "eps": 1e-6,
              "schedule": "cosine", "min_lr_ratio": 0.1},
    "budget": {"total_updates": 300, "prompts_per_update": 32, "mini_batches": 4},
    "checkpoint": {"every": 25, "keep": 2},
    "evaluation": {"every": 10, "temperature": 0.7},
    "resources": {"nodes": 1, "gpus_per_node": 8},
}


def golden(algorithm: dict[str, Any], **model: Any) -> dict[str, Any]:
    """Token-mean aggregation unless asked: the only one every release has."""
    return variant(BASE, algorithm, algorithm_defaults={"loss_aggregation": "token_mean"}, **model)


GOLDEN = {
    "grpo": golden({"objective": "grpo"}),
    "grpo_dual_clip": golden({"objective": "grpo", "clip": {"low": 0.2, "high": 0.28,
                                                           "dual_clip": 3.0}}),
    "rloo": golden({"objective": "rloo", "kl": {"coef": 0.001, "estimator": "k1",
                                                "placement": "loss"}}),
    "gspo": golden({"objective": "gspo", "loss_aggregation": "seq_mean_token_mean"}),
    "dapo": golden({"objective": "dapo", "overlong": {"buffer_tokens": 128, "penalty": 1.0}}),
    "kl_k1": golden({"objective": "grpo", "kl": {"coef": 0.05, "estimator": "k1"}}),
    "cispo": golden({"objective": "cispo"}),
    "reinforce_pp": golden({"objective": "reinforce_pp"}),
    "lora": golden({"objective": "grpo"}, lora={"rank": 8, "alpha": 32}),
}
SUPPORTS = {"cispo": "0.7.0", "lora": "0.6.0", "reinforce_pp": "0.6.0"}
ENTRY = AdapterEntry(NemoRLAdapter(), "builtin", "stateset-backend", "0.1.0")


def plan_for(doc: dict[str, Any], version: str):
    return make_plan(parse_spec(doc), ENTRY, version, base_dir=EXAMPLES)


def overrides_of(plan, run_dir: str) -> list[str]:
    at = plan.argv.index("--config")
    return [a.replace("{run_dir}", run_dir) for a in plan.argv[at + 2:]]


def release_config(version: str):
    return OmegaConf.load(CONFIGS / f"v{version}" / "examples" / "configs" / "grpo_math_1B.yaml")


def apply(version: str, overrides: list[str]):
    base = release_config(version)
    cfg = copy.deepcopy(base)
    OmegaConf.set_struct(cfg, True)
    parsed = OverridesParser.create().parse_overrides(overrides=overrides)
    ConfigLoaderImpl._apply_overrides_to_config(overrides=parsed, cfg=cfg)
    return base, cfg, parsed


def raw(cfg: Any, key: str) -> Any:
    """A key's value as the YAML writes it (interpolations unresolved)."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return OmegaConf.to_container(node, resolve=False)[leaf]


# keys NeMo RL types as optional (``prompt_file: NotRequired[str | None]`` in nemo_rl/data)
NULLABLE = ("prompt_file", "system_prompt_file", "metric_name", "kl_input_clamp_value",
            "kl_output_clamp_value", "keep_top_k", "truncated_importance_sampling_type")


def _kind(value: Any) -> str:
    """Type classes as a config reader sees them: YAML writes the float 1.0 as ``1``, so
    int and float are one numeric kind; bool, str, list and dict must match exactly."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__.replace("ListConfig", "list").replace("DictConfig", "dict")


@pytest.mark.parametrize("version", VERSIONS)
def test_recorded_defaults_are_the_release_config(version):
    dialect = ENTRY.adapter.contract.dialect(Version(version))
    cfg = release_config(version)
    assert dialect.defaults, version
    for key, value in dialect.defaults.items():
        assert OmegaConf.select(cfg, key, default="<absent>") != "<absent>", key
        assert raw(cfg, key) == value, key


@pytest.mark.parametrize("version", VERSIONS)
def test_every_math_key_of_the_recipe_is_recorded(version):
    """The loss, advantage and budget sections are recorded whole: a key NeMo RL adds there
    in a later tag fails this test until it is pinned."""
    cfg = release_config(version)
    dialect = ENTRY.adapter.contract.dialect(Version(version))
    for section in ("loss_fn", "grpo"):
        flat = OmegaConf.to_container(cfg[section], resolve=False)
        for key, value in flat.items():
            path = f"{section}.{key}"
            if isinstance(value, dict):
                continue
            assert path in dialect.defaults or path in {"grpo.adv_estimator"}, path


def _resolved(name: str, version: str, tmp_path: Path):
    plan = plan_for(GOLDEN[name], version)
    overrides = overrides_of(plan, str(tmp_path))
    base, cfg, parsed = apply(version, overrides)
    for override in parsed:
        key = override.key_or_group
        old = OmegaConf.select(base, key, throw_on_missing=False)
        new = OmegaConf.select(cfg, key, throw_on_missing=False)
        if override.is_add() or old is None or (new is None and key.endswith(NULLABLE)):
            continue
        assert _kind(new) == _kind(old), (key, old, new)
    OmegaConf.register_new_resolver("mul", lambda a, b: a * b, replace=True)
    return plan, OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_the_resolved_release_config_means_what_the_spec_says(name, version, tmp_path):
    if Version(version) < Version(SUPPORTS.get(name, "0.5.0")):
        pytest.skip(f"{name} is refused before launch on {version} (see the refusal tests)")
    plan, cfg = _resolved(name, version, tmp_path)
    dialect = plan.resolved_dialect()
    assert set(dialect.defaults) <= {k.lstrip("+") for k in plan.native}
    spec = parse_spec(GOLDEN[name])
    a = spec.algorithm
    grpo, loss, policy = cfg["grpo"], cfg["loss_fn"], cfg["policy"]
    # budget: exactly total_updates, one pass never ends it early, the last batch is dropped
    assert grpo["max_num_steps"] == grpo["max_num_epochs"] == 300
    assert grpo["num_prompts_per_step"] == 32
    assert grpo["num_generations_per_prompt"] == a.group_size
    assert policy["train_global_batch_size"] == 32 * a.group_size // 4
    assert grpo["seed"] == 5 and cfg["data"]["shuffle"] is True
    # optimizer and schedule
    opt = policy["optimizer"]
    assert opt["name"] == "torch.optim.AdamW"
    assert opt["kwargs"]["lr"] == 3e-6 and opt["kwargs"]["betas"] == [0.9, 0.95]
    assert opt["kwargs"]["eps"] == 1e-6 and opt["kwargs"]["weight_decay"] == 0.01
    assert policy["max_grad_norm"] == 1.0
    assert policy["scheduler"] == [
        {"name": "torch.optim.lr_scheduler.LinearLR",
         "kwargs": {"start_factor": WARMUP_START, "end_factor": 1.0, "total_iters": 20}},
        {"name": "torch.optim.lr_scheduler.CosineAnnealingLR",
         "kwargs": {"T_max": 280, "eta_min": pytest.approx(3e-7)}},
        {"milestones": [20]}]
    assert policy["dtensor_cfg"]["_v2"] and not policy["megatron_cfg"]["enabled"]
    # clip and loss
    assert (loss["ratio_clip_min"], loss["ratio_clip_max"]) == (a.clip.low, a.clip.high)
    assert loss["ratio_clip_c"] == a.clip.dual_clip
    assert loss["token_level_loss"] == (a.loss_aggregation == "token_mean")
    assert loss["sequence_level_importance_ratios"] == (a.objective == "gspo")
    if a.kl is None:
        assert loss["reference_policy_kl_penalty"] == 0.0
    else:
        assert loss["reference_policy_kl_penalty"] == a.kl.coef
        assert loss["reference_policy_kl_type"] == a.kl.estimator
        assert loss["kl_output_clamp_value"] == a.kl.clamp
        assert loss["kl_input_clamp_value"] == (20.0 if a.kl.estimator == "k3" else None)
    if "use_kl_in_reward" in loss:
        assert loss["use_kl_in_reward"] is False
    if "use_cispo" in loss:
        assert loss["use_cispo"] == (a.objective == "cispo")
    # advantages
    assert grpo["normalize_rewards"] == a.advantage.std_normalize
    assert grpo["use_leave_one_out_baseline"] == (a.objective == "rloo")
    if "adv_estimator" in grpo:
        assert grpo["adv_estimator"]["name"] == ("reinforce_plus_plus"
                                                 if a.objective == "reinforce_pp" else "grpo")
        assert grpo["adv_estimator"]["normalize_rewards"] == a.advantage.std_normalize
    assert grpo["use_dynamic_sampling"] == (a.dynamic_sampling is not None)
    if a.dynamic_sampling is not None:  # one batch plus max_rounds more
        assert grpo["dynamic_sampling_max_gen_batches"] == a.dynamic_sampling.max_rounds
    shaping = grpo["reward_shaping"]
    assert shaping["enabled"] == (a.overlong is not None)
    if a.overlong is not None:
        assert shaping["overlong_buffer_length"] == a.overlong.buffer_tokens
        assert shaping["max_response_length"] == 768
    # features the spec has no name for are off
    fixed = dialect.keys["fixed"]
    assert fixed and set(fixed) <= set(dialect.defaults)
    for key, off in fixed.items():
        assert OmegaConf.select(OmegaConf.create(cfg), key) == off, key
    # prompts: limits, chat template, no chain-of-thought wrapper
    assert policy["model_name"] == "/models/qwen2.5-1.5b"
    assert policy["max_total_sequence_length"] == 256 + 768
    assert policy["generation"]["max_new_tokens"] == 768
    assert cfg["data"]["max_input_seq_length"] == 257  # the launcher drops longer prompts
    assert policy["tokenizer"]["chat_template_kwargs"] is None
    # sampling and validation
    gen = policy["generation"]
    assert (gen["temperature"], gen["top_p"], gen["top_k"]) == (0.7, 1.0, None)
    assert grpo["val_period"] == 10 and grpo["val_at_start"] is False
    assert grpo.get("val_at_end", False) is False
    assert grpo["max_val_samples"] == grpo["val_batch_size"] == VALIDATION_ROWS
    # checkpoints: every 25 (and the last), the newest 2 kept, whole optimizer state
    ck = cfg["checkpointing"]
    assert (ck["enabled"], ck["save_period"], ck["keep_top_k"]) == (True, 25, 2)
    assert ck["metric_name"] is None and ck["checkpoint_must_save_by"] is None
    assert ck.get("save_optimizer", True) is True
    assert policy["precision"] == "bfloat16"
    # outputs and identity
    assert ck["checkpoint_dir"] == f"{tmp_path}/checkpoints"
    assert cfg["logger"]["log_dir"] == f"{tmp_path}/logs" and cfg["logger"]["tensorboard_enabled"]
    assert cfg["logger"]["wandb"]["name"] == f"{plan.run_id}.{plan.experiment_digest[7:]}"
    # the launcher converts each split into ResponseDataset rows in the run directory, and
    # NeMo RL scores them with the environment and processor it registers
    converted = {k: f"{tmp_path}/data/{k}.jsonl" for k in ("train", "validation")}
    data = cfg["data"]
    if version == "0.5.0":
        assert (data["train_data_path"], data["val_data_path"]) == tuple(converted.values())
        train = validation = defaults = data
    else:
        train, validation, defaults = data["train"], data["validation"], data["default"]
        assert (train["data_path"], validation["data_path"]) == tuple(converted.values())
        assert train["split_validation_size"] == 0
    for section in (train, validation):
        assert section["dataset_name"] == "ResponseDataset"
        assert (section["input_key"], section["output_key"]) == ("input", "output")
    assert (defaults["env_name"], defaults["processor"]) == ("stateset_reward",
                                                             "stateset_chat_prompt")
    assert defaults["prompt_file"] is None and defaults["system_prompt_file"] is None
    assert cfg["env"]["stateset_reward"] == {"entrypoint": "/rewards/math.py:score",
                                             "sha256": "c" * 64}
    if spec.model.lora:
        lora = policy["dtensor_cfg"]["lora_cfg"]
        assert (lora["enabled"], lora["dim"], lora["alpha"], lora["match_all_linear"]) == (
            True, 8, 32.0, True)
    prepare = json.loads(plan.files["stateset_nemo_rl.json"])
    assert (prepare["max_prompt_tokens"], prepare["prompt_overflow"]) == (256, "drop")
    rounds = 1 + (a.dynamic_sampling.max_rounds if a.dynamic_sampling else 0)
    assert prepare["min_train_rows"] == 32 * rounds


def _nemo_scheduler(entries: list[dict[str, Any]], lr: float):
    """NeMo RL's DTensor v2 scheduler setup (automodel/setup.py), with a one-weight AdamW."""
    import torch
    from hydra.utils import get_class

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    schedulers, milestones = [], []
    for entry in entries:
        if "name" in entry:
            schedulers.append(get_class(entry["name"])(optimizer, **entry["kwargs"]))
        else:
            milestones = entry["milestones"]
    return optimizer, torch.optim.lr_scheduler.SequentialLR(optimizer, schedulers, milestones)


@pytest.mark.parametrize("schedule, warmup", [("constant", 0), ("constant", 5), ("linear", 5),
                                              ("cosine", 5), ("cosine", 0), ("linear", 12)])
def test_the_learning_rate_of_every_update_is_the_spec_formula(schedule, warmup, tmp_path):
    pytest.importorskip("torch")
    lr, total, floor = 1e-5, 12, 0.1
    doc = copy.deepcopy(BASE)
    doc["optim"] = {"lr": lr, "warmup_steps": warmup, "schedule": schedule,
                    "min_lr_ratio": floor}
    doc["budget"]["total_updates"] = total
    plan = plan_for(doc, "0.7.0")
    _, cfg, _ = apply("0.7.0", overrides_of(plan, str(tmp_path)))
    entries = OmegaConf.to_container(cfg.policy.scheduler, resolve=True)
    optimizer, scheduler = _nemo_scheduler(entries, lr)
    for u in range(total):
        if u < warmup:
            want = lr * u / warmup
        elif schedule == "constant" or total == warmup:
            want = lr
        else:
            progress = (u - warmup) / (total - warmup)
            shape = 1 - progress if schedule == "linear" else (1 + math.cos(math.pi * progress)) / 2
            want = lr * (floor + (1 - floor) * shape)
        got = optimizer.param_groups[0]["lr"]
        assert got == pytest.approx(want, abs=WARMUP_START * lr + 1e-18), u
        scheduler.step()  # once per update, after its optimizer steps
    deviations = {d["deviation"] for d in plan.deviations}
    assert ("warmup_start_factor" in deviations) == (warmup > 0)


@pytest.mark.parametrize("version, names", [
    ("0.5.0", {"warmup_start_factor"}),
    ("0.7.0", {"warmup_start_factor", "kl_score_function_gradient"}),
])
def test_declared_deviations_are_recorded_and_strict_refuses_them(version, names):
    plan = plan_for(GOLDEN["grpo"], version)
    assert {d["deviation"] for d in plan.deviations} == names
    doc = {**GOLDEN["grpo"], "equivalence": "strict"}
    with pytest.raises(Unsupported, match="under equivalence: strict"):
        plan_for(doc, version)


@pytest.mark.parametrize("version, change, deviation", [
    ("0.7.0", {"evaluation": {"every": 10}}, "validation_temperature"),
    ("0.7.0", {"evaluation": {"every": 10, "temperature": 0.7, "top_p": 0.9}},
     "validation_top_p"),
    ("0.5.0", {"algorithm": {"objective": "rloo", "kl": None,
                             "advantage": {"std_normalize": True}}},
     "rloo_leave_one_out_std"),
    ("0.6.0", {"algorithm": {"objective": "reinforce_pp"}}, "reinforce_pp_token_whitening"),
    ("0.6.0", {"algorithm": {"objective": "reinforce_pp"}}, "reinforce_pp_std"),
    ("0.7.0", {"algorithm": {"objective": "reinforce_pp"}}, "reinforce_pp_variance_floor"),
    ("0.7.0", {"algorithm": {"objective": "reinforce_pp",
                             "kl": {"coef": 0.01, "estimator": "k3", "placement": "reward"}}},
     "kl_reward_per_token"),
])
def test_what_nemo_rl_hard_codes_is_declared(version, change, deviation):
    doc = copy.deepcopy(BASE)
    doc.update({k: v for k, v in change.items() if k != "algorithm"})
    if "algorithm" in change:
        doc = variant(doc, change["algorithm"],
                      algorithm_defaults={"loss_aggregation": "token_mean"})
    plan = plan_for(doc, version)
    assert deviation in {d["deviation"] for d in plan.deviations}
    described = plan.resolved_dialect().deviations[deviation]
    assert described.description and described.setting in {
        d["setting"] for d in plan.deviations}


@pytest.mark.parametrize("version, change, refused", [
    ("0.5.0", {"rollout": {"temperature": 0.7, "top_k": 50}}, "rollout.top_k"),
    ("0.5.0", {"rollout": {"temperature": 0.7, "top_p": 0.9}}, "rollout.top_p"),
    ("0.7.0", {"model": {"path": "/m", "param_dtype": "bfloat16"}}, "model.param_dtype"),
    ("0.7.0", {"evaluation": {"every": 10, "temperature": 0.7, "samples": 4}},
     "evaluation.samples"),
    ("0.7.0", {"data": {**BASE["data"], "prompt_overflow": "truncate_left"}},
     "data.prompt_overflow"),
    ("0.7.0", {"data": {**BASE["data"], "chat_template": False}}, "data.chat_template"),
    ("0.7.0", {"algorithm": {"objective": "grpo", "advantage": {"std_normalize": True,
                                                                "std": "population"}}},
     "algorithm.advantage.std"),
    ("0.7.0", {"algorithm": {"objective": "grpo", "advantage": {"std_normalize": True,
                                                                "epsilon": 1e-8}}},
     "algorithm.advantage.epsilon"),
    ("0.7.0", {"algorithm": {"objective": "grpo",
                             "kl": {"coef": 0.1, "estimator": "k1", "placement": "reward"}}},
     "algorithm.kl.placement"),
    ("0.7.0", {"algorithm": {"objective": "reinforce_pp",
                             "kl": {"coef": 0.1, "estimator": "k1", "placement": "reward"}}},
     "algorithm.kl.clamp"),
    ("0.7.0", {"algorithm": {"objective": "grpo", "advantage": {"std_normalize": True,
                                                                "scope": "batch"}}},
     "algorithm.advantage.scope"),
])
def test_what_nemo_rl_cannot_do_is_refused_naming_the_setting(version, change, refused):
    doc = copy.deepcopy(BASE)
    for key, value in change.items():
        if key == "algorithm":
            doc = variant(doc, value, algorithm_defaults={"loss_aggregation": "token_mean"})
        elif key == "model":
            doc["model"].update(value)
        else:
            doc[key] = value
    with pytest.raises(Unsupported, match=refused.replace(".", r"\.")):
        plan_for(doc, version)


def test_an_unknown_key_fails_in_struct_mode():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="no_such_key"):
        apply("0.7.0", ["grpo.no_such_key=1"])


@pytest.mark.parametrize("version, change, missing", [
    ("0.6.0", {"objective": "cispo"}, "objective:cispo (available in nemo-rl >=0.7.0,<0.8)"),
    ("0.6.0", {"objective": "reinforce_pp", "kl": {"coef": 0.1, "placement": "reward"}},
     "kl:reward (available in nemo-rl >=0.7.0,<0.8)"),
    ("0.7.0", {"objective": "grpo"}, "reward:model (not available in any nemo-rl version)"),
])
def test_what_nemo_rl_cannot_honour_is_refused_before_launch(version, change, missing):
    doc = golden(change)
    if "reward:model" in missing:
        doc["reward"] = {"kind": "model", "entrypoint": "/models/rm", "sha256": None}
    with pytest.raises(Unsupported, match=missing.replace("(", r"\(").replace(")", r"\)")):
        plan_for(doc, version)


def test_resume_stages_the_checkpoint_in_the_new_attempts_checkpoint_dir(tmp_path):
    adapter = NemoRLAdapter()
    earlier, new = tmp_path / "1", tmp_path / "2"
    for step in (10, 20):
        (earlier / "checkpoints" / f"step_{step}" / "policy").mkdir(parents=True)
        (earlier / "checkpoints" / f"step_{step}" / "training_info.json").write_text("{}")
        (earlier / "checkpoints" / f"step_{step}" / "policy" / "w.pt").write_bytes(b"w")
    (earlier / "checkpoints" / "step_30").mkdir()  # incomplete: no training_info.json
    found = adapter.latest_checkpoint(earlier)
    assert found is not None and found.update == 20
    argv = overrides_of(plan_for(GOLDEN["grpo"], "0.7.0"), str(new))
    assert adapter.resume_argv(found, argv, new) == argv  # NeMo RL looks in its own folder
    assert f"checkpointing.checkpoint_dir='{new}/checkpoints'" in argv
    assert adapter.latest_checkpoint(new) == found.__class__(
        new / "checkpoints" / "step_20", 20)
    assert (new / "checkpoints" / "step_20" / "policy" / "w.pt").read_bytes() == b"w"
    assert (earlier / "checkpoints" / "step_20" / "policy" / "w.pt").is_file()
    apply("0.7.0", argv)  # still applies in struct mode


@pytest.mark.parametrize("constants, version", [
    ('MAJOR = 0\nMINOR = 7\nPATCH = 0\nPRE_RELEASE = ""\n', "0.7.0"),
    ('MAJOR = 0\nMINOR = 5\nPATCH = 0\nPRE_RELEASE = "rc0"\n', "0.5.0rc0"),  # the v0.5.0 tag
])
def test_the_version_is_read_from_the_checkout(cli, tmp_path, constants, version):
    home = tmp_path / "nemo-rl"
    (home / "nemo_rl").mkdir(parents=True)
    (home / "nemo_rl" / "package_info.py").write_text(constants + "__version__ = 'x'\n")
    spec = tmp_path / "spec.json"
    doc = golden({"objective": "grpo"})
    for split in ("train", "validation"):  # check sizes the launch by the data, as plan
        doc["data"][split]["uri"] = str(EXAMPLES / doc["data"][split]["uri"])
    spec.write_text(json.dumps(doc))
    proc = cli("check", "--engine", "nemo-rl", "--engine-home", home, "--json", spec)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["engine_version"] == version


def test_a_folder_that_is_not_a_checkout_is_refused(cli, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(golden({"objective": "grpo"})))
    proc = cli("check", "--engine", "nemo-rl", "--engine-home", tmp_path, spec)
    assert proc.returncode == 2 and "not a NeMo RL checkout" in proc.stderr


@pytest.mark.parametrize("version", ["0.5.0", "0.6.0", "0.7.0"])
def test_shipped_surfaces_are_the_tags_example_configs(version):
    """The surface the kit reads NeMo RL launches against, regenerated from the tag's
    grpo_math_1B.yaml by the command that wrote it, is byte for byte the one shipped."""
    from importlib import resources

    from stateset_backend.conformance import surface_gen

    config = CONFIGS / f"v{version}" / "examples" / "configs" / "grpo_math_1B.yaml"
    if not config.is_file():
        pytest.skip(f"{config} is absent: check out NeMo RL's examples/configs at tag "
                    f"v{version} there to compare the shipped surface with it")
    shipped = json.loads(resources.files("stateset_backend.contracts").joinpath(
        "surfaces", f"nemo-rl-{version}.json").read_text())
    generated = json.loads(surface_gen.render(surface_gen.nemo_rl_surface(config, version)))
    # the values and numbers read from the tag's source are the next test's
    from_config = {k: {f: v for f, v in o.items() if f != "values"}
                   for k, o in shipped["options"].items()}
    assert generated["options"] == from_config, "regenerate: python -m " \
        f"stateset_backend.conformance.surface_gen nemo-rl {config} --version {version} " \
        "--source CHECKOUT -o stateset_backend/contracts/surfaces"


NEMO_RL_SOURCE = os.environ.get("STATESET_TEST_NEMO_RL_SOURCE")


@pytest.mark.parametrize("version", ["0.5.0", "0.6.0", "0.7.0"])
def test_shipped_quantities_are_the_tags_own(version, tmp_path):
    """The numbers the kit holds NeMo RL's deviations to and the values it holds its string
    settings to, read again from the tag's own source (a git clone of NVIDIA-NeMo/RL, read at
    the tag), are the ones shipped."""
    import subprocess
    from importlib import resources

    from stateset_backend.conformance import quantities, surface_gen
    from stateset_backend.contracts import domains

    if NEMO_RL_SOURCE is None:
        pytest.skip("set STATESET_TEST_NEMO_RL_SOURCE to a git clone of NVIDIA-NeMo/RL (with "
                    "its tags) to measure the shipped numbers from the tag's source")
    archive = subprocess.run(["git", "-C", NEMO_RL_SOURCE, "archive", f"v{version}",
                              "nemo_rl/algorithms"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive.stdout, check=True)
    shipped = json.loads(resources.files("stateset_backend.contracts").joinpath(
        "surfaces", f"nemo-rl-{version}.json").read_text())
    measured = quantities.nemo_rl_quantities(surface_gen.folder_reader(tmp_path))
    assert json.loads(json.dumps(measured)) == shipped["quantities"]
    values = domains.nemo_rl_domains(surface_gen.folder_reader(tmp_path), shipped["options"])
    assert values == {k: o["values"] for k, o in shipped["options"].items() if "values" in o}
