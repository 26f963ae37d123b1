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

import ast
from collections.abc import Callable, Iterable
from typing import Any

from stateset_backend.contracts.surfaces import outside_domain

Read = Callable[[str], "str | None"]


def _subject(node: ast.expr) -> str:
    return ast.unparse(node)


def _matches(node: ast.expr, names: Iterable[str]) -> bool:
    """``loss_type`` matches ``loss_type``, ``self.loss_type`` and ``args.loss_type``;
    ``kl_ctrl.type`` matches ``self.kl_ctrl.type``."""
    text = _subject(node)
    return any(text == name or text.endswith("." + name) for name in names)


def _strings(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return {e.value for e in node.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def compared(source: str, *names: str) -> set[str]:
    """The string literals the code compares a setting with (``==``, ``!=``, ``in``, ``not
    in``, either side), and, where it strips a suffix it tests with ``endswith`` (verl's
    ``low_var_kl+``, the straight-through form), each literal with that suffix too."""
    found: set[str] = set()
    suffixes: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for i, side in enumerate(sides):
                if _matches(side, names):
                    for other in sides[:i] + sides[i + 1:]:
                        found |= _strings(other)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "endswith" and _matches(node.func.value, names):
            for arg in node.args:
                suffixes |= _strings(arg)
    return found | {value + suffix for value in found for suffix in suffixes
                    if not value.endswith(suffix)}


def enum_members(source: str, cls: str) -> dict[str, str]:
    """The members of a ``class NAME(str, Enum)``: member name → value."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {target.id: stmt.value.value for stmt in node.body
                    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)
                    for target in stmt.targets if isinstance(target, ast.Name)}
    return {}


def registered(source: str, decorator: str, members: dict[str, str] | None = None) -> set[str]:
    """The names a registry decorator (``@register_policy_loss("gspo")``) registers; an enum
    member argument (``@register_adv_est(AdvantageEstimator.GRPO)``) is its value."""
    members = members or {}
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _subject(node.func).split(".")[-1] == decorator:
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.add(arg.value)
                elif isinstance(arg, ast.Attribute) and arg.attr in members:
                    found.add(members[arg.attr])
    return found


# -- verl ------------------------------------------------------------------------------------
_ALGOS = "verl/trainer/ppo/core_algos.py"
_RAY_TRAINER = "verl/trainer/ppo/ray_trainer.py"
# where the releases before the loss registry covered every mode dispatch on ``vanilla``
_DP_ACTOR = "verl/workers/actor/dp_actor.py"
# where an FSDP run dispatches on its learning-rate schedule: the worker before the engine
# refactor, the FSDP engine after it
_SCHEDULERS = ("verl/workers/fsdp_workers.py", "verl/workers/engine/fsdp/transformer_impl.py")
_ACTOR = "actor_rollout_ref.actor"


def verl_domains(read: Read, keys: Iterable[str]) -> dict[str, list[str]]:
    """The domains of verl's math-changing string settings in one release, for those of
    ``keys`` (the release's config) it has; ``read`` gives a file of the release by its path
    in the wheel (None where the release has no such file)."""
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
    present = set(keys)
    return {key: sorted(values) for key, values in found.items() if key in present and values}


def violation(key: str, value: object, option: dict[str, Any], where: str) -> str | None:
    """Why a launch's value is outside the release's domain for ``key``; None where it is
    inside, or the release has no domain for the key."""
    allowed = outside_domain(option, value)
    if allowed is None:
        return None
    return (f"{key} = {value!r}: {where} implements only {', '.join(map(repr, allowed))} "
            "(read from its own code), so the engine refuses the value or falls through to "
            "another branch; claim the capability only for releases that have it")
