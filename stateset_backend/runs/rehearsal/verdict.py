"""What a rehearsal proves, one line per check, each with its numbers.

The result checks a run gets (the engine exited 0, its outputs carry the run's identity, every
metric is finite, every planned update was committed, every artifact is there and hashed) are
read from collect-and-validate's result, so a rehearsal passes only where a run of the same
plan would be ``succeeded``. Beside them, what must hold at the first update whatever the
model learns: the KL to the reference is exactly 0 while the policy still is the reference, and
the rollout's probabilities are the learner's own. A check the engine gives no numbers for is
"not measured", with the reason, never passed.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from stateset_backend.engines.adapter import Rehearsal
from stateset_backend.providers.local import STDERR_LOG, Exit
from stateset_backend.runs.results import Result, best_update
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.spec.schedule import lr_at

State = Literal["ok", "FAILED", "not measured"]
TAIL_LINES = 20  # of the engine's stderr, when it failed: its own last words
UNREAD = "not checked: the engine's outputs could not be read"


def _unread(result: Result) -> str:
    """UNREAD, with why where the collector said (its error is the finding)."""
    failed = next((c for c in result.checks if c.name == "collect" and not c.ok), None)
    return UNREAD if failed is None else f"{UNREAD} ({failed.detail})"


@dataclass(frozen=True)
class Line:
    check: str
    state: State
    detail: str
    tail: list[str] = field(default_factory=list)
    numbers: dict[str, Any] = field(default_factory=dict)  # what the detail says, as data

    def to_json(self) -> dict[str, Any]:
        doc = {"check": self.check, "state": self.state, "detail": self.detail,
               "tail": self.tail}
        return {**doc, "numbers": self.numbers} if self.numbers else doc


KINDS = {"final": "the final model", "model": "the final model"}  # kinds by what they hold


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _updates(steps: list[int]) -> str:
    return ("update " if len(steps) == 1 else "updates ") + ", ".join(map(str, steps))


def stderr_tail(run_dir: Path) -> list[str]:
    try:
        text = (run_dir / STDERR_LOG).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    lines = [line.rstrip()[:300] for line in text.splitlines() if line.strip()]
    return lines[-TAIL_LINES:]


def launch(exit_: Exit, seconds: float, run_dir: Path) -> Line:
    if exit_.code == 0 and not exit_.interrupted and not exit_.timed_out:
        return Line("launch", "ok", f"the engine started and exited 0 after {seconds:.1f} s")
    how = "was interrupted" if exit_.interrupted else "timed out" if exit_.timed_out else \
        f"exited {exit_.code}"
    return Line("launch", "FAILED", f"the engine {how} after {seconds:.1f} s; the last lines of "
                                    "its stderr:", stderr_tail(run_dir))


def _from_check(result: Result, name: str, check: str) -> Line:
    found = next((c for c in result.checks if c.name == name), None)
    if found is None:
        return Line(check, "FAILED", _unread(result))
    return Line(check, "ok" if found.ok else "FAILED", found.detail)


def rows_of(result: Result, run_dir: Path) -> list[dict[str, Any]]:
    if result.metrics.series is None or not (run_dir / result.metrics.series).is_file():
        return []
    text = (run_dir / result.metrics.series).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def first_update_kl(spec: ExperimentSpec, result: Result, run_dir: Path,
                    per_step: int = 1) -> Line:
    """Policy and reference are the same weights until the first optimizer step that moves
    them, so every estimator of their KL is exactly 0 there: anything else is a reference
    built differently (another precision, another model) or log-probs computed differently for
    the two. An update of several optimizer steps keeps the weights only where it runs at lr 0
    (the first update of a warm-up, unless the engine advances the schedule per step:
    ``per_step`` > 1)."""
    name = "KL at update 1"
    if spec.algorithm.kl is None:
        return Line(name, "not measured", "the spec has no KL term")
    steps = spec.budget.ppo_epochs * spec.budget.mini_batches
    still = lr_at(spec.optim, 1, spec.budget.total_updates) == 0.0 and per_step == 1
    if steps > 1 and not still:
        return Line(name, "not measured", f"update 1 averages the KL over {steps} optimizer "
                                          "steps (ppo_epochs x mini_batches) and moves the "
                                          "policy after the first")
    raw = result.metrics.raw_names.get("kl", "kl")
    value = next((row["kl"] for row in rows_of(result, run_dir)
                  if row.get("step") == 1 and isinstance(row.get("kl"), int | float)), None)
    if value is None:
        return Line(name, "not measured", f"the engine reported no KL ({raw}) at update 1")
    if value == 0.0:
        return Line(name, "ok", f"exactly 0 ({raw}): the reference is the policy's own weights")
    return Line(name, "FAILED", f"{value:.3g} ({raw}); it must be exactly 0 while the policy "
                                "equals its reference (a reference in another precision, or "
                                "another model, shows here first)")


def rollout_gap(rehearsal: Rehearsal, run_dir: Path) -> Line:
    """Sampling and learning must see one model: the probability the rollout gave each token
    and the learner's recompute of it agree (exactly, up to float rounding) while the weights
    are synced."""
    name = "rollout vs learner"
    if rehearsal.rollout_gap is None:
        return Line(name, "not measured", rehearsal.gap_unmeasured)
    gaps = rehearsal.rollout_gap(run_dir)
    if not gaps:
        return Line(name, "not measured", f"the engine logged no {rehearsal.gap_metric}")
    tolerance = rehearsal.gap_tolerance
    each = ", ".join(f"{gap:.2g} at update {step}" for step, gap in sorted(gaps.items()))
    over = sorted(step for step, gap in gaps.items() if not gap <= tolerance)
    where = f"({rehearsal.gap_metric}; tolerance {tolerance:g})"
    if over:
        return Line(name, "FAILED", f"largest token-probability gap {each}: over the tolerance "
                                    f"at {_updates(over)} {where}")
    return Line(name, "ok", f"largest token-probability gap {each} {where}")


def checkpoints(spec: ExperimentSpec, result: Result, updates: int,
                rows: list[dict[str, Any]]) -> Line:
    """The layout the hub's collector reads: checkpoints at the updates the spec asks (an
    engine may also save at the last update), none at others, every file hashed, and those
    left at the end the ones ``checkpoint.keep`` keeps (``retained``)."""
    name = "checkpoints"
    hashed = next((c for c in result.checks if c.name == "artifacts"), None)
    if hashed is None:
        return Line(name, "FAILED", _unread(result))
    saved = Counter(a.step for a in result.artifacts
                    if a.kind == "checkpoint" and a.step is not None)
    others = Counter(a.kind for a in result.artifacts if a.kind != "checkpoint")
    every = spec.checkpoint.every
    asked = list(range(every, updates + 1, every)) if every else []
    unasked = sorted(s for s in saved if s not in asked and s != updates)
    found = (f"the collector read checkpoints of {_updates(sorted(saved))} "
             f"({sum(saved.values())} files)" if saved else "the collector read no checkpoint")
    found += "".join(f" and {KINDS.get(kind, kind)} ({count} files)"
                     for kind, count in sorted(others.items()))
    wanted = (f"the spec asks for one every {_count(every, 'update')}" if every else
              "the spec asks for one only at the end") + (
        f" (none by update {updates})" if every and not asked else "") + (
        f", keeping {spec.checkpoint.keep}" if spec.checkpoint.keep else "")
    if not hashed.ok:
        return Line(name, "FAILED", f"{hashed.detail}; {wanted}")
    if unasked:
        return Line(name, "FAILED", f"{found}; {wanted}, not at {_updates(unasked)}")
    # what retention leaves of those saved (the last update's too, where the engine saved it)
    made = asked + ([updates] if updates in saved and updates not in asked else [])
    kept, why = retained(spec, made, rows)
    numbers = {"left": sorted(saved), "expected": sorted(kept)}
    missing, extra = sorted(kept - set(saved)), sorted(set(saved) - kept)
    if missing:
        return Line(name, "FAILED", f"{found}; {wanted}, so one of update {missing[-1]}"
                    + (f" ({why})" if spec.checkpoint.keep else ""), numbers=numbers)
    if extra:
        return Line(name, "FAILED", f"{found}; {wanted}: {why} leaves "
                                    f"{_updates(sorted(kept))}, not {_updates(extra)}",
                    numbers=numbers)
    return Line(name, "ok", f"{found}, every file hashed; {wanted}" +
                (f" ({why})" if spec.checkpoint.keep else ""))


def retained(spec: ExperimentSpec, made: list[int],
             rows: list[dict[str, Any]]) -> tuple[set[int], str]:
    """The updates whose checkpoints are left once ``made`` (in order) were saved, and why:
    the newest ``checkpoint.keep``, and the best validated one by ``evaluation.select_by``
    (the earlier on a tie, as the run's recommendation ranks them), by the values the engine
    itself logged; every one where keep is null."""
    keep = spec.checkpoint.keep
    if keep is None:
        return set(made), "keeping every one"
    kept, why = set(made[-keep:]), f"keeping the newest {keep}"
    best = best_update(spec.evaluation.select_by, rows, set(made))
    if best is not None:
        kept.add(best[1])
        why += (f" and the best by {spec.evaluation.select_by} (update {best[1]}, "
                f"{best[0]:.4g})")
    return kept, why


def lines(spec: ExperimentSpec, result: Result, rehearsal: Rehearsal, exit_: Exit,
          seconds: float, run_dir: Path, updates: int, resume: Line | None = None,
          watched: list[Line] | None = None, per_step: int = 1) -> list[Line]:
    """Every check, in the order a reader asks: did it run, is it this run, are the numbers
    sane, do the first-update invariants hold, did it do what the spec asks (``watched``:
    its reward calls, validation and learning rate), did it leave what a run must leave, does
    a second start continue it."""
    out = [launch(exit_, seconds, run_dir),
           _from_check(result, "identity", "identity"),
           _from_check(result, "metrics_finite", "metrics finite"),
           first_update_kl(spec, result, run_dir, per_step),
           rollout_gap(rehearsal, run_dir),
           *(watched or []),
           checkpoints(spec, result, updates, rows_of(result, run_dir)),
           _from_check(result, "committed_updates", "updates")]
    if resume is not None:
        out.append(resume)
    shown = {"exit_code", "identity", "metrics_finite", "artifacts", "committed_updates"}
    out += [Line(c.name, "FAILED", c.detail) for c in result.checks
            if c.name not in shown and not c.ok]
    return out

