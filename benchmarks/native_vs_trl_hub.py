"""Native engine vs the TRL plugin, both run through the hub on one spec, side by side.

The same spec (examples/support-routing.json, the tiny Llama on support routing) is planned
for both engines: one experiment digest. Each is run with `stateset-backend run`, in its own
process tree, one after the other. Reported per engine: the experiment digest, committed
updates, updates per second over the whole attempt (engine start-up and model load included,
as a user waits for them), peak RSS of the run's process tree, the final and last-20 mean
training reward, the validation reward (the spec's greedy validation, untrained and final, by
each engine's own validation path), and the declared deviations; then the ratio native / TRL.

    pip install examples/plugins/stateset-trl-engine
    python benchmarks/native_vs_trl_hub.py [--updates 200] [--out benchmarks/results/hub.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "examples" / "support-routing-trl.json"
# Runs the CLI and reports the peak RSS of its whole process tree (children it waited for).
WRAPPER = ("import json, resource, subprocess, sys\n"
           "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
           "print(json.dumps({'code': code, 'peak_kib': "
           "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))\n")


def _spec(updates: int, folder: Path) -> Path:
    doc = json.loads(SPEC.read_text())
    base = SPEC.parent
    for split in ("train", "validation", "test"):
        if doc["data"].get(split):
            doc["data"][split]["uri"] = str(base / doc["data"][split]["uri"])
    doc["reward"]["entrypoint"] = str(base / doc["reward"]["entrypoint"])
    doc["budget"]["total_updates"] = updates
    path = folder / "spec.json"
    path.write_text(json.dumps(doc))
    return path


def _run(engine: str, spec: Path, runs: Path) -> dict[str, Any]:
    cli = [sys.executable, "-m", "stateset_backend", "run", "--engine", engine, "--quiet",
           "--runs-dir", str(runs / engine), str(spec)]
    proc = subprocess.run([sys.executable, "-c", WRAPPER, *cli], capture_output=True,
                          text=True, check=True)
    outcome = json.loads(proc.stdout)
    (result_path,) = (runs / engine).glob("*/result.json")
    result = json.loads(result_path.read_text())
    series = result_path.parent / "attempts" / str(result["attempt"]) / \
        (result["metrics"]["series"] or "")
    rewards = [row["reward/mean"] for row in map(json.loads, series.read_text().splitlines())
               if "reward/mean" in row] if series.is_file() else []
    return {"exit_code": outcome["code"], "status": result["status"],
            "experiment_digest": result["experiment_digest"],
            "committed_updates": result["committed_updates"],
            "duration_s": result["duration_s"],
            "updates_per_s": round(result["committed_updates"] / result["duration_s"], 3),
            "peak_rss_mib": round(outcome["peak_kib"] / 1024, 1),
            "final_reward": result["metrics"]["summary"].get("reward/mean"),
            "validation_reward": [result["metrics"]["initial"].get("val/reward/mean"),
                                  result["metrics"]["summary"].get("val/reward/mean")],
            "last20_reward": round(sum(rewards[-20:]) / max(1, len(rewards[-20:])), 4),
            "deviations": [d["deviation"] for d in result["deviations"]]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spec = _spec(args.updates, Path(tmp))
        native = _run("native", spec, Path(tmp) / "runs")
        trl = _run("trl", spec, Path(tmp) / "runs")
    report = {"updates": args.updates, "native": native, "trl": trl,
              "same_digest": native["experiment_digest"] == trl["experiment_digest"],
              "updates_per_s_ratio": round(native["updates_per_s"] / trl["updates_per_s"], 2),
              "peak_rss_ratio": round(native["peak_rss_mib"] / trl["peak_rss_mib"], 2)}
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
