"""An update's anatomy on one shape, and the two floors its time is held against.

Where the time goes: the model's phases (sampling, the KL reference's log-probs, the learner's
forward, backward and step) and the records, each timed by wrapping the function the trainer
calls, over plain updates after a warm-up (means over those updates; "other" is the rest of
the loop: tokenizing, the reward, collating); sampling is also given per token step.

How much work that is: the operators an update runs, by phase (top-level operator events
under torch's profiler: an operator called inside another is the caller's work, and the
autograd engine's backward functions count as the operators they are), and its arithmetic
(the floating-point operations of its matrix products and attention, counted by torch's
FlopCounterMode, forward and backward).

The floors, both measured on this machine in the same process: the dispatch floor is the
update's operators times the cost of a trivial operator (adding 1 to a one-element tensor,
from Python): what the update would cost if every operator did nothing; the arithmetic floor
is its floating-point operations at the matrix-product throughput this machine reaches, taken
twice: at the model's own widths (the best over token row counts from a decode step's to the
update's whole batch) and at the best of large square products, the machine's peak. An
update cannot take less than either floor; how far above the larger one it runs is what an
engine could still win.

Which work that distance is in: the profiled update's time by kind (the linear layers' matrix
products, attention, every other operator, and the time outside operators), and the FLOPs of
the first two. From them, what better product and attention kernels could win at most: the
update with its products at the machine's rate and its attention free, every other operator
and the interpreter's time as they are. Where that is still far above the floor, the distance
is in the many small operators around the products (norms, rotations, the vocabulary's
softmax, sampling, indexing, the optimizer), which only fusing them into fewer kernels removes.
"""

from __future__ import annotations

import functools
import shutil
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness

PHASES = {"sampling": "sample", "reference log-probs": "reference_logprobs",
          "learner update": "update"}
RECORDS = ("log_metrics", "write_receipt", "_write_trajectories", "commit")
MARK = "anatomy phase: "
# the operators of each kind of work, by aten name: a linear layer's products are mm (addmm
# with a bias), forward and backward; attention is torch's fused kernel, forward and
# backward, or, where the engine writes it out (decoding, short responses), its batched
# products and softmax; every other operator is "other operators"
KINDS = {"matrix products": ("aten::mm", "aten::addmm"),
         "attention": ("aten::bmm", "aten::baddbmm", "aten::_softmax",
                       "aten::_softmax_backward_data",
                       "aten::_scaled_dot_product_flash_attention_for_cpu",
                       "aten::_scaled_dot_product_flash_attention_for_cpu_backward")}


def _best_us(fn: Callable[[], Any], repeat: int) -> float:
    """The fastest of ``repeat`` calls, in microseconds: on a shared machine the fastest is
    the one least disturbed, the closest to what the machine can do."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def trivial_op_us() -> float:
    """One trivial operator from Python, in microseconds (the fastest of batches of calls:
    a floor takes the machine at its least disturbed, like ``_best_us``)."""
    import torch

    x = torch.zeros(1)
    per_batch = []
    for _ in range(20):
        start = time.perf_counter()
        for _ in range(1000):
            x.add(1)
        per_batch.append((time.perf_counter() - start) * 1e3)  # us per call
    return min(per_batch)


def matmul_gflops(rows: int, widths: list[tuple[int, int]]) -> dict[str, float]:
    """Matrix-product throughput, GFLOP/s: at the model's widths (each (in, out) width pair,
    at token row counts from 256 up to ``rows``, the best of them) and the machine's peak
    (the best of large square products).

    The best over row counts, not the rate at ``rows`` alone: a floor must be a bound no
    engine can beat, and an engine chooses how many rows its products take at once (the
    native learner runs chunks of a few thousand, sampling one token of every row). At a
    whole batch's rows (32,768 at 128-token completions) the operands outgrow the caches,
    and the rate measured there (39 GFLOP/s on a loaded day, against 90 at the peak) put
    the floor at twice the time the products can take."""
    import torch
    import torch.nn.functional as F

    def rate(m: int, k: int, n: int) -> float:
        a, b = torch.randn(m, k), torch.randn(n, k)
        return 2 * m * k * n / _best_us(lambda: F.linear(a, b), 15) / 1e3

    top = min(rows, 1 << 17)  # beyond this many rows the rate no longer changes
    counts = sorted({min(top, c) for c in (256, 1 << 10, 1 << 12, 1 << 14, top)})
    model = max(rate(m, k, n) for m in counts for k, n in widths)
    peak = max(rate(s, s, s) for s in (512, 1024, 2048))
    return {"model_shapes": round(model, 1), "peak": round(peak, 1)}


def _attention_flops() -> dict[Any, Any]:
    """FlopCounterMode's attention formulas for the CPU's fused kernel, which it lacks."""
    import torch
    from torch.utils import flop_counter

    aten = torch.ops.aten

    def forward(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None,
                **kwargs: Any) -> int:
        return flop_counter.sdpa_flop_count(query, key, value)

    def backward(grad: Any, query: Any, key: Any, value: Any, *args: Any,
                 out_shape: Any = None, **kwargs: Any) -> int:
        return flop_counter.sdpa_backward_flop_count(grad, query, key, value)

    return {aten._scaled_dot_product_flash_attention_for_cpu: forward,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: backward}


def _kind(op: str) -> str:
    return next((kind for kind, names in KINDS.items() if op in names), "other operators")


def work_by_kind(events: Any, wall_ms: float) -> dict[str, float]:
    """One profiled update's milliseconds by kind of work (``KINDS``): each operator's own
    time (its callees' are theirs) on the training thread, and outside operators the rest of
    the update's wall time (the interpreter, the profiler's own bookkeeping)."""
    thread = next(e.thread for e in events if e.name.startswith(MARK))
    spent: dict[str, float] = dict.fromkeys([*KINDS, "other operators"], 0.0)
    for e in events:
        if e.thread == thread and e.name.startswith("aten::"):
            spent[_kind(e.name)] += e.self_cpu_time_total / 1e3
    spent["outside operators"] = wall_ms - sum(spent.values())
    return {kind: round(ms, 2) for kind, ms in spent.items()}


def gflop_by_kind(counts: dict[Any, int]) -> dict[str, float]:
    """FlopCounterMode's global counts (operator -> FLOPs) summed by kind of work."""
    gflop = dict.fromkeys(KINDS, 0.0)
    for op, flops in counts.items():
        kind = _kind(str(op).replace(".", "::", 1))
        if kind in gflop:
            gflop[kind] += flops / 1e9
    return {kind: round(g, 3) for kind, g in gflop.items()}


def _top_level_ops(events: Any) -> Counter[str]:
    """Top-level operator events per phase mark: an operator inside another is its caller's."""
    counts: Counter[str] = Counter()
    for e in events:
        if not e.name.startswith("aten::"):
            continue
        phase, parent, nested = "other", e.cpu_parent, False
        while parent is not None:
            if parent.name.startswith("aten::"):
                nested = True
                break
            if parent.name.startswith(MARK):
                phase = parent.name[len(MARK):]
            parent = parent.cpu_parent
        if not nested:
            counts[phase] += 1
    return counts


def measure(spec: Any, examples: Path, timed_updates: int) -> dict[str, Any]:
    """The anatomy of ``spec``'s updates: ``timed_updates`` plain ones after two of warm-up,
    then one update under the profiler (operators) and one under FlopCounterMode (FLOPs)."""
    from torch.profiler import ProfilerActivity, profile, record_function
    from torch.utils.flop_counter import FlopCounterMode

    from stateset_backend.native import trainer as trainer_module
    from stateset_backend.native.trainer import RunSettings, Trainer
    from stateset_backend.spec.digest import experiment_digest

    warmup = 2
    # the profiled update, the counted one, and one more whose start closes the counted one
    total = warmup + timed_updates + 3
    spec = spec.model_copy(update={
        "budget": spec.budget.model_copy(update={"total_updates": total}),
        "checkpoint": spec.checkpoint.model_copy(update={"every": None, "keep": None}),
        "evaluation": spec.evaluation.model_copy(update={"every": None, "select_by": None})})
    out = harness.ROOT / "benchmarks" / "results" / "anatomy-run"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    trainer = Trainer(RunSettings("anatomy", experiment_digest(spec), spec, examples), out)
    trainer.save_final = lambda: None  # type: ignore[method-assign]  # not part of an update

    spent: dict[str, float] = defaultdict(float)
    state = {"update": -1, "started": 0.0}
    events: list[Any] = []
    counted_flops: list[int] = []
    counted_kinds: list[dict[str, float]] = []
    profiled_ms: list[float] = []
    walls: list[float] = []
    tokens: list[int] = []
    profiler: list[Any] = []
    flops: list[FlopCounterMode] = []

    def wrap(phase: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            timing = warmup <= state["update"] < warmup + timed_updates
            start = time.perf_counter()
            with record_function(MARK + phase):
                got = fn(*a, **kw)
            if timing:
                spent[phase] += time.perf_counter() - start
                if phase == "sampling":
                    tokens.append(int(got[0].shape[1]))
            return got
        return wrapper

    collect = trainer.collect_batch

    def begin() -> Any:
        """Each update begins with its sampling: close the last one, open the next."""
        now = time.perf_counter()
        at = state["update"]
        if warmup <= at < warmup + timed_updates:
            walls.append(now - state["started"])
        for p in profiler:
            p.stop()
            profiled_ms.append(1e3 * (now - state["started"]))
            events.extend(p.events())
        profiler.clear()
        for f in flops:
            f.__exit__(None, None, None)
            counted_flops.append(f.get_total_flops())
            counted_kinds.append(gflop_by_kind(f.get_flop_counts().get("Global", {})))
        flops.clear()
        at = state["update"] = at + 1
        if at == warmup + timed_updates:
            profiler.append(profile(activities=[ProfilerActivity.CPU]))
            profiler[0].start()
        elif at == warmup + timed_updates + 1:
            flops.append(FlopCounterMode(display=False, custom_mapping=_attention_flops()))
            flops[0].__enter__()
        state["started"] = time.perf_counter()
        return collect()

    trainer.collect_batch = begin  # type: ignore[method-assign]
    originals = {name: getattr(trainer_module, name) for name in PHASES.values()}
    record_methods = {name: getattr(Trainer, name) for name in RECORDS}
    try:
        for phase, name in PHASES.items():
            setattr(trainer_module, name, wrap(phase, originals[name]))
        for name in RECORDS:
            setattr(Trainer, name, wrap("records", record_methods[name]))
        trainer.train()
    finally:
        for name, fn in originals.items():
            setattr(trainer_module, name, fn)
        for name, fn in record_methods.items():
            setattr(Trainer, name, fn)
    ops = _top_level_ops(events)
    if not events or not counted_flops:
        raise SystemExit(f"the run ended before its profiled and counted updates ({total})")
    flop_count = counted_flops[0]
    n = len(walls)
    update_ms = 1e3 * statistics.fmean(walls)  # the mean, as the phases' (sums over updates)
    phases_ms = {phase: round(1e3 * seconds / n, 2) for phase, seconds in spent.items()}
    phases_ms["other"] = round(update_ms - sum(phases_ms.values()), 2)
    steps = statistics.median(tokens)
    model = trainer.model.config
    widths = [(model.hidden_size, model.hidden_size), (model.hidden_size,
              model.intermediate_size), (model.intermediate_size, model.hidden_size),
              (model.hidden_size, model.vocab_size)]
    rows = spec.budget.prompts_per_update * spec.algorithm.group_size * max(steps, 1)
    rates = matmul_gflops(int(rows), widths)
    op_us = trivial_op_us()
    total_ops = sum(ops.values())
    work = work_by_kind(events, profiled_ms[0])
    kinds_gflop = counted_kinds[0]
    # the plain update less what its products and attention took under the profiler (large
    # operators, whose time the profiler's per-operator bookkeeping hardly changes), plus
    # the products at the machine's rate
    rest_ms = update_ms - work["matrix products"] - work["attention"]
    bound_ms = rest_ms + kinds_gflop["matrix products"] / rates["model_shapes"] * 1e3
    return {
        "updates_timed": n, "update_ms": round(update_ms, 2),
        "update_ms_rounds": [round(1e3 * w, 2) for w in walls],
        "phases_ms": phases_ms, "tokens_sampled_per_row": steps,
        "sampling_ms_per_token": round(phases_ms.get("sampling", 0.0) / max(steps, 1), 3),
        "operators": {"total": total_ops, **dict(sorted(ops.items()))},
        "gflop": round(flop_count / 1e9, 3),
        "work_ms": {"profiled update": round(profiled_ms[0], 2), **work},
        "gflop_by_kind": kinds_gflop,
        "products_at_rate_attention_free_ms": round(bound_ms, 2),
        "trivial_op_us": round(op_us, 3), "matmul_gflops": rates,
        "floors_ms": {
            "dispatch": round(total_ops * op_us / 1e3, 2),
            "arithmetic_model_shapes": round(flop_count / rates["model_shapes"] / 1e6, 2),
            "arithmetic_peak": round(flop_count / rates["peak"] / 1e6, 2)},
    }
