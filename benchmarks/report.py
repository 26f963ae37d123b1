"""Report generation time for a 200-update run (and for an experiment overlaying its runs).

    python benchmarks/report.py [--updates 200] [--copies 3] [--runs-dir DIR]

Trains one real native run of the tiny support-routing model (validation every 10 updates,
a checkpoint every 50), unless --runs-dir names a store that already holds a run, then
times the CLI's `report RUN` in a fresh interpreter, as a user runs it (so matplotlib's
import is counted), and in this process (drawing and writing only). For the experiment page
the run's records are copied under new run ids into a scratch store (--copies), so the
digest report overlays that many 200-update runs; the store named by --runs-dir is only
read.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stateset_backend.cli import main
from stateset_backend.publish.report import report
from stateset_backend.runs.store import RunStore

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def spec(updates: int) -> dict:
    doc = json.loads((EXAMPLES / "support-routing.json").read_text())
    for split in ("train", "validation", "test"):
        doc["data"][split]["uri"] = str(EXAMPLES / doc["data"][split]["uri"])
    doc["reward"]["entrypoint"] = str(EXAMPLES / doc["reward"]["entrypoint"])
    doc["algorithm"] = {"objective": "grpo", "group_size": 2,
                        "kl": {"coef": 0.01, "estimator": "k3", "placement": "loss"}}
    doc["data"]["max_response_tokens"] = 2
    doc["data"]["chat_template"] = False
    doc["budget"] = {"total_updates": updates, "prompts_per_update": 2, "ppo_epochs": 1,
                     "mini_batches": 1}
    doc["checkpoint"] = {"every": 50, "keep": None}
    doc["evaluation"] = {"every": 10, "select_by": "val/reward/mean"}
    return doc


def copy_run(source: RunStore, target: RunStore, run_id: str, n: int) -> str:
    """The run's plan, results and metric series under another id, in another store: one more
    run of the same experiment for the overlay (checkpoints are not copied; the page lists
    their recorded hashes)."""
    new_id = f"{run_id[:-8]}{n:08x}"
    src, dst = source.run_dir(run_id), target.run_dir(new_id)
    for path in [src / "plan.json", *src.glob("attempts/*/result.json"),
                 *src.glob("attempts/*/canonical_metrics.jsonl")]:
        to = dst / path.relative_to(src)
        to.parent.mkdir(parents=True, exist_ok=True)
        to.write_text(path.read_text().replace(run_id, new_id))
    return new_id


def main_() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--runs-dir", help="time reports over this store instead of training")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.runs_dir) if args.runs_dir else Path(tmp) / "runs"
        train_s = None
        if not args.runs_dir:
            (Path(tmp) / "spec.json").write_text(json.dumps(spec(args.updates)))
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                assert main(["run", "--engine", "native", "--runs-dir", str(root), "--quiet",
                             str(Path(tmp) / "spec.json")]) == 0
            train_s = time.perf_counter() - t0
        store = RunStore(root)
        rows = store.query()
        run_id, digest = rows[0]["run_id"], rows[0]["experiment_digest"]
        updates = rows[0]["committed_updates"]
        out = Path(tmp) / "report.html"
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "stateset_backend", "report", "--runs-dir",
                        str(root), run_id, "-o", str(out)], check=True, capture_output=True)
        cli_s = time.perf_counter() - t0
        report(store, run_id, out)  # warm matplotlib's font cache and imports
        t0 = time.perf_counter()
        report(store, run_id, out)
        warm_s = time.perf_counter() - t0
        size = out.stat().st_size
        overlay = RunStore(Path(tmp) / "overlay")
        for n in range(args.copies + 1):
            copy_run(store, overlay, run_id, n)
        overlay.reindex()
        t0 = time.perf_counter()
        _, records, _ = report(overlay, digest, out)
        overlay_s = time.perf_counter() - t0
        result = {"updates": updates, "train_s": round(train_s, 1) if train_s else None,
                  "report_run_cli_s": round(cli_s, 2), "report_run_in_process_s":
                  round(warm_s, 3), "report_run_bytes": size,
                  "report_digest_runs": len(records),
                  "report_digest_in_process_s": round(overlay_s, 3),
                  "report_digest_bytes": out.stat().st_size}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main_())
