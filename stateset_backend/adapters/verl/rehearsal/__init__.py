"""Rehearsal: verl's own ``main_ppo`` runs a hub verl plan for a few updates on this machine's
CPUs, so what a GPU run would hit in verl's trainer, data pipeline, reward loop, checkpointing
and logging shows up on a laptop.

``rehearsal`` is what the verl adapter hands the hub's ``rehearse`` (``rehearsal_launch``
turns a plan's launch into that run's); ``stateset_verl_cpu`` and
``stateset_verl_hf_rollout`` are the modules verl itself loads (they import verl, so they run
only in verl's environment and nothing here imports them). The rollout is a transformers
sampler of ours, not vLLM or SGLang.
"""

from stateset_backend.adapters.verl.rehearsal.launch import (
    RehearsalLaunch,
    rehearsal,
    rehearsal_launch,
)

__all__ = ["RehearsalLaunch", "rehearsal", "rehearsal_launch"]
