"""Samples that reach every declared deviation.

A deviation the contract declares but no sample runs is a claim nobody checked: removing the
rule that returns it, or declaring it on the wrong setting, would pass unseen. The kit looks
for a spec that runs each one by moving the sample specs it already has, the setting alone
first (every value its schema allows: the other enum members, the other boolean, null, nearby
numbers), then the setting together with one other leaf, because many deviations apply only in
a context (a warmup under a cosine schedule, an estimator's own clamp). The search is bounded;
what it cannot reach is reported with what it tried.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from stateset_backend.plan.launch_plan import LaunchPlan
from stateset_backend.spec.model import ExperimentSpec

# leaves whose values are paths, code, identities or sizes of the machine: moving them cannot
# put a launch into a different behaviour of the engine, only make it unplannable
_FIXED_ROOTS = ("name", "data.train", "data.validation", "data.test", "model.path",
                "model.revision", "reward", "engine_options", "resources", "seed",
                "environment.entrypoint", "from_run")
SEARCH_PLANS = 1500  # plans per unreached deviation and depth (a few ms each)


@lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    return ExperimentSpec.model_json_schema()


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref:
        return _resolve(_schema()["$defs"][ref.rsplit("/", 1)[-1]])
    return node


def _node(path: str) -> dict[str, Any] | None:
    """The schema of one spec leaf, with its ``anyOf`` branches merged (enum, type, null)."""
    node: dict[str, Any] | None = _schema()
    for part in path.split("."):
        if node is None:
            return None
        node = _object_branch(node)
        node = (node or {}).get("properties", {}).get(part)
    return node


def _object_branch(node: dict[str, Any]) -> dict[str, Any] | None:
    node = _resolve(node)
    if "properties" in node:
        return node
    for branch in node.get("anyOf", ()):
        found = _resolve(branch)
        if "properties" in found:
            return found
    return None


def _branches(node: dict[str, Any]) -> list[dict[str, Any]]:
    node = _resolve(node)
    return [_resolve(b) for b in node["anyOf"]] if "anyOf" in node else [node]


def values_for(path: str, current: Any) -> list[Any]:
    """Other values the spec's schema allows for ``path``, simplest moves first."""
    node = _node(path)
    if node is None:
        return []
    out: list[Any] = []
    for branch in _branches(node):
        kind = branch.get("type")
        if "enum" in branch:
            out += list(branch["enum"])
        elif "const" in branch:
            out.append(branch["const"])
        elif kind == "boolean":
            out += [True, False]
        elif kind == "null":
            out.append(None)
        elif kind == "integer":
            start = current if isinstance(current, int) and not isinstance(current, bool) \
                else 0
            out += [start + 1, start + 2, start * 2, max(start - 1, 0)]
        elif kind == "number":
            number = float(current) if isinstance(current, (int, float)) and \
                not isinstance(current, bool) and current else 0.0
            out += [number * 0.5, number * 2, number + 0.1] if number else [0.1, 0.5, 5.0]
    return [v for v in dict.fromkeys(out) if v != current or type(v) is not type(current)]


def leaves(doc: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every movable leaf of a full spec (the validated dump), with its value."""
    for key, value in doc.items():
        path = f"{prefix}{key}"
        if any(path == r or path.startswith(r + ".") for r in _FIXED_ROOTS):
            continue
        if isinstance(value, dict):
            yield from leaves(value, path + ".")
        elif not isinstance(value, list):
            yield path, value


def with_leaf(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``doc`` with the dotted ``path`` set (a null or missing parent becomes a
    mapping)."""
    out = copy.deepcopy(doc)
    node = out
    *parents, last = path.split(".")
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value
    return out


def leaf(doc: dict[str, Any], path: str) -> Any:
    """The value at a dotted path of a spec document, None where it is absent."""
    node: Any = doc
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _has_parent(doc: dict[str, Any], path: str) -> bool:
    parent = path.rpartition(".")[0]
    return not parent or isinstance(leaf(doc, parent), dict)


@dataclass
class Reach:
    """Which declared deviations ran, in which plan, and what was tried for the others."""

    plans: dict[str, LaunchPlan] = field(default_factory=dict)
    tried: dict[str, list[Any]] = field(default_factory=dict)

    def missing(self, declared: Iterable[str]) -> list[str]:
        return sorted(set(declared) - set(self.plans))


def _ran(plan: LaunchPlan | None) -> set[str]:
    return {d["deviation"] for d in plan.deviations} if plan is not None else set()


def _nearness(path: str, setting: str) -> int:
    if path.rpartition(".")[0] == setting.rpartition(".")[0]:
        return 0
    return 1 if path.startswith("budget.") or path == "algorithm.objective" else 2


def _near(path: str, setting: str) -> bool:
    return _nearness(path, setting) < 2


def _moves(doc: dict[str, Any], setting: str) -> list[tuple[str, Any]]:
    """Single-leaf moves of ``doc`` other than ``setting``: its siblings first, then the budget
    and the objective (which decide most contexts), then the rest; every enum member and
    boolean, three nearby numbers."""
    out = []
    for path, current in sorted(leaves(doc), key=lambda item: _nearness(item[0], setting)):
        if path == setting:
            continue
        values = values_for(path, current)
        numeric = isinstance(current, (int, float)) and not isinstance(current, bool)
        out += [(path, v) for v in (values[:3] if numeric else values)]
    return out


class _Search:
    """The search for one deviation: plans are memoised across deviations (``planned``)."""

    def __init__(self, name: str, setting: str, reach: Reach,
                 plan: Callable[[dict[str, Any]], LaunchPlan | None],
                 planned: dict[str, LaunchPlan | None]) -> None:
        self.name, self.setting, self.reach = name, setting, reach
        self.plan, self.planned = plan, planned
        self.budget = SEARCH_PLANS
        self.tried: list[Any] = []

    def plan_once(self, doc: dict[str, Any]) -> LaunchPlan | None:
        key = json.dumps(doc, sort_keys=True)
        if key not in self.planned:
            self.budget -= 1
            self.planned[key] = self.plan(doc)
        return self.planned[key]

    def runs(self, doc: dict[str, Any]) -> bool:
        got = self.plan_once(doc)
        for ran in _ran(got):
            self.reach.plans.setdefault(ran, got)  # type: ignore[arg-type]
        return self.name in self.reach.plans

    def own(self, doc: dict[str, Any]) -> list[Any]:
        current = leaf(doc, self.setting)
        return [current, *values_for(self.setting, current)]

    def search(self, doc: dict[str, Any], depth: int, only_near: bool) -> bool:
        """The setting at each value on ``doc``, then (``depth``) after one more move."""
        for value in self.own(doc):
            self.tried.append(value)
            if self.runs(with_leaf(doc, self.setting, value)):
                return True
        if depth == 0:
            return False
        for path, moved in _moves(doc, self.setting):
            if self.budget <= 0 or (only_near and not _near(path, self.setting)):
                return False
            next_doc = with_leaf(doc, path, moved)
            if depth == 1:
                if any(self.runs(with_leaf(next_doc, self.setting, value))
                       for value in self.own(doc)[:3]):
                    return True
            elif self.plan_once(next_doc) is not None and self.search(next_doc, 1, True):
                return True
        return False


def reach_deviations(declared: dict[str, str], plans: list[LaunchPlan],
                     docs: list[dict[str, Any]],
                     plan: Callable[[dict[str, Any]], LaunchPlan | None]) -> Reach:
    """Find a plan running each deviation in ``declared`` (name -> spec setting): first among
    ``plans``; then by moving ``docs`` (full spec dumps, the base first): the setting alone,
    then with one more leaf near it moved (its siblings, the budget, the objective), then two
    (the second only on plannable specs), then one anywhere. At most ``SEARCH_PLANS`` plans
    per step."""
    reach = Reach()
    planned: dict[str, LaunchPlan | None] = {}
    for known in plans:
        for ran in _ran(known):
            reach.plans.setdefault(ran, known)
    for name, setting in declared.items():
        if name in reach.plans:
            continue
        holders = [d for d in docs if _has_parent(d, setting)] or docs[:1]
        search = _Search(name, setting, reach, plan, planned)
        for depth, only_near in ((0, True), (1, True), (2, True), (1, False)):
            search.budget = SEARCH_PLANS
            if any(search.budget > 0 and search.search(doc, depth, only_near)
                   for doc in holders[:2 if depth else None]):
                break
        reach.tried[name] = list(dict.fromkeys(map(repr, search.tried)))[:12]
    return reach
