"""``python -m stateset_backend.runs.abandoned ATTEMPT_DIR``: what the tether of a killed
``run`` runs once it has stopped the engine, so that the attempt reads as interrupted with what
it committed, in its folder and in the index, before anyone looks (runner.record_abandoned).

It is a process of its own because the process that would have recorded the attempt is the
one that died; it loads the plugins and the result model only now, never while the engine
runs, so the tether that waits for this moment stays small.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from stateset_backend.common.errors import StatesetError
    from stateset_backend.engines.registry import build_registry
    from stateset_backend.plan.launch_plan import load_plan
    from stateset_backend.runs.runner import record_abandoned
    from stateset_backend.runs.store import RunStore

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0]:
        print("usage: python -m stateset_backend.runs.abandoned ATTEMPT_DIR", file=sys.stderr)
        return 2
    attempt_dir = Path(args[0]).resolve()
    run_dir = attempt_dir.parent.parent
    try:
        plan = load_plan(run_dir / "plan.json")
        adapter = build_registry().get(plan.engine).adapter
        done = record_abandoned(plan, adapter, RunStore(run_dir.parent),
                                only=int(attempt_dir.name))
    except (StatesetError, OSError, ValueError) as exc:
        print(f"stateset-backend: {attempt_dir}: could not record the attempt: {exc}",
              file=sys.stderr)
        return 1
    for result, path in done:
        print(f"stateset-backend: run {result.run_id} attempt {result.attempt} recorded as "
              f"{result.status} after {result.committed_updates}/{result.planned_updates} "
              f"updates (result: {path})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
