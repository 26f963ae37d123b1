"""Declared deviations' numbers against the release's own code.

A deviation that states a number (verl clamps k3 at 10, OpenRLHF divides by the group std +
1e-9, TRL by the std + 1e-4) is a claim about the engine's code that no launch carries: the
contract's number is what ``explain`` shows and what users reason with. The surface generator
measures each such number from the release itself, running the release's own function
(extracted from its source, on inputs that expose the number) or, where the engine computes it
inline, reading the constant from the line that uses it, and records it in the surface
(``"quantities"``, with how it was measured). The kit holds every number a deviation states to
that measurement; a deviation whose number nothing measures is named as ``unverified``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from stateset_backend.contracts.loader import Deviation
from stateset_backend.contracts.release_code import (
    Read,
    added_constants,
    keyword_values,
    run_function,
)

# which measured quantity of the release each built-in deviation's number is; a plugin names
# its own in ``KitSupport.quantities``
QUANTITY_OF: dict[str, dict[str, str]] = {
    "verl": {"k3_clamp": "k3_bound", "whitening_epsilon": "whiten_variance_epsilon"},
    "openrlhf": {"kl_clamped_to_10": "kl_bound", "group_std_plus_1e-9": "group_std_epsilon",
                 "batch_variance_floor_1e-8": "batch_variance_floor",
                 "min_one_response_token": "sampling_min_tokens"},
    "nemo-rl": {"reinforce_pp_variance_floor": "advantage_variance_floor"},
}


def declared_number(deviation: Deviation) -> float | None:
    """The number a deviation states: its ``quantity`` (the number an engine value in words
    names), else its engine value when that is a number; None when it states none."""
    if deviation.quantity is not None:
        return deviation.quantity
    value = deviation.engine_value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _only(values: set[float], what: str) -> float:
    if len(values) != 1:
        raise LookupError(f"{what}: expected one value in the release's source, found "
                          f"{sorted(values) or 'none'}")
    return values.pop()


def _variance_floor(source: str, path: str) -> dict[str, Any]:
    """The floor a batch variance is clamped to before its rsqrt: the one small floor among
    the source's clamps (the others bound ratios)."""
    floors = {v for v in keyword_values(source, "clamp", "min") if 0 < v < 1e-3}
    return _measured(_only(floors, "variance floor"),
                     f"{path}: the floor the batch variance is clamped to before rsqrt")


def _measured(value: float, how: str) -> dict[str, Any]:
    return {"value": float(f"{value:.6g}"), "how": how}


def _each(measures: dict[str, Callable[[], dict[str, Any] | None]]) -> dict[str, Any]:
    """Each measurement on its own: one a release's code does not allow (its function
    missing or changed, its source not Python this interpreter parses) is left out with a
    line saying why, and the kit then names the deviation it would have held ``unverified``."""
    import sys

    out = {}
    for name, measure in measures.items():
        try:
            found = measure()
        except (SyntaxError, LookupError, TypeError, ValueError, RuntimeError,
                AttributeError) as exc:
            print(f"surface_gen: {name} not measured: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            continue
        if found is not None:
            out[name] = found
    return out


# -- verl ---------------------------------------------------------------------------------------
_ALGOS = "verl/trainer/ppo/core_algos.py"
_TORCH_FUNCTIONAL = "verl/utils/torch_functional.py"


def verl_quantities(read: Read) -> dict[str, dict[str, Any]]:
    """verl's hard-coded numbers, each from the release's own functions."""
    import torch

    def k3() -> dict[str, Any] | None:
        algos = read(_ALGOS)
        if algos is None:
            return None

        def bound(scope: dict[str, Any]) -> float:
            # a log-ratio far past any clamp: what comes out is the estimate's bound
            kl = scope["kl_penalty"](torch.zeros(1), torch.full((1,), 15.0), "low_var_kl")
            return float(kl.max())

        return _measured(run_function(algos, ("kl_penalty", "kl_penalty_forward"), bound),
                         f"{_ALGOS}: kl_penalty(logprob 0, ref_logprob 15, 'low_var_kl')")

    def whitening() -> dict[str, Any] | None:
        functional = read(_TORCH_FUNCTIONAL)
        if functional is None:
            return None

        def epsilon(scope: dict[str, Any]) -> float:
            # two values 1e-4 apart: their variance (5e-9) is small enough that the constant
            # added to it shows; solve (v - mean) * rsqrt(var + eps) for eps
            values = torch.tensor([0.0, 1e-4], dtype=torch.float64)
            mask = torch.ones(2, dtype=torch.float64)
            out = scope["masked_whiten"](values, mask)
            var = scope["masked_var"](values, mask)
            mean = scope["masked_mean"](values, mask)
            return float(((values[0] - mean) / out[0]) ** 2 - var)

        return _measured(run_function(functional, ("masked_sum", "masked_mean", "masked_var",
                                                   "masked_whiten"), epsilon),
                         f"{_TORCH_FUNCTIONAL}: masked_whiten([0, 1e-4]) solved for the "
                         "constant added to the variance")

    return _each({"k3_bound": k3, "whiten_variance_epsilon": whitening})


# -- OpenRLHF -----------------------------------------------------------------------------------
_MODEL_UTILS = "openrlhf/models/utils.py"
_EXPERIENCE = "openrlhf/trainer/ppo_utils/experience_maker.py"
_SAMPLES = ("openrlhf/trainer/ppo_utils/samples_generator.py", _EXPERIENCE)


def openrlhf_quantities(read: Read) -> dict[str, dict[str, Any]]:
    """OpenRLHF's hard-coded numbers: its KL function run from the release's source, the
    normalisation constants it writes inline read from the lines that use them."""
    import inspect

    import torch

    def kl_bound() -> dict[str, Any] | None:
        utils = read(_MODEL_UTILS)
        if utils is None:
            return None

        def bound(scope: dict[str, Any]) -> float:
            fn = scope["compute_approx_kl"]
            kwargs = {"kl_estimator": "k1"} if "kl_estimator" in \
                inspect.signature(fn).parameters else {}
            return float(fn(torch.full((1,), 30.0), torch.zeros(1), **kwargs).abs().max())

        return _measured(run_function(utils, ("compute_approx_kl",), bound),
                         f"{_MODEL_UTILS}: compute_approx_kl(30, 0, 'k1')")

    def group_epsilon() -> dict[str, Any] | None:
        experience = read(_EXPERIENCE)
        return None if experience is None else _measured(
            _only(added_constants(experience, "std"), "group std epsilon"),
            f"{_EXPERIENCE}: the constant added to the group's reward std")

    def variance_floor() -> dict[str, Any] | None:
        experience = read(_EXPERIENCE)
        return None if experience is None else _variance_floor(experience, _EXPERIENCE)

    def min_tokens() -> dict[str, Any] | None:
        for path in _SAMPLES:
            source = read(path)
            tokens = keyword_values(source, "SamplingParams", "min_tokens") if source else set()
            if tokens:
                return _measured(_only(tokens, "min_tokens"),
                                 f"{path}: SamplingParams(min_tokens=...)")
        return None

    return _each({"kl_bound": kl_bound, "group_std_epsilon": group_epsilon,
                  "batch_variance_floor": variance_floor, "sampling_min_tokens": min_tokens})


# -- NeMo RL ------------------------------------------------------------------------------------
_ADVANTAGES = "nemo_rl/algorithms/advantage_estimator.py"


def nemo_rl_quantities(read: Read) -> dict[str, dict[str, Any]]:
    """NeMo RL's hard-coded numbers, read from the tag's source (NeMo RL ships no wheel)."""
    def variance_floor() -> dict[str, Any] | None:
        advantages = read(_ADVANTAGES)  # the estimators arrive in v0.6.0
        return None if advantages is None else _variance_floor(advantages, _ADVANTAGES)

    return _each({"advantage_variance_floor": variance_floor})


# -- the kit's check ----------------------------------------------------------------------------
def check_quantities(deviations: dict[str, Deviation], measured: dict[str, Any],
                     quantity_of: dict[str, str], where: str,
                     fail: Callable[[str], Exception]) -> tuple[list[str], list[str]]:
    """Each deviation's stated number against the release's measured quantity; returns the
    names checked and the names no measurement covers (for the caller to report)."""
    checked, missing = [], []
    for name, deviation in sorted(deviations.items()):
        number = declared_number(deviation)
        if number is None:
            continue
        quantity = quantity_of.get(name)
        found = measured.get(quantity) if quantity else None
        if found is None:
            missing.append(name)
            continue
        if not isinstance(found, dict) or isinstance(found.get("value"), bool) or \
                not isinstance(found.get("value"), int | float):
            raise fail(f"the surface's quantities[{quantity!r}] is {found!r}: give "
                       '{"value": number, "how": "where the release\'s code gives it"}')
        found = {"how": "", **found}
        # measurements are stored to 6 significant digits: the stated number is compared so
        if not math.isclose(float(f"{number:.6g}"), found["value"], rel_tol=1e-9):
            raise fail(f"deviation {name!r} states {number:g} ({deviation.setting}), but "
                       f"{where}'s own code gives {found['value']:g} ({found['how']}); state "
                       "the release's number")
        checked.append(name)
    return checked, missing
