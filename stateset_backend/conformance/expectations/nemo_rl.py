"""NeMo RL's keys, as its releases' own master configs and code read them."""

from __future__ import annotations

from stateset_backend.conformance.expectations.common import Expect

# NeMo RL: its GRPO master config (examples/configs/grpo_math_1B.yaml)
NEMO_RL: list[tuple[tuple[str, ...], Expect]] = [
    (("grpo.num_generations_per_prompt",), lambda s: s.algorithm.group_size),
    (("grpo.num_prompts_per_step",), lambda s: s.budget.prompts_per_update),
    (("loss_fn.ratio_clip_min",), lambda s: s.algorithm.clip.low),
    (("loss_fn.ratio_clip_max",), lambda s: s.algorithm.clip.high),
    (("policy.optimizer.kwargs.lr",), lambda s: s.optim.lr),
    (("policy.optimizer.kwargs.weight_decay",), lambda s: s.optim.weight_decay),
    (("policy.max_grad_norm",), lambda s: s.optim.grad_clip),
    (("policy.generation.temperature",), lambda s: s.rollout.temperature),
    (("policy.generation.top_p",), lambda s: s.rollout.top_p),
]
