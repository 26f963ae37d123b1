"""Cold-start wall time of `stateset-backend digest` and `validate` against `python3 -c pass`.

Each command runs as a fresh process, interleaved round by round so that machine noise hits
all of them alike; the report is the median of each and its ratio to the bare interpreter.
Goal: digest and validate under 0.3 s.

    python benchmarks/cold_start.py [--rounds 15] [--spec examples/support-routing.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _time(argv: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--spec", default=str(ROOT / "examples" / "support-routing.json"))
    args = parser.parse_args()
    cli = shutil.which("stateset-backend") or sys.exit("stateset-backend is not installed")
    commands = {
        "python3 -c pass": [sys.executable, "-c", "pass"],
        "stateset-backend digest": [cli, "digest", args.spec],
        "stateset-backend validate": [cli, "validate", args.spec],
    }
    for argv in commands.values():  # warm the page cache; not counted
        _time(argv)
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.rounds):
        for name, argv in commands.items():
            samples[name].append(_time(argv))
    baseline = statistics.median(samples["python3 -c pass"])
    report = {name: {"median_s": round(statistics.median(s), 4),
                     "ratio_to_python": round(statistics.median(s) / baseline, 2),
                     "under_0.3s": statistics.median(s) < 0.3}
              for name, s in samples.items()}
    print(f"{'command':28} {'median s':>9} {'x python':>9}")
    for name, row in report.items():
        print(f"{name:28} {row['median_s']:9.4f} {row['ratio_to_python']:9.2f}")
    print(json.dumps({"rounds": args.rounds, "results": report}))


if __name__ == "__main__":
    main()
