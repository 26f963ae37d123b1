"""Per-release value domains: the values of a string-valued setting a release's code
implements, read from that code (its registries, its enum classes, the literals it dispatches
on), never from an adapter.

verl's Hydra config takes any string for ``adv_estimator``, ``loss_mode`` or
``loss_agg_mode`` and fails (or, worse, falls through to another branch) only at the first
update on the GPU; a surface that knows only a key's default cannot tell that ``gspo`` or
``token-sum`` arrived in a later release than a contract claims. The generator records each
domain beside the key's default (``"values"``), and the kit holds every launch's value to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stateset_backend.contracts.release_code import Read, compared, enum_members, registered
from stateset_backend.contracts.surfaces import outside_domain

# -- verl ------------------------------------------------------------------------------------
_ALGOS = "verl/trainer/ppo/core_algos.py"
_RAY_TRAINER = "verl/trainer/ppo/ray_trainer.py"
# where the releases before the loss registry covered every mode dispatch on ``vanilla``
_DP_ACTOR = "verl/workers/actor/dp_actor.py"
# where an FSDP run dispatches on its learning-rate schedule: the worker before the engine
# refactor, the FSDP engine after it
_SCHEDULERS = ("verl/workers/fsdp_workers.py", "verl/workers/engine/fsdp/transformer_impl.py")
_ACTOR = "actor_rollout_ref.actor"


def verl_domains(read: Read, options: Mapping[str, Any]) -> dict[str, list[str]]:
    """The domains of verl's math-changing string settings in one release, for those of its
    config (``options``) it has; ``read`` gives a file of the release by its path in the wheel
    (None where the release has no such file)."""
    algos = read(_ALGOS) or ""
    members = enum_members(algos, "AdvantageEstimator") or \
        enum_members(read(_RAY_TRAINER) or "", "AdvantageEstimator")
    schedule_code = [code for code in map(read, _SCHEDULERS) if code]
    schedules = set().union(*(compared(code, "warmup_style", "lr_scheduler_type")
                              for code in schedule_code)) if schedule_code else set()
    aggregations = compared(algos, "loss_agg_mode")
    kl_types = compared(algos, "kl_penalty")
    found = {
        "algorithm.adv_estimator": set(members.values()) |
        registered(algos, "register_adv_est", members),
        f"{_ACTOR}.policy_loss.loss_mode": registered(algos, "register_policy_loss") |
        compared(read(_DP_ACTOR) or "", "loss_mode"),
        f"{_ACTOR}.loss_agg_mode": aggregations,
        "critic.loss_agg_mode": aggregations,
        "algorithm.kl_penalty": kl_types,
        f"{_ACTOR}.kl_loss_type": kl_types,
        "algorithm.kl_ctrl.type": compared(algos, "kl_ctrl.type"),
        f"{_ACTOR}.optim.warmup_style": schedules,
        f"{_ACTOR}.optim.lr_scheduler_type": schedules,
        "critic.optim.warmup_style": schedules,
        "critic.optim.lr_scheduler_type": schedules,
    }
    return _whole(found, options)


def _whole(found: dict[str, set[str]], options: Mapping[str, Any]) -> dict[str, list[str]]:
    """The domains of the keys the release has; a domain without the release's own default
    was read incompletely (a dispatch site not read) and is left out, never used to refuse a
    value the release takes."""
    out = {}
    for key, values in found.items():
        default = options.get(key, {}).get("default") if key in options else None
        # a default that interpolates another key (verl's critic follows the actor) is
        # that key's, held there
        own = isinstance(default, str) and "${" not in default
        if key in options and values and (not own or default in values):
            out[key] = sorted(values)
    return out


# -- NeMo RL ---------------------------------------------------------------------------------
_NEMO_GRPO = "nemo_rl/algorithms/grpo.py"
_NEMO_UTILS = "nemo_rl/algorithms/utils.py"


def nemo_rl_domains(read: Read, options: Mapping[str, Any]) -> dict[str, list[str]]:
    """The domains of NeMo RL's math-changing string settings in one tag: the advantage
    estimators its GRPO loop dispatches on, the KL types its ``calculate_kl`` computes."""
    found = {
        "grpo.adv_estimator.name": compared(read(_NEMO_GRPO) or "", "adv_estimator_name"),
        "loss_fn.reference_policy_kl_type": compared(read(_NEMO_UTILS) or "", "kl_type"),
    }
    return _whole(found, options)


def violation(key: str, value: object, option: dict[str, Any], where: str) -> str | None:
    """Why a launch's value is outside the release's domain for ``key``; None where it is
    inside, or the release has no domain for the key."""
    allowed = outside_domain(option, value)
    if allowed is None:
        return None
    return (f"{key} = {value!r}: {where} implements only {', '.join(map(repr, allowed))} "
            "(read from its own code), so the engine refuses the value or falls through to "
            "another branch; claim the capability only for releases that have it")
