"""What the native engine's PPO critic cannot do, torch-free, so the adapter refuses it when
the plan is made and the trainer refuses it again before anything loads."""

from __future__ import annotations

from typing import Any


def ppo_refusals(spec: Any) -> list[str]:
    """One line per PPO setting the native engine implements no meaning of."""
    alg, problems = spec.algorithm, list[str]()
    if alg.gae is None:
        return problems
    if alg.gae.critic.model != "separate":
        problems.append("algorithm.gae.critic.model value_head: the native engine's critic is "
                        "a separate value model ('separate')")
    if alg.advantage.scope != "batch":
        problems.append("algorithm.advantage.scope group: PPO's token advantages are "
                        "normalised over the batch ('batch')")
    if spec.environment.kind != "single_turn":
        problems.append(f"environment.kind {spec.environment.kind}: the native critic learns "
                        "from single-turn rollouts only")
    return problems
