"""Long fuzz run: mutated specs through the CLI's own main(); counts exit codes and lists any
spec that breaks a rule of the project: exit 1 (a bug of ours), an exception escaping main(),
an adapter bug reported for a spec validate accepted, an error that is not one line on
stderr, and, for plans made, an interpolation left for OmegaConf or an argv the engine would
parse differently.

    python benchmarks/fuzz.py --n 10000 [--seed 0] [--hostile 0.8] [--max-seconds S]
                              [--out benchmarks/results/fuzz.json]

Two mutators (tests/spec_fuzz.py): ``mutate``, values of the wrong shape on the conformance
specs, and ``hostile``, hostile strings, paths, numbers, Unicode, option keys and sizes on the
examples, written beside a copy of their data so most reach the adapters. ``--hostile`` is the
share of specs from the second.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from spec_fuzz import RULES, hostile, load_bases, make_workspace, mutate, probe, write_spec  # noqa: E402

from stateset_backend.conformance.specs import FULL_DAPO, FULL_PPO, MINIMAL  # noqa: E402

# The rules (spec_fuzz.RULES); stderr_on_success, c1_control_in_stderr and the like are
# counted, not bugs.
BUGS = RULES


def _signature(finding: dict[str, object]) -> str:
    """Findings that differ only in the user's strings or numbers count as one."""
    command = finding["command"]
    assert isinstance(command, list)
    engine = command[command.index("--engine") + 1] if "--engine" in command else ""
    text = str(finding.get("stderr") or finding.get("error") or finding.get("option") or
               finding.get("element") or finding.get("exception") or "")
    text = re.sub(r"'[^']*'|\"[^\"]*\"|/\S+|\d+", "_", text)[:90]
    return f"{finding['kind']}|{command[0]}|{engine}|{text}"


def main_() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hostile", type=float, default=0.8,
                        help="share of specs from the hostile mutator (default 0.8)")
    parser.add_argument("--max-seconds", type=float, help="stop after this long")
    parser.add_argument("--quick", action="store_true",
                        help="skip the Hydra and argparse read-back checks of each plan")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    classic = [MINIMAL, FULL_DAPO, FULL_PPO,
               json.loads((ROOT / "examples" / "support-routing.json").read_text()),
               json.loads((ROOT / "examples" / "external" / "grpo.json").read_text())]
    rng = random.Random(args.seed)
    codes: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    mutations: Counter[str] = Counter()
    plans: Counter[str] = Counter()
    seen: dict[str, dict[str, object]] = {}
    specs = probes = valid = 0
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = make_workspace(Path(tmp) / "examples")
        bases = load_bases(work)
        bare = Path(tmp) / "bare"
        bare.mkdir()
        plan_dir = Path(tmp) / "plans"
        plan_dir.mkdir()
        for i in range(args.n):
            if args.max_seconds and time.monotonic() - start > args.max_seconds:
                break
            if rng.random() < args.hostile:
                here, base = rng.choice(bases)
                doc, applied = hostile(base, rng, steps=rng.randint(1, 3), here=here)
                mutations.update(applied)
                which = "hostile"
            else:
                here, doc, which = bare, mutate(rng.choice(classic), rng,
                                                steps=rng.randint(1, 4)), "classic"
            path = here / "spec.json"
            text = write_spec(path, doc, rng)
            result = probe(path, plan_dir, all_checks=not args.quick)
            specs += 1
            valid += result.valid
            probes += len(result.codes)
            plans.update(result.plans_ok)
            for command, code in result.codes:
                codes[f"{command}:{code}"] += 1
            for finding in result.findings:
                kinds[finding["kind"]] += 1
                sig = _signature(finding)
                if sig not in seen:
                    seen[sig] = {"i": i, "mutator": which, **finding, "count": 0,
                                 "folder": str(here.relative_to(tmp)),
                                 "spec": text.decode("utf-8", "replace")[:20_000]}
                seen[sig]["count"] = int(str(seen[sig]["count"])) + 1
            if (i + 1) % 500 == 0:
                print(f"{i + 1} specs, {time.monotonic() - start:.0f}s, findings "
                      f"{dict(kinds)}", file=sys.stderr, flush=True)
    seconds = time.monotonic() - start
    by_code: Counter[int | None] = Counter()
    for key, count in codes.items():
        by_code[key.rsplit(":", 1)[1]] += count
    bugs = {sig: f for sig, f in seen.items() if f["kind"] in BUGS}
    report = {"specs": specs, "seed": args.seed, "hostile_share": args.hostile,
              "seconds": round(seconds, 1), "specs_per_second": round(specs / seconds, 1),
              "probes": probes, "valid_specs": valid, "plans_made": dict(plans),
              "exit_codes_by_command": dict(sorted(codes.items())),
              "exit_codes": dict(sorted(by_code.items())),
              "exit_1": sum(c for k, c in codes.items() if k.endswith(":1")),
              "adapter_bugs": kinds["adapter_bug"], "multi_line_errors": kinds["multiline"],
              "escaped": kinds["escaped"], "finding_counts": dict(sorted(kinds.items())),
              "mutations": dict(sorted(mutations.items())),
              "distinct_bugs": len(bugs), "bugs": list(bugs.values()),
              "other_findings": [f for sig, f in seen.items() if sig not in bugs][:20]}
    text = json.dumps(report, indent=2, default=str, ensure_ascii=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    summary = {k: v for k, v in report.items() if k not in ("bugs", "other_findings")}
    print(json.dumps(summary, indent=2, default=str))
    return 1 if bugs else 0


if __name__ == "__main__":
    raise SystemExit(main_())
