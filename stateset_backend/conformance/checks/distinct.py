"""Settings of different math launch differently: estimators, aggregations and objectives
(every other setting held) must never reach the engine alike, whatever each adapter's own
translation says, because a launch that runs one in place of the other is an experiment
recorded under the wrong name (an adapter that claims rloo and launches grpo fails here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stateset_backend.common.errors import InvalidInput
from stateset_backend.common.jsonio import flatten
from stateset_backend.conformance.checks.engine_reads import normalize_values
from stateset_backend.conformance.checks.planning import CheckFailed, plan_doc, plan_or_none
from stateset_backend.conformance.reach import with_leaf
from stateset_backend.conformance.samples import SampleFiles
from stateset_backend.engines.adapter import EngineAdapter
from stateset_backend.plan.launch_plan import LaunchPlan
from stateset_backend.spec.files import parse_spec

# Objectives whose math differs whatever the other settings are: two of different classes
# must never launch alike (an adapter that claims rloo and launches grpo fails here).
OBJECTIVE_CLASSES = {"grpo": "group", "dr_grpo": "group", "dapo": "group", "gspo": "gspo",
                     "cispo": "cispo", "rloo": "rloo", "reinforce_pp": "reinforce_pp",
                     "ppo": "ppo"}
DISTINCT_LEAVES = {"algorithm.kl.estimator": ("k1", "k2", "k3"),
                   "algorithm.loss_aggregation": ("token_mean", "seq_mean_token_mean",
                                                  "seq_mean_token_sum",
                                                  "seq_mean_token_sum_norm")}


def check_distinct_launches(adapter: EngineAdapter, version: str, base: dict[str, Any],
                            files: SampleFiles,
                            read: Callable[[LaunchPlan], dict[str, Any]]) -> int:
    """Different estimators, aggregations and objectives (with every other setting held)
    launch differently, as the engine reads them. Returns how many pairs were compared."""
    origin = plan_doc(adapter, version, base, files)
    full = origin.validated_spec().model_dump(mode="json")
    compared = 0
    reads: dict[str, dict[str, Any] | None] = {}  # each pair's sides recur in other pairs

    def launches(doc: dict[str, Any]) -> dict[str, Any] | None:
        key = repr(doc)
        if key not in reads:
            plan = plan_or_none(adapter, version, doc, files)
            reads[key] = None if plan is None else {
                k: v for k, v in flatten(normalize_values(read(plan), plan)).items()
                if "<run-id>" not in str(v)}
        return reads[key]

    for path, values in DISTINCT_LEAVES.items():
        if path.startswith("algorithm.kl.") and full["algorithm"].get("kl") is None:
            held = with_leaf(full, "algorithm.kl", {"coef": 0.01, "estimator": "k1",
                                               "placement": "loss"})
        else:
            held = full
        seen: dict[str, Any] = {}
        for value in values:
            got = launches(with_leaf(held, path, value))
            if got is None:
                continue
            for other, launched in seen.items():
                compared += 1
                if launched == got:
                    raise CheckFailed(f"{path}: {other!r} and {value!r} launch alike as the "
                                      "engine reads them; one of them is not what it claims")
            seen[value] = got
    for first in OBJECTIVE_CLASSES:
        for second in OBJECTIVE_CLASSES:
            if first >= second or OBJECTIVE_CLASSES[first] == OBJECTIVE_CLASSES[second]:
                continue
            for recipe in (first, second):  # every other setting held at one recipe's
                try:
                    filled = parse_spec(with_leaf(base, "algorithm.objective", recipe)) \
                        .model_dump(mode="json")
                except InvalidInput:
                    continue
                a = launches(with_leaf(filled, "algorithm.objective", first))
                b = launches(with_leaf(filled, "algorithm.objective", second))
                if a is None or b is None:
                    continue
                compared += 1
                if a == b:
                    raise CheckFailed(f"algorithm.objective: {first!r} and {second!r} launch "
                                      "alike as the engine reads them (other settings held "
                                      f"at {recipe}'s); one of them is not what it claims")
                break
    return compared
