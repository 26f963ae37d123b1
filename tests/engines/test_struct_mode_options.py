"""verl and NeMo RL apply a launch's overrides in struct mode: a plain ``key={...}`` merges
into the config's mapping and may not bring it a key it lacks. A mapping given in
``engine_options`` (a model's config overrides, a library's kwargs) reaches the engine force-
added, as the release's own recipe takes it, and the kit's readers refuse what the engine
would refuse."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from optional_installs import NEMO_RL_CONFIGS, NEMO_RL_CONFIGS_MISSING

from stateset_backend.conformance.readers import BUILTIN, LaunchUnreadable
from stateset_backend.engines.registry import build_registry
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.model import ExperimentSpec

RECIPES = Path(__file__).resolve().parents[2] / "examples" / "recipes"
OPTIONS = {"logger.tensorboard": {"flush_secs": 5}}


def _plan(options: dict) -> object:
    doc = json.loads((RECIPES / "nemo-rl-grpo_math_1B.json").read_text(encoding="utf-8"))
    doc["engine_options"] = {"nemo-rl": copy.deepcopy(options)}
    return make_plan(ExperimentSpec.model_validate(doc), build_registry().get("nemo-rl"),
                     "0.7.0", base_dir=RECIPES)


@pytest.mark.skipif(not NEMO_RL_CONFIGS.is_dir(), reason=NEMO_RL_CONFIGS_MISSING)
def test_a_mapping_option_applies_to_the_release_recipe_as_run_grpo_applies_it():
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    plan = _plan(OPTIONS)
    at = plan.argv.index("--config")
    overrides = [a.replace("{run_dir}", "/run") for a in plan.argv[at + 2:]]
    cfg = OmegaConf.load(NEMO_RL_CONFIGS / "v0.7.0" / "examples" / "configs" /
                         "grpo_math_1B.yaml")
    OmegaConf.set_struct(cfg, True)  # nemo_rl.utils.config.parse_hydra_overrides
    ConfigLoaderImpl._apply_overrides_to_config(
        overrides=OverridesParser.create().parse_overrides(overrides=overrides), cfg=cfg)
    for key, value in OPTIONS.items():
        assert OmegaConf.to_container(OmegaConf.select(cfg, key)) == value, key


def test_the_kit_reads_a_plain_mapping_override_as_the_engine_refuses_it():
    """The same launch with the mappings written plainly is one NeMo RL refuses at start-up;
    the kit's reader says so, naming the key the mapping lacks."""
    plan = _plan(OPTIONS)
    plain = [a.lstrip("+") if a.startswith("++") else a for a in plan.argv]
    with pytest.raises(LaunchUnreadable, match=r"struct mode.*only \+\+ adds it"):
        BUILTIN["nemo-rl"](SimpleNamespace(argv=plain, engine_version="0.7.0", files={}))
    read = BUILTIN["nemo-rl"](plan)
    assert read["logger.tensorboard.flush_secs"] == 5


def test_the_model_loads_kwargs_are_held_like_its_config_overrides():
    """NeMo RL hands ``automodel_kwargs`` to the trainer's ``from_pretrained``: a config key
    there changes the trained model (and not the one vLLM samples with), so the launch holds
    it empty, as it holds ``hf_config_overrides``."""
    from stateset_backend.common.errors import InvalidInput

    with pytest.raises(InvalidInput, match="automodel_kwargs"):
        _plan({"policy.dtensor_cfg.automodel_kwargs": {"num_hidden_layers": 2}})


@pytest.mark.parametrize("key", ["grpo.overlong_filtering", "loss_fn.force_on_policy_ratio",
                                 "policy.generation.stop_strings"])
def test_a_switch_held_for_every_spec_says_so(key):
    """NeMo RL's features the spec has no name for are held off on every launch: no spec
    setting turns them on, so an option reaching one is told the launch holds it, not sent to
    the spec leaf whose rule happens to write it."""
    from stateset_backend.common.errors import InvalidInput

    with pytest.raises(InvalidInput, match="for every spec") as refused:
        _plan({key: True})
    assert "algorithm.objective" not in str(refused.value)


@pytest.mark.skipif(not NEMO_RL_CONFIGS.is_dir(), reason=NEMO_RL_CONFIGS_MISSING)
def test_vllm_compilation_options_are_the_only_vllm_kwargs_a_user_may_set():
    """The launch pins vLLM's kwargs empty; only their declared part, vLLM's compilation of
    the same model, may be given, as the mapping whole, and it reaches NeMo RL force-added."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from stateset_backend.common.errors import InvalidInput

    compile_ = {"compilation_config": {"backend": "eager", "custom_ops": ["+rms_norm"]}}
    plan = _plan({"policy.generation.vllm_kwargs": compile_})
    at = plan.argv.index("--config")
    cfg = OmegaConf.load(NEMO_RL_CONFIGS / "v0.7.0" / "examples" / "configs" /
                         "grpo_math_1B.yaml")
    OmegaConf.set_struct(cfg, True)
    ConfigLoaderImpl._apply_overrides_to_config(overrides=OverridesParser.create().parse_overrides(
        overrides=[a.replace("{run_dir}", "/run") for a in plan.argv[at + 2:]]), cfg=cfg)
    assert OmegaConf.to_container(OmegaConf.select(cfg, "policy.generation.vllm_kwargs")) == \
        compile_
    with pytest.raises(InvalidInput, match=r"only policy\.generation\.vllm_kwargs\."
                                           "compilation_config may be given"):
        _plan({"policy.generation.vllm_kwargs": {"enforce_eager": True}})


def _verl_plan(options: dict, version: str = "0.9.1") -> object:
    doc = json.loads((RECIPES / "verl-grpo-qwen2-7b-math.json").read_text(encoding="utf-8"))
    doc["engine_options"] = {"verl": copy.deepcopy(options)}
    return make_plan(ExperimentSpec.model_validate(doc), build_registry().get("verl"),
                     version, base_dir=RECIPES)


@pytest.mark.parametrize("version", ["0.4.1", "0.7.0", "0.9.1"])
@pytest.mark.parametrize("options", [
    {"actor_rollout_ref.model.override_config": {"rope_theta": 1.0}},
    {"actor_rollout_ref.model.override_config": {"attn_implementation": "sdpa",
                                                 "num_hidden_layers": 2}},
    {"critic.model.override_config": {"tie_word_embeddings": False}},
    {"actor_rollout_ref.model.external_lib": "my_models"},
    {"critic.model.external_lib": "my_models"},
    {"actor_rollout_ref.model.tokenizer_path": "/other/tokenizer"},
    {"actor_rollout_ref.model.custom_chat_template": "{{ messages }}"},
])
def test_verl_holds_the_trained_models_config(options, version):
    """verl builds the trained model from hf_config_path, updated with override_config, after
    importing external_lib, and tokenizes with the model's own tokenizer and chat template: an
    engine option there would change the model or its inputs outside the experiment's
    identity, so the launch holds them all, on every release."""
    from stateset_backend.common.errors import InvalidInput

    with pytest.raises(InvalidInput, match=r"pins|which the launch holds|has no option"):
        _verl_plan(options, version)  # or, on a release without the key, named as unknown


def test_verl_takes_only_the_attention_kernel_and_vllms_compilation_from_a_user():
    """The two execution choices inside those held mappings, each given as the mapping whole,
    reach verl force-added and are read back by the kit's reader as verl's Hydra applies them;
    any other vLLM engine argument (an fp8 KV cache samples another distribution) is refused."""
    from stateset_backend.common.errors import InvalidInput

    plan = _verl_plan({
        "actor_rollout_ref.model.override_config": {"attn_implementation": "sdpa"},
        "actor_rollout_ref.model.use_remove_padding": False,
        "actor_rollout_ref.rollout.engine_kwargs.vllm": {
            "compilation_config": {"cudagraph_capture_sizes": [1, 2]}}})
    read = BUILTIN["verl"](plan)
    assert read["actor_rollout_ref.model.override_config.attn_implementation"] == "sdpa"
    assert read["actor_rollout_ref.rollout.engine_kwargs.vllm.compilation_config"
                ".cudagraph_capture_sizes"] == [1, 2]
    assert read["actor_rollout_ref.model.external_lib"] is None
    with pytest.raises(InvalidInput, match="only actor_rollout_ref.rollout.engine_kwargs.vllm"
                                           r"\.compilation_config may be given"):
        _verl_plan({"actor_rollout_ref.rollout.engine_kwargs.vllm": {"kv_cache_dtype": "fp8"}})
    # padding-free rows carry no attention mask: only flash-attention keeps them apart;
    # 0.9.1 defaults to them, 0.6.1 to padded rows, whose default meets the requirement
    sdpa = {"actor_rollout_ref.model.override_config": {"attn_implementation": "sdpa"}}
    with pytest.raises(InvalidInput, match=r"use_remove_padding to be False \(it is True, "
                                           r"the release's default\)"):
        _verl_plan(sdpa)
    assert BUILTIN["verl"](_verl_plan(sdpa, "0.6.1"))[
        "actor_rollout_ref.model.override_config.attn_implementation"] == "sdpa"
    with pytest.raises(InvalidInput, match="which the launch holds"):
        _verl_plan({"actor_rollout_ref.model.override_config": {"attn_implementation": "flex"}})


@pytest.mark.parametrize("options", [
    {"actor_rollout_ref.rollout.engine_kwargs.sglang": {"kv_cache_dtype": "fp8_e5m2"}},
    {"actor_rollout_ref.rollout.quantization": "fp8"},
    {"actor_rollout_ref.rollout.quantization_config_file": "/q.json"},
])
def test_verl_holds_what_the_rollout_samples_with(options):
    """sglang's engine arguments and the rollout's own quantization change what is sampled,
    as vLLM's engine arguments do: held, on 0.9.1."""
    from stateset_backend.common.errors import InvalidInput

    with pytest.raises(InvalidInput, match=r"pins|which the launch holds"):
        _verl_plan(options)
