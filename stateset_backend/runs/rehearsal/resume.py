"""The resume check: a second start of the engine, through the hub's own resume path, from
the checkpoint of update N-1 of the N-update rehearsal, must continue at update N and compute
what the uninterrupted run computed there.

A resume that quietly starts afresh, or restores the step count but trains nothing and exits
0, costs a GPU run all the time it had done, and nothing on the launch says so: only the
engine's own outputs do. So the second start is the one `run PLAN --resume` would make (the
adapter's ``checkpoints``, ``checkpoint_problem``, the recorded runtime, ``resume_argv``, and
collect-and-validate told where it continued from), and it holds when its first logged step is
N, it committed update N and no other, and update N's metrics equal the uninterrupted run's.

Update N's metrics are computed from the restored weights, data position, learning-rate
schedule and sampler, so each of them shows there; the restored optimizer moments shape only the
weights update N leaves, which none of its metrics show.

Equal means within a tolerance per kind of metric. Values the learner computes in float32
(losses, KL, entropy, gradient norm) round differently when a sum is taken in another order
(two ranks' parts gathered in another order, threads splitting a reduction otherwise): two
runs of one plan agree to a few float32 rounding steps, so they may differ by ``COMPUTED``,
far below what a step from other weights or other completions moves them. Statistics of the
sampled completions (rewards, lengths, kept groups, validation scores) come from the same
tokens when the sampler is restored, so only the rounding of their float32 mean may differ
(``SAMPLED``), while one other completion among n moves a mean by a whole token or reward
over n. The learning rate is a function of the step count (``SCHEDULE``). Wall-clock figures
are not compared.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stateset_backend.common.errors import ResumeImpossible, Unsupported
from stateset_backend.common.jsonio import atomic_write_json, utc_now
from stateset_backend.engines.adapter import Checkpoint, EngineAdapter, LaunchContext, Rehearsal
from stateset_backend.plan.launch_plan import LaunchPlan
from stateset_backend.providers.local import Exit, run_local
from stateset_backend.runs.rehearsal.verdict import Line, stderr_tail
from stateset_backend.runs.results import Result
from stateset_backend.runs.runner import (
    collect_and_validate,
    fill_placeholders,
    prepare_attempt,
    require_exact_resume,
)
from stateset_backend.runs.runtime import check_resume
from stateset_backend.runs.store import Attempt
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.spec.schedule import NEXT_LR

NAME = "resume"
FOLDER = "resumed"  # the second start's run directory, beside the first's ``attempt``
RESULT = "resumed.json"  # its collect-and-validate result, beside the first's result.json


@dataclass(frozen=True)
class Tolerance:
    """Two values agree when ``|a - b| <= absolute + relative * max(|a|, |b|)``."""

    kind: str
    absolute: float
    relative: float

    def allows(self, a: float, b: float) -> bool:
        return abs(a - b) <= self.absolute + self.relative * max(abs(a), abs(b))

    def __str__(self) -> str:
        if not self.relative:
            return f"{self.absolute:g}"
        scaled = f"{self.relative:g} x |value|"
        return f"{self.absolute:g} + {scaled}" if self.absolute else scaled


COMPUTED = Tolerance("computed", 1e-6, 1e-5)
SAMPLED = Tolerance("sampled", 1e-6, 1e-6)
SCHEDULE = Tolerance("schedule", 0.0, 1e-9)
KINDS = (COMPUTED, SAMPLED, SCHEDULE)
SAMPLED_PREFIXES = ("reward/", "response_length/", "groups/", "val/")
WALL_CLOCK = ("time", "per_second", "throughput", "perf/", "memory")


def kind_of(name: str) -> Tolerance | None:
    """The tolerance a canonical metric is compared with; None for a wall-clock figure."""
    if any(part in name for part in WALL_CLOCK):
        return None
    if name in ("lr", NEXT_LR):
        return SCHEDULE
    return SAMPLED if name.startswith(SAMPLED_PREFIXES) else COMPUTED


def unchecked(plan: LaunchPlan, adapter: EngineAdapter, updates: int) -> str | None:
    """Why the rehearsal cannot check a resume of ``plan``'s engine, or None when it can."""
    if updates < 2:
        return ("a resume continues from an earlier update's checkpoint: it needs --updates 2 "
                "or more")
    if not adapter.declares("resume_argv"):
        return f"the {plan.engine} adapter declares no resume"
    try:
        require_exact_resume(plan, adapter)
    except Unsupported as exc:
        return exc.message
    return None


def checkpoint_changes(doc: dict[str, Any], updates: int) -> dict[str, tuple[str, str]]:
    """Make the spec document ``doc`` save the checkpoint of update ``updates - 1`` and keep it
    past the next save, changing as little as that needs; each change as (was, now)."""
    checkpoint = doc["checkpoint"]
    changed: dict[str, tuple[str, str]] = {}
    every, keep = checkpoint.get("every"), checkpoint.get("keep")
    if not every or (updates - 1) % every:
        checkpoint["every"] = 1
        changed["checkpoint.every"] = (json.dumps(every), "1")
    if keep is not None and keep < 2:
        checkpoint["keep"] = 2
        changed["checkpoint.keep"] = (json.dumps(keep), "2")
    return changed


@dataclass(frozen=True)
class Resumed:
    """The second start: where it ran, from which checkpoint, how it ended."""

    folder: Path
    checkpoint: Checkpoint
    ended: Exit
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"folder": str(self.folder), "from_update": self.checkpoint.update,
                "checkpoint": str(self.checkpoint.path), "exit_code": self.ended.code,
                "seconds": round(self.seconds, 3),
                "result": str(self.folder.parent / RESULT)}


def _resume_point(plan: LaunchPlan, adapter: EngineAdapter, spec: ExperimentSpec, first: Path,
                  update: int, python: str | None) -> Checkpoint | str:
    """The checkpoint of ``update`` the first run left, accepted as `run --resume` accepts
    one, or why not."""
    saved = adapter.checkpoints(first)
    found = next((c for c in saved if c.update == update), None)
    if found is None:
        have = ", ".join(str(c.update) for c in saved) or "none"
        return (f"no complete checkpoint of update {update} in {first.name}/ to continue from "
                f"(the adapter finds updates: {have})")
    problem = adapter.checkpoint_problem(found, plan.experiment_digest)
    if problem is not None:
        return f"the checkpoint of update {update} is refused: {problem}"
    try:
        check_resume(adapter.checkpoint_runtime(found), adapter.current_runtime(spec, python),
                     allow_change=False, where=f"the checkpoint of update {update}")
    except ResumeImpossible as exc:
        return exc.message
    return found


def rehearse_resume(plan: LaunchPlan, adapter: EngineAdapter, rehearsal: Rehearsal,
                    spec: ExperimentSpec, folder: Path, updates: int, *, python: str | None,
                    engine_home: str | None, timeout: float | None, echo_stderr: bool,
                    live_progress: bool) -> tuple[Resumed | None, Line]:
    """Start the engine again from the first run's checkpoint of update N-1 and judge it. The
    adapter's resume path is what is rehearsed, so an exception it raises is a finding."""
    first = (folder / "attempt").resolve()
    raised = f"the {plan.engine} adapter's resume path raised"
    try:
        point = _resume_point(plan, adapter, spec, first, updates - 1, python)
    except Exception as exc:
        return None, Line(NAME, "FAILED", f"{raised} {type(exc).__name__}: {exc}")
    if isinstance(point, str):
        return None, Line(NAME, "FAILED", point)
    attempt = Attempt(plan.run_id, 2, folder / FOLDER)
    attempt.directory.mkdir(parents=True)
    if echo_stderr:
        print(f"stateset-backend: rehearsal {plan.run_id}: starting {plan.engine} again from "
              f"the checkpoint of update {point.update}; its output is kept in "
              f"{attempt.directory}", file=sys.stderr, flush=True)
    prepared = prepare_attempt(plan, adapter, attempt, None, python=python,
                               engine_home=engine_home, echo_stderr=echo_stderr,
                               live_progress=live_progress)
    run_dir = prepared.run_dir
    argv = [fill_placeholders(a, run_dir, python or sys.executable, engine_home)
            for a in rehearsal.argv]
    try:  # as `run --resume` changes a plan's filled argv (runner.prepare_attempt)
        argv = adapter.resume_argv(point, argv, run_dir)
    except Exception as exc:
        return None, Line(NAME, "FAILED", f"{raised} {type(exc).__name__}: {exc}")
    started, t0 = utc_now(), time.monotonic()
    ended = run_local(argv, cwd=run_dir, env=rehearsal.environment(prepared.env),
                      timeout=timeout, echo_stderr=echo_stderr,
                      stdout_path=prepared.stdout_path, stderr_path=prepared.stderr_path)
    seconds = time.monotonic() - t0
    result = collect_and_validate(plan, adapter, attempt, spec, ended, point, started=started,
                                  duration=seconds)
    atomic_write_json(folder / RESULT, result.to_json())
    resumed = Resumed(run_dir, point, ended, seconds)
    return resumed, judge(plan, adapter, first, resumed, result, updates)


def _rows_at(rows: list[dict[str, Any]], step: int) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for row in rows:
        if row.get("step") == step:
            merged.update(row)
    merged.pop("step", None)
    return merged


def judge(plan: LaunchPlan, adapter: EngineAdapter, first: Path, resumed: Resumed,
          result: Result, updates: int) -> Line:
    """What the second start's own outputs say: where it began, what it committed, and
    whether update N is the uninterrupted run's."""
    start = f"the second start, from the checkpoint of update {resumed.checkpoint.update},"
    ended = resumed.ended
    if ended.code != 0 or ended.interrupted or ended.timed_out:
        how = "was interrupted" if ended.interrupted else "timed out" if ended.timed_out else \
            f"exited {ended.code}"
        return Line(NAME, "FAILED", f"{start} {how} after {resumed.seconds:.1f} s; the last "
                                    "lines of its stderr:", stderr_tail(resumed.folder))
    ctx = LaunchContext(plan.run_id, plan.experiment_digest, plan.engine_version,
                        plan.resolved_dialect())
    try:
        before, after = adapter.collect(first, ctx).metrics, adapter.collect(resumed.folder,
                                                                             ctx).metrics
    except Exception as exc:  # whatever the adapter raises, the check gets its answer
        return Line(NAME, "FAILED", f"{start} left outputs the collector cannot read: "
                                    f"{type(exc).__name__}: {exc}")
    steps = sorted({int(r["step"]) for r in after if isinstance(r.get("step"), int)})
    if not steps:
        return Line(NAME, "FAILED", f"{start} exited 0 having trained nothing: it logged no "
                                    "update")
    if steps[0] != updates:
        afresh = ": it started afresh" if steps[0] <= 1 else ""
        return Line(NAME, "FAILED", f"{start} logged {_steps(steps)}; its first logged step "
                                    f"is {steps[0]}, not {updates}{afresh}")
    if steps != [updates]:
        return Line(NAME, "FAILED", f"{start} logged {_steps(steps)}, not update {updates} "
                                    "alone")
    failed = [f"{c.name}: {c.detail}" for c in result.checks if not c.ok]
    if failed:
        return Line(NAME, "FAILED", f"{start} did not pass the checks of a resumed attempt: "
                                    + "; ".join(failed))
    said = (f"{start} logged update {updates} first, committed it alone and exited 0 after "
            f"{resumed.seconds:.1f} s")
    return compare(_rows_at(before, updates), _rows_at(after, updates), updates, said)


def _steps(steps: list[int]) -> str:
    return ("step " if len(steps) == 1 else "steps ") + ", ".join(map(str, steps))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def compare(before: dict[str, Any], after: dict[str, Any], update: int, said: str) -> Line:
    """Update ``update``'s metrics of the uninterrupted run (``before``) and the resumed one
    (``after``), per kind of metric; the line carries every kind's largest difference."""
    per_kind: dict[str, list[tuple[str, float]]] = {t.kind: [] for t in KINDS}
    unequal: list[str] = []
    clock = sorted(n for n in set(before) | set(after) if kind_of(n) is None)
    for name in sorted(set(before) | set(after)):
        tolerance = kind_of(name)
        if tolerance is None:
            continue
        if (name in before) != (name in after):
            which = "uninterrupted" if name in before else "resumed"
            unequal.append(f"{name} logged by the {which} run only")
            continue
        a, b = _number(before[name]), _number(after[name])
        if a is None or b is None:
            if before[name] != after[name]:
                unequal.append(f"{name} {before[name]!r} vs {after[name]!r}")
            continue
        diff = abs(a - b) if math.isfinite(a) and math.isfinite(b) else \
            (0.0 if a == b or (math.isnan(a) and math.isnan(b)) else math.inf)
        per_kind[tolerance.kind].append((name, diff))
        if not (diff == 0.0 or tolerance.allows(a, b)):
            unequal.append(f"{name} {a:.6g} vs {b:.6g} (difference {diff:.2g}, tolerance "
                           f"{tolerance})")
    tail = []
    largest: tuple[str, float] | None = None
    numbers: dict[str, Any] = {"update": update, "kinds": {}}
    for tolerance in KINDS:
        found = per_kind[tolerance.kind]
        if not found:
            continue
        name, diff = max(found, key=lambda item: item[1])
        if largest is None or diff > largest[1]:
            largest = (name, diff)
        tail.append(f"{tolerance.kind} ({', '.join(n for n, _ in found)}): largest difference "
                    f"{diff:.2g}" + (f" ({name})" if diff else "") + f", tolerance {tolerance}")
        numbers["kinds"][tolerance.kind] = {
            "metrics": {n: d for n, d in found}, "largest": diff,
            "tolerance": {"absolute": tolerance.absolute, "relative": tolerance.relative}}
    if clock:
        tail.append(f"not compared (wall-clock): {', '.join(clock)}")
    numbers["largest"] = None if largest is None else {"metric": largest[0],
                                                       "difference": largest[1]}
    if unequal:
        return Line(NAME, "FAILED", f"{said}, but update {update}'s metrics differ from the "
                                    f"uninterrupted run's: {'; '.join(unequal[:5])}", tail,
                    numbers)
    if largest is None:
        return Line(NAME, "FAILED", f"{said}, but neither run logged a metric of update "
                                    f"{update} to compare", tail, numbers)
    count = sum(len(found) for found in per_kind.values())
    biggest = f"{largest[1]:.2g} ({largest[0]})" if largest[1] else "0"
    return Line(NAME, "ok", f"{said}; update {update}'s {count} metrics equal the "
                            f"uninterrupted run's, largest difference {biggest}", tail, numbers)
