"""verl's own vocabulary, spelled once: its config sections, the closed mappings from the
spec's values to the names verl accepts, and the dialect keys (what differs between releases).

verl carries an unknown value along until something fails far into a run, or never, so no
rule writes a verl value that is not in one of these mappings, and every key that a release
may lack or read undeclared goes through ``NativeKeys``.
"""

from __future__ import annotations

from typing import Any, Literal

from stateset_backend.plugin import Dialect, DialectKeys, ExperimentSpec, Outcome, Pinned, Rule

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
ROLLOUT = "actor_rollout_ref.rollout"
MODEL = "actor_rollout_ref.model"
VAL = f"{ROLLOUT}.val_kwargs"
FILTER = "algorithm.filter_groups"

ESTIMATOR = {"grpo": "grpo", "dr_grpo": "grpo", "dapo": "grpo", "gspo": "grpo",
             "cispo": "grpo", "rloo": "rloo", "reinforce_pp": "reinforce_plus_plus_baseline",
             "ppo": "gae"}
GROUP_NORMALISED = frozenset({"grpo", "dr_grpo", "dapo", "gspo", "cispo"})
WHITENED = frozenset({"reinforce_pp", "ppo"})  # verl whitens these over the batch
LOSS_MODE = {"gspo": "gspo", "cispo": "cispo"}  # everything else: "vanilla"
AGGREGATION = {"token_mean": "token-mean", "seq_mean_token_mean": "seq-mean-token-mean",
               "seq_mean_token_sum": "seq-mean-token-sum",
               "seq_mean_token_sum_norm": "seq-mean-token-sum-norm"}
KL_TYPE = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}  # names every release accepts
PRECISION = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
GRPO_EPSILON = 1e-6  # compute_grpo_outcome_advantage's default; no caller passes another
K3_CLAMP = 10.0  # kl_penalty_forward clamps low_var_kl to [-10, 10]
NO_DUAL_CLIP = 1e9  # above exp(20) >= any ratio verl computes: min() never picks -A * c
NO_VALUE_CLIP = 1e9  # cliprange_value for an unclipped value loss
ADAM_EPS = 1e-8  # torch.optim.AdamW's default, which verl passes on before 0.6.1


class VerlKeys(DialectKeys):
    reward_function: str  # the custom reward function section
    reward_manager: str  # the reward manager's name key
    reward_kwargs: str  # the reward manager's kwargs (with '+': not in the base config)
    seed: list[str]  # every seed the release reads
    logger: Literal["file", "tensorboard"]
    filter_groups: str | None  # dynamic sampling (the V1 trainer only)
    filter_metric: str | None  # what filter_groups compares within a group
    # the V1 trainer's custom sampler section: the launch hands each update's samples to the
    # actor in the order their prompts were drawn (ordered_sampler.py), not as they finished
    v1_sampler: str | None = None
    grad_clip: list[str]  # the actor keys the release clips with
    critic_grad_clip: list[str]
    prompt_truncation: Literal["dataset", "none", "left"]  # what happens to a long prompt
    token_mean: Literal["global", "micro_batch"]  # what token-mean averages over
    cosine_warmup_from_floor: bool  # cosine warmup starts at min_lr_ratio (0.4, 0.5)
    critic_fsdp: str  # the critic's FSDP section: precision, master weights
    # what the actor's and reference's forward autocasts to: bfloat16 whatever the launch says,
    # their fsdp_config.dtype, or their mixed_precision.param_dtype (no autocast for fp32)
    autocast: Literal["bfloat16", "fsdp_dtype", "param_dtype"]
    critic_autocast: Literal["bfloat16", "param_dtype"]  # the same for the critic
    added: list[str]  # keys read with .get() but absent from the config: written with '+'
    fixed: list[str]  # keys pinned at the recorded default, which is what the spec means
    agent_loop: bool = False  # the agent loop the conversation shim implements (0.9.1)


def loss_mode(spec: ExperimentSpec) -> str:
    return LOSS_MODE.get(spec.algorithm.objective, "vanilla")


class NativeKeys:
    """Native key names for one dialect: '+' where the release reads a key it does not
    declare, and only keys the release has (by its recorded defaults)."""

    def __init__(self, dialect: Dialect, keys: VerlKeys) -> None:
        self.defaults = dialect.defaults
        self.added = set(keys.added)
        self.keys = keys

    def __call__(self, key: str) -> str:
        return f"+{key}" if key in self.added else key

    def has(self, key: str) -> bool:
        return key in self.defaults

    def optim(self, suffix: str, value: Any) -> dict[str, Any]:
        """The same optimizer setting for the actor and (for PPO) the critic, where the
        release reads it."""
        return {self(k): value for k in (f"{ACTOR}.optim.{suffix}", f"critic.optim.{suffix}")
                if self.has(k)}

    def optim_rule(self, suffix: str) -> Rule:
        def rule(value: Any, spec: ExperimentSpec) -> Outcome:
            return Pinned(self.optim(suffix, value))

        return rule

