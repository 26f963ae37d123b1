"""The public API for engine plugins: everything an adapter needs, from one module.

A plugin (ours included) imports only from here, so the internal layout can change without
breaking third-party engines. Declaring an adapter:

    from stateset_backend.plugin import EngineAdapter, hookimpl, to, ...

    class MyAdapter(EngineAdapter):
        name = "my-engine"
        contract_package = "my_engine_plugin"   # where contract.json ships
        contract_file = "contract.json"
        def rules(self, dialect): ...           # every spec leaf: pinned, refused or declared
        def render(self, translation, spec, ctx): ...
        def collect(self, attempt_dir, ctx): ...

    @hookimpl
    def register_adapters(register):
        register(MyAdapter())

See docs/plugins.md.
"""

from __future__ import annotations

from stateset_backend.common.errors import AdapterBug, InvalidInput, StatesetError, Unsupported
from stateset_backend.common.jsonio import atomic_write_bytes, atomic_write_json, log_rows
from stateset_backend.contracts.capabilities import VOCABULARY as CAPABILITIES
from stateset_backend.contracts.capabilities import required_capabilities
from stateset_backend.contracts.loader import Contract, Deviation, Dialect, parse_version
from stateset_backend.contracts.release_code import added_constants
from stateset_backend.contracts.release_code import compared as compared_values
from stateset_backend.contracts.surfaces import check_options
from stateset_backend.engines.adapter import (
    ENGINE_HOME,
    PYTHON,
    RUN_DIR,
    Artifact,
    CannotWrite,
    Checkpoint,
    Collected,
    DialectKeys,
    EngineAdapter,
    KitSupport,
    LaunchContext,
    NativeLaunch,
    Rehearsal,
    checkpoint_artifacts,
    distribution_version,
    resumed_from_steps,
    stage_checkpoint,
)
from stateset_backend.engines.hookspecs import hookimpl
from stateset_backend.native.layout import (
    MANIFEST,
    RUNTIME_FILE,
    manifest_problem,
    read_runtime,
    runtime_identity,
)
from stateset_backend.native.tiny_model import builtin_dir
from stateset_backend.providers.base import PROVIDERS_ACROSS_NODES
from stateset_backend.runs.lineage import STAGED_CHECKPOINT
from stateset_backend.runs.tensorboard import canonical_rows, read_hparams, read_scalars
from stateset_backend.spec.content import directory_digest, sha256_file
from stateset_backend.spec.inputs import (
    BUILTIN_PREFIX,
    REWARD_SHIM_FILE,
    Uncountable,
    local_path,
    resolved,
    reward_function,
    reward_shim,
    split_rows,
)
from stateset_backend.spec.model import LOWER_IS_BETTER, ExperimentSpec
from stateset_backend.spec.modeltree import all_leaf_paths, leaves
from stateset_backend.spec.schedule import NEXT_LR
from stateset_backend.translate import overrides
from stateset_backend.translate.execution import ExecutionDefault, execution_defaults
from stateset_backend.translate.hub import pinned_model_path, revision_outcome
from stateset_backend.translate.rules import (
    CORE_HANDLED,
    Hardcoded,
    NotApplicable,
    Outcome,
    Pinned,
    Refused,
    Rule,
    RuleSet,
    Translation,
    carried,
    hardcoded,
    inert_reason,
    na,
    only,
    refuse,
    to,
    when_set,
    with_owned_keys,
)
from stateset_backend.translate.shared_rules import (
    VERIFIED,
    by_conversation,
    conversation_rules,
    conversation_settings,
    disabled_when_none,
    environment_file,
    even_split,
    external_rules,
    gpu_workers,
    is_conversation,
    local_splits,
    refuse_selection,
    rl_objective,
    total_limit,
    turn_limit,
    zero_variance_rule,
)

__all__ = [
    "BUILTIN_PREFIX",
    "CAPABILITIES",
    "CORE_HANDLED",
    "ENGINE_HOME",
    "LOWER_IS_BETTER",
    "MANIFEST",
    "NEXT_LR",
    "PROVIDERS_ACROSS_NODES",
    "PYTHON",
    "REWARD_SHIM_FILE",
    "RUNTIME_FILE",
    "RUN_DIR",
    "STAGED_CHECKPOINT",
    "VERIFIED",
    "AdapterBug",
    "Artifact",
    "CannotWrite",
    "Checkpoint",
    "Collected",
    "Contract",
    "Deviation",
    "Dialect",
    "DialectKeys",
    "EngineAdapter",
    "ExecutionDefault",
    "ExperimentSpec",
    "Hardcoded",
    "InvalidInput",
    "KitSupport",
    "LaunchContext",
    "NativeLaunch",
    "NotApplicable",
    "Outcome",
    "Pinned",
    "Refused",
    "Rehearsal",
    "Rule",
    "RuleSet",
    "StatesetError",
    "Translation",
    "Uncountable",
    "Unsupported",
    "added_constants",
    "all_leaf_paths",
    "atomic_write_bytes",
    "atomic_write_json",
    "builtin_dir",
    "by_conversation",
    "canonical_rows",
    "carried",
    "check_options",
    "checkpoint_artifacts",
    "compared_values",
    "conversation_rules",
    "conversation_settings",
    "directory_digest",
    "disabled_when_none",
    "distribution_version",
    "environment_file",
    "even_split",
    "execution_defaults",
    "external_rules",
    "gpu_workers",
    "hardcoded",
    "hookimpl",
    "inert_reason",
    "is_conversation",
    "leaves",
    "local_path",
    "local_splits",
    "log_rows",
    "manifest_problem",
    "na",
    "only",
    "overrides",
    "parse_version",
    "pinned_model_path",
    "read_hparams",
    "read_runtime",
    "read_scalars",
    "refuse",
    "refuse_selection",
    "required_capabilities",
    "resolved",
    "resumed_from_steps",
    "revision_outcome",
    "reward_function",
    "reward_shim",
    "rl_objective",
    "runtime_identity",
    "sha256_file",
    "split_rows",
    "stage_checkpoint",
    "to",
    "total_limit",
    "turn_limit",
    "when_set",
    "with_owned_keys",
    "zero_variance_rule",
]
