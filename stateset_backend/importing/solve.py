"""The spec whose launch is the one given: translation run backwards by running it forwards.

The adapters' rules say, for every spec leaf, which engine keys it sets and to what; a second,
hand-written table from engine keys back to spec leaves would drift from them the first time a
rule changed. So the import never inverts a rule by hand. It proposes values for each leaf
(the leaf's own choices, the values the launch gives the keys that leaf's rule sets, and those
values in the other units the rules convert between: per prompt, per sample, per update) and
keeps, leaf by leaf, the value whose translation agrees with the most of what the engine will
read, until no leaf changes. What the rules cannot reproduce stays different, and the import
screen names it.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from stateset_backend.common.errors import StatesetError
from stateset_backend.common.jsonio import flatten
from stateset_backend.contracts.capabilities import required_capabilities
from stateset_backend.contracts.loader import Dialect
from stateset_backend.importing.leaf_values import (
    annotation_at,
    choices,
    converted,
    kinds_of,
    neutral,
    neutral_section,
    unwrap,
)
from stateset_backend.spec.model import OBJECTIVE_DEFAULTS, ExperimentSpec
from stateset_backend.spec.modeltree import all_leaf_paths, leaves, model_in
from stateset_backend.translate.reading import inert_under, read_alike
from stateset_backend.translate.rules import (
    CORE_HANDLED,
    FieldRow,
    RuleSet,
    _same,
    explain_rows,
)

# Leaves the launch cannot say anything about: the spec's own bookkeeping, and the pinned
# inputs' digests (filled from the files, never from a launch).
_NOT_SOLVED = (*CORE_HANDLED, "name", "model.revision", "data.train.sha256",
               "data.validation.sha256", "data.test", "reward", "environment",
               "model.from_run")
_MAX_PASSES = 5
_GIVEN_WEIGHT = 10.0
_WRITTEN_WEIGHT = 2.0
# Spec leaves whose numbers other rules convert between units (prompts, samples, GPUs).
_UNITS = ("budget.prompts_per_update", "algorithm.group_size", "budget.mini_batches",
          "budget.ppo_epochs", "budget.total_updates", "resources.gpus_per_node",
          "resources.nodes")
# Token limits some engines read as one sum (a prompt and its response).
_SUMMANDS = ("data.max_prompt_tokens", "data.max_response_tokens")
# The budget a prompt and its response share, which binds only below their sum and above the
# prompt limit: it moves with them.
_SHARED_TOTAL = "data.max_total_tokens"


def bare(key: str) -> str:
    """A native key without Hydra's add prefixes: every spelling that reaches one key."""
    return key.lstrip("+")


def native_of(rows: list[FieldRow]) -> dict[str, Any]:
    """What a translation sets, flattened and unprefixed, as the engine's reader sees keys."""
    out: dict[str, Any] = {}
    for row in rows:
        for key, value in row.native.items():
            out.update(flatten(value, bare(key)) if isinstance(value, dict) and value
                       else {bare(key): value})
    return out


@dataclass
class Solver:
    """One engine release's rules, and the configuration the engine would read."""

    rules: RuleSet
    dialect: Dialect
    engine: str
    effective: dict[str, Any]  # every key the engine reads: its default, or the launch's value
    given: frozenset[str] = frozenset()  # the keys the launch itself sets
    provided: frozenset[str] | None = None  # the release's capabilities, where known
    written: frozenset[str] = frozenset()  # keys the launch restates at the release's default

    def __post_init__(self) -> None:
        self._inert_keys: dict[str, bool] = {}
        self._unread = inert_under(self.dialect, self.effective)
        self._last: tuple[ExperimentSpec | None, str] = (None, "")
        self._rows: dict[str, list[FieldRow] | None] = {}
        self._scores: dict[str, float] = {}

    def _key(self, spec: ExperimentSpec) -> str:
        """The spec's content, as the cache's key: passes propose the same trial specs again
        and again (every leaf's candidates, each pass), each a fresh object."""
        if self._last[0] is not spec:
            self._last = (spec, spec.model_dump_json())
        return self._last[1]

    def rows(self, spec: ExperimentSpec) -> list[FieldRow] | None:
        """The spec's translation, computed once per distinct spec."""
        key = self._key(spec)
        if key not in self._rows:
            try:
                self._rows[key] = explain_rows(spec, self.rules, self.dialect, self.engine)
            except StatesetError:
                self._rows[key] = None
        return self._rows[key]

    def score(self, spec: ExperimentSpec) -> float:
        key = self._key(spec)
        if key not in self._scores:
            self._scores[key] = self._score(spec)
        return self._scores[key]

    def _score(self, spec: ExperimentSpec) -> float:
        """How much of the engine's configuration this spec's translation reproduces: a key
        set to the value the engine reads counts one, to another value minus one; a refused
        leaf makes the spec unusable, a declared deviation costs a little."""
        rows = self.rows(spec)
        if rows is None:
            return float("-inf")
        # between two specs the engine reads alike, the one more engines can run (fewer
        # capabilities), then the one it runs exactly (no declared deviation), is the
        # experiment the launch ran: a release's stand-in for a setting it cannot give (NeMo
        # RL's warmup from 1e-8 * lr for one from 0) reads as that setting, with the release's
        # declared deviation, not as a setting of its own
        needs = required_capabilities(spec)
        total = -100.0 * sum(row.state == "refused" for row in rows) - \
            0.25 * sum(row.state == "declared" for row in rows) - 0.3 * len(needs)
        if self.provided is not None:  # a spec the release cannot run is no answer
            total -= 100.0 * len(needs - self.provided)
        total += 0.01 * _as_published(spec)
        for key, value in native_of(rows).items():
            if key in self.effective and not _placeholder(value) and not self._inert(key):
                # what the launch says outweighs what it leaves to the release's defaults
                # and a default it restates outweighs one it leaves unsaid
                weight = _GIVEN_WEIGHT if key in self.given else \
                    _WRITTEN_WEIGHT if key in self.written else 1.0
                alike = _same(value, self.effective[key]) or \
                    read_alike(self.dialect, key, value, self.effective[key]) is not None
                total += weight if alike else -weight
        return total

    def _inert(self, key: str) -> bool:
        """A setting inside a section the launch switches off, or one the release declares
        inert under the launch's values, changes nothing the engine computes."""
        known = self._inert_keys.get(key)
        if known is None:
            parts = key.split(".")
            switched_off = parts[-1] not in ("enabled", "enable") and any(
                self.effective.get(f"{'.'.join(parts[:i])}.{switch}") is False
                for i in range(1, len(parts)) for switch in ("enabled", "enable"))
            known = switched_off or key.lstrip("+~") in self._unread
            self._inert_keys[key] = known
        return known

    def solve(self, doc: dict[str, Any]) -> ExperimentSpec:
        """From a valid starting spec, each leaf in turn takes the candidate that scores best
        (the current value wins ties), until a whole pass changes nothing."""
        spec = ExperimentSpec.model_validate(doc)
        best = self.score(spec)
        for _ in range(_MAX_PASSES):
            spec, best, changed = self._pass(spec, best, "", deep=True)
            if not changed:
                break
        return spec

    def _pass(self, spec: ExperimentSpec, best: float, prefix: str,
              deep: bool) -> tuple[ExperimentSpec, float, bool]:
        """One greedy pass over the leaves under ``prefix``. A move that changes what other
        leaves mean (switching a section on, another objective) is judged after a pass over
        the leaves it governs, since alone it rarely scores better."""
        changed = False
        for path, value in [*leaves(spec), *_switched_on(spec)]:
            if _skip(path) or not path.startswith(prefix):
                continue
            for candidate, trial in self._trials(spec, path, value):
                got = self.score(trial)
                governed = _governed(path, value, candidate) if deep else ()
                if governed and (path in _ENABLES or self._explains(trial, path)):
                    for scope in governed:
                        trial, got, _ = self._pass(trial, got, scope, deep=False)
                if got > best:
                    spec, best, changed = trial, got, True
                    value = candidate
        return spec, best, changed

    def _explains(self, spec: ExperimentSpec, path: str) -> bool:
        """Whether the leaf's own translation sets some key to what the engine reads: only
        then is re-solving the leaves it governs worth its cost."""
        rows = self.rows(spec) or []
        row = next((r for r in rows if r.path == path), None)
        if row is None:  # a section switched on: its own leaves are the rows
            return any(r.path.startswith(path + ".") for r in rows)
        if not row.native:
            return True  # a section switched on may set nothing itself
        flat = flatten({bare(k): v for k, v in row.native.items()})
        return any(k in self.effective and _same(v, self.effective[k])
                   for k, v in flat.items())

    def _sharing(self, spec: ExperimentSpec, path: str) -> list[str]:
        """The other leaves an engine reads from the same key as this one (verl's one
        ``data.prompt_key`` for every split; OpenRLHF's, which the validation split's rule
        sets nothing for but must agree with): they can only move together."""
        rows = self.rows(spec) or []
        mine = next((set(r.native) for r in rows if r.path == path), set())
        shared = [r.path for r in rows if r.path != path and mine & set(r.native)]
        if path.startswith("data.train.") and path.endswith("_field"):
            twin = "data.validation." + path.removeprefix("data.train.")
            if twin not in shared and any(r.path == twin for r in rows):
                shared.append(twin)
        return shared

    def _trials(self, spec: ExperimentSpec, path: str,
                value: Any) -> Iterator[tuple[Any, ExperimentSpec]]:
        sharing = self._sharing(spec, path)
        yield from self._pairs(spec, path, sharing)
        for candidate in self.candidates(spec, path, value):
            if sharing:
                together = _with(spec, path, candidate, *((p, candidate) for p in sharing))
                if together is not None:
                    yield candidate, together
            trial = _with(spec, path, candidate)
            if trial is None and path == "algorithm.objective":
                # another objective starts from its own published recipe (a critic for ppo)
                trial = _with(spec, "algorithm", {"objective": candidate,
                                                  "group_size": spec.algorithm.group_size})
            if trial is not None:
                yield candidate, trial
                continue
            for partner in _partners(spec, path, candidate):
                yield candidate, partner


    def _pairs(self, spec: ExperimentSpec, path: str,
               sharing: list[str]) -> Iterator[tuple[Any, ExperimentSpec]]:
        """Two leaves an engine reads as one pair (OpenRLHF's importance-sampling threshold,
        ``low high``): the launch's pair, each way round, moves both at once, since neither
        alone makes the engine read it."""
        numeric = [p for p in sharing if isinstance(v := _leaf(spec, p), int | float) and
                    not isinstance(v, bool)]
        if len(numeric) != 1:
            return
        for raw in self._touched(spec, path):
            if isinstance(raw, list) and len(raw) == 2 and all(
                    isinstance(v, int | float) and not isinstance(v, bool) for v in raw):
                for mine, theirs in (raw, raw[::-1]):
                    trial = _with(spec, path, mine, (numeric[0], theirs))
                    if trial is not None:
                        yield mine, trial

    def candidates(self, spec: ExperimentSpec, path: str, value: Any) -> Iterator[Any]:
        annotation = annotation_at(path)
        seen: list[Any] = [value]

        def fresh(item: Any) -> bool:
            if any(_same(item, s) and type(item) is type(s) for s in seen):
                return False
            seen.append(item)
            return True

        for item in choices(annotation):
            if fresh(item):
                yield item
        section = model_in(annotation)
        if section is not None:
            if value is None:
                filled = neutral_section(section)
                if filled is not None and fresh(filled):
                    yield filled
            return
        touched = self._touched(spec, path)
        kinds = kinds_of(annotation)
        numbers = [v for leaf in _UNITS if isinstance(v := _leaf(spec, leaf), int | float)
                   and not isinstance(v, bool) and v]
        summands = [v for leaf in _SUMMANDS if leaf != path and
                    isinstance(v := _leaf(spec, leaf), int)]
        for raw in touched:
            for item in converted(raw, kinds, numbers, summands):
                if fresh(item):
                    yield item
            # a limit an engine counts with one token more (NeMo RL's max_input_seq_length is
            # the prompt limit plus one) or one fewer
            if path in (*_SUMMANDS, _SHARED_TOTAL) and type(raw) is int:
                for item in (raw - 1, raw + 1):
                    if fresh(item):
                        yield item

    def _touched(self, spec: ExperimentSpec, path: str) -> list[Any]:
        """The values the engine reads at the keys this leaf's rule sets."""
        starts = neutral(annotation_at(path))
        if path == _SHARED_TOTAL:  # the one value that surely binds
            starts = [spec.data.max_prompt_tokens + 1]
        for probe in [spec, *filter(None, (_with(spec, path, v) for v in starts))]:
            rows = self.rows(probe)
            row = next((r for r in rows or [] if r.path == path), None)
            if row is not None and row.native:  # a refused value sets nothing: probe others
                keys = flatten({bare(k): v for k, v in row.native.items()})
                return [self.effective[k] for k in keys if k in self.effective]
        return []


def _as_published(spec: ExperimentSpec) -> int:
    """How many algorithm settings keep the objective's published recipe: between objectives
    an engine runs alike (verl's grpo and a dr_grpo with grpo's settings), the launch ran the
    one whose recipe it follows."""
    recipe = OBJECTIVE_DEFAULTS.get(spec.algorithm.objective, {})
    doc = spec.algorithm.model_dump(mode="json")
    return sum(1 for key, value in recipe.items() if key in doc and (
        doc[key] == value or (isinstance(value, dict) and isinstance(doc[key], dict) and
                              all(doc[key].get(k) == v for k, v in value.items()))))


def _governed(path: str, old: Any, new: Any) -> tuple[str, ...]:
    """The leaves a move changes the meaning of: a section switched on, the whole algorithm
    for another objective, the other half of a sum an engine reads as one limit."""
    if path == "algorithm.objective":
        return ("algorithm.",)
    if old is None and isinstance(new, dict):  # its own leaves, and its siblings' meaning
        return (path.rsplit(".", 1)[0] + "." if "." in path else path + ".",)
    if path in (*_SUMMANDS, _SHARED_TOTAL):
        return tuple(p for p in (*_SUMMANDS, _SHARED_TOTAL) if p != path)
    if path in _UNITS:  # the others are counted in this one's units
        return tuple(p for p in _UNITS if p != path)
    if path in _ENABLES and not old and new:
        return _ENABLES[path]
    return ()


# Leaves that mean something only once another is on, judged with it: a warmup's start (NeMo
# RL's LinearLR start_factor) in the one scheduler list the engine reads for both
_ENABLES = {"optim.warmup_steps": ("optim.warmup_start_ratio",)}


@functools.cache
def _optional_sections() -> tuple[str, ...]:
    return tuple(p for p in all_leaf_paths(ExperimentSpec) if not p.startswith("data.") and
                 model_in(annotation_at(p)) is not None and
                 type(None) in unwrap(annotation_at(p)))


def _switched_on(spec: ExperimentSpec) -> list[tuple[str, Any]]:
    """The optional sections the spec holds, each a move of its own (switching it off): a
    section is no leaf once set, and a launch that reads nothing of it (verl's PPO recipes
    without KL) is the spec without it. The data's splits are the import's inputs."""
    out: list[tuple[str, Any]] = []
    for path in _optional_sections():
        value = _leaf(spec, path)
        if isinstance(value, BaseModel):
            out.append((path, value.model_dump(mode="json")))
    return out


def _placeholder(value: Any) -> bool:
    """A value only the launch fills in (the run's folder): never the launch's own."""
    return isinstance(value, str) and "{run_dir}" in value


def _skip(path: str) -> bool:
    return any(path == p or path.startswith(p + ".") for p in _NOT_SOLVED)


def _leaf(spec: ExperimentSpec, path: str) -> Any:
    node: Any = spec
    for part in path.split("."):
        node = getattr(node, part, None)
    return node


def _with(spec: ExperimentSpec, path: str, value: Any,
          *more: tuple[str, Any]) -> ExperimentSpec | None:
    """The spec with leaves replaced, or None when the result is not a valid spec."""
    doc = spec.model_dump(mode="json")
    for where, what in ((path, value), *more):
        node: Any = doc
        *parents, last = where.split(".")
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):  # an earlier move switched the section off
            return None
        node[last] = copy.deepcopy(what)
    try:
        return ExperimentSpec.model_validate(doc)
    except ValidationError:
        return None


def _partners(spec: ExperimentSpec, path: str, value: Any) -> Iterator[ExperimentSpec]:
    """A move the spec's own consistency rules refuse alone (dynamic sampling without
    excluding zero-variance groups), made valid by a choice of one other leaf of its section."""
    section = path.split(".", 1)[0] + "."
    for other, current in list(leaves(spec)):
        if other == path or not other.startswith(section) or _skip(other):
            continue
        for choice in choices(annotation_at(other)):
            if choice is None or _same(choice, current):
                continue
            trial = _with(spec, path, value, (other, choice))
            if trial is not None:
                yield trial
