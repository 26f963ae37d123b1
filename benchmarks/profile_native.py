"""Where the native engine's time goes: one run of the README's job, timed by phase.

The phases are the loop's own steps: sampling (KV-cache generation that records each token's
log-prob), scoring (the reward function), reference log-probs (the frozen policy for the KL),
the learner update (forward, backward, optimizer), validation, checkpoint writes and the
records (metrics, receipts, trajectories). Each phase is timed by wrapping the function the
trainer calls, so the trainer runs unmodified; "other" is the loop time no phase accounts for.

Then a second, shorter run under torch's profiler answers how much of an update is spent
outside torch's operators (Python, the tokenizer, the reward, records): the wall time of the
training loop minus the time covered by top-level operator events (forward ops, the autograd
engine's backward functions, the optimizer's kernels). The profiler's own bookkeeping counts
partly outside, so the share is an upper bound.

    python benchmarks/profile_native.py [--updates 200] [--threads 1] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SPEC = EXAMPLES / "support-routing.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--profiled-updates", type=int, default=30,
                        help="updates of the run under torch's profiler (default 30)")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "benchmarks" / "results" / "profile_native.json")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)

    from stateset_backend.native import trainer as trainer_module
    from stateset_backend.native.trainer import RunSettings, Trainer
    from stateset_backend.spec.digest import experiment_digest
    from stateset_backend.spec.files import parse_spec

    doc = json.loads(SPEC.read_text())
    doc["budget"]["total_updates"] = args.updates
    spec = parse_spec(doc)
    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)

    active: list[str] = []

    def timed(phase: str, fn: Any) -> Any:
        """Time ``fn`` as ``phase``, unless it runs inside another phase (validation samples
        and scores too), whose time already counts it."""
        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            if active:
                return fn(*a, **kw)
            active.append(phase)
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[phase] += time.perf_counter() - t0
                calls[phase] += 1
                active.pop()
        return wrapper

    # module-level names the trainer calls, and its own methods
    trainer_module.sample = timed("sampling", trainer_module.sample)
    trainer_module.reference_logprobs = timed("reference log-probs",
                                              trainer_module.reference_logprobs)
    trainer_module.update = timed("learner update", trainer_module.update)
    for method, phase in [
            ("validate", "validation"), ("save_checkpoint", "checkpoint writes"),
            ("log_metrics", "records: metrics"), ("write_receipt", "records: receipts"),
            ("_write_trajectories", "records: trajectories"), ("commit", "records: run info"),
            ("save_final", "final model")]:
        setattr(Trainer, method, timed(phase, getattr(Trainer, method)))

    out = ROOT / "benchmarks" / "results" / "profile-run"
    if out.exists():
        import shutil
        shutil.rmtree(out)
    out.mkdir(parents=True)
    trainer = Trainer(RunSettings("profile", experiment_digest(spec), spec, EXAMPLES), out)
    reward_fn = trainer.reward_fn
    trainer.reward_fn = timed("scoring", reward_fn)
    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0
    accounted = sum(spent.values())
    phases = {k: round(v, 3) for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}
    counted = dict(calls)  # before the profiled run, whose calls the wrappers also see
    outside = outside_torch_share(spec, args.profiled_updates)
    report = {"updates": args.updates, "threads": args.threads, "total_s": round(total, 3),
              "updates_per_second": round(args.updates / total, 3),
              "phases_s": phases, "calls": counted,
              "other_s": round(total - accounted, 3), "outside_torch": outside}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{args.updates} updates in {total:.1f} s ({args.updates / total:.2f} updates/s)")
    for phase, seconds in phases.items():
        print(f"  {phase:22} {seconds:8.2f} s  {100 * seconds / total:5.1f}%  "
              f"({counted[phase]} calls)")
    print(f"  {'other':22} {total - accounted:8.2f} s")
    print(f"outside torch's operators: {100 * outside['share']:.1f}% of the training loop "
          f"({outside['updates']} updates under the profiler)")


def outside_torch_share(spec: Any, updates: int) -> dict[str, Any]:
    """The share of the training loop's wall time not covered by a top-level torch operator.

    Checkpoints and evaluation are off in this run: it measures the update itself."""
    import shutil

    from torch.profiler import ProfilerActivity, profile

    from stateset_backend.native.trainer import RunSettings, Trainer
    from stateset_backend.spec.digest import experiment_digest

    spec = spec.model_copy(update={
        "budget": spec.budget.model_copy(update={"total_updates": updates}),
        "checkpoint": spec.checkpoint.model_copy(update={"every": None, "keep": None}),
        "evaluation": spec.evaluation.model_copy(update={"every": None, "select_by": None})})
    out = ROOT / "benchmarks" / "results" / "profile-torch-run"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    trainer = Trainer(RunSettings("profile", experiment_digest(spec), spec, EXAMPLES), out)
    trainer.save_final = lambda: None  # the final save is not part of an update
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        trainer.train()
        wall = time.perf_counter() - t0
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.cpu_parent is None and e.device_type.name == "CPU")
    covered, reach = 0.0, float("-inf")
    for start, end in spans:  # the union of the top-level operator intervals (us)
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    inside = covered / 1e6
    return {"updates": updates, "wall_s": round(wall, 3), "inside_s": round(inside, 3),
            "share": round(max(0.0, 1 - inside / wall), 4)}


if __name__ == "__main__":
    main()
