"""What a compiled learner step would cost and give: torch.compile (Inductor) against eager.

The native engine runs eagerly. On the README's job about a quarter of an update is the
interpreter's time between torch's operators (profile_native.py), and only a compiled graph
removes that time; this measures what the graph costs to get. Each side runs the learner's
forward and backward (the policy's log-probs of one sampled batch of the shape, through the
grouped forward, and the backward of their masked sum), with the optimizer's step left out,
in a fresh process:

- ``eager``: the steady time of a step;
- ``compiled``: ``torch.compile`` of the same step, first with an empty Inductor cache (what
  a user's first run pays: tracing, then C++ code generated and built with the system's
  compiler), then again in a new process on the cache that run left (what every later run
  pays, on the same machine, torch and shapes); for each, the first call's seconds and the
  steady time of a step.

Rounds are interleaved (the sides' order alternates) after no warm-up; each value is the
median of the rounds with their range.

    python benchmarks/compile_cost.py [--rounds 3] [--shapes readme] [--steps 50]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from shapes import EXAMPLES, add_shapes_option, larger_model_revision, shape_spec

ROOT = harness.ROOT
SIDES = ("eager", "compiled")
# the stored measurement the README's table of benchmarks points to (``--out`` it to renew it)
MEASURED = ROOT / "benchmarks" / "measured" / "compile_cost.json"


def child(shape: str, compiled: bool, steps: int, revision: str | None) -> dict[str, float]:
    """One side's measurement in this process: the first call's seconds, then ms a step."""
    harness.set_threads(1)
    import torch

    from stateset_backend.native import rollout
    from stateset_backend.native.batch import RolloutBatch
    from stateset_backend.native.trainer import RunSettings, Trainer
    from stateset_backend.spec.digest import experiment_digest
    from stateset_backend.spec.files import parse_spec

    spec = parse_spec(shape_spec(shape, 1, revision))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        out.mkdir()
        trainer = Trainer(RunSettings("compile-cost", experiment_digest(spec), spec,
                                      EXAMPLES), out)
        batch, _, _ = trainer.collect_batch()
        if not isinstance(batch, RolloutBatch):
            raise SystemExit(f"{shape}: the first update sampled no batch to learn from")
        model, group_size = trainer.model, spec.algorithm.group_size

        def step() -> Any:
            logp, _ = rollout.response_logprobs(
                model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                batch.response_mask, 1.0, group_size)
            loss = (logp * batch.response_mask).sum()
            loss.backward()
            return loss

        fn = torch.compile(step) if compiled else step
        start = time.perf_counter()
        fn()
        first = time.perf_counter() - start
        fn()
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        ms = 1e3 * (time.perf_counter() - start) / steps
        trainer.close()
    return {"first_call_s": round(first, 3), "ms_per_step": round(ms, 3)}


def _run(shape: str, compiled: bool, steps: int, revision: str | None,
         cache: Path | None) -> dict[str, float]:
    env = harness.pinned_env(1)
    if cache is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    argv = [sys.executable, __file__, "--child", shape, "--steps", str(steps)]
    if compiled:
        argv.append("--compiled")
    if revision is not None:
        argv += ["--revision", revision]
    return json.loads(harness.child(argv, env))


def measure(shape: str, rounds: int, steps: int, revision: str | None) -> dict[str, Any]:
    def run(side: str, r: int) -> dict[str, Any]:
        print(f"round {r + 1}/{rounds} {shape} {side}", file=sys.stderr, flush=True)
        if side == "eager":
            return _run(shape, False, steps, revision, None)
        with tempfile.TemporaryDirectory() as cache:  # empty: a first run on this machine
            cold = _run(shape, True, steps, revision, Path(cache))
            warm = _run(shape, True, steps, revision, Path(cache))
        return {"cold": cold, "warm": warm}

    kept = harness.interleaved(SIDES, rounds, 0, run)
    eager, compiled = kept["eager"], kept["compiled"]
    return {
        "eager_ms_per_step": harness.per_round([e["ms_per_step"] for e in eager]),
        **{f"{cache}_first_call_s": harness.per_round(
            [c[cache]["first_call_s"] for c in compiled]) for cache in ("cold", "warm")},
        "compiled_ms_per_step": harness.per_round(
            [c["warm"]["ms_per_step"] for c in compiled]),
        "speedup": harness.per_round([e["ms_per_step"] / c["warm"]["ms_per_step"]
                                      for e, c in zip(eager, compiled, strict=True)])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50, help="timed steps a process")
    add_shapes_option(parser, default=("readme",))
    parser.add_argument("--out", type=Path,
                        default=ROOT / "benchmarks" / "results" / "compile_cost.json")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--compiled", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--revision", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT=" + json.dumps(child(args.child, args.compiled, args.steps,
                                           args.revision)))
        return
    revision = larger_model_revision(args.shapes)
    report = {"shapes": {shape: measure(shape, args.rounds, args.steps, revision)
                         for shape in args.shapes},
              "rounds": args.rounds, "steps": args.steps, "machine": harness.machine(1),
              "command": "python benchmarks/compile_cost.py " + " ".join(sys.argv[1:])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for shape, m in report["shapes"].items():
        print(f"{shape}: eager {harness.show(m['eager_ms_per_step'], ' ms')} a step; compiled "
              f"{harness.show(m['compiled_ms_per_step'], ' ms')} "
              f"({harness.show(m['speedup'], 'x')} faster), after a first call of "
              f"{harness.show(m['cold_first_call_s'], ' s', 1)} on an empty cache and "
              f"{harness.show(m['warm_first_call_s'], ' s', 1)} on a warm one")


if __name__ == "__main__":
    main()
