"""What differs between OpenRLHF releases: each release range's exact option strings and
the few behaviours that change between releases without a flag of their own.

argparse accepts any unambiguous abbreviation of a flag, so a stale or shortened flag can
silently land on another option; every flag a rule writes is read from these keys, which the
contract records for each release, and never spelled in a rule.
"""

from __future__ import annotations

from typing import Any

from stateset_backend.plugin import DialectKeys


class OpenRLHFKeys(DialectKeys):
    """One release range's option strings (None: the release has no such flag) and the few
    behaviours that differ between releases without a flag of their own."""

    # identity, inputs, outputs and resources
    model: str
    prompt_data: str
    eval_data: str
    input_key: str
    label_key: str
    reward_url: str
    run_name: str
    tensorboard: str
    ckpt_path: str
    save_path: str
    load_checkpoint: str
    nodes: str
    gpus_per_node: str
    vllm_engines: str
    vllm_tensor_parallel_size: str  # GPUs per vLLM engine (engine_options may set it)
    colocate_all: str  # every model and the vLLM engines on the same GPUs (engine_options)
    micro_rollout_batch_size: str
    micro_train_batch_size: str
    # algorithm
    estimator: str
    group_size: str
    policy_loss_type: str
    loss_agg_mode: str | None
    eps_clip_low_high: str
    dual_clip: str
    entropy_coef: str
    kl_coef: str
    kl_estimator: str
    kl_use_loss: str
    no_std_norm: str
    gamma: str
    lambd: str
    value_clip: str
    freezing_actor_steps: str  # updates (0-based) up to this one train the critic only
    overlong_buffer_len: str
    overlong_penalty_factor: str
    dynamic_filtering: str
    dynamic_filtering_range: str
    # optimizer: the actor's flag and, where the critic has its own, the critic's
    lr: list[str]
    betas: list[str]
    eps: list[str] | None
    weight_decay: list[str]
    max_norm: list[str]
    lr_scheduler: list[str]
    warmup_ratio: list[str]
    min_lr_ratio: list[str] | None
    # budget, prompts, sampling, validation, checkpoints, dtypes, LoRA
    num_episodes: str
    rollout_batch_size: str
    generate_batch_size: str
    train_batch_size: str
    max_epochs: str
    max_samples: str
    seed: str
    max_len: str
    max_new_tokens: str
    apply_chat_template: str
    temperature: str
    top_p: str
    eval_temperature: str
    eval_samples: str
    eval_steps: str
    save_steps: str
    max_ckpt_num: str
    best_metric_key: str | None
    param_dtype: str
    lora_rank: str
    lora_alpha: str
    lora_dropout: str
    target_modules: str
    # behaviours
    schedulers: list[str]  # lr_scheduler names this release's scheduler call accepts
    fixed_min_lr_ratio: float | None  # the cosine floor when the release has no flag for it
    token_mean_over: str  # "micro_batch" (before 0.11.1) or "optimizer_step"
    fixed: dict[str, Any]  # switches every launch sets to the same value
    agent_func_path: str | None = None  # the agent executor file (multi-turn)
    # the sampler/learner log-prob correction: a switch, a type and a threshold pair before
    # 0.11.2; a level, a mode, a gating statistic and the pair from it (None: no such flag)
    is_correction_enable: str | None = None
    is_correction_type: str | None = None
    is_correction_level: str | None = None
    is_correction_mode: str | None = None
    is_correction_gating: str | None = None
    is_correction_threshold: str | None = None
