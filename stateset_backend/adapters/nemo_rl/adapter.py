"""Adapter for NeMo RL: a source checkout run as ``examples/run_grpo.py --config <yaml>``
with Hydra-style overrides applied in struct mode, through a generated launcher
(``launcher.py``) that converts the splits (dropping prompts over the limit) and registers
the spec's python reward as a NeMo RL environment.

Every override is a key of the release's own ``grpo_math_1B.yaml`` (checked against the pinned
configs of each supported tag), or added with ``+`` where NeMo RL reads an optional key. Every
key of that file that changes the math or the budget is in the dialect's ``defaults`` and set
by every launch, also where the spec has no name for the feature (it is then switched off).
The adapter itself only hands each stage to its module: ``rules``, ``render``, ``collect``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stateset_backend.adapters.nemo_rl import collect, render, rules
from stateset_backend.adapters.nemo_rl.dialect import NemoRLKeys, checkout_version
from stateset_backend.plugin import (
    Checkpoint,
    Collected,
    Dialect,
    EngineAdapter,
    ExperimentSpec,
    KitSupport,
    LaunchContext,
    NativeLaunch,
    Rehearsal,
    RuleSet,
    Translation,
    Unsupported,
)


class NemoRLAdapter(EngineAdapter):
    name = "nemo-rl"
    contract_file = "nemo-rl.json"
    dialect_keys = NemoRLKeys
    cluster_launch = "ray"  # its launch is a Ray driver: a cluster's nodes join a Ray cluster

    def rules(self, dialect: Dialect) -> RuleSet:
        return rules.rule_set(dialect, self.keys(dialect))

    def kit_support(self) -> KitSupport:
        # the kit reads NeMo RL's launches and writes its outputs with its own knowledge
        return KitSupport(option_key=lambda plan: "logger.wandb.project")

    def render(self, translation: Translation, spec: ExperimentSpec,
               ctx: LaunchContext) -> NativeLaunch:
        return render.launch(translation, spec, ctx, self.keys(ctx.dialect))

    def installed_version(self, python: str | None = None,
                          home: str | None = None) -> str | None:
        """A NeMo RL checkout states its version in ``nemo_rl/package_info.py``."""
        return checkout_version(home)

    def collect(self, attempt_dir: Path, ctx: LaunchContext) -> Collected:
        return collect.outputs(attempt_dir, ctx)

    def latest_checkpoint(self, attempt_dir: Path) -> Checkpoint | None:
        return collect.latest_checkpoint(attempt_dir)

    def resume_argv(self, checkpoint: Checkpoint, argv: list[str],
                    attempt_dir: Path) -> list[str]:
        return collect.resume_argv(checkpoint, argv, attempt_dir)

    def rehearse(self, plan: Any) -> Rehearsal:
        raise Unsupported("NeMo RL has no release to install here: its name on PyPI is a "
                          "0.0.0 placeholder, so this machine has no NeMo RL trainer to run")
