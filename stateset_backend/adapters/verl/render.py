"""Building verl's launch from a translation: the Hydra overrides, the files written into
the run folder (the reward shim, or the agent loop with its settings and registration) and
where the metrics logger writes.

The launch adds what no spec leaf decides (the run's identity, its output folders, memory
knobs) and is the last point where a value can be refused before verl's config resolution
reads it, so it is kept apart from the translation rules.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from stateset_backend.adapters.agent_shims import CONFIG_FILE as CONVERSATION_FILE
from stateset_backend.adapters.agent_shims import VERL_AGENT_NAME, VERL_AGENT_TARGET, shim_files
from stateset_backend.adapters.verl.dialect import ACTOR, VerlKeys
from stateset_backend.adapters.verl.rows import LAYOUT, layout_problems
from stateset_backend.adapters.verl.rules import AGENT_LOOPS_FILE
from stateset_backend.plugin import (
    PYTHON,
    REWARD_SHIM_FILE,
    RUN_DIR,
    ExperimentSpec,
    LaunchContext,
    NativeLaunch,
    Translation,
    Unsupported,
    conversation_settings,
    environment_file,
    is_conversation,
    local_path,
    local_splits,
    overrides,
    pinned_model_path,
    resolved,
    reward_shim,
    with_owned_keys,
)

LOG_ROOT = "logs"
CHECKPOINTS = "checkpoints"
AGENT_LAUNCHER = "stateset_verl_agent.py"  # agent_shims/verl_agent_loop.py in the run folder
SAMPLER_FILE = "stateset_verl_sampler.py"  # ordered_sampler.py in the run folder
SAMPLER_CLASS = "OrderedReplayBuffer"
# What verl does with a launch's strings: Hydra's override parser, then main_ppo's
# OmegaConf.resolve(config) in place (every release), then reads that interpolate again, and
# hydra.utils.instantiate resolving a copy of each _target_ section once more.
READ_PATH = "main_ppo resolves its config in place and Hydra's instantiate resolves again"


def launch(translation: Translation, spec: ExperimentSpec, ctx: LaunchContext,
           keys: VerlKeys) -> NativeLaunch:
    # Memory/speed knobs the spec does not describe (they do not change the math):
    # token-budget micro-batching, which verl requires some setting of.
    tokens = spec.data.max_prompt_tokens + spec.data.max_response_tokens
    native = {f"{ACTOR}.use_dynamic_bsz": True,
              f"{ACTOR}.ppo_max_token_len_per_gpu": max(16384, 2 * tokens),
              **translation.native}
    # verl runs in the run folder: a split named relative to the spec is made absolute
    for key in ("data.train_files", "data.val_files"):
        if str(native[key]).startswith(RUN_DIR):
            continue  # converted by the conversation launcher
        path = local_path(native[key], Path(ctx.base_dir or "."))
        if path is not None:
            field = translation.sources.get(key, key)
            native[key] = str(resolved(field, path))
            _check_layout(field, path, spec)
    # Identity and outputs: the run id and digest name the run inside verl's own outputs.
    # The project name is a folder name to verl's loggers and dumps: never the user's text.
    owned = {
        "trainer.project_name": overrides.slug(spec.name, "stateset"),
        "trainer.experiment_name": ctx.run_name,
        "trainer.default_local_dir": f"{RUN_DIR}/{CHECKPOINTS}",
        "trainer.logger": ["console", keys.logger],
        "trainer.resume_mode": "disable",
        **_ordered_batches(keys),
    }
    native = with_owned_keys("verl", native, owned)
    overrides.refuse_interpolations(native, translation.sources, "verl", READ_PATH)
    native = overrides.force_add_mappings(native, translation.sources, "verl")
    sampler = {SAMPLER_FILE: _sampler_source()} if keys.v1_sampler else {}
    if is_conversation(spec):
        return NativeLaunch(
            argv=[PYTHON, f"{RUN_DIR}/{AGENT_LAUNCHER}", *overrides.render(native)],
            files={**_conversation_files(spec, ctx), **sampler},
            set_env=_logger_env(keys, ctx),
            env=["CUDA_VISIBLE_DEVICES", "HF_HOME", "HF_HUB_CACHE", "WANDB_API_KEY"],
            native=native)
    return NativeLaunch(
        argv=[PYTHON, "-m", "verl.trainer.main_ppo", *overrides.render(native)],
        files={REWARD_SHIM_FILE: reward_shim(spec, ctx.base_dir, "verl", REWARD_CALL),
               **sampler},
        set_env=_logger_env(keys, ctx),
        env=["CUDA_VISIBLE_DEVICES", "HF_HOME", "HF_HUB_CACHE", "WANDB_API_KEY"],
        native=native)


def _ordered_batches(keys: VerlKeys) -> dict[str, str]:
    """The V1 trainer's sampler that keeps each update's samples in the order their prompts
    were drawn, so mini-batches are whole groups and a run (or its resume) repeats."""
    if keys.v1_sampler is None:
        return {}
    return {f"{keys.v1_sampler}.path": f"{RUN_DIR}/{SAMPLER_FILE}",
            f"{keys.v1_sampler}.name": SAMPLER_CLASS}


def _sampler_source() -> str:
    return resources.files(__package__).joinpath("ordered_sampler.py").read_text(
        encoding="utf-8")


def _check_layout(field: str, path: Path, spec: ExperimentSpec) -> None:
    """A split verl's pipeline cannot read is refused at plan time, with the columns to add."""
    if not path.is_file():
        return
    split = spec.data.validation if field.startswith("data.validation") and \
        spec.data.validation is not None else spec.data.train
    problems = layout_problems(path, split.prompt_field)
    if problems:
        raise Unsupported(f"{field.removesuffix('.uri')}: {path.name} is not in verl's row "
                          f"layout ({'; '.join(problems)}): {LAYOUT}; convert the split first")


def _logger_env(keys: VerlKeys, ctx: LaunchContext) -> dict[str, str]:
    """Where verl's metrics logger writes, named by the run and nothing of the user's: the
    file logger's (>=0.6) whole path, which it then takes as given; before it, the
    TensorBoard logger's folder."""
    if keys.logger == "file":
        # the attempt folder itself: verl opens the path without creating its folder
        return {"VERL_FILE_LOGGER_PATH": f"{RUN_DIR}/{ctx.run_name}.jsonl"}
    return {"TENSORBOARD_DIR": f"{RUN_DIR}/{LOG_ROOT}/{ctx.run_name}"}


def _conversation_files(spec: ExperimentSpec, ctx: LaunchContext) -> dict[str, str]:
    """The shim, its settings (JSON) and the agent-loop registration verl reads (YAML of two
    fixed names: nothing from the spec)."""
    base = Path(ctx.base_dir or ".")
    settings = conversation_settings(spec, environment_file(spec, base), pinned_model_path(spec),
                                     local_splits(spec, base, "verl conversation",
                                                  "prompt_field"))
    return {**shim_files("verl_agent_loop.py"),
            CONVERSATION_FILE: json.dumps(settings, indent=2, sort_keys=True),
            AGENT_LOOPS_FILE: f"- name: {VERL_AGENT_NAME}\n  _target_: {VERL_AGENT_TARGET}\n"}


REWARD_CALL = '''

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    prompt = (extra_info or {}).get("prompt", "")
    return float(score(prompt, solution_str, ground_truth))
'''
