"""Run with verl's own interpreter: compose overrides against the installed verl's Hydra config,
run verl's validate_config, and report the composed config plus the registries verl itself
does not check against. Reads a JSON list of overrides on stdin; prints JSON on stdout."""

import json
import os
import sys

import verl
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config


def _vllm_free_lora_check() -> None:
    """verl checks a LoRA rank with a function in a module that imports vLLM (a GPU package).
    Without vLLM, load verl's own function from its source alone, so the real check runs."""
    try:
        import vllm  # noqa: F401
        return
    except ImportError:
        pass
    import ast
    import types
    import typing

    import verl.workers.rollout as rollout_pkg

    path = os.path.join(os.path.dirname(rollout_pkg.__file__), "vllm_rollout", "utils.py")
    with open(path) as fh:
        tree = ast.parse(fh.read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
              and n.name == "get_vllm_max_lora_rank")
    namespace = {"Literal": typing.Literal, "get_args": typing.get_args}
    exec(compile(ast.Module([fn], []), path, "exec"), namespace)
    package = types.ModuleType("verl.workers.rollout.vllm_rollout")
    package.__path__ = []
    utils = types.ModuleType("verl.workers.rollout.vllm_rollout.utils")
    utils.get_vllm_max_lora_rank = namespace["get_vllm_max_lora_rank"]
    sys.modules[package.__name__] = package
    sys.modules[utils.__name__] = utils


_vllm_free_lora_check()
overrides = json.loads(sys.stdin.read())
config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
with initialize_config_dir(config_dir=config_dir, version_base=None):
    cfg = compose(config_name="ppo_trainer", overrides=overrides)
validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
print(json.dumps({
    "config": OmegaConf.to_container(cfg, resolve=True),
    "known_estimators": sorted(str(k) for k in core_algos.ADV_ESTIMATOR_REGISTRY),
    "known_loss_modes": sorted(core_algos.POLICY_LOSS_REGISTRY),
    "need_critic": need_critic(cfg),
    "need_reference_policy": need_reference_policy(cfg),
    "verl_version": verl.__version__,
}))
