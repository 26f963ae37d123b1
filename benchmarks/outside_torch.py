"""How much of an update is spent outside torch's operators, measured the same way for any
engine whose loop can say when an update begins.

Inside torch: the union of the top-level operator intervals (forward operators, the autograd
engine's backward functions, the optimizer's kernels), and the time between two backward
functions the engine runs one after the other: that is the engine's own scheduling, in torch's
C++ with the interpreter released, not Python. Annotations are not operators: an optimizer's
``Optimizer.step`` and ``zero_grad`` ranges (and the update marks here) count their operators
inside and the Python around them outside. Nor is a custom autograd Function: its forward and
its backward count their operators inside and their Python outside, and the engine's step
around a Python backward is not counted as the engine's.

The profiler's bookkeeping (about a microsecond per operator, most of it outside the
operator's interval) counts as outside, so the share is an upper bound; plain stretches of the
same updates give their wall time without it. The profiled inside time against that plain wall
would be a lower bound, but a loose one (the inside time carries the bookkeeping of every
nested operator) and, on a shared machine, one that two stretches' different loads make
meaningless, so it is not reported. Each figure is the median over the stretches.
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections import defaultdict
from typing import Any

ENGINE = "autograd::engine::evaluate_function"
MARK = "profile: update"
PHASE_MARK = "profile phase: "
# stretches of plain and profiled updates after the warm-up, and the warm-up
STRETCHES, WARMUP = 3, 5


class Stretches:
    """Alternating plain and profiled stretches of whole updates, driven by one call as each
    update begins: the native loop is wrapped to make that call, and TRL's makes it from its
    ``on_step_begin`` callback, so both engines are measured on one schedule and by one rule.

    ``warmup`` updates run first, unmeasured (the first ones pay for lazy imports, the
    allocator's growth and the record writer's start, once per run); then ``count`` pairs of
    stretches, one plain and one under torch's profiler, each of ``per`` updates timed from
    the start of its first update to the start of the update after its last, so a run's own
    start and end (the durable progress record's fsyncs, the writer's join) are not counted
    as updates. That next update is not measured: the profiler stops as it begins."""

    def __init__(self, warmup: int, per: int, count: int) -> None:
        self.warmup, self.per, self.count = warmup, per, count
        self.begun = 0
        self.plain: list[float] = []
        # each profiled stretch's figures (``covered``), taken as it ends, inside the update
        # that is not measured, so no stretch runs beside the events of the ones before it
        self.profiled: list[tuple[float, float, float, dict[str, tuple[float, float]]]] = []
        self._started = 0.0
        self._profiler: Any = None

    @classmethod
    def of(cls, profiled: int) -> Stretches:
        """The schedule that profiles about ``profiled`` updates in all (at least one a
        stretch), after the usual warm-up."""
        return cls(WARMUP, max(1, profiled // STRETCHES), STRETCHES)

    @property
    def updates(self) -> int:
        """The updates a run needs for the whole schedule."""
        return self.warmup + self.count * 2 * (self.per + 1)

    def begin_update(self) -> None:
        """Mark an update's start, and start or stop a stretch there: a stretch must hold
        whole updates only, or a stretch would weigh one phase of the loop more than another."""
        from torch.profiler import ProfilerActivity, profile, record_function

        at, self.begun = self.begun - self.warmup, self.begun + 1
        if at < 0 or at >= self.count * 2 * (self.per + 1):
            return
        segment, step = divmod(at, self.per + 1)
        profiled = segment % 2 == 1
        if step == 0:
            if profiled:
                self._profiler = profile(activities=[ProfilerActivity.CPU])
                self._profiler.start()
            self._started = time.perf_counter()
        with record_function(MARK):  # where the update begins, in the profiler's clock
            pass
        if step == self.per:
            if profiled:
                self._profiler.stop()
                self.profiled.append(covered(self._profiler.events()))
                self._profiler = None
            else:
                self.plain.append((time.perf_counter() - self._started) / self.per)

    def result(self) -> dict[str, Any]:
        """Each figure the median over the stretches; per model phase where the run marked
        them (``PHASE_MARK``)."""
        if len(self.plain) != self.count or len(self.profiled) != self.count:
            raise SystemExit(f"the run began {self.begun} updates, not the "
                             f"{self.updates} its measurement needs")
        profiled, inside_s, outside_s, steps_s, shares = [], [], [], [], []
        phases: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for wall, inside, steps, by_phase in self.profiled:
            profiled.append(wall / self.per)
            inside_s.append(inside / self.per)
            outside_s.append((wall - inside) / self.per)
            steps_s.append(steps / self.per)
            shares.append(1 - inside / wall)
            for phase, (phase_wall, phase_inside) in by_phase.items():
                phases[phase].append((phase_wall / self.per, 1 - phase_inside / phase_wall))
        median = statistics.median
        got: dict[str, Any] = {
            "updates": self.per * self.count, "warmup_updates": self.warmup,
            "stretches": self.count, "update_ms_plain": round(1e3 * median(self.plain), 2),
            "update_ms_profiled": round(1e3 * median(profiled), 2),
            "inside_ms": round(1e3 * median(inside_s), 2),
            "outside_ms": round(1e3 * median(outside_s), 2),
            "engine_steps_ms": round(1e3 * median(steps_s), 2),
            "share": round(max(0.0, median(shares)), 4)}
        if phases:
            got["phases"] = {phase: {"ms_profiled": round(1e3 * median(w for w, _ in p), 2),
                                     "share": round(max(0.0, median(sh for _, sh in p)), 4)}
                             for phase, p in phases.items()}
            got["model_phases_share"] = round(median(
                sum(w * sh for w, sh in stretch) / sum(w for w, _ in stretch)
                for stretch in zip(*phases.values(), strict=True)), 4)
        return got


def covered(events: Any) -> tuple[float, float, float, dict[str, tuple[float, float]]]:
    """(the wall time from the first update mark to the last, the time inside torch in it,
    the part of that which is the engine's steps between backward functions, and for each
    model phase its wall time and the time inside torch in it), in seconds, from the
    profiler's events."""
    marks = sorted(e.time_range.start for e in events if e.name == MARK)
    first, last = marks[0], marks[-1]
    python = _python_ranges(events)
    tops, windows, python_backward = [], [], []
    for e in events:  # the operators at the top, annotations and Python seen through
        if e.name.startswith(PHASE_MARK) and first <= e.time_range.start < last:
            windows.append((e.name[len(PHASE_MARK):], e.time_range.start, e.time_range.end))
        parent = e.cpu_parent
        while parent is not None and python(parent):
            parent = parent.cpu_parent
        if parent is None and e.device_type.name == "CPU":
            if not python(e):
                tops.append((e.time_range.start, e.time_range.end, e.name.startswith(ENGINE)))
            elif e.name.startswith(ENGINE):
                python_backward.append(e.time_range.start)
    tops.sort()
    python_backward.sort()
    spans: list[tuple[float, float]] = []  # disjoint, in order
    steps, reach, engine_before = 0.0, float(first), False
    for start, end, engine in tops:
        start, end = max(start, first), min(end, last)
        if end <= reach:
            continue
        # the engine's step from one function to the next, unless a Python backward ran
        # between them (whose own operators, if any, are at the top; but it may call none)
        later = bisect.bisect_right(python_backward, reach)
        if engine and engine_before and not (later < len(python_backward) and
                                             python_backward[later] < start):
            steps += max(0.0, start - reach)
            start = reach
        spans.append((max(start, reach), end))
        reach, engine_before = end, engine
    begins = [start for start, _ in spans]

    def inside(a: float, b: float) -> float:
        total, i = 0.0, max(0, bisect.bisect_right(begins, a) - 1)
        while i < len(spans) and spans[i][0] < b:
            total += max(0.0, min(spans[i][1], b) - max(spans[i][0], a))
            i += 1
        return total

    by_phase: dict[str, tuple[float, float]] = {}
    for phase, a, b in windows:
        wall, got = by_phase.get(phase, (0.0, 0.0))
        by_phase[phase] = (wall + (b - a) / 1e6, got + inside(a, b) / 1e6)
    return (last - first) / 1e6, inside(first, last) / 1e6, steps / 1e6, by_phase


def _python_ranges(events: Any) -> Any:
    """Whether an event is a range of Python code rather than an operator, to be seen through
    to the operators it calls: an annotation, or a custom autograd Function (TRL computes
    its log-probs in one), whose forward torch records under the class's name and whose
    backward the engine runs as ``evaluate_function: <name>Backward``, both with their
    Python inside. Counting those ranges whole would credit their Python to torch.

    Operators are named ``namespace::name``; the autograd engine's nodes are not, but they
    sit under their ``evaluate_function`` and are never at the top."""
    named = {e.name for e in events if "::" not in e.name and not e.is_user_annotation}
    backward = {ENGINE + ": " + name + "Backward" for name in named}

    def python(e: Any) -> bool:
        return bool(e.is_user_annotation) or "::" not in e.name or e.name in backward
    return python

