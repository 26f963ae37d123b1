"""Building OpenRLHF's launch: the argparse argv, the passes and rows kept that give exactly
total_updates updates, and the files written into the run folder (the reward shim, or the
agent executor with its settings).

It is separate from the rules because the passes depend on the train split's row count, known
only when the launch is rendered, and because the argv is rendered so that no value can be
read by argparse as another option.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from stateset_backend.adapters.agent_shims import CONFIG_FILE as CONVERSATION_FILE
from stateset_backend.adapters.agent_shims import shim_files
from stateset_backend.adapters.openrlhf.budget import passes, train_rows
from stateset_backend.adapters.openrlhf.dialect import OpenRLHFKeys
from stateset_backend.adapters.openrlhf.rules import AGENT_FILE
from stateset_backend.plugin import (
    PYTHON,
    REWARD_SHIM_FILE,
    RUN_DIR,
    ExperimentSpec,
    InvalidInput,
    LaunchContext,
    NativeLaunch,
    Translation,
    conversation_settings,
    environment_file,
    is_conversation,
    local_path,
    local_splits,
    pinned_model_path,
    reward_shim,
    with_owned_keys,
)

TENSORBOARD = "tensorboard"
CHECKPOINTS = "checkpoints"


def render_flags(native: dict[str, Any]) -> list[str]:
    """argparse argv: True -> bare flag, False/None -> omitted, a scalar -> ``--flag=value``
    (so a value that starts with ``--`` stays a value), lists -> several values.

    A key that is not a ``--flag`` would become a positional argument, and a list item that
    starts with ``-`` (other than a number) would be read as an option: both are refused."""
    argv: list[str] = []
    for flag, value in sorted(native.items()):
        if not flag.startswith("--") or "=" in flag or len(flag) < 3:
            raise InvalidInput(f"{flag!r}: OpenRLHF options are --flags (without '=')")
        if value is False or value is None:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, list | tuple):
            items = [str(v) for v in value]
            for item in items:
                if item.startswith("-") and not _NUMBER.match(item):
                    raise InvalidInput(f"{flag}: list value {item!r} would be read as an "
                                       "option")
            argv += [flag, *items]
        else:
            if str(value) == "--":  # argparse drops a "--" even after "=": the value is lost
                raise InvalidInput(f"{flag}: the value '--' cannot reach OpenRLHF (its argument "
                                   "parser reads it as the end of the options)")
            argv.append(f"{flag}={value}")
    return argv


# argparse's own test for a negative number (a value, not an option), in Python 3.11.
_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def launch(translation: Translation, spec: ExperimentSpec, ctx: LaunchContext,
           f: OpenRLHFKeys) -> NativeLaunch:
    owned = {f.run_name: ctx.run_name,
             f.tensorboard: f"{RUN_DIR}/{TENSORBOARD}",
             f.ckpt_path: f"{RUN_DIR}/{CHECKPOINTS}",
             f.save_path: f"{RUN_DIR}/final"}
    episodes, rows = passes(spec, train_rows(spec, ctx.base_dir))
    budget = {f.num_episodes: episodes, f.max_samples: rows}
    # The contract's execution defaults (keys.execution): engine_options may change them, so
    # an option the user gave wins over the value chosen here.
    execution = _execution(spec, translation.native, f)
    native = with_owned_keys("openrlhf", {**f.fixed, **execution, **translation.native},
                             {**owned, **budget})
    # the engine runs in the run folder: local splits are named by absolute path
    for key in (f.prompt_data, f.eval_data):
        if native.get(key) is not None and not str(native[key]).startswith(RUN_DIR):
            local = local_path(native[key], Path(ctx.base_dir or "."))
            native[key] = str(local) if local is not None else native[key]
    if is_conversation(spec):
        return NativeLaunch(
            argv=[PYTHON, f"{RUN_DIR}/{AGENT_FILE}", *render_flags(native)],
            files=_conversation_files(spec, ctx),
            env=["CUDA_VISIBLE_DEVICES", "HF_HOME", "WANDB_API_KEY"], native=native)
    return NativeLaunch(
        argv=[PYTHON, "-m", "openrlhf.cli.train_ppo_ray", *render_flags(native)],
        files={REWARD_SHIM_FILE: reward_shim(spec, ctx.base_dir, "OpenRLHF", REWARD_CALL)},
        env=["CUDA_VISIBLE_DEVICES", "HF_HOME", "WANDB_API_KEY"],
        native=native)


def _execution(spec: ExperimentSpec, native: dict[str, Any],
               f: OpenRLHFKeys) -> dict[str, Any]:
    """Micro-batch sizes and the vLLM engine count, chosen from the spec's resources.

    Micro-batch sizes trade memory for speed (and, before 0.11.1, weigh the token mean, which
    the contract declares); OpenRLHF needs at least one micro-batch per actor process, so take
    the largest size (<= 8) that gives that. DeepSpeed also needs a training micro-batch that
    divides each rank's share of an optimizer step (its train_batch = micro x accumulation x
    ranks): 9 prompts x 4 samples on one rank is 36, which a micro-batch of 8 would stop at
    start-up. vLLM engines that share the training GPUs (engine_options colocating every
    model) fill them, one engine per tensor-parallel group; otherwise each engine takes GPUs
    of its own beyond the spec's, so one, the fewest."""
    processes = max(1, spec.resources.nodes * max(spec.resources.gpus_per_node, 1))
    samples = spec.budget.prompts_per_update * spec.algorithm.group_size
    micro = max(1, min(8, samples // processes))
    share = max(1, samples // spec.budget.mini_batches // processes)
    train_micro = max(d for d in range(1, min(8, share) + 1) if share % d == 0)
    tensor_parallel = native.get(f.vllm_tensor_parallel_size)
    if not isinstance(tensor_parallel, int) or isinstance(tensor_parallel, bool) or \
            tensor_parallel < 1:
        tensor_parallel = 1
    engines = max(1, processes // tensor_parallel) if native.get(f.colocate_all) is True \
        else 1
    return {f.micro_rollout_batch_size: micro, f.micro_train_batch_size: train_micro,
            f.vllm_engines: engines}


def _conversation_files(spec: ExperimentSpec, ctx: LaunchContext) -> dict[str, str]:
    """The executor, the shared shim and their settings (JSON; nothing from the spec becomes
    source)."""
    import json

    base = Path(ctx.base_dir or ".")
    settings = conversation_settings(spec, environment_file(spec, base), pinned_model_path(spec),
                                     local_splits(spec, base, "OpenRLHF conversation",
                                                  "prompt_field"))
    return {**shim_files("openrlhf_agent.py"),
            CONVERSATION_FILE: json.dumps(settings, indent=2, sort_keys=True)}


REWARD_CALL = '''

def reward_func(queries, prompts, labels, **kwargs):
    import torch

    scores = [float(score(p, q[len(p):], a)) for q, p, a in zip(queries, prompts, labels)]
    rewards = torch.tensor(scores)
    return {"rewards": rewards, "scores": rewards, "extra_logs": {}}
'''
