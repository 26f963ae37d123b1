"""What the native engine cannot do with conversations, torch-free and free of the worker
machinery (multiprocessing) that runs them, so the adapter refuses it when the plan is made
and the trainer refuses it again before anything loads."""

from __future__ import annotations

from typing import Any


def conversation_refusals(spec: Any) -> list[str]:
    """Settings the native engine implements no meaning of for conversations."""
    alg, problems = spec.algorithm, list[str]()
    if spec.environment.kind == "single_turn":
        return problems
    if alg.kl is not None and alg.kl.placement == "reward":
        problems.append("algorithm.kl.placement reward: for conversations the native engine "
                        "puts KL in the loss only (a per-turn reward-to-go has no KL term)")
    if alg.overlong is not None:
        problems.append("algorithm.overlong: the soft overlong penalty is defined on one "
                        "response, not on a conversation")
    if alg.dynamic_sampling is not None:
        problems.append("algorithm.dynamic_sampling: the native engine does not refill "
                        "batches of conversations")
    if spec.data.prompt_overflow in ("truncate_left", "truncate_right"):
        problems.append(f"data.prompt_overflow {spec.data.prompt_overflow}: an environment's "
                        "opening is never truncated (one over max_prompt_tokens fails its "
                        "conversation)")
    return problems
