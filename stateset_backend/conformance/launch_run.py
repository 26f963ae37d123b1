"""A launch run for real under a stub of the engine: the generated files written into an attempt
folder, the argv's placeholders filled as the runner fills them, and the process started with
the stub's modules first on the path. What the stub received is compared with what the launch
declares (read as the engine reads it), and the kit's reward cases must score as the sample
reward says: a launcher is a program, not a string that compiles.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from stateset_backend.common.jsonio import flatten
from stateset_backend.conformance.checks import CheckFailed, normalize_values, same_value
from stateset_backend.conformance.stubs import common
from stateset_backend.engines.adapter import ENGINE_HOME, RUN_DIR, EngineAdapter, LaunchContext
from stateset_backend.plan.launch_plan import LaunchPlan
from stateset_backend.providers.local import Exit
from stateset_backend.runs.results import evaluate
from stateset_backend.runs.runner import fill_placeholders

# the kit's sample reward (samples.REWARD_SOURCE) scores 1 when the answer is in the response
# and the prompt is not empty
CASES = [{"prompt": "Route: my card was charged twice", "response": "billing, I think",
          "answer": "billing"},
         {"prompt": "Route: my card was charged twice", "response": "shipping",
          "answer": "billing"}]
EXPECTED_REWARDS = [1.0, 0.0]
TIMEOUT_S = 120


def _argv(plan: LaunchPlan, run_dir: Path, stub_root: Path) -> list[str]:
    """The launch's argv as the runner fills it; a leading ``uv run --project X`` (an engine
    run from its own project) runs with this interpreter instead."""
    argv = [fill_placeholders(a, run_dir, sys.executable, str(stub_root)) for a in plan.argv]
    if argv[:2] == ["uv", "run"]:
        rest = argv[2:]
        while rest and rest[0].startswith("-"):
            rest = rest[2:] if rest[0] in ("--project", "--directory", "--with") else rest[1:]
        argv = rest
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def run_under_stub(plan: LaunchPlan, stub: dict[str, str], tmp: Path) -> dict[str, Any]:
    """Run the plan's launch with ``stub`` (relative path -> source) standing in for the engine;
    returns what the stub received. Fails when the launch does not reach the stub."""
    run_dir, stub_root = tmp / "attempt", tmp / "engine"
    for root, files in ((run_dir, plan.files),
                        (stub_root, {"stateset_kit_stub.py": common(), **stub})):
        root.mkdir(parents=True, exist_ok=True)  # a launch of flags alone writes no file
        for rel, text in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    out = tmp / "received.json"
    set_env = {k: fill_placeholders(v, run_dir, sys.executable, str(stub_root))
               for k, v in plan.set_env.items()}
    env = {**os.environ, **set_env, "STATESET_KIT_RECEIVED": str(out),
           "STATESET_KIT_CASES": json.dumps(CASES), "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": os.pathsep.join([str(stub_root), str(run_dir),
                                          *filter(None, [os.environ.get("PYTHONPATH")])])}
    argv = _argv(plan, run_dir, stub_root)
    try:
        proc = subprocess.run(argv, cwd=run_dir, env=env, capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CheckFailed(f"the launch {argv[:3]} cannot run under the engine stub: "
                          f"{exc}") from None
    if proc.returncode != 0 or not out.is_file():
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise CheckFailed(f"the launch {argv[:4]} does not reach the engine's entry point "
                          f"with what it needs (exit {proc.returncode}): {tail}")
    doc: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return doc


def _placeholders(node: Any, paths: dict[str, str]) -> Any:
    """Real paths of this run put back as the launch's placeholders, to compare with it."""
    if isinstance(node, str):
        for real, placeholder in paths.items():
            node = node.replace(real, placeholder)
        return node
    if isinstance(node, list):
        return [_placeholders(v, paths) for v in node]
    if isinstance(node, dict):
        return {k: _placeholders(v, paths) for k, v in node.items()}
    return node


def check_launch_runs(plan: LaunchPlan, stub: dict[str, str], read: dict[str, Any],
                      tmp: Path, surface: dict[str, Any] | None = None,
                      adapter: EngineAdapter | None = None) -> int:
    """The launch run under ``stub``: the argv the entry point gets is the launch's, every key
    the stub received as the engine's configuration is the one the launch declares (relative
    paths resolved against the attempt folder) and none of the engine's keys (its
    ``surface``) the launch sets is missing from it, and the reward cases score as the sample
    reward does, and every prompt the stub reports is handed to the policy as the model's chat
template renders it with its generation prompt and to the reward as its last user message.
A stub that trained (``logged``: canonical rows per update) is collected by
    the adapter: the run succeeds with exactly those values and updates. Returns how many
    things were compared."""
    got = run_under_stub(plan, stub, tmp)
    compared = 0
    run_dir = tmp / "attempt"
    expected_argv = _argv(plan, run_dir, tmp / "engine")
    if "argv" in got:
        tail = expected_argv[-len(got["argv"]):] if got["argv"] else []
        if got["argv"] != tail:
            raise CheckFailed(f"the engine's entry point receives {got['argv'][:6]}..., not "
                              "the launch's arguments: the launcher changes what it hands on")
        compared += 1
    declared = flatten(normalize_values(read, plan))
    placed = _placeholders(got.get("config") or {}, {str(run_dir): RUN_DIR,
                                                     str(tmp / "engine"): ENGINE_HOME})
    handed = flatten(normalize_values(placed, plan))
    options = (surface or {}).get("options", {})
    dropped = sorted(k for k in declared if k in options and k not in handed)
    if got.get("config") and dropped:
        raise CheckFailed(f"the launcher does not hand {dropped[:4]} to the engine, though "
                          "the launch sets them")
    for key, value in handed.items():
        if key not in declared:
            continue
        want = declared[key]
        if not (same_value(value, want) or value == f"{RUN_DIR}/{want}"):
            raise CheckFailed(f"{key}: the engine receives {value!r} from the launcher, but "
                              f"the launch declares {want!r}")
        compared += 1
    if "rewards" in got:
        if [float(r) for r in got["rewards"]] != EXPECTED_REWARDS:
            raise CheckFailed(f"the reward, called as the engine calls it, scores the kit's "
                              f"cases {got['rewards']}, but the spec's reward scores them "
                              f"{EXPECTED_REWARDS}: the reward shim does not answer the "
                              "engine's call")
        compared += 1
    for prompt in got.get("prompts") or []:
        if prompt["seen"] != prompt["template"]:
            raise CheckFailed(f"the launcher hands the policy the prompt {prompt['seen']!r}, "
                              f"where the model's chat template with its generation prompt "
                              f"gives {prompt['template']!r}: the policy would continue "
                              "another turn than its own")
        if prompt["reward_prompt"] != prompt["last_user"]:
            raise CheckFailed(f"the launcher hands the reward the prompt "
                              f"{prompt['reward_prompt']!r}, not the last user message "
                              f"{prompt['last_user']!r}, as the other engines do")
        compared += 1
    if got.get("logged") and adapter is not None:
        compared += _check_collected(adapter, plan, run_dir, got["logged"])
    return compared


def _check_collected(adapter: EngineAdapter, plan: LaunchPlan, run_dir: Path,
                     logged: list[dict[str, Any]]) -> int:
    """What the adapter collects from the stub's run is what the stub logged."""
    ctx = LaunchContext(plan.run_id, plan.experiment_digest, plan.engine_version,
                        plan.resolved_dialect(), plan.base_dir)
    try:
        collected = adapter.collect(run_dir, ctx)
    except Exception as exc:  # the adapter's own error is the finding
        raise CheckFailed(f"collecting the run the stub trained fails: {exc}") from None
    status, results, _ = evaluate(plan, Exit(0), collected, run_dir)
    if status != "succeeded":
        failed = "; ".join(f"{c.name}: {c.detail}" for c in results if not c.ok)
        raise CheckFailed(f"the run the stub trained is collected as {status} ({failed})")
    rows = {int(r["step"]): r for r in collected.metrics}
    for want in logged:
        for name, value in want.items():
            got = rows.get(int(want["step"]), {}).get(name)
            if name != "step" and not same_value(got, value):
                raise CheckFailed(f"update {want['step']}: the engine logged {name} = "
                                  f"{value!r}, the adapter collects {got!r}")
    updates = max(int(r["step"]) for r in logged)
    if collected.committed_updates != updates:
        raise CheckFailed(f"the stub trained {updates} updates, the adapter collects "
                          f"committed_updates = {collected.committed_updates}")
    return len(logged)
