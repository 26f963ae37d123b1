"""OpenRLHF's options, as its releases' own argparse and trainers read them."""

from __future__ import annotations

from stateset_backend.conformance.expectations.common import Expect

# OpenRLHF: flat option strings before 0.10.2, dotted after (its own parser's)
OPENRLHF: list[tuple[tuple[str, ...], Expect]] = [
    (("--n_samples_per_prompt", "--rollout.n_samples_per_prompt"),
     lambda s: s.algorithm.group_size),
    (("--eps_clip_low_high", "--actor.eps_clip_low_high"),
     lambda s: [s.algorithm.clip.low, s.algorithm.clip.high]),
    (("--actor_learning_rate", "--actor.adam.lr"), lambda s: s.optim.lr),
    (("--l2", "--actor.adam.weight_decay"), lambda s: s.optim.weight_decay),
    (("--max_norm", "--actor.max_norm"), lambda s: s.optim.grad_clip),
    (("--temperature", "--rollout.temperature"), lambda s: s.rollout.temperature),
    (("--top_p", "--rollout.top_p"), lambda s: s.rollout.top_p),
    (("--rollout_batch_size", "--rollout.batch_size"), lambda s: s.budget.prompts_per_update),
    # OpenRLHF's train batch is counted in samples (prompts x samples per prompt)
    (("--train_batch_size", "--train.batch_size"),
     lambda s: s.budget.prompts_per_update * s.algorithm.group_size // s.budget.mini_batches),
    (("--kl_estimator", "--algo.kl.estimator"),
     lambda s: s.algorithm.kl.estimator if s.algorithm.kl is not None else None),
]
