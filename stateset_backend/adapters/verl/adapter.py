"""Adapter for verl: ``python -m verl.trainer.main_ppo`` with Hydra overrides.

verl accepts several values it never checks (an unknown ``adv_estimator``, ``loss_mode``,
rollout name, logger, ``resume_mode`` or ``kl_loss_type`` is carried along until something
fails far into a run, or never), so every value the adapter writes comes from a closed mapping.
Every key a release reads that changes the math or the budget is recorded with its default in
the dialect and written by every launch; what a release hard-codes differently is declared
there, quantified, or refused by its rules with the reason. The adapter itself only hands
each stage to its module: ``rules``, ``render``, ``collect``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stateset_backend.adapters.verl import collect, render, rules
from stateset_backend.adapters.verl.dialect import VerlKeys
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
)


class VerlAdapter(EngineAdapter):
    name = "verl"
    contract_file = "verl.json"
    dialect_keys = VerlKeys
    cluster_launch = "ray"  # its launch is a Ray driver: a cluster's nodes join a Ray cluster

    def rules(self, dialect: Dialect) -> RuleSet:
        return rules.rule_set(dialect, self.keys(dialect))

    def kit_support(self) -> KitSupport:
        # the kit reads verl's launches and writes its outputs with its own knowledge
        return KitSupport(option_key=lambda plan: "trainer.validation_data_dir")

    def render(self, translation: Translation, spec: ExperimentSpec,
               ctx: LaunchContext) -> NativeLaunch:
        return render.launch(translation, spec, ctx, self.keys(ctx.dialect))

    def collect(self, attempt_dir: Path, ctx: LaunchContext) -> Collected:
        return collect.outputs(attempt_dir, ctx, self.keys(ctx.dialect))

    def latest_checkpoint(self, attempt_dir: Path) -> Checkpoint | None:
        return collect.latest_checkpoint(attempt_dir)

    def checkpoints(self, attempt_dir: Path) -> list[Checkpoint]:
        return collect.checkpoints(attempt_dir)

    def rehearse(self, plan: Any) -> Rehearsal:
        from stateset_backend.adapters.verl.rehearsal import rehearsal

        return rehearsal(plan)

    def resume_argv(self, checkpoint: Checkpoint, argv: list[str],
                    attempt_dir: Path) -> list[str]:
        return collect.resume_argv(checkpoint, argv, attempt_dir)
