"""How long a user waits to learn that verl cannot run their spec: stateset-backend vs verl.

The request: GRPO with population-std advantages, which verl cannot express (its GRPO divides by
the unbiased std). ``stateset-backend run --engine verl`` refuses it with exit 3 before anything
starts. verl itself has no way to refuse it; the least a user pays to learn anything from verl
is for it to start and print its composed config (``--cfg job --resolve``) for the same request
in verl's own terms. Both are timed as fresh processes, interleaved, median of N rounds.

    python benchmarks/unsupported_exit.py --verl-python /path/to/verl-env/bin/python
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _time(argv: list[str], expect: int) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != expect:
        sys.exit(f"{argv[:4]} exited {proc.returncode}, expected {expect}:\n{proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verl-python", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cli = shutil.which("stateset-backend") or sys.exit("stateset-backend is not installed")
    sys.path.insert(0, str(ROOT / "tests" / "engines"))
    from test_verl import golden  # the golden verl specs double as realistic requests

    from stateset_backend.adapters.verl.adapter import VerlAdapter
    from stateset_backend.engines.registry import AdapterEntry
    from stateset_backend.plan.launch_plan import make_plan
    from stateset_backend.spec.files import parse_spec

    work = Path(tempfile.mkdtemp())
    bad = golden({"objective": "grpo", "advantage": {"std": "population"}})
    (work / "bad.json").write_text(json.dumps(bad))
    # the same request in verl's terms: the closest verl can get (it ignores the std kind)
    ok = golden({"objective": "grpo"})
    plan = make_plan(parse_spec(ok), AdapterEntry(VerlAdapter(), "builtin", "stateset-backend",
                                                  "0"), "0.9.1", base_dir=work)
    overrides = [a.replace("{run_dir}", str(work)) for a in plan.argv[3:]]
    ours = [cli, "run", "--engine", "verl", "--python", args.verl_python, "--runs-dir",
            str(work / "runs"), str(work / "bad.json")]
    verl = [args.verl_python, "-m", "verl.trainer.main_ppo", *overrides, "--cfg", "job",
            "--resolve"]
    samples: dict[str, list[float]] = {"stateset-backend exit 3": [], "verl --cfg job": []}
    for _ in range(args.rounds):
        samples["stateset-backend exit 3"].append(_time(ours, 3))
        samples["verl --cfg job"].append(_time(verl, 0))
    med = {k: statistics.median(v) for k, v in samples.items()}
    ratio = med["verl --cfg job"] / med["stateset-backend exit 3"]
    for name, value in med.items():
        print(f"{name:26} {value:7.3f} s")
    print(f"verl takes {ratio:.1f}x longer just to show its config (and would then run)")
    print(json.dumps({"rounds": args.rounds, "median_s": med, "ratio": round(ratio, 1)}))


if __name__ == "__main__":
    main()
