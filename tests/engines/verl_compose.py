"""Run with verl's own interpreter: compose overrides against the installed verl's Hydra config,
run verl's validate_config, and report the composed config plus the registries verl itself
does not check against. The actor config is also turned into verl's own dataclass, its
optimizer built by verl's build_optimizer on a one-element parameter, and the learning rate of
every update read from verl's own scheduler functions with the arguments its FSDP engine
passes, so the test sees what verl will really use. Reads a JSON list of override lists on
stdin and prints a JSON list on stdout: for each, that report, or ``{"error": traceback}`` when
verl refuses it. Each is composed on its own; they share one interpreter because importing verl
is most of a probe's time."""

import json
import os
import sys
import traceback

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


def _composed(overrides: list) -> object:
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg),
                    use_critic=need_critic(cfg))
    return cfg


def _engine_view(cfg) -> dict:
    """The actor as the FSDP engine (0.8 on) builds it: optimizer hyper-parameters, LR per
    update, mixed precision."""
    import torch
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.torch_functional import (
        get_constant_schedule_with_warmup,
        get_cosine_schedule_with_warmup,
    )
    from verl.workers.config.optimizer import build_optimizer

    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    optim = actor.optim
    optimizer = build_optimizer([torch.nn.Parameter(torch.zeros(1))], optim)
    total = cfg.trainer.total_training_steps  # what the trainer writes into optim
    warmup = optim.lr_warmup_steps if optim.lr_warmup_steps > 0 else \
        int(optim.lr_warmup_steps_ratio * total)
    if optim.lr_scheduler_type == "constant":
        scheduler = get_constant_schedule_with_warmup(optimizer, num_warmup_steps=warmup)
    else:
        scheduler = get_cosine_schedule_with_warmup(
            optimizer, num_warmup_steps=warmup, num_training_steps=total,
            min_lr_ratio=optim.min_lr_ratio, num_cycles=optim.num_cycles,
            zero_indexed_step=optim.zero_indexed_step)
    lrs = []
    for _ in range(total):  # one scheduler step per update, after it
        lrs.append(optimizer.param_groups[0]["lr"])
        scheduler.step()
    group = optimizer.param_groups[0]
    return {"optimizer": type(optimizer).__name__, "betas": list(group["betas"]),
            "eps": group["eps"], "weight_decay": group["weight_decay"], "lrs": lrs,
            "clip_grad": optim.clip_grad, "clip_ratio_c": actor.clip_ratio_c,
            "mixed_precision": dict(actor.fsdp_config.mixed_precision or {}),
            "model_dtype": actor.fsdp_config.model_dtype}


def probe(overrides: list) -> dict:
    cfg = _composed(overrides)
    return {
        "engine": _engine_view(cfg),
        "config": OmegaConf.to_container(cfg, resolve=True),
        "known_estimators": sorted(str(k) for k in core_algos.ADV_ESTIMATOR_REGISTRY),
        "known_loss_modes": sorted(core_algos.POLICY_LOSS_REGISTRY),
        "need_critic": need_critic(cfg),
        "need_reference_policy": need_reference_policy(cfg),
        "verl_version": verl.__version__,
    }


def _reported(overrides: list) -> dict:
    try:
        return probe(overrides)
    except Exception:
        return {"error": traceback.format_exc()}


_vllm_free_lora_check()
print(json.dumps([_reported(overrides) for overrides in json.loads(sys.stdin.read())]))
