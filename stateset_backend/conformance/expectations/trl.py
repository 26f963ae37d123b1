"""TRL's GRPOConfig and SFTConfig fields, as its release reads them."""

from __future__ import annotations

from stateset_backend.conformance.expectations.common import Expect, rl, sft, single_turn

# TRL: GRPOConfig's fields (TRL's epsilon pair is CISPO's weight cap there: not checked); an sft
# spec runs SFTTrainer, whose SFTConfig fields the TRL plugin names sft.<field>
TRL: list[tuple[tuple[str, ...], Expect]] = [
    (("num_generations",), rl(lambda s: s.algorithm.group_size)),
    (("epsilon",), rl(lambda s: None if s.algorithm.objective == "cispo"
                       else s.algorithm.clip.low)),
    (("epsilon_high",),
     rl(lambda s: None if s.algorithm.objective == "cispo" else s.algorithm.clip.high)),
    (("learning_rate",), rl(lambda s: s.optim.lr)),
    (("weight_decay",), rl(lambda s: s.optim.weight_decay)),
    (("max_grad_norm",), rl(lambda s: s.optim.grad_clip)),
    (("num_iterations",), rl(lambda s: s.budget.ppo_epochs)),
    (("temperature",), rl(lambda s: s.rollout.temperature)),
    (("top_p",), rl(lambda s: s.rollout.top_p)),
    (("max_completion_length",),
     rl(lambda s: s.data.max_response_tokens if single_turn(s) else None)),
    (("sft.learning_rate",), sft(lambda s: s.optim.lr)),
    (("sft.weight_decay",), sft(lambda s: s.optim.weight_decay)),
    (("sft.max_grad_norm",), sft(lambda s: s.optim.grad_clip)),
    # one optimizer step per update, on the update's rows
    (("sft.per_device_train_batch_size",), sft(lambda s: s.budget.prompts_per_update)),
    (("sft.gradient_accumulation_steps",), sft(lambda s: 1)),
    (("sft.max_steps",), sft(lambda s: s.budget.total_updates)),
    # the loss on the answer (completion) tokens only
    (("sft.completion_only_loss",), sft(lambda s: True)),
]
