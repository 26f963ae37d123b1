"""Sample specs for conformance and identity tests.

A minimal spec, and three that switch every optional section on (``gae`` is PPO-only and
``algorithm.sft`` sft-only, hence three): together they contain every leaf the spec schema
has, so a rule-coverage check over them covers every field.
"""

from __future__ import annotations

import copy
from typing import Any

SHA_A = "a" * 64
SHA_B = "b" * 64

MINIMAL: dict[str, Any] = {
    "name": "minimal",
    "seed": 7,
    "algorithm": {"objective": "grpo", "group_size": 4},
    "model": {"path": "org/tiny-model", "revision": "0123456789abcdef0123456789abcdef01234567"},
    "data": {"train": {"uri": "data/train.jsonl", "sha256": SHA_A}},
    "reward": {"entrypoint": "reward.py:score", "sha256": SHA_B},
    "rollout": {"backend": "hf"},
    "budget": {"total_updates": 3, "prompts_per_update": 2},
}

# Every optional section switched on, so every leaf of the schema is present (except gae,
# which only PPO may have: see FULL_PPO).
FULL_DAPO: dict[str, Any] = {
    "name": "full", "labels": {"team": "rl"}, "seed": 11,
    "algorithm": {
        "objective": "dapo", "group_size": 8,
        "clip": {"low": 0.2, "high": 0.28, "dual_clip": 3.0},
        "ratio_level": "token", "loss_aggregation": "token_mean",
        "kl": {"coef": 0.01, "estimator": "k2", "placement": "loss", "clamp": 10.0},
        "advantage": {"std_normalize": True, "std": "population", "epsilon": 1e-5,
                      "scope": "group", "zero_variance_groups": "exclude"},
        "dynamic_sampling": {"max_rounds": 4}, "overlong": {"buffer_tokens": 32, "penalty": 0.5},
        "entropy_coef": 0.001, "gae": None,
    },
    "model": {"path": "org/model", "revision": "abc123", "dtype": "bfloat16",
              "param_dtype": "float32",
              "lora": {"rank": 8, "alpha": 16, "dropout": 0.05, "target_modules": ["q_proj"]}},
    "data": {
        "train": {"uri": "train.jsonl", "sha256": SHA_A, "prompt_field": "q", "answer_field": "a"},
        "validation": {"uri": "val.jsonl", "sha256": SHA_B, "prompt_field": "q",
                       "answer_field": "a"},
        "test": {"uri": "test.jsonl", "sha256": "c" * 64, "prompt_field": "q",
                 "answer_field": "a"},
        "max_prompt_tokens": 256, "max_response_tokens": 128, "chat_template": True,
        "prompt_overflow": "drop", "shuffle": True,
    },
    "reward": {"kind": "environment"},
    "environment": {"kind": "multi_turn", "entrypoint": "env.py:Env", "sha256": "d" * 64,
                    "max_turns": 3, "max_turn_tokens": 64, "max_total_tokens": 512,
                    "reward_placement": "per_turn", "turn_discount": 0.9,
                    "step_timeout_s": 10.0, "max_failed_share": 0.1},
    "rollout": {"backend": "vllm", "temperature": 0.9, "top_p": 0.95, "top_k": 50},
    "optim": {"kind": "adamw", "lr": 2e-6, "betas": [0.9, 0.95], "eps": 1e-8,
              "weight_decay": 0.1, "grad_clip": 0.5, "schedule": "cosine", "warmup_steps": 5,
              "min_lr_ratio": 0.1},
    "budget": {"total_updates": 100, "prompts_per_update": 16, "ppo_epochs": 2,
               "mini_batches": 4, "partial_batch": "drop"},
    "checkpoint": {"every": 10, "keep": 3},
    "evaluation": {"every": 5, "temperature": 0.6, "top_p": 0.95, "samples": 4,
                   "select_by": "val/reward/mean"},
    "resources": {"nodes": 2, "gpus_per_node": 8},
    "engine_options": {"verl": {"trainer.val_before_train": False}},
}

FULL_PPO: dict[str, Any] = copy.deepcopy(FULL_DAPO)
FULL_PPO["algorithm"].update({"objective": "ppo", "group_size": 1, "dynamic_sampling": None,
                              "gae": {"gamma": 0.99, "lam": 0.9}})
FULL_PPO["algorithm"]["advantage"]["zero_variance_groups"] = "keep"
# PPO scores single responses with a reward function, so the two together cover every leaf.
FULL_PPO["reward"] = {"kind": "python", "entrypoint": "reward.py:score", "sha256": SHA_B}
FULL_PPO["environment"] = {"kind": "single_turn"}
FULL_PPO["algorithm"]["rollout_correction"] = {"mode": "mask", "low": 0.25, "high": 4.0}
FULL_PPO["data"]["max_total_tokens"] = 300  # binds: below 256 + 128, a single-turn budget
FULL_PPO["optim"]["warmup_start_ratio"] = 0.1

# SFT from a stored run's checkpoint, packed: the leaves only sft and a warm start have.
FULL_SFT: dict[str, Any] = copy.deepcopy(FULL_PPO)
FULL_SFT["algorithm"] = {"objective": "sft", "loss_aggregation": "seq_mean_token_mean",
                         "sft": {"layout": "packed"}}
FULL_SFT["model"]["from_run"] = {"run_id": "20260101T000000Z-00000000",
                                 "checkpoint": "update-000010", "sha256": "e" * 64}
FULL_SFT["budget"].update({"ppo_epochs": 1, "mini_batches": 1})
del FULL_SFT["data"]["max_total_tokens"]  # a budget for sampled responses: sft samples none

SAMPLES: dict[str, dict[str, Any]] = {"minimal": MINIMAL, "full_dapo": FULL_DAPO,
                                      "full_ppo": FULL_PPO, "full_sft": FULL_SFT}

# Numbers where a unit slip or a rounding rule shows, each merged onto the kit's base sample
# (one with ``evaluation`` also gets the kit's validation split). The base's round numbers hide
# them: a budget sized from the response limit alone equals the right one under an engine's
# 16K floor, a micro-batch sized from the whole update (or one node's ranks) divides one
# optimizer step too when every count is a power of two, and W/T is the engine's own warmup
# rounding when it is exact. Settings apart are varied one at a time elsewhere; these also
# vary the ones that interact (a cosine with its warmup, checkpoints with several optimizer
# steps an update, validation sampled apart from the rollout). Every one needs at most the
# kit's 64 training rows (``samples.TRAIN_ROWS``): a run of one pass. Mini-batches of unequal
# sizes are a spec verl, OpenRLHF and NeMo RL refuse: an adapter that plans it is held to the
# equal split its engine needs, which no size gives.
AWKWARD: dict[str, dict[str, Any]] = {
    "limits past 16K tokens": {"data": {"max_prompt_tokens": 20000,
                                        "max_response_tokens": 3000}},
    "mini-batches that split a group": {"budget": {"prompts_per_update": 6, "mini_batches": 4}},
    "mini-batches of unequal sizes": {"algorithm": {"group_size": 3},
                                      "budget": {"prompts_per_update": 5, "mini_batches": 2}},
    "odd groups in three mini-batches": {"algorithm": {"group_size": 5},
                                         "budget": {"prompts_per_update": 12, "mini_batches": 3}},
    "two nodes of two ranks, three samples a rank a step": {
        "resources": {"nodes": 2, "gpus_per_node": 2},
        "budget": {"prompts_per_update": 6, "mini_batches": 2}},
    "warmup of an inexact share": {"budget": {"total_updates": 25, "prompts_per_update": 2},
                                   "optim": {"warmup_steps": 7}},
    "warmup of an inexact share, three epochs of two mini-batches": {
        "budget": {"total_updates": 25, "prompts_per_update": 2, "mini_batches": 2,
                   "ppo_epochs": 3},
        "optim": {"warmup_steps": 7}},
    "warmup of an inexact share, three epochs of one mini-batch": {
        "budget": {"total_updates": 25, "prompts_per_update": 2, "ppo_epochs": 3},
        "optim": {"warmup_steps": 7}},
    # the policy term aggregated per sequence beside an entropy term (no KL): an engine that
    # adds the other terms as token means differs only here
    "a sequence mean beside an entropy bonus": {
        "algorithm": {"loss_aggregation": "seq_mean_token_mean", "entropy_coef": 0.01}},
    "cosine after warmup": {"budget": {"total_updates": 25, "prompts_per_update": 2},
                            "optim": {"schedule": "cosine", "warmup_steps": 7,
                                      "min_lr_ratio": 0.1}},
    "linear after warmup to a floor": {"budget": {"total_updates": 25, "prompts_per_update": 2},
                                       "optim": {"schedule": "linear", "warmup_steps": 7,
                                                 "min_lr_ratio": 0.1}},
    # a seed of 0 (an `or` turns it into a default) and rates of more digits than an engine's
    # docs print (a format that rounds them still reads back as a number)
    "seed 0, numbers of nine digits": {
        "seed": 0, "optim": {"lr": 1.23456789e-6, "weight_decay": 0.0123456789,
                             "grad_clip": 0.987654321}},
    # near greedy, not greedy: a rule that rounds a small temperature to 0 samples greedily
    "a temperature near greedy": {"rollout": {"temperature": 0.01}},
    "checkpoints and validation every 3 updates of two optimizer steps": {
        "budget": {"total_updates": 7, "mini_batches": 2},
        "checkpoint": {"every": 3, "keep": 2}, "evaluation": {"every": 3, "temperature": 0.6}},
    "validation apart from the rollout's top-k": {
        "rollout": {"top_k": 20}, "evaluation": {"every": 3, "temperature": 0.6}},
    "validation at its own temperature and top-p": {
        "rollout": {"temperature": 0.8, "top_p": 0.9},
        "evaluation": {"every": 3, "temperature": 0.6, "top_p": 0.95}},
    "validation of three samples a prompt": {
        "evaluation": {"every": 3, "temperature": 0.6, "samples": 3}},
}
