"""`runs list`, `runs show` and `runs compare` over generated stores of 1k, 10k and 100k runs
(goal: each under 0.5 s at 100k, with a flat cost per run), and the index build (`runs
reindex`).

    python benchmarks/runs_store.py [--sizes 1000,10000,100000] [--rounds 5]
        [--stores benchmarks/results/stores] [--before PYTHONPATH]

Each store holds what runs leave: a real launch plan (`plan` of examples/support-routing.json,
~10 KB) and a schema-valid result per attempt, the run's latest result beside its plan, over
twenty experiments and four engines. Most runs succeeded; some failed, were retried or
resumed, were invalid, interrupted or quarantined (an active or a cleared mark); a few results
are damaged (listed as `unreadable`); some runs carry a held-out evaluation record. Stores are
generated once into ``--stores`` (ignored by git) and reused.

Every command runs as the fresh process a user starts, imports included (from compiled
bytecode, as an installed package runs; the cache goes to benchmarks/results/pycache), in
interleaved rounds (each round runs every command on every size), after one untimed warm-up
of each; the table gives the median and the range of the rounds, and the growth from the
smallest store to the largest. ``--before PATH`` times the same commands with
PYTHONPATH=PATH too (another checkout of the package, e.g. the code before a change), on
hard-linked copies of the stores so that each keeps its own index. The Markdown table goes to
stdout, the samples to ``benchmarks/results/runs_store.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
ENGINES = [("native", "0.1.0"), ("verl", "0.9.1"), ("openrlhf", "0.11.2"), ("nemo-rl", "0.7.0")]
EXPERIMENTS = 20
UPDATES = 200
START = 1767225600  # 2026-01-01T00:00:00Z
GENERATOR = 2  # bump when the generated store changes, so old copies are regenerated


def _sha(*parts: object) -> str:
    return "sha256:" + hashlib.sha256(repr(parts).encode()).hexdigest()


def _plan_template() -> dict[str, Any]:
    """A real plan of the support-routing example on the native engine."""
    from stateset_backend import __version__
    from stateset_backend.adapters.native.adapter import NativeAdapter
    from stateset_backend.engines.registry import AdapterEntry
    from stateset_backend.plan.launch_plan import make_plan
    from stateset_backend.spec.files import load_spec

    examples = ROOT / "examples"
    entry = AdapterEntry(NativeAdapter(), "builtin", "stateset-backend", __version__)
    plan = make_plan(load_spec(examples / "support-routing.json"), entry, __version__,
                     base_dir=examples)
    return plan.to_json()


def _result(run_id: str, attempt: int, plan: dict[str, Any], status: str,
            rng: random.Random, started: int) -> dict[str, Any]:
    done = UPDATES if status == "succeeded" else rng.randrange(0, UPDATES, 10)
    checkpoints = [s for s in range(50, done + 1, 50)]
    artifacts = [{"path": f"checkpoints/update-{s:06d}/{name}", "kind": "checkpoint", "step": s,
                  "bytes": size, "sha256": hashlib.sha256(f"{run_id}{s}{name}".encode())
                  .hexdigest()}
                 for s in checkpoints for name, size in (("weights.safetensors", 4_718_592),
                                                         ("manifest.json", 2_048))]
    artifacts.append({"path": "metrics.jsonl", "kind": "metrics", "step": None,
                      "bytes": 61_440, "sha256": hashlib.sha256(run_id.encode()).hexdigest()})
    reward = round(0.2 + 0.6 * done / UPDATES + rng.uniform(-0.05, 0.05), 4)
    ok = status == "succeeded"
    checks = [{"name": "exit_code", "ok": status not in ("failed", "interrupted"),
               "detail": {"failed": "engine exited 1: RuntimeError: CUDA error: an illegal "
                                    "memory access was encountered",
                          "interrupted": "interrupted: SIGTERM"}.get(status, "engine exited 0")},
              {"name": "identity", "ok": True, "detail": "run id and experiment digest found "
                                                        "in the engine's outputs"},
              {"name": "committed_updates", "ok": done == UPDATES,
               "detail": f"{done} of {UPDATES} planned updates committed"},
              {"name": "metrics_finite", "ok": status != "invalid",
               "detail": "non-finite: loss/policy=nan at step 120" if status == "invalid"
               else f"{done} rows, all finite"},
              {"name": "artifacts", "ok": bool(checkpoints),
               "detail": f"{len(artifacts)} files hashed"}]
    if status == "quarantined":
        checks.append({"name": "quarantine", "ok": False, "detail": "learner update failed at "
                       f"update {done + 1}: NonFiniteUpdate: loss is nan"})
    summary = {"reward/mean": reward, "val/reward/mean": round(reward + 0.03, 4),
               "loss/policy": round(rng.uniform(-0.1, 0.1), 4), "kl": round(rng.uniform(0, .02), 5)}
    return {
        "schema": "stateset-backend/result/v1", "run_id": run_id, "attempt": attempt,
        "experiment_digest": plan["experiment_digest"], "binding_digest": plan["binding_digest"],
        "plan_checksum": plan["checksum"], "engine": plan["engine"],
        "engine_version": plan["engine_version"], "provider": "local", "status": status,
        "exit_code": {"succeeded": 0, "invalid": 0, "interrupted": None}.get(status, 1),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "ended_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started + 600)),
        "duration_s": 600.0, "planned_updates": UPDATES, "committed_updates": done,
        "resumed_from": {"attempt": attempt - 1, "update": 100} if attempt > 1 and rng.random()
        < 0.5 else None,
        "selection": {"select_by": "val/reward/mean", "direction": "max", "candidates": 4,
                      "update": checkpoints[-1], "value": summary["val/reward/mean"],
                      "checkpoint": f"checkpoints/update-{checkpoints[-1]:06d}",
                      "attempt": attempt} if ok and checkpoints else None,
        "deviations": plan["deviations"],
        "metrics": {"series": "metrics.jsonl", "summary": summary,
                    "initial": {"reward/mean": 0.2, "val/reward/mean": 0.21},
                    "raw_names": {k: k for k in summary}},
        "artifacts": artifacts, "checks": checks, "warnings": []}


def _statuses(rng: random.Random) -> tuple[list[str], str | None]:
    """The attempts of one run and its quarantine mark (None, "active" or "cleared")."""
    x = rng.random()
    for bound, attempts, mark in ((0.80, ["succeeded"], None),
                                  (0.86, ["failed", "succeeded"], None),
                                  (0.90, ["failed"], None), (0.93, ["invalid"], None),
                                  (0.96, ["interrupted"], None),
                                  (0.975, ["interrupted", "succeeded"], None),
                                  (0.99, ["quarantined"], "active"),
                                  (0.995, ["quarantined"], "cleared")):
        if x < bound:
            return attempts, mark
    return ["unreadable"], None


def generate(root: Path, runs: int, seed: int = 0) -> None:
    """Write ``runs`` run directories as the runner leaves them (no index: `runs reindex`)."""
    rng = random.Random(seed)
    template = _plan_template()
    digests = [_sha("experiment", k) for k in range(EXPERIMENTS)]
    root.mkdir(parents=True)
    for i in range(runs):
        created = START + i * 37
        run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(created)) + \
            f"-{rng.getrandbits(32):08x}"
        k = rng.randrange(EXPERIMENTS)
        engine, version = ENGINES[(k + i) % len(ENGINES)] if rng.random() < 0.3 else \
            ENGINES[k % len(ENGINES)]
        plan = {**template, "run_id": run_id, "experiment_digest": digests[k],
                "binding_digest": _sha("binding", k, engine, version), "engine": engine,
                "engine_version": version, "checksum": _sha("plan", run_id),
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)),
                "spec": {**template["spec"], "seed": rng.randrange(1, 6)},
                "deviations": [] if engine == "native" else [
                    {"setting": "algorithm.kl.clamp", "deviation": "kl_clamp_unsupported",
                     "description": f"{engine} does not clamp the KL term"}]}
        run_dir = root / run_id
        (run_dir / "attempts").mkdir(parents=True)
        (run_dir / "plan.json").write_text(json.dumps(plan, indent=2))
        statuses, mark = _statuses(rng)
        latest = None
        for n, status in enumerate(statuses, 1):
            folder = run_dir / "attempts" / str(n)
            folder.mkdir()
            latest = folder / "result.json"
            if status == "unreadable":  # a result cut short by a full disk
                latest.write_text(json.dumps(_result(run_id, n, plan, "succeeded", rng,
                                                     created))[:700])
            else:
                latest.write_text(json.dumps(_result(run_id, n, plan, status, rng,
                                                     created + 700 * n), indent=2))
        assert latest is not None
        os.link(latest, run_dir / "result.json")  # the store writes the same document twice
        if mark is not None:
            doc = {"quarantined": mark == "active", "fault": "learner_update",
                   "reason": "NonFiniteUpdate: loss is nan", "update": 121, "attempt": 1,
                   "marked_at": "2026-01-02T00:00:00Z"}
            if mark == "cleared":
                doc.update(cleared_at="2026-01-03T00:00:00Z", cleared_by={"update": 100})
            (run_dir / "quarantine.json").write_text(json.dumps(doc))
        if statuses[-1] == "succeeded" and rng.random() < 0.05:
            (run_dir / "evaluations").mkdir()
            (run_dir / "evaluations" / "test-attempt1-update-000200.json").write_text(
                json.dumps({"schema": "stateset-backend/evaluation/v1", "run_id": run_id,
                            "attempt": len(statuses), "split": "test",
                            "checkpoint": {"requested": "recommended", "update": 200},
                            "metrics": {"test/reward/mean": round(rng.random(), 4)}}))


def store(stores: Path, runs: int) -> Path:
    """The generated store of ``runs`` runs, made once."""
    root = stores / f"{runs}"
    stamp = root / ".generated"
    if stamp.is_file() and stamp.read_text() == f"{GENERATOR}":
        return root
    shutil.rmtree(root, ignore_errors=True)
    t0 = time.perf_counter()
    generate(root, runs)
    stamp.write_text(f"{GENERATOR}")
    print(f"generated {runs} runs in {time.perf_counter() - t0:.1f} s: {root}", file=sys.stderr)
    return root


def linked_copy(root: Path, where: Path) -> Path:
    """The same run files (hard links), without the index: a store of its own for other code."""
    if not (where / ".generated").is_file() or \
            (where / ".generated").read_text() != (root / ".generated").read_text():
        shutil.rmtree(where, ignore_errors=True)
        subprocess.run(["cp", "-al", str(root), str(where)], check=True)
        for name in ("index.sqlite", ".quarantined"):
            path = where / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    return where


def _time(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    # not from the checkout: `-m` puts the working directory first on the path
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env, cwd=RESULTS)
    return time.perf_counter() - t0


def _commands(root: Path) -> dict[str, list[str]]:
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(root / "index.sqlite")) as conn:
        newest = conn.execute("SELECT MAX(run_id) FROM attempts").fetchone()[0]
        digest = conn.execute("SELECT experiment_digest FROM attempts WHERE run_id = ?",
                              [newest]).fetchone()[0]
    cli = [sys.executable, "-m", "stateset_backend"]
    at = ["--runs-dir", str(root)]
    return {"runs list": [*cli, "runs", "list", *at],
            "runs list --json": [*cli, "runs", "list", *at, "--json"],
            "runs show PREFIX": [*cli, "runs", "show", *at, newest[:-3]],
            "runs compare DIGEST": [*cli, "runs", "compare", *at, digest[7:19]],
            "runs compare DIGEST --json": [*cli, "runs", "compare", *at, digest[7:19],
                                           "--json"],
            "--version (floor)": [*cli, "--version"]}


def _row(name: str, samples: dict[int, list[float]]) -> str:
    cells = [f"{statistics.median(s):.3f} ({min(s):.3f}-{max(s):.3f})"
             for s in samples.values()]
    medians = [statistics.median(s) for s in samples.values()]
    return f"| {name} | " + " | ".join(cells) + f" | x{medians[-1] / medians[0]:.2f} |"


def main_() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000",
                        help="store sizes in runs, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reindex-rounds", type=int, default=3)
    parser.add_argument("--stores", type=Path, default=RESULTS / "stores")
    parser.add_argument("--before", metavar="PYTHONPATH",
                        help="also time the package found on this path (e.g. a checkout of "
                             "the code before a change)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    pythonpath = os.environ.get("PYTHONPATH", "")
    # as an installed package runs: from compiled bytecode (kept apart, under the results)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(RESULTS / "pycache")
    codes = {"": env}
    if args.before:
        codes["before: "] = {**env, "PYTHONPATH": os.pathsep.join(
            [args.before, *[p for p in pythonpath.split(os.pathsep) if p and
                            Path(p).resolve() != ROOT]])}
    RESULTS.mkdir(parents=True, exist_ok=True)
    roots = {(code, n): store(args.stores, n) if not code else
             linked_copy(store(args.stores, n), args.stores / f"before-{n}")
             for code in codes for n in sizes}

    reindex: dict[tuple[str, int], list[float]] = {key: [] for key in roots}
    for _ in range(args.reindex_rounds):
        for (code, n), root in roots.items():
            reindex[code, n].append(_time([sys.executable, "-m", "stateset_backend", "runs",
                                           "reindex", "--runs-dir", str(root)], codes[code]))
    commands = {key: _commands(root) for key, root in roots.items()}
    samples: dict[str, dict[int, list[float]]] = {}
    for key in roots:  # warm-up, not counted (and a failing command stops here)
        for argv in commands[key].values():
            _time(argv, codes[key[0]])
    for _ in range(args.rounds):
        for (code, n) in roots:
            for name, argv in commands[code, n].items():
                samples.setdefault(code + name, {}).setdefault(n, []).append(
                    _time(argv, codes[code]))

    print(f"\n{args.rounds} rounds (reindex: {args.reindex_rounds}), fresh process each, "
          "seconds: median (min-max)\n")
    print("| command | " + " | ".join(f"{n:,} runs" for n in sizes) +
          f" | {sizes[-1] // sizes[0]}x runs |")
    print("|---|" + "---|" * (len(sizes) + 1))
    for code in codes:
        print(_row(f"{code}runs reindex", {n: reindex[code, n] for n in sizes}))
    for name, by_size in samples.items():
        print(_row(name, by_size))
    (RESULTS / "runs_store.json").write_text(json.dumps({
        "rounds": args.rounds, "sizes": sizes,
        "reindex": {f"{code}{n}": s for (code, n), s in reindex.items()},
        "commands": samples}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main_())
