"""The experiment spec v2: one engine-neutral description of an RL post-training experiment.

Names describe the experiment, never an engine. Every model forbids unknown keys, because a
misspelled key that is silently ignored is the most common way a run quietly differs from
what its author meant. Per-objective defaults are filled in here, once, so every engine and
the experiment digest see the same fully-specified experiment.

v2 names every setting that changes the math or the budget (optimizer, LR schedule, dual-clip,
KL clamp, advantage scope, prompt handling, validation decoding, parameter dtype), because a
setting the spec does not name is one each engine fills with its own default, and the same
digest then launches different experiments. A v1 document validates as v2 (the new settings
take their defaults); its digest changes once, since the v1 digest never fixed those settings.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

SPEC_VERSION: Final = 2
SPEC_SCHEMA_ID = f"stateset-backend/experiment-spec/v{SPEC_VERSION}"

Objective = Literal["grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo", "reinforce_pp", "ppo",
                    "sft"]
RatioLevel = Literal["token", "sequence"]
LossAggregation = Literal[
    "token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"
]
KLEstimator = Literal["k1", "k2", "k3"]
KLPlacement = Literal["loss", "reward"]
StdKind = Literal["unbiased", "population"]
ZeroVarianceGroups = Literal["keep", "exclude"]
DType = Literal["float32", "bfloat16", "float16"]
RolloutBackend = Literal["vllm", "sglang", "hf"]
RewardKind = Literal["python", "model", "remote", "environment"]
EnvironmentKind = Literal["single_turn", "multi_turn", "tool_use"]
AdvantageScope = Literal["group", "batch"]
ParamDType = Literal["float32", "bfloat16"]
OptimizerKind = Literal["adamw"]
Schedule = Literal["constant", "cosine", "linear"]
PromptOverflow = Literal["drop", "truncate_left", "truncate_right", "error"]
PartialBatch = Literal["drop"]
Equivalence = Literal["declared", "strict"]
RewardPlacement = Literal["final", "per_turn"]
CriticModel = Literal["separate", "value_head"]
SFTLayout = Literal["padded", "packed"]
RolloutCorrectionMode = Literal["truncate", "mask", "sequence_mask"]

OBJECTIVES: tuple[str, ...] = Objective.__args__  # type: ignore[attr-defined]
GROUP_OBJECTIVES = frozenset({"grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo", "reinforce_pp"})
SUPERVISED = "sft"
# What supervised fine-tuning learns from is the data's answers: no sampling, no ratio, no clip,
# no advantage, no reference. In an sft spec these algorithm keys hold the sft recipe's fixed
# values (any other value is refused), which translate.rules reports as inert on every engine.
RL_ONLY_ALGORITHM_KEYS = ("group_size", "clip", "ratio_level", "kl", "advantage",
                          "dynamic_sampling", "overlong", "entropy_coef", "gae",
                          "rollout_correction")

Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$",
                                 description="lower-case hex SHA-256 of the content")]
# Counts (tokens, samples, updates, processes) beyond 2^24 describe no real experiment, and
# the sums and products engines derive from them must stay inside canonical JSON's 2^53.
MAX_COUNT = 2**24
PositiveInt = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Probability = Annotated[float, Field(ge=0.0, le=1.0)]


class _Section(BaseModel):
    """Base for every spec section: unknown keys are errors, non-finite numbers are errors."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


class Clip(_Section):
    """PPO-style ratio clip range ``[1 - low, 1 + high]``; low != high is asymmetric (DAPO)."""

    low: float = Field(ge=0.0, description="ratio floor is 1 - low")
    high: float = Field(gt=0.0, description="ratio ceiling is 1 + high")
    dual_clip: float | None = Field(
        None, gt=1.0, description="dual-clip PPO: for tokens with a negative advantage the "
                                  "loss is at most -A * dual_clip; null = no dual clip")


class KL(_Section):
    """KL regularisation toward the frozen reference policy. Absent (null) means no KL."""

    coef: float = Field(gt=0.0, description="must be positive: a zero coefficient means no KL; "
                                            "say so with `kl: null`")
    estimator: KLEstimator = Field("k3", description="with d = log pi - log pi_ref: k1 = d, "
                                                     "k2 = d^2/2, k3 = exp(-d) - 1 + d")
    placement: KLPlacement = Field("loss", description="added to the loss, or subtracted "
                                                       "from the token reward")
    clamp: float | None = Field(None, gt=0.0, description="the per-token estimate is clamped "
                                "to [-clamp, clamp]; null = not clamped. Default: 10 for k3 "
                                "(the low-variance estimator's usual guard), null otherwise")

    @model_validator(mode="before")
    @classmethod
    def _default_clamp(cls, data: Any) -> Any:
        """k3 is exp(-d) - 1 + d: one token far from the reference dominates a whole batch
        unless clamped, so its recipe clamps it; k1 and k2 are not clamped by default."""
        if isinstance(data, dict) and "clamp" not in data:
            return {**data, "clamp": 10.0 if data.get("estimator", "k3") == "k3" else None}
        return data


class Advantage(_Section):
    """How advantages are normalised, stated exactly so two engines can be compared."""

    std_normalize: bool = Field(description="divide by the std of the group (or of the batch "
                                            "for reinforce_pp)")
    std: StdKind = Field("unbiased", description="unbiased (n-1, torch.std default) or "
                                                 "population (n)")
    epsilon: float = Field(1e-6, gt=0.0, description="added to the std before dividing")
    scope: AdvantageScope = Field(
        "group", description="group: the std is the group's; batch: the group-mean-subtracted "
                             "advantages are whitened over the whole batch (mean and std)")
    zero_variance_groups: ZeroVarianceGroups = Field(
        "keep",
        description="groups whose rewards are all equal: keep (advantage 0, still counted in "
                    "loss denominators) or exclude (removed from the batch before the loss)",
    )


class DynamicSampling(_Section):
    """DAPO dynamic sampling: drop zero-variance groups and sample more prompts to refill."""

    max_rounds: PositiveInt = Field(3, description="extra generation rounds allowed to "
                                                   "refill one update's batch")


class Overlong(_Section):
    """DAPO soft overlong punishment over the last ``buffer_tokens`` of the response budget."""

    buffer_tokens: PositiveInt
    penalty: float = Field(1.0, gt=0.0, description="reward penalty at the hard limit")


class RolloutCorrection(_Section):
    """Importance weights for the gap between the sampler's token probabilities and the
    learner's: a fast sampler (vLLM) and the trainer compute slightly different log-probs for
    the same weights, so the samples are slightly off-policy even on the first step.

    With w_t = exp(logp_old_t - logp_rollout_t), detached (logp_old: the learner's log-prob
    under the weights that sampled, before this update's optimizer steps; logp_rollout: the
    sampler's), the per-token policy-gradient term loss_t (the clipped surrogate, before
    aggregation; the KL and entropy terms are not weighted) becomes the mode's."""

    mode: RolloutCorrectionMode = Field(
        description="truncate (TIS): loss_t *= clamp(w_t, low, high); mask (IcePop): "
                    "loss_t *= w_t if low <= w_t <= high else 0; sequence_mask "
                    "(seq-mask-tis): loss_t *= w_t if low <= exp(mean over the sequence's "
                    "response tokens of log w) <= high else 0")
    low: float = Field(0.5, ge=0.0, description="lower bound on the weight (or, for "
                                                "sequence_mask, on the sequence's geometric "
                                                "mean weight)")
    high: float = Field(5.0, gt=0.0, description="upper bound, >= low")

    @model_validator(mode="after")
    def _ordered(self) -> RolloutCorrection:
        if self.low > self.high:
            raise ValueError(f"rollout_correction.low ({self.low:g}) must not exceed "
                             f"rollout_correction.high ({self.high:g})")
        return self


class Critic(_Section):
    """The learned value function V(s) that GAE bootstraps from (PPO's recipe values)."""

    model: CriticModel = Field(
        "separate", description="separate: a critic model initialised from model.path at "
                                "model.revision, whose last hidden state feeds a scalar value "
                                "head (verl's and OpenRLHF's critic); value_head: a scalar head "
                                "on the policy's own trunk")
    lr: float = Field(1e-5, gt=0.0, description="the critic's learning rate; every other "
                      "optimizer setting (betas, eps, weight decay, grad clip, schedule, "
                      "warmup) is optim's")
    value_clip: float | None = Field(
        0.5, gt=0.0, description="value loss 0.5 * max((V - R)^2, (V_clip - R)^2) with V_clip "
                                 "= V_old + clamp(V - V_old, -value_clip, value_clip), V_old the "
                                 "value recorded at rollout; null = unclipped (V - R)^2 / 2")
    warmup_updates: Count = Field(0, description="the first N updates train the critic "
                                "only: the policy is not updated until update N + 1")


class GAE(_Section):
    """Generalised advantage estimation for PPO with a learned critic."""

    gamma: Probability = Field(1.0, description="discount per response token")
    lam: Probability = Field(0.95, description="GAE lambda: 1 = Monte-Carlo return minus V, "
                                               "0 = one-step TD error")
    critic: Critic = Critic()


class SFT(_Section):
    """Supervised fine-tuning on the data's prompt/answer rows: the loss is the answer tokens'
    negative log-likelihood; prompt tokens are context only."""

    layout: SFTLayout = Field(
        "padded", description="padded: one row per sequence, right-padded to the longest in "
                              "the update; packed: rows concatenated into sequences of up to "
                              "max_prompt_tokens + max_response_tokens tokens, each row "
                              "attending only to itself with its own positions (the same loss "
                              "as padded, fewer pad tokens)")


class Algorithm(_Section):
    objective: Objective
    group_size: PositiveInt = Field(description="samples per prompt")
    clip: Clip
    ratio_level: RatioLevel = Field(description="importance ratio per token, or per sequence "
                                                "from the length-normalised log-prob difference")
    loss_aggregation: LossAggregation
    kl: KL | None
    advantage: Advantage
    dynamic_sampling: DynamicSampling | None
    overlong: Overlong | None
    entropy_coef: float = Field(0.0, ge=0.0, description="entropy bonus in the loss")
    gae: GAE | None = Field(description="PPO only: critic-based advantages")
    sft: SFT | None = Field(None, description="sft only: how answer rows are laid out")
    rollout_correction: RolloutCorrection | None = Field(
        None, description="weights the policy-gradient term by the learner/sampler "
                          "probability ratio; null = unweighted")

    @model_validator(mode="before")
    @classmethod
    def _fill_objective_defaults(cls, data: Any) -> Any:
        """Fill every key the user left out from the objective's published recipe.

        Presence is what matters: ``"kl": null`` is an explicit choice and is kept.
        """
        if not isinstance(data, dict) or not isinstance(data.get("objective"), str) or \
                data["objective"] not in OBJECTIVE_DEFAULTS:
            return data
        filled = dict(data)
        for key, default in OBJECTIVE_DEFAULTS[data["objective"]].items():
            if key not in filled:
                filled[key] = default
            elif isinstance(default, dict) and isinstance(filled[key], dict):
                filled[key] = {**default, **filled[key]}
        return filled

    @model_validator(mode="after")
    def _consistent(self) -> Algorithm:
        obj = self.objective
        if obj in GROUP_OBJECTIVES - {"reinforce_pp"} and self.group_size < 2:
            raise ValueError(f"{obj} compares samples within a group: group_size must be >= 2")
        if obj == "gspo" and self.ratio_level != "sequence":
            raise ValueError("gspo is defined by a sequence-level ratio: ratio_level must be "
                             "'sequence'")
        if obj == "ppo" and self.gae is None:
            raise ValueError("ppo needs gae (its advantages come from a critic)")
        if obj != "ppo" and self.gae is not None:
            raise ValueError(f"gae applies to ppo only, not {obj}")
        if (obj == SUPERVISED) != (self.sft is not None):
            raise ValueError(f"algorithm.sft applies to sft only, not {obj}")
        if obj == SUPERVISED:
            for key in RL_ONLY_ALGORITHM_KEYS:  # the recipe's own value reads back unchanged
                value, fixed = getattr(self, key), OBJECTIVE_DEFAULTS[obj].get(key)
                if isinstance(value, BaseModel) and isinstance(fixed, dict):
                    fixed = type(value).model_validate(fixed)
                if value != fixed:
                    raise ValueError(f"algorithm.{key} applies to RL objectives, not sft (sft "
                                     "learns from the data's answers: nothing is sampled)")
        if self.dynamic_sampling is not None and \
                self.advantage.zero_variance_groups != "exclude":
            raise ValueError("dynamic_sampling removes zero-variance groups: set "
                             "advantage.zero_variance_groups to 'exclude'")
        return self


_PPO_CLIP = {"low": 0.2, "high": 0.2}
_GROUP_ADV = {"std_normalize": True}

OBJECTIVE_DEFAULTS: dict[str, dict[str, Any]] = {
    # GRPO (DeepSeekMath): group-normalised advantages, k3 KL in the loss, per-sequence mean.
    "grpo": {"group_size": 8, "clip": _PPO_CLIP, "ratio_level": "token",
             "loss_aggregation": "seq_mean_token_mean",
             "kl": {"coef": 0.001, "estimator": "k3", "placement": "loss"},
             "advantage": _GROUP_ADV, "dynamic_sampling": None, "overlong": None, "gae": None},
    # Dr.GRPO: no std division, no length normalisation per sequence, no KL.
    "dr_grpo": {"group_size": 8, "clip": _PPO_CLIP, "ratio_level": "token",
                "loss_aggregation": "seq_mean_token_sum_norm", "kl": None,
                "advantage": {"std_normalize": False}, "dynamic_sampling": None,
                "overlong": None, "gae": None},
    # DAPO: clip-higher, token-level mean, dynamic sampling, soft overlong punishment, no KL.
    "dapo": {"group_size": 8, "clip": {"low": 0.2, "high": 0.28}, "ratio_level": "token",
             "loss_aggregation": "token_mean", "kl": None,
             "advantage": {"std_normalize": True, "zero_variance_groups": "exclude"},
             "dynamic_sampling": {"max_rounds": 3},
             "overlong": {"buffer_tokens": 64, "penalty": 1.0}, "gae": None},
    # GSPO: sequence-level ratio with a very tight clip range.
    "gspo": {"group_size": 8, "clip": {"low": 3e-4, "high": 4e-4}, "ratio_level": "sequence",
             "loss_aggregation": "seq_mean_token_mean", "kl": None, "advantage": _GROUP_ADV,
             "dynamic_sampling": None, "overlong": None, "gae": None},
    # CISPO (MiniMax-M1): clipped, detached IS weight; no lower bound in practice.
    "cispo": {"group_size": 8, "clip": {"low": 1.0, "high": 0.28}, "ratio_level": "token",
              "loss_aggregation": "token_mean", "kl": None, "advantage": _GROUP_ADV,
              "dynamic_sampling": None, "overlong": None, "gae": None},
    # RLOO: leave-one-out baseline, no std division, KL folded into the reward.
    "rloo": {"group_size": 8, "clip": _PPO_CLIP, "ratio_level": "token",
             "loss_aggregation": "token_mean",
             "kl": {"coef": 0.001, "estimator": "k1", "placement": "reward"},
             "advantage": {"std_normalize": False}, "dynamic_sampling": None,
             "overlong": None, "gae": None},
    # REINFORCE++ with baseline: group-mean baseline, batch-level std normalisation.
    "reinforce_pp": {"group_size": 8, "clip": _PPO_CLIP, "ratio_level": "token",
                     "loss_aggregation": "token_mean",
                     "kl": {"coef": 0.001, "estimator": "k2", "placement": "loss"},
                     "advantage": {"std_normalize": True, "scope": "batch"},
                     "dynamic_sampling": None, "overlong": None, "gae": None},
    # PPO: one sample per prompt, critic + GAE, KL penalty in the reward.
    "ppo": {"group_size": 1, "clip": _PPO_CLIP, "ratio_level": "token",
            "loss_aggregation": "token_mean",
            "kl": {"coef": 0.001, "estimator": "k1", "placement": "reward"},
            "advantage": {"std_normalize": True, "scope": "batch"}, "dynamic_sampling": None,
            "overlong": None, "gae": {"gamma": 1.0, "lam": 0.95}},
    # SFT: the answer tokens' mean negative log-likelihood. The RL keys hold fixed values that
    # no engine reads (inert); the user may not set them.
    "sft": {"group_size": 1, "clip": _PPO_CLIP, "ratio_level": "token",
            "loss_aggregation": "token_mean", "kl": None,
            "advantage": {"std_normalize": False}, "dynamic_sampling": None, "overlong": None,
            "entropy_coef": 0.0, "gae": None, "sft": {}},
}


class LoRA(_Section):
    rank: PositiveInt
    alpha: float = Field(gt=0.0)
    dropout: Probability = 0.0
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class FromRun(_Section):
    """Start from a checkpoint another run left in the run store (an SFT warm start). The
    checkpoint's manifest hash makes the starting weights part of this experiment."""

    run_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                        description="the run whose checkpoint is the starting point")
    checkpoint: str = Field(pattern=r"^update-[0-9]{6}$",
                            description="the checkpoint of that update, e.g. 'update-000040' "
                                        "(the native engine's folder name; other engines map "
                                        "it to theirs)")
    sha256: Sha256Hex = Field(description="SHA-256 of the checkpoint's manifest.json (it lists "
                                          "every file's sha256), as `runs from-run` prints it")


class Model(_Section):
    path: str = Field(min_length=1, description="hub id or local directory")
    revision: str | None = Field(
        None, description="commit for hub ids; 'sha256:<hex>' content digest for local dirs")
    dtype: DType = Field("bfloat16", description="compute dtype of forward and backward")
    param_dtype: ParamDType = Field("float32", description="master weights and optimizer "
                                                           "state")
    lora: LoRA | None = None
    from_run: FromRun | None = Field(
        None, description="start from this stored run's checkpoint instead of model.path's "
                          "weights; model.path, revision and lora must be that run's")


class DataSplit(_Section):
    uri: str = Field(min_length=1, description="local path or URI of the split")
    sha256: Sha256Hex
    prompt_field: str = "prompt"
    answer_field: str = "answer"


class Data(_Section):
    train: DataSplit
    validation: DataSplit | None = None
    test: DataSplit | None = None
    max_prompt_tokens: PositiveInt = 512
    max_response_tokens: PositiveInt = Field(512, description="the total limit is "
                                             "max_prompt_tokens + max_response_tokens, "
                                             "unless max_total_tokens is lower")
    max_total_tokens: PositiveInt | None = Field(
        None, description="a budget a prompt and its response share: a response also stops "
                          "when prompt + response tokens reach it, so a longer prompt leaves "
                          "a shorter response (vLLM's max_model_len); null = none. A value of "
                          "at least max_prompt_tokens + max_response_tokens never binds and is "
                          "read as null")
    chat_template: bool = Field(True, description="render prompts with the model's chat "
                                "template (a text prompt is one user message)")
    prompt_overflow: PromptOverflow = Field(
        "drop", description="a prompt longer than max_prompt_tokens: dropped from the split "
                            "before training, truncated from the left or right, or an error")
    shuffle: bool = Field(True, description="each pass over the train split is shuffled "
                                            "(seeded)")

    @model_validator(mode="before")
    @classmethod
    def _unbinding_total_is_none(cls, data: Any) -> Any:
        """A shared budget no prompt and response can reach changes nothing: it is the same
        experiment as none, so it must have the same digest."""
        if not isinstance(data, dict) or data.get("max_total_tokens") is None:
            return data
        total, prompt, response = (data.get(k, 512) for k in (
            "max_total_tokens", "max_prompt_tokens", "max_response_tokens"))
        # whole numbers as pydantic reads them (150.0 is 150): the same spec, the same digest
        if all(isinstance(v, int | float) and not isinstance(v, bool) and float(v).is_integer()
               for v in (total, prompt, response)) and total >= prompt + response:
            return {**data, "max_total_tokens": None}
        return data


_ENTRYPOINT = re.compile(r"^[^:]+\.py:[A-Za-z_][A-Za-z0-9_]*$")


class Reward(_Section):
    kind: RewardKind = Field("python", description="python: a function scores each response; "
                             "environment: the conversation's environment returns the rewards "
                             "(multi_turn and tool_use)")
    entrypoint: str | None = Field(None, description="python: 'file.py:function'; model: model "
                                                     "path; remote: URL; environment: null")
    sha256: Sha256Hex | None = Field(None, description="content of the reward file or model")

    @model_validator(mode="after")
    def _entrypoint_shape(self) -> Reward:
        if self.kind == "environment":
            if self.entrypoint is not None or self.sha256 is not None:
                raise ValueError("an environment reward comes from environment.entrypoint: "
                                 "leave reward.entrypoint and reward.sha256 null")
            return self
        if not self.entrypoint:
            raise ValueError(f"a {self.kind} reward needs an entrypoint")
        if self.kind == "python":
            if not _ENTRYPOINT.match(self.entrypoint):
                raise ValueError("a python reward entrypoint is 'file.py:function'")
            if self.sha256 is None:
                raise ValueError("a python reward needs sha256 of its file: the reward is "
                                 "part of the experiment")
        return self


_CLASS_ENTRYPOINT = re.compile(r"^[^:]+\.py:[A-Za-z_][A-Za-z0-9_]*$")


class Environment(_Section):
    """Who the policy talks to. single_turn: one response per prompt, scored by the reward
    function. multi_turn / tool_use: a conversation with an environment class
    (docs/environments.md) that answers each assistant turn with observation messages, a
    reward and whether the conversation is done; tool_use adds tools with JSON schemas."""

    kind: EnvironmentKind = "single_turn"
    entrypoint: str | None = Field(None, description="'file.py:Class', the environment class")
    sha256: Sha256Hex | None = Field(None, description="content of the environment file")
    max_turns: PositiveInt = Field(1, description="assistant turns per conversation")
    max_turn_tokens: PositiveInt | None = Field(
        None, description="tokens per assistant turn; null = data.max_response_tokens")
    max_total_tokens: PositiveInt | None = Field(
        None, description="tokens of the whole conversation (prompt, environment and "
                          "assistant); the conversation ends when the next turn cannot fit; "
                          "null = max_prompt_tokens + max_turns * the turn limit")
    reward_placement: RewardPlacement = Field(
        "final", description="final: the last step's reward is the conversation's reward; "
                             "per_turn: each assistant turn learns from its discounted "
                             "reward-to-go")
    turn_discount: Probability = Field(1.0, description="per_turn: gamma in sum_k gamma^(k-t) "
                                                        "r_k")
    step_timeout_s: float = Field(30.0, gt=0.0, description="an environment step that takes "
                                                            "longer ends its conversation "
                                                            "with a recorded error")
    max_failed_share: Probability = Field(
        0.0, description="share of an update's (or a validation's) conversations whose "
                         "environment raised, timed out or answered malformed output above "
                         "which the update is refused (the validation reports no reward); "
                         "failed conversations never get an invented reward")

    @model_validator(mode="after")
    def _turns(self) -> Environment:
        if self.kind == "single_turn":
            if self.max_turns != 1:
                raise ValueError("single_turn environments have max_turns 1")
            if self.entrypoint is not None or self.sha256 is not None:
                raise ValueError("a single_turn environment has no entrypoint: the reward "
                                 "function is the environment")
            return self
        if self.entrypoint is None or not _CLASS_ENTRYPOINT.match(self.entrypoint):
            raise ValueError(f"a {self.kind} environment needs an entrypoint 'file.py:Class'")
        if self.sha256 is None:
            raise ValueError(f"a {self.kind} environment needs sha256 of its file: the "
                             "environment is part of the experiment")
        return self


class Rollout(_Section):
    backend: RolloutBackend = "vllm"
    temperature: float = Field(1.0, gt=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: PositiveInt | None = Field(None, description="null = no top-k filtering")


class Optim(_Section):
    kind: OptimizerKind = Field("adamw", description="AdamW (decoupled weight decay)")
    lr: float = Field(1e-6, gt=0.0)
    betas: tuple[Probability, Probability] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0.0)
    weight_decay: float = Field(0.01, ge=0.0)
    grad_clip: float = Field(1.0, gt=0.0, description="max global grad norm")
    schedule: Schedule = Field("constant", description="LR after warmup: constant, or a "
                               "cosine / linear decay to min_lr_ratio * lr at total_updates")
    warmup_steps: Count = Field(0, description="updates of linear warmup: update u < W "
                              "runs at lr * u / W (from warmup_start_ratio * lr where set); "
                              "the schedule advances once per update")
    warmup_start_ratio: Probability | None = Field(
        None, description="where warmup starts, as a fraction of lr: update u < W runs at "
                          "lr * (s + (1 - s) * u / W); null = 0")
    min_lr_ratio: Probability = Field(0.0, description="floor of the decay, as a fraction "
                                                       "of lr")

    @model_validator(mode="wrap")
    @classmethod
    def _inert_start_is_none(cls, data: Any, handler: Any) -> Any:
        """A warmup that starts from 0, or no warmup at all, is the same experiment as no
        start ratio: it must have the same digest, however the input spelled the numbers
        (judged on the validated values)."""
        optim = handler(data)
        if optim.warmup_start_ratio is not None and \
                (optim.warmup_start_ratio == 0 or optim.warmup_steps == 0):
            return optim.model_copy(update={"warmup_start_ratio": None})
        return optim


class Budget(_Section):
    total_updates: PositiveInt = Field(description="exactly this many updates run, whatever "
                                                   "the size of the train split")
    prompts_per_update: PositiveInt = 32
    ppo_epochs: PositiveInt = 1
    mini_batches: PositiveInt = Field(1, description="optimizer steps per PPO epoch")
    partial_batch: PartialBatch = Field(
        "drop", description="prompts left at the end of a pass that cannot fill an update "
                            "are skipped; the next pass starts over, reshuffled")


class Checkpoint(_Section):
    every: PositiveInt | None = Field(None, description="updates between checkpoints; "
                                                        "null = only at the end")
    keep: PositiveInt | None = Field(None, description="newest checkpoints kept (the native "
                                                     "engine also keeps the one "
                                                     "evaluation.select_by recommends so "
                                                     "far); null = all")


# the canonical validation metrics engines report: the only names select_by can rank by
VALIDATION_METRICS = ("val/reward/mean", "val/conversations/failed_share", "val/loss",
                      "val/token_accuracy")
LOWER_IS_BETTER = frozenset({"val/conversations/failed_share", "val/loss"})


class Evaluation(_Section):
    every: PositiveInt | None = Field(None, description="updates between validation runs")
    temperature: float = Field(0.0, ge=0.0, description="validation decoding; 0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    samples: PositiveInt = Field(1, description="responses per validation prompt")

    @model_validator(mode="after")
    def _sampled(self) -> Evaluation:
        if self.samples > 1 and self.temperature == 0:
            raise ValueError("greedy validation (temperature 0) gives one response per prompt: "
                             "set samples to 1 or a temperature above 0")
        return self
    select_by: str | None = Field(None, description="validation metric that picks the best "
                                                    "checkpoint: one of "
                                                    + ", ".join(VALIDATION_METRICS))

    @field_validator("select_by")
    @classmethod
    def _known_metric(cls, value: str | None, info: ValidationInfo) -> str | None:
        # a misspelt name would validate, never match a row, and recommend nothing; a spec a
        # stored plan carries was accepted when it was made and is read back as it is
        if (info.context or {}).get("stored"):
            return value
        if value is not None and value not in VALIDATION_METRICS:
            raise ValueError(f"{value!r} is not a validation metric; one of "
                             + ", ".join(VALIDATION_METRICS))
        return value


class Resources(_Section):
    """Where a run executes. None of it is identity: every engine must compute the same
    experiment whatever the world size (the native engine proves it in its tests)."""

    nodes: PositiveInt = 1
    gpus_per_node: Count = 0
    processes_per_node: PositiveInt | None = Field(
        None, description="training processes per node (data-parallel ranks); default: "
                          "gpus_per_node, or 1 without GPUs. Set it to run several CPU "
                          "processes; with GPUs it may not exceed gpus_per_node (one GPU per "
                          "process)")

    @model_validator(mode="after")
    def _one_gpu_per_process(self) -> Resources:
        if self.gpus_per_node and self.processes_per_node is not None and \
                self.processes_per_node > self.gpus_per_node:
            raise ValueError(f"processes_per_node {self.processes_per_node} exceeds "
                             f"gpus_per_node {self.gpus_per_node}: each process drives one GPU")
        return self

    @property
    def processes(self) -> int:
        """Processes on each node: processes_per_node, else one per GPU, else one."""
        return self.processes_per_node or self.gpus_per_node or 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.processes


class ExperimentSpec(_Section):
    """An experiment. Sections in NON_IDENTITY_FIELDS do not change its digest."""

    version: Literal[1, 2] = Field(
        SPEC_VERSION, description="the spec version the document was written for; a v1 "
                                  "document reads as v2 with the settings v2 added at their "
                                  "defaults")
    name: str = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    equivalence: Equivalence = Field(
        "declared", description="declared: an engine may run with a deviation its contract "
                                "names and quantifies (shown by explain, recorded in plan and "
                                "result); strict: any declared deviation is refused")
    seed: int = Field(ge=0, le=2**32 - 1,
                      description="engines seed numpy with it, which takes 32 bits")
    algorithm: Algorithm
    model: Model
    data: Data
    reward: Reward
    environment: Environment = Environment()
    rollout: Rollout = Rollout()
    optim: Optim = Optim()
    budget: Budget
    checkpoint: Checkpoint = Checkpoint()
    evaluation: Evaluation = Evaluation()
    resources: Resources = Resources()
    engine_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="raw native keys per engine name; may not override "
                                          "a key that a spec field maps to")

    @model_validator(mode="after")
    def _cross_section(self) -> ExperimentSpec:
        ov = self.algorithm.overlong
        if ov is not None and ov.buffer_tokens >= self.data.max_response_tokens:
            raise ValueError("algorithm.overlong.buffer_tokens must be smaller than "
                             "data.max_response_tokens")
        if self.evaluation.every is not None and self.data.validation is None:
            raise ValueError("evaluation.every needs data.validation")
        conversation = self.environment.kind != "single_turn"
        if conversation != (self.reward.kind == "environment"):
            raise ValueError("multi_turn and tool_use environments give the reward "
                             "(reward.kind 'environment'); a single_turn spec needs a reward "
                             "function")
        total = self.data.max_total_tokens
        if total is not None:
            if conversation:
                raise ValueError("data.max_total_tokens is a single-turn budget: a conversation "
                                 "shares environment.max_total_tokens")
            if self.algorithm.objective == SUPERVISED:
                raise ValueError("data.max_total_tokens caps sampled responses, and sft samples "
                                 "none: limit answers with data.max_response_tokens")
            if total <= self.data.max_prompt_tokens:
                raise ValueError(f"data.max_total_tokens ({total}) must exceed "
                                 f"data.max_prompt_tokens ({self.data.max_prompt_tokens}): a "
                                 "prompt of that length would leave no room for a response")
        if self.budget.mini_batches > self.budget.prompts_per_update:
            raise ValueError("budget.mini_batches cannot exceed budget.prompts_per_update")
        if self.algorithm.objective == SUPERVISED:
            if conversation:
                raise ValueError("sft learns from single-turn prompt/answer rows: "
                                 "environment.kind must be single_turn")
            if (self.budget.ppo_epochs, self.budget.mini_batches) != (1, 1):
                raise ValueError("budget.ppo_epochs and budget.mini_batches apply to RL "
                                 "objectives: sft makes one optimizer step per update")
        return self


NON_IDENTITY_FIELDS: frozenset[str] = frozenset({"version", "name", "labels", "equivalence",
                                                 "resources", "engine_options"})

# Sections added after v2 was published, left out of the experiment digest while null, so an
# experiment written before they existed keeps its digest (and its stored runs stay resumable).
ABSENT_WHEN_NULL: tuple[tuple[str, str], ...] = (("algorithm", "sft"), ("model", "from_run"),
                                                  ("data", "max_total_tokens"),
                                                  ("algorithm", "rollout_correction"),
                                                  ("optim", "warmup_start_ratio"))
