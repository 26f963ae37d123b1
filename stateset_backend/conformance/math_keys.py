"""The engine keys whose release defaults change an experiment's math or budget, written
from each engine's own code (never from an adapter), and the kit's check that every launch
sets each one that matters to it.

A launch that leaves such a key at the release's default runs whatever that release chose:
the next release may choose otherwise and the experiment changes without a word. A contract
records these defaults and every launch pins them; this list is the kit's independent word on
which keys those are, so a key nobody thought of fails instead of passing unseen. An entry is
a key, or ``(key, switch, value)`` for a key the engine reads only where ``switch`` has
``value`` (the adaptive KL controller's horizon, GAE's lambda), which matters only in the
launches that switch it on; ``value`` ``...`` means "where the launch sets ``switch``" (one
engine with two trainers, each reading its own config). A plugin lists its engine's in
``KitSupport.math_keys``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MathKey = str | tuple[str, str, Any]

_ACTOR = "actor_rollout_ref.actor"
_ROLLOUT = "actor_rollout_ref.rollout"

VERL: tuple[MathKey, ...] = (
    # advantages and KL (verl/trainer/ppo/core_algos.py, ray_trainer.compute_advantage)
    "algorithm.adv_estimator", "algorithm.norm_adv_by_std_in_grpo", "algorithm.use_kl_in_reward",
    ("algorithm.gamma", "algorithm.adv_estimator", "gae"),
    ("algorithm.lam", "algorithm.adv_estimator", "gae"),
    ("algorithm.kl_penalty", "algorithm.use_kl_in_reward", True),
    ("algorithm.kl_ctrl.type", "algorithm.use_kl_in_reward", True),
    ("algorithm.kl_ctrl.kl_coef", "algorithm.use_kl_in_reward", True),
    ("algorithm.kl_ctrl.horizon", "algorithm.kl_ctrl.type", "adaptive"),
    ("algorithm.kl_ctrl.target_kl", "algorithm.kl_ctrl.type", "adaptive"),
    # the actor's loss and its optimizer (workers/actor/dp_actor.py, workers/config/actor.py)
    f"{_ACTOR}.clip_ratio_low", f"{_ACTOR}.clip_ratio_high", f"{_ACTOR}.clip_ratio_c",
    f"{_ACTOR}.entropy_coeff", f"{_ACTOR}.loss_agg_mode", f"{_ACTOR}.ppo_epochs",
    f"{_ACTOR}.ppo_mini_batch_size", f"{_ACTOR}.shuffle", f"{_ACTOR}.use_kl_loss",
    f"{_ACTOR}.policy_loss.loss_mode", f"{_ACTOR}.grad_clip",
    (f"{_ACTOR}.kl_loss_coef", f"{_ACTOR}.use_kl_loss", True),
    (f"{_ACTOR}.kl_loss_type", f"{_ACTOR}.use_kl_loss", True),
    f"{_ACTOR}.optim.lr", f"{_ACTOR}.optim.betas", f"{_ACTOR}.optim.weight_decay",
    f"{_ACTOR}.optim.lr_warmup_steps", f"{_ACTOR}.optim.lr_warmup_steps_ratio",
    f"{_ACTOR}.optim.min_lr_ratio", f"{_ACTOR}.optim.clip_grad",
    f"{_ACTOR}.optim.lr_scheduler_type", f"{_ACTOR}.optim.warmup_style",
    # sampling (workers/rollout: SamplingParams from these)
    f"{_ROLLOUT}.n", f"{_ROLLOUT}.temperature", f"{_ROLLOUT}.top_p", f"{_ROLLOUT}.top_k",
    f"{_ROLLOUT}.do_sample", f"{_ROLLOUT}.ignore_eos",
    # the data an update sees (trainer/main_ppo.py, utils/dataset/rl_dataset.py)
    "data.train_batch_size", "data.max_prompt_length", "data.max_response_length",
    "data.shuffle", "data.seed", "data.filter_overlong_prompts",
    # the model trained (workers/config/model.py: the HF config is read from hf_config_path,
    # updated with override_config, after external_lib is imported to register architectures);
    # each one's default changes nothing, but a launch that leaves it open lets an engine
    # option change the model outside the experiment's identity
    "actor_rollout_ref.model.override_config", "actor_rollout_ref.model.hf_config_path",
    "actor_rollout_ref.model.external_lib",
    ("critic.model.override_config", "algorithm.adv_estimator", "gae"),
    ("critic.model.hf_config_path", "algorithm.adv_estimator", "gae"),
    ("critic.model.external_lib", "algorithm.adv_estimator", "gae"),
    # the rollout engines' arguments (a KV cache in fp8, a quantized load) and the rollout's
    # own quantization change what is sampled; a tokenizer or chat template of its own
    # changes the tokens and prompts the model sees (workers/rollout, workers/config/model.py)
    f"{_ROLLOUT}.engine_kwargs.vllm", f"{_ROLLOUT}.engine_kwargs.sglang",
    f"{_ROLLOUT}.engine_kwargs.trtllm", f"{_ROLLOUT}.quantization",
    f"{_ROLLOUT}.quantization_config_file", "actor_rollout_ref.model.tokenizer_path",
    "actor_rollout_ref.model.custom_chat_template",
    ("critic.model.custom_chat_template", "algorithm.adv_estimator", "gae"),
)

OPENRLHF: tuple[MathKey, ...] = (
    # the flat releases' flags (cli/train_ppo_ray.py before 0.11)
    "--advantage_estimator", "--kl_estimator", "--init_kl_coef", "--entropy_loss_coef",
    "--eps_clip_low_high", "--actor_learning_rate", "--adam_betas", "--l2", "--max_norm",
    "--lr_scheduler", "--lr_warmup_ratio", "--n_samples_per_prompt", "--rollout_batch_size",
    "--train_batch_size", "--max_epochs", "--temperature", "--top_p", "--max_new_tokens",
    "--seed", "--no_advantage_std_norm",
    ("--gamma", "--advantage_estimator", "gae"), ("--lambd", "--advantage_estimator", "gae"),
    # the dotted releases' (0.11 on)
    "--algo.advantage.estimator", "--algo.kl.estimator", "--algo.kl.init_coef",
    "--actor.entropy_coef", "--actor.eps_clip_low_high", "--actor.adam.lr",
    "--actor.adam.betas", "--actor.adam.weight_decay", "--actor.max_norm",
    "--actor.lr_scheduler", "--actor.lr_warmup_ratio", "--actor.loss_agg_mode",
    "--rollout.n_samples_per_prompt", "--rollout.batch_size", "--train.batch_size",
    "--train.max_epochs", "--rollout.temperature", "--rollout.top_p",
    "--rollout.max_new_tokens", "--train.seed", "--algo.advantage.no_std_norm",
    ("--algo.advantage.gamma", "--algo.advantage.estimator", "gae"),
    ("--algo.advantage.lambd", "--algo.advantage.estimator", "gae"),
)

# NeMo RL's loss and advantage sections are read whole by its GRPO loop and ClippedPGLoss:
# every leaf directly under them matters (nested sections switch themselves on)
NEMO_RL_SECTIONS = ("loss_fn", "grpo")

BUILTIN: dict[str, tuple[MathKey, ...]] = {"verl": VERL, "openrlhf": OPENRLHF}


def _sections(options: dict[str, Any], sections: Iterable[str]) -> tuple[MathKey, ...]:
    return tuple(k for k in options for s in sections
                 if k.startswith(s + ".") and "." not in k[len(s) + 1:])


def math_keys_of(engine: str, options: dict[str, Any],
                 declared: tuple[MathKey, ...]) -> tuple[MathKey, ...]:
    """The math keys the kit holds a release's launches to: its own for a built-in engine, a
    plugin's ``KitSupport.math_keys`` otherwise."""
    if engine == "nemo-rl":
        return _sections(options, NEMO_RL_SECTIONS)
    return BUILTIN.get(engine, declared)


def unset_math_keys(keys: tuple[MathKey, ...], launch: dict[str, Any],
                    options: dict[str, Any], unread: set[str] | frozenset[str] = frozenset(),
                    ) -> list[str]:
    """The math keys of the release (those in its surface) that matter to this launch and
    that it leaves at the release's default; ``launch`` is its declared keys, flattened, and
    ``unread`` the keys its entry point does not read (another trainer's)."""
    def value(key: str) -> Any:
        return launch[key] if key in launch else options.get(key, {}).get("default")

    out = []
    for entry in keys:
        key, switch, on = (entry, None, None) if isinstance(entry, str) else entry
        if key not in options or key in launch or key in unread or \
                key.endswith("._target_"):
            continue
        if switch is not None and (switch not in launch if on is ... else value(switch) != on):
            continue
        out.append(key)
    return out


def check_math_pinned(where: str, keys: tuple[MathKey, ...], options: dict[str, Any],
                      samples: Iterable[tuple[Any, Any]]) -> None:
    """Every claimed sample's launch sets each math key that matters to it, and its release
    declares none of them an execution default (CheckFailed naming the keys, their defaults
    and the samples otherwise)."""
    from stateset_backend.common.jsonio import flatten
    from stateset_backend.conformance.checks import CheckFailed
    from stateset_backend.translate.execution import execution_defaults

    left: dict[str, list[str]] = {}
    for sample, plan in samples:
        declared = math_execution_defaults(keys, execution_defaults(plan.resolved_dialect()),
                                           options)
        if declared:
            raise CheckFailed(f"{', '.join(declared)}: declared execution defaults of {where} "
                              "that change the math; engine_options would reach them")
        launch = {k.lstrip("+"): v for k, v in flatten(plan.native).items()}
        unread = {k.lstrip("+") for k in plan.unread_defaults}
        for key in unset_math_keys(keys, launch, options, unread):
            left.setdefault(key, []).append(sample.capability)
    if left:
        shown = "; ".join(f"{key} (at {options[key].get('default')!r}, in "
                          f"{', '.join(caps[:3])}{', ...' if len(caps) > 3 else ''})"
                          for key, caps in sorted(left.items())[:8])
        raise CheckFailed(f"{len(left)} engine keys that change the math are left at "
                          f"{where}'s default by the launches that read them: {shown}; set "
                          "each in the launch and record the release's default in the dialect")


# Math keys that matter only through a count the launch derives from them: NeMo RL validates
# max_val_samples // val_batch_size batches (algorithms/grpo.py validate), so a launch that
# sets max_val_samples from the batch size it runs reads every row whatever that size is.
RESIZED_BY: dict[str, str] = {"grpo.val_batch_size": "grpo.max_val_samples"}


def math_execution_defaults(keys: tuple[MathKey, ...], execution: Iterable[str],
                            options: dict[str, Any] | None = None) -> list[str]:
    """The declared execution defaults (keys ``engine_options`` may change) that are math
    keys, or keys inside or around one: a key whose default changes the math can never be a
    setting of memory, speed or placement, whatever reason the contract gives (but a key
    RESIZED_BY another, which the launch keeps owning, and a key inside a math key that is a
    mapping empty by default (``options``, the release's surface): the launch holds that
    mapping empty, and the declared key is the one thing it lets in, as verl's attention
    kernel in the model's otherwise held config overrides)."""
    named = [entry if isinstance(entry, str) else entry[0] for entry in keys]

    def held_empty(key: str) -> bool:
        return (options or {}).get(key, {}).get("default") == {}

    return sorted({e for e in execution for k in named if e not in RESIZED_BY and
                   (e == k or k.startswith(e + ".") or
                    (e.startswith(k + ".") and not held_empty(k)))})
