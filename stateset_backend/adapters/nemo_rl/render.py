"""Building NeMo RL's launch: the launcher shipped into the run folder (``launcher.py``)
with the settings it converts the splits by, the reward or conversation shim, and the
overrides ``run_grpo.py`` applies.

The launch owns what no spec leaf decides (log and checkpoint folders, the run name NeMo RL
records, the validation batch sized from the split's rows), so it is kept apart from the rules.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from stateset_backend.adapters.agent_shims import CONFIG_FILE as CONVERSATION_FILE
from stateset_backend.adapters.agent_shims import shim_files
from stateset_backend.adapters.nemo_rl import launcher as launcher
from stateset_backend.adapters.nemo_rl.dialect import NemoRLKeys
from stateset_backend.plugin import (
    ENGINE_HOME,
    REWARD_SHIM_FILE,
    RUN_DIR,
    ExperimentSpec,
    InvalidInput,
    LaunchContext,
    NativeLaunch,
    Translation,
    Uncountable,
    conversation_settings,
    environment_file,
    is_conversation,
    local_splits,
    overrides,
    pinned_model_path,
    reward_shim,
    split_rows,
    with_owned_keys,
)

LAUNCHER_FILE = "stateset_nemo_rl.py"  # its module name is how NeMo RL finds the environment
CHECKPOINTS = "checkpoints"
LOGS = "logs"
CHECKPOINT_DIR = "checkpointing.checkpoint_dir"
RUN_NAME_KEY = "logger.wandb.name"  # NeMo RL records its whole config as hparams
VAL_BATCH = "grpo.val_batch_size"
V2_WORKER = "policy.dtensor_cfg._v2"


def launch(translation: Translation, spec: ExperimentSpec, ctx: LaunchContext,
           keys: NemoRLKeys) -> NativeLaunch:
    owned = {"logger.log_dir": f"{RUN_DIR}/{LOGS}", "logger.tensorboard_enabled": True,
             RUN_NAME_KEY: ctx.run_name,
             CHECKPOINT_DIR: f"{RUN_DIR}/{CHECKPOINTS}"}
    base = Path(ctx.base_dir or ".")
    # validation reads max_val_samples // val_batch_size batches (a last partial batch only
    # within that count): every row, in one batch unless engine_options sizes the batches
    rows = 1 if spec.data.validation is None else \
        _row_count(spec.data.validation.uri, base, "data.validation.uri")
    batch = translation.native.get(VAL_BATCH, rows)
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise InvalidInput(f"engine_options.nemo-rl.{VAL_BATCH}: a positive whole number")
    owned["grpo.max_val_samples"] = -(-rows // batch) * batch
    # the contract's execution defaults (keys.execution), where engine_options leaves them
    execution = {VAL_BATCH: rows, V2_WORKER: True}
    native = with_owned_keys("nemo-rl", {**execution, **translation.native}, owned)
    config = f"{ENGINE_HOME}/{keys.config}"
    splits = local_splits(spec, base, "NeMo RL", "prompt_field", "answer_field")
    ds = spec.algorithm.dynamic_sampling
    rounds = 1 + (ds.max_rounds if ds is not None else 0)
    prepare = {"splits": splits, "model": pinned_model_path(spec),
               "max_prompt_tokens": spec.data.max_prompt_tokens,
               "prompt_overflow": spec.data.prompt_overflow,
               # every pass must hold the batches of at least one whole update
               "min_train_rows": spec.budget.prompts_per_update * rounds}
    files = {
        LAUNCHER_FILE: resources.files(__package__).joinpath(
            "launcher.py").read_text(encoding="utf-8"),
        launcher.CONFIG_FILE: json.dumps(prepare, indent=2, sort_keys=True)}
    if is_conversation(spec):
        prepare["conversation"] = True
        files[launcher.CONFIG_FILE] = json.dumps(prepare, indent=2, sort_keys=True)
        files[CONVERSATION_FILE] = json.dumps(conversation_settings(
            spec, environment_file(spec, base), pinned_model_path(spec), splits),
            indent=2, sort_keys=True)
        files.update(shim_files("nemo_rl_environment.py"))
    else:
        files[REWARD_SHIM_FILE] = reward_shim(spec, ctx.base_dir, "NeMo RL")
    return NativeLaunch(
        argv=["uv", "run", "--project", ENGINE_HOME, "python", f"{RUN_DIR}/{LAUNCHER_FILE}",
              f"{ENGINE_HOME}/examples/run_grpo.py", "--config", config,
              *overrides.render(overrides.force_add_mappings(
                  native, translation.sources, "nemo-rl"))],
        files=files, env=["CUDA_VISIBLE_DEVICES", "HF_HOME", "WANDB_API_KEY"],
        native=native)


def _row_count(uri: str, base_dir: Path, field: str) -> int:
    """Rows of a local split (NeMo RL sizes the validation batch by it)."""
    try:
        return split_rows(uri, base_dir, field)
    except Uncountable as exc:
        raise InvalidInput(f"the NeMo RL launch sizes validation by the split's rows: {exc}") \
            from None

