"""Adapter for OpenRLHF: ``python -m openrlhf.cli.train_ppo_ray`` with argparse flags.

OpenRLHF renamed every flag into a dotted hierarchy at 0.10.2, and argparse accepts any
unambiguous abbreviation of a flag, so a stale or shortened flag can silently land on another
option. Every flag here is an exact option string taken from the contract's dialect for the
installed version, and every flag whose release default changes the math is passed on every
launch (the contract records those defaults; the core refuses a launch that leaves one out).
The adapter itself only hands each stage to its module: ``rules``, ``render``, ``collect``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stateset_backend.adapters.openrlhf import collect, render, rules
from stateset_backend.adapters.openrlhf.dialect import OpenRLHFKeys
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


class OpenRLHFAdapter(EngineAdapter):
    name = "openrlhf"
    contract_file = "openrlhf.json"
    dialect_keys = OpenRLHFKeys
    cluster_launch = "ray"  # its launch is a Ray driver: a cluster's nodes join a Ray cluster

    def rules(self, dialect: Dialect) -> RuleSet:
        return rules.rule_set(self.keys(dialect))

    def kit_support(self) -> KitSupport:
        # the kit reads OpenRLHF's launches and writes its outputs with its own knowledge;
        # a free-text option of the release's own spelling (flags renamed at 0.10.2)
        return KitSupport(option_key=lambda plan: "--wandb_project" if self.keys(
            plan.resolved_dialect()).run_name.startswith("--wandb") else
            "--logger.wandb.project")

    def render(self, translation: Translation, spec: ExperimentSpec,
               ctx: LaunchContext) -> NativeLaunch:
        return render.launch(translation, spec, ctx, self.keys(ctx.dialect))

    def collect(self, attempt_dir: Path, ctx: LaunchContext) -> Collected:
        return collect.outputs(attempt_dir, ctx)

    def latest_checkpoint(self, attempt_dir: Path) -> Checkpoint | None:
        return collect.latest_checkpoint(attempt_dir)

    def resume_argv(self, checkpoint: Checkpoint, argv: list[str],
                    attempt_dir: Path) -> list[str]:
        return collect.resume_argv(checkpoint, argv, attempt_dir)

    def rehearse(self, plan: Any) -> Rehearsal:
        raise Unsupported("OpenRLHF's trainer cannot run on a machine without CUDA: the "
                          "flash-attn it pins builds only against a CUDA torch (its setup reads "
                          "torch.version.cuda, which a CPU build leaves None), and it generates "
                          "only through vLLM engines, which have no CPU build (with "
                          "--vllm_num_engines 0 it has no generator at all)")
