"""`runs list` and `runs compare` over a generated store of many runs (goal: < 0.5 s each).

    python benchmarks/runs_store.py [--runs 1000] [--attempts 2]

Builds a store of synthetic but schema-valid plans and results (four engines, ten
experiments), indexes it, then times the CLI's own `runs list --json` and `runs compare
DIGEST --json`, in this process and as the fresh CLI process a user starts (imports
included; `--version` is the floor of any command), against reading every result.json
directly as the reference.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stateset_backend.cli import main
from stateset_backend.runs.results import Result
from stateset_backend.runs.store import RunStore

ENGINES = [("native", "0.1.0"), ("verl", "0.9.1"), ("openrlhf", "0.11.2"), ("nemo-rl", "0.7.0")]


def _result(run_id: str, attempt: int, digest: str, engine: tuple[str, str]) -> Result:
    return Result.model_validate({
        "schema": "stateset-backend/result/v1", "run_id": run_id, "attempt": attempt,
        "experiment_digest": digest, "binding_digest": "sha256:" + "b" * 64,
        "plan_checksum": "sha256:" + "c" * 64, "engine": engine[0], "engine_version": engine[1],
        "provider": "local", "status": "succeeded", "exit_code": 0,
        "started_at": "2026-01-01T00:00:00Z", "ended_at": "2026-01-01T00:10:00Z",
        "duration_s": 600.0, "planned_updates": 200, "committed_updates": 200,
        "metrics": {"series": None, "summary": {"reward/mean": 0.5, "val/reward/mean": 0.7},
                    "initial": {}, "raw_names": {}},
        "selection": None, "deviations": [], "artifacts": [], "checks": []})


def build(root: Path, runs: int, attempts: int) -> list[str]:
    store = RunStore(root)
    digests = [f"sha256:{hashlib.sha256(str(i).encode()).hexdigest()}" for i in range(10)]
    for i in range(runs):
        run_id = f"20260101T{i // 3600:02d}{i // 60 % 60:02d}{i % 60:02d}Z-{i:08x}"
        digest, engine = digests[i % len(digests)], ENGINES[i % len(ENGINES)]
        run_dir = store.run_dir(run_id)
        run_dir.mkdir(parents=True)
        (run_dir / "plan.json").write_text(json.dumps({
            "run_id": run_id, "experiment_digest": digest, "engine": engine[0],
            "engine_version": engine[1], "checksum": "sha256:" + "c" * 64, "spec": {"seed": 1},
            "deviations": []}))
        for n in range(1, attempts + 1):
            folder = run_dir / "attempts" / str(n)
            folder.mkdir(parents=True)
            (folder / "result.json").write_text(json.dumps(
                _result(run_id, n, digest, engine).to_json()))
    store.reindex()
    return digests


def timed(*args: str) -> float:
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(list(args)) == 0
    return time.perf_counter() - t0


def timed_cli(*args: str, repeat: int = 3) -> float:
    """What the user waits for: a fresh `stateset-backend` process, imports included (the
    best of ``repeat``, so a cold file cache does not count)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "stateset_backend", *args], check=True,
                       stdout=subprocess.DEVNULL)
        best = min(best, time.perf_counter() - t0)
    return best


def main_() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--attempts", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        t0 = time.perf_counter()
        digests = build(root, args.runs, args.attempts)
        built = time.perf_counter() - t0
        t0 = time.perf_counter()
        every = [json.loads(p.read_text()) for p in root.glob("*/attempts/*/result.json")]
        reference = time.perf_counter() - t0
        listed = timed("runs", "list", "--runs-dir", str(root), "--json")
        compared = timed("runs", "compare", "--runs-dir", str(root), digests[0], "--json")
        cli_list = timed_cli("runs", "list", "--runs-dir", str(root), "--json")
        cli_compare = timed_cli("runs", "compare", "--runs-dir", str(root), digests[0][:15],
                                "--json")
        cli_version = timed_cli("--version")
        report = {"runs": args.runs, "attempts": len(every), "build_s": round(built, 2),
                  "runs_list_s": round(listed, 3), "runs_compare_s": round(compared, 3),
                  "cli_runs_list_s": round(cli_list, 3),
                  "cli_runs_compare_s": round(cli_compare, 3),
                  "cli_version_s": round(cli_version, 3),
                  "read_every_result_s": round(reference, 3),
                  "list_vs_reading_every_result": round(listed / reference, 2)}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main_())
