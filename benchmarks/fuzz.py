"""Long fuzz run: mutated specs through the CLI's own main(); counts exit codes and lists any
spec that ends in exit 1 (a bug of ours) or escapes main() with an exception.

    python benchmarks/fuzz.py --n 10000 [--seed 0] [--out benchmarks/results/fuzz.json]

The mutations are the ones the test suite runs a few dozen of (tests/spec_fuzz.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from spec_fuzz import mutate  # noqa: E402

from stateset_backend.cli import main  # noqa: E402
from stateset_backend.conformance.specs import FULL_DAPO, FULL_PPO, MINIMAL  # noqa: E402

ENGINES = (("native", "0.1.0"), ("verl", "0.9.1"), ("openrlhf", "0.11.2"),
           ("nemo-rl", "0.7.0"))


def _run(*args: str) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(list(args))


def main_() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    bases = [MINIMAL, FULL_DAPO, FULL_PPO,
             json.loads((ROOT / "examples" / "support-routing.json").read_text()),
             json.loads((ROOT / "examples" / "external" / "grpo.json").read_text())]
    rng = random.Random(args.seed)
    codes: Counter[str] = Counter()
    bugs: list[dict[str, object]] = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.json"
        for i in range(args.n):
            doc = mutate(rng.choice(bases), rng, steps=rng.randint(1, 4))
            path.write_text(json.dumps(doc, ensure_ascii=True))
            calls = [("validate", str(path))]
            try:
                code = _run(*calls[0])
                codes[f"validate:{code}"] += 1
                if code == 0:
                    calls = [("explain", "--all-engines", "--effective", "--json", str(path))]
                    calls += [("plan", "--engine", e, "--engine-version", v, str(path))
                              for e, v in ENGINES]
                    for call in calls:
                        code = _run(*call)
                        codes[f"{call[0]}:{code}"] += 1
                        if code not in (0, 2, 3):
                            bugs.append({"i": i, "call": call[0], "code": code, "spec": doc})
            except BaseException as exc:  # counting what escapes main() is the point
                bugs.append({"i": i, "escaped": repr(exc), "spec": doc})
    report = {"n": args.n, "seed": args.seed, "seconds": round(time.monotonic() - start, 1),
              "exit_codes": dict(sorted(codes.items())), "bugs": len(bugs),
              "first_bugs": bugs[:5]}
    text = json.dumps(report, indent=2, default=str)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    return 1 if bugs else 0


if __name__ == "__main__":
    raise SystemExit(main_())
