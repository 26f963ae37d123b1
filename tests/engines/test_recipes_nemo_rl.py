"""The published NeMo RL recipe grpo_math_1B (v0.7.0), as a spec: planned for the release it
comes from, its launch resolves, in the release's own config, to the recipe's values for every
setting the spec reproduces (read from the recipe's YAML, not retyped)."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf
from optional_installs import NEMO_RL_CONFIGS_MISSING
from test_nemo_rl import CONFIGS, apply, overrides_of, release_config

from stateset_backend.adapters.nemo_rl.adapter import NemoRLAdapter
from stateset_backend.engines.registry import AdapterEntry
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.files import load_spec

RECIPES = Path(__file__).resolve().parents[2] / "examples" / "recipes"
pytestmark = pytest.mark.skipif(not CONFIGS.is_dir(), reason=NEMO_RL_CONFIGS_MISSING)

# the recipe's keys this spec reproduces (labels say what differs: model, data, lengths,
# warmup start, checkpoint retention, stopping)
REPRODUCED = [
    "grpo.num_prompts_per_step", "grpo.num_generations_per_prompt", "grpo.normalize_rewards",
    "grpo.use_leave_one_out_baseline", "grpo.val_period", "grpo.val_at_start", "grpo.val_at_end",
    "grpo.seed", "grpo.use_dynamic_sampling", "grpo.overlong_filtering",
    "grpo.reward_shaping.enabled", "grpo.adv_estimator.name", "grpo.advantage_clip_low",
    "grpo.advantage_clip_high", "loss_fn.reference_policy_kl_penalty",
    "loss_fn.reference_policy_kl_type", "loss_fn.kl_input_clamp_value",
    "loss_fn.kl_output_clamp_value", "loss_fn.ratio_clip_min", "loss_fn.ratio_clip_max",
    "loss_fn.ratio_clip_c", "loss_fn.token_level_loss",
    "loss_fn.sequence_level_importance_ratios", "loss_fn.use_kl_in_reward",
    "loss_fn.use_importance_sampling_correction", "policy.optimizer.name",
    "policy.optimizer.kwargs.lr", "policy.optimizer.kwargs.weight_decay",
    "policy.optimizer.kwargs.betas", "policy.optimizer.kwargs.eps", "policy.max_grad_norm",
    "policy.precision", "policy.train_global_batch_size", "policy.max_total_sequence_length",
    "policy.generation.temperature", "policy.generation.top_p", "policy.generation.top_k",
    "checkpointing.enabled", "checkpointing.save_period", "checkpointing.keep_top_k",
    "data.shuffle",
]


def test_grpo_math_1b_resolves_to_the_recipes_values(tmp_path):
    version = "0.7.0"
    entry = AdapterEntry(NemoRLAdapter(), "builtin", "stateset-backend", "0.1.0")
    plan = make_plan(load_spec(RECIPES / "nemo-rl-grpo_math_1B.json"), entry, version,
                     base_dir=RECIPES)
    _, cfg, _ = apply(version, overrides_of(plan, str(tmp_path)))
    OmegaConf.register_new_resolver("mul", lambda a, b: a * b, replace=True)
    recipe = release_config(version)
    for key in REPRODUCED:
        assert OmegaConf.select(cfg, key) == OmegaConf.select(recipe, key), key
    # the warmup (its start at 0.1 * lr included) and the constant LR after it are the recipe's
    assert cfg.policy.scheduler == recipe.policy.scheduler
    assert {d["deviation"] for d in plan.deviations} == {
        "rloo_leave_one_out_std", "kl_score_function_gradient"}
    assert plan.spec["labels"]["source"].endswith("v0.7.0/examples/configs/grpo_math_1B.yaml")
