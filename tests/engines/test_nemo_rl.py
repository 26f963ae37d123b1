"""NeMo RL: our overrides apply in struct mode to the real v0.5.0, v0.6.0 and v0.7.0 configs
(pinned copies in ../shared/engines/nemo-rl), with the types of the base config, and set what
the spec meant. The override check covers every field that is mapped."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from golden import variant
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from packaging.version import Version

from stateset_backend.adapters.nemo_rl import NemoRLAdapter
from stateset_backend.core.adapter import LaunchContext
from stateset_backend.core.errors import Unsupported
from stateset_backend.core.plan import make_plan
from stateset_backend.core.registry import AdapterEntry
from stateset_backend.core.rules import Mapped, Translation, explain_rows
from stateset_backend.core.specfile import parse_spec

CONFIGS = Path(__file__).resolve().parents[3] / "shared" / "engines" / "nemo-rl"
pytestmark = pytest.mark.skipif(not CONFIGS.is_dir(), reason=f"{CONFIGS} is not present")

BASE: dict[str, Any] = {
    "name": "golden", "seed": 5,
    "algorithm": {"objective": "grpo", "group_size": 16, "loss_aggregation": "token_mean"},
    "model": {"path": "/models/qwen2.5-1.5b", "dtype": "bfloat16"},
    "data": {"train": {"uri": "/data/train.jsonl", "sha256": "a" * 64, "prompt_field": "q",
                       "answer_field": "a"},
             "validation": {"uri": "/data/val.jsonl", "sha256": "b" * 64},
             "max_prompt_tokens": 256, "max_response_tokens": 768},
    "reward": {"entrypoint": "/rewards/math.py:score", "sha256": "c" * 64},
    "rollout": {"backend": "vllm", "temperature": 0.7},
    "optim": {"lr": 3e-6, "warmup_steps": 20},
    "budget": {"total_updates": 300, "prompts_per_update": 32, "mini_batches": 4},
    "checkpoint": {"every": 25, "keep": 2},
    "evaluation": {"every": 10},
    "resources": {"nodes": 1, "gpus_per_node": 8},
}


def golden(algorithm: dict[str, Any], **model: Any) -> dict[str, Any]:
    """Token-mean aggregation unless asked: the only one every release has."""
    return variant(BASE, algorithm, algorithm_defaults={"loss_aggregation": "token_mean"}, **model)


GOLDEN = {
    "grpo": golden({"objective": "grpo"}),
    "rloo": golden({"objective": "rloo"}),
    "gspo": golden({"objective": "gspo", "loss_aggregation": "seq_mean_token_mean"}),
    "dapo": golden({"objective": "dapo", "overlong": {"buffer_tokens": 128, "penalty": 1.0}}),
    "kl_k1": golden({"objective": "grpo", "kl": {"coef": 0.05, "estimator": "k1"}}),
    "cispo": golden({"objective": "cispo"}),
    "lora": golden({"objective": "grpo"}, lora={"rank": 8, "alpha": 32}),
}
SUPPORTS = {"cispo": "0.7.0", "lora": "0.6.0"}


def _overrides(doc: dict[str, Any], version: str, run_dir: str) -> list[str]:
    """Every mapped field's overrides, rendered exactly as a launch renders them."""
    adapter = NemoRLAdapter()
    dialect = adapter.contract.dialect(Version(version))
    spec = parse_spec(doc)
    native: dict[str, Any] = {}
    for row in explain_rows(spec, adapter.rules(dialect)):
        if isinstance(row.outcome, Mapped):
            native.update(row.outcome.native)
    ctx = LaunchContext("20260101T000000Z-00000000", "sha256:" + "0" * 64, version, dialect)
    launch = adapter.render(Translation(native, {}), spec, ctx)
    at = launch.argv.index("--config")
    return [a.replace("{run_dir}", run_dir) for a in launch.argv[at + 2:]]


def _apply(version: str, overrides: list[str]):
    base = OmegaConf.load(CONFIGS / f"v{version}" / "examples" / "configs" / "grpo_math_1B.yaml")
    cfg = copy.deepcopy(base)
    OmegaConf.set_struct(cfg, True)
    parsed = OverridesParser.create().parse_overrides(overrides=overrides)
    ConfigLoaderImpl._apply_overrides_to_config(overrides=parsed, cfg=cfg)
    return base, cfg, parsed


# keys NeMo RL types as optional (``prompt_file: NotRequired[str | None]`` in nemo_rl/data)
NULLABLE = ("prompt_file",)


def _kind(value: Any) -> str:
    """Type classes as a config reader sees them: YAML writes the float 1.0 as ``1``, so
    int and float are one numeric kind; bool, str, list and dict must match exactly."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__.replace("ListConfig", "list").replace("DictConfig", "dict")


@pytest.mark.parametrize("version", ["0.5.0", "0.6.0", "0.7.0"])
@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_overrides_apply_in_struct_mode_with_matching_types(name, version, tmp_path):
    if Version(version) < Version(SUPPORTS.get(name, "0.5.0")):
        pytest.skip(f"{name} is refused before launch on {version} (see the refusal test)")
    doc = GOLDEN[name]
    overrides = _overrides(doc, version, str(tmp_path))
    base, cfg, parsed = _apply(version, overrides)
    for override in parsed:
        key = override.key_or_group
        old = OmegaConf.select(base, key, throw_on_missing=False)
        new = OmegaConf.select(cfg, key, throw_on_missing=False)
        if override.is_add() or old is None or (new is None and key.endswith(NULLABLE)):
            continue
        assert _kind(new) == _kind(old), (key, old, new)
    spec = parse_spec(doc)
    a = spec.algorithm
    assert cfg.grpo.num_generations_per_prompt == a.group_size
    assert cfg.grpo.num_prompts_per_step == 32 and cfg.grpo.max_num_steps == 300
    assert cfg.grpo.seed == 5 and cfg.grpo.use_leave_one_out_baseline == (a.objective == "rloo")
    assert (cfg.loss_fn.ratio_clip_min, cfg.loss_fn.ratio_clip_max) == (a.clip.low, a.clip.high)
    assert cfg.loss_fn.token_level_loss == (a.loss_aggregation == "token_mean")
    assert cfg.loss_fn.sequence_level_importance_ratios == (a.objective == "gspo")
    assert cfg.loss_fn.reference_policy_kl_penalty == (a.kl.coef if a.kl else 0.0)
    if a.kl:
        assert cfg.loss_fn.reference_policy_kl_type == a.kl.estimator
    assert cfg.grpo.normalize_rewards == a.advantage.std_normalize
    assert cfg.grpo.use_dynamic_sampling == (a.dynamic_sampling is not None)
    assert cfg.grpo.reward_shaping.enabled == (a.overlong is not None)
    assert cfg.policy.model_name == "/models/qwen2.5-1.5b"
    assert cfg.policy.max_total_sequence_length == 256 + 768
    assert cfg.policy.train_global_batch_size == 32 * a.group_size // 4
    assert cfg.policy.optimizer.kwargs.lr == 3e-6
    assert cfg.policy.scheduler[0].kwargs.total_iters == 20
    assert cfg.checkpointing.save_period == 25 and cfg.checkpointing.keep_top_k == 2
    assert cfg.checkpointing.checkpoint_dir == f"{tmp_path}/checkpoints"
    assert cfg.logger.log_dir == f"{tmp_path}/logs" and cfg.logger.tensorboard_enabled
    assert cfg.logger.wandb.name == "20260101T000000Z-00000000." + "0" * 64
    # the launcher converts each split into ResponseDataset rows in the run directory, and
    # NeMo RL scores them with the environment and processor it registers
    converted = {k: f"{tmp_path}/data/{k}.jsonl" for k in ("train", "validation")}
    if version == "0.5.0":
        data = cfg.data
        assert (data.train_data_path, data.val_data_path) == tuple(converted.values())
        train = validation = defaults = data
    else:
        train, validation, defaults = cfg.data.train, cfg.data.validation, cfg.data.default
        assert (train.data_path, validation.data_path) == tuple(converted.values())
        assert train.split_validation_size == 0
    for section in (train, validation):
        assert section.dataset_name == "ResponseDataset"
        assert (section.input_key, section.output_key) == ("input", "output")
    assert (defaults.env_name, defaults.processor) == ("stateset_reward",
                                                       "stateset_chat_prompt")
    assert defaults.prompt_file is None  # no chain-of-thought template around the prompt
    assert cfg.env.stateset_reward == {"entrypoint": "/rewards/math.py:score",
                                       "sha256": "c" * 64}
    if a.objective == "cispo":
        assert cfg.loss_fn.use_cispo is True
    if spec.model.lora:
        lora = cfg.policy.dtensor_cfg.lora_cfg
        assert (lora.enabled, lora.dim, lora.alpha, lora.match_all_linear) == (True, 8, 32.0,
                                                                               True)


def test_an_unknown_key_fails_in_struct_mode():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="no_such_key"):
        _apply("0.7.0", ["grpo.no_such_key=1"])


@pytest.mark.parametrize("version, change, missing", [
    ("0.6.0", {"objective": "cispo"}, "objective:cispo (available in nemo-rl >=0.7.0,<0.8)"),
    ("0.5.0", {"objective": "grpo", "kl": {"coef": 0.1, "placement": "reward"}},
     "kl:reward (available in nemo-rl >=0.6.0,<0.8)"),
    ("0.7.0", {"objective": "grpo"}, "reward:model (not available in any nemo-rl version)"),
])
def test_what_nemo_rl_cannot_honour_is_refused_before_launch(version, change, missing):
    entry = AdapterEntry(NemoRLAdapter(), "builtin", "stateset-backend", "0.1.0")
    doc = golden(change)
    if "reward:model" in missing:
        doc["reward"] = {"kind": "model", "entrypoint": "/models/rm", "sha256": None}
    with pytest.raises(Unsupported, match=missing.replace("(", r"\(").replace(")", r"\)")):
        make_plan(parse_spec(doc), entry, version, base_dir=Path("/"))


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
    argv = _overrides(GOLDEN["grpo"], "0.7.0", str(new))
    assert adapter.resume_argv(found, argv, new) == argv  # NeMo RL looks in its own folder
    assert f"checkpointing.checkpoint_dir='{new}/checkpoints'" in argv
    assert adapter.latest_checkpoint(new) == found.__class__(
        new / "checkpoints" / "step_20", 20)
    assert (new / "checkpoints" / "step_20" / "policy" / "w.pt").read_bytes() == b"w"
    assert (earlier / "checkpoints" / "step_20" / "policy" / "w.pt").is_file()
    _apply("0.7.0", argv)  # still applies in struct mode


@pytest.mark.parametrize("constants, version", [
    ('MAJOR = 0\nMINOR = 7\nPATCH = 0\nPRE_RELEASE = ""\n', "0.7.0"),
    ('MAJOR = 0\nMINOR = 5\nPATCH = 0\nPRE_RELEASE = "rc0"\n', "0.5.0rc0"),  # the v0.5.0 tag
])
def test_the_version_is_read_from_the_checkout(cli, tmp_path, constants, version):
    home = tmp_path / "nemo-rl"
    (home / "nemo_rl").mkdir(parents=True)
    (home / "nemo_rl" / "package_info.py").write_text(constants + "__version__ = 'x'\n")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(golden({"objective": "grpo"})))
    proc = cli("check", "--engine", "nemo-rl", "--engine-home", home, "--json", spec)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["engine_version"] == version


def test_a_folder_that_is_not_a_checkout_is_refused(cli, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(golden({"objective": "grpo"})))
    proc = cli("check", "--engine", "nemo-rl", "--engine-home", tmp_path, spec)
    assert proc.returncode == 2 and "not a NeMo RL checkout" in proc.stderr
