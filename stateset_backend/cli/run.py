"""``run`` is the command that trains, so it is the one that guards against training twice:
a plan whose run already has attempts is trained again only when asked (``--resume`` or
``--retry``), and every refusal names the command for each choice."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from stateset_backend.cli.runs_tables import run_summary
from stateset_backend.cli.shared import RUNS_DIR_HELP, Commands, emit, load_registry, read_spec
from stateset_backend.cli.target import engine_options, plan_for, provider_options
from stateset_backend.providers.slurm.flags import OPTIONS

COMMANDS = ("run",)


def add_parsers(commands: Commands) -> None:
    p = commands.add("run", cmd_run, "run a plan, or plan and run a spec with --engine")
    engine_options(p, required=False)
    provider_options(p)
    p.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    p.add_argument("--timeout", type=float, help="seconds before the engine is stopped")
    p.add_argument("--quiet", action="store_true", help="do not echo the engine's stderr")
    p.add_argument("--ray-address", help="Ray dashboard address for --provider ray (default "
                                         "$RAY_ADDRESS), e.g. http://127.0.0.1:8265")
    p.add_argument("--apply", action="store_true",
                   help="with a kuberay plan: apply the attempt's RayJob with kubectl and "
                        "follow it; without it the manifest is written, nothing runs (exit 7)")
    p.add_argument("--resume", action="store_true",
                   help="continue the plan's run from its newest complete checkpoint")
    p.add_argument("--retry", action="store_true",
                   help="train the plan's run again from scratch as a new attempt, although "
                        "earlier attempts exist (without it, a run that has attempts is "
                        "never trained again unasked)")
    p.add_argument("--kuberay-deadline", type=int, metavar="SECONDS",
                   help="with a kuberay plan and --resume or --retry: the new attempt's "
                        "activeDeadlineSeconds (a run its deadline cut off goes on with more)")
    p.add_argument("--allow-runtime-change", action="store_true",
                   help="with --resume: continue although torch, transformers or "
                        "stateset-backend changed version since the checkpoint (recorded as "
                        "a warning in the result); a world-size change is always refused")
    p.add_argument("document", metavar="PLAN|SPEC")


def cmd_run(args: argparse.Namespace) -> int:
    if not args.quiet and not args.json and sys.stderr.isatty():
        # a person watching sees something before the runner, the plugins and the spec load;
        # a pipe keeps bad input to its one line
        target = f"{args.document} on {args.engine}" if args.engine else args.document
        print(f"stateset-backend: checking {target}", file=sys.stderr, flush=True)
    from stateset_backend.common.errors import InvalidInput, NotExecuted
    from stateset_backend.providers.base import SUBMITTED
    from stateset_backend.runs.runner import (
        completed,
        newest_checkpoint,
        raise_for_status,
        run_plan,
        stopped_by_cluster,
    )
    from stateset_backend.runs.store import RunStore, runs_dir_from
    from stateset_backend.runs.views import record_submitted

    registry = load_registry()
    store = RunStore(runs_dir_from(args.runs_dir))
    if record_submitted not in SUBMITTED:  # a listing shows a cluster's job while it runs
        SUBMITTED.append(record_submitted)
    if args.resume and args.engine is not None:
        raise InvalidInput(_resume_needs_plan(args.document, args.engine, store))
    if args.engine is not None:
        args.spec = args.document
        plan = plan_for(args, registry)
    elif args.engine_version is not None:
        raise InvalidInput("--engine-version needs --engine (a plan already fixes the version)")
    else:
        plan = _with_more_time(_load_run_document(args.document), args, registry)
    if args.retry and (args.resume or args.engine is not None):
        raise InvalidInput("--retry runs a plan's run again from scratch: give the plan, "
                           "without --resume" + (" (with --engine every run is a new run)"
                                                 if args.engine is not None else ""))
    if args.engine is None and not args.resume and not args.retry:
        earlier = _earlier_attempts(plan, store, args.document, args.apply,
                                    registry.get(plan.engine).adapter)
        if earlier is not None:
            code, doc, line = earlier
            if code:
                raise InvalidInput(line)
            emit(args, doc, line)
            return 0
    done = completed(plan, store) if args.resume else None
    if done is not None:
        result, path = done
        emit(args, {**result.to_json(), "already_complete": True},
             f"run {result.run_id} is already complete ({result.committed_updates}/"
             f"{result.planned_updates} updates, attempt {result.attempt}); nothing to resume "
             f"(result: {path})")
        return 0
    if args.apply and plan.provider != "kuberay":
        raise InvalidInput(f"--apply applies a kuberay plan's RayJob; this plan runs on the "
                           f"{plan.provider} provider")
    if args.allow_runtime_change and not args.resume:
        raise InvalidInput("--allow-runtime-change applies to --resume only")
    resume, requeues = args.resume, int(plan.provider_settings.get("requeue", 0))
    while True:
        result, path = run_plan(plan, registry, store, python=args.python,
                                timeout=args.timeout, echo_stderr=not args.quiet,
                                resume=resume, live_progress=not args.json,
                                engine_home=args.engine_home, ray_address=args.ray_address,
                                allow_runtime_change=args.allow_runtime_change,
                                apply=args.apply)
        if not (requeues and stopped_by_cluster(result)):
            break
        requeues, resume = requeues - 1, True
        if not args.quiet:  # the cluster's requeue, done by the hub: a new attempt, same run
            print(f"stateset-backend: the cluster stopped attempt {result.attempt} after a "
                  f"checkpoint; resuming it ({requeues} more resume(s) allowed)",
                  file=sys.stderr, flush=True)
    if result.status == "prepared" and not args.json:  # as asked: a screen, not an error
        from stateset_backend.runs.kuberay_attempt import prepared_screen
        print(prepared_screen(plan, store, result), flush=True)
        return NotExecuted.exit_code
    if result.status != "succeeded":
        newest = newest_checkpoint(registry.get(plan.engine).adapter, store, plan.run_id)
        raise_for_status(result, path, None if newest is None else newest[1].update)
    emit(args, result.to_json(), run_summary(result, path, args.runs_dir))
    return 0


def _prepared_only(folders: list[Path]) -> bool:
    """Every earlier attempt only wrote a cluster manifest and ran nothing."""
    from stateset_backend.common.errors import InvalidInput
    from stateset_backend.runs.results import Result

    try:
        return all(Result.load(f / "result.json").status == "prepared" for f in folders)
    except (InvalidInput, OSError):
        return False


def _earlier_attempts(plan: Any, store: Any, document: str, apply: bool = False,
                      adapter: Any = None) -> tuple[int, dict[str, Any], str] | None:
    """A plan whose run already has attempts is never trained again without being asked:
    (0, result, message) when it finished, (2, {}, message) when it did not; each message
    says what exists and the command for each choice. None when the run has no attempt."""
    from stateset_backend.common.errors import InvalidInput
    from stateset_backend.runs.results import Result
    from stateset_backend.runs.runner import (
        attempt_dirs,
        completed,
        newest_checkpoint,
        record_abandoned,
    )

    if adapter is not None:  # a killed `run`'s attempt (its Slurm job since ended) first
        record_abandoned(plan, adapter, store)
    folders = attempt_dirs(store, plan.run_id)  # newest first
    if not folders or (apply and _prepared_only(folders)):  # applying what was prepared
        return None
    # a command to copy: the plan's path quoted as a shell would need it
    run, newest = plan.run_id, int(folders[0].name)
    cmd = f"stateset-backend run {shlex.quote(document)}"
    done = completed(plan, store)
    if done is not None:
        result, path = done
        return 0, {**result.to_json(), "already_complete": True}, (
            f"run {run} is already complete (attempt {result.attempt}: "
            f"{result.committed_updates}/{result.planned_updates} updates, {path}); nothing "
            f"was run. See it: stateset-backend runs show {run}; train it again from scratch "
            f"as attempt {newest + 1}: {cmd} --retry")
    ended = "ended without a result (interrupted)"
    result_path = folders[0] / "result.json"
    if result_path.is_file():
        try:
            last = Result.load(result_path)
            ended = f"ended {last.status} after {last.committed_updates}/" \
                    f"{last.planned_updates} updates"
        except InvalidInput:  # an unreadable result: say so, the choices stay the same
            ended = "left a result that cannot be read"
    count = f"{len(folders)} attempt" + ("s" if len(folders) > 1 else "")
    again = f"train it again from scratch as attempt {newest + 1}: {cmd} --retry"
    if adapter is not None and newest_checkpoint(adapter, store, run) is None:
        return 2, {}, (f"run {run} already has {count}; attempt {newest} {ended}, and no "
                       f"attempt left a checkpoint to resume from. To {again}")
    return 2, {}, (f"run {run} already has {count}; attempt {newest} {ended}. Continue it "
                   f"from its newest checkpoint: {cmd} --resume; or {again}")


def _with_more_time(plan: Any, args: argparse.Namespace, registry: Any) -> Any:
    """A plan fixes where it runs; only a later attempt of its run may get another time limit
    (a run its limit cut off goes on with more), recorded in that attempt's script or
    manifest: ``--slurm-time`` for a Slurm plan, ``--kuberay-deadline`` for a kuberay one."""
    from stateset_backend.common.errors import InvalidInput
    given = [s for s in OPTIONS if getattr(args, f"slurm_{s}", None) is not None]
    deadline = args.kuberay_deadline
    if given and (given != ["time_limit"] or plan.provider != "slurm" or
                  not (args.resume or args.retry)):
        raise InvalidInput(f"{OPTIONS['time_limit']} with a plan gives a Slurm plan's run more "
                           "time for --resume or --retry; the plan fixes the rest")
    if deadline is not None and (plan.provider != "kuberay" or not (args.resume or args.retry)):
        raise InvalidInput("--kuberay-deadline gives a kuberay plan's run more time for "
                           "--resume or --retry; the plan fixes the rest")
    if given:
        from stateset_backend.providers.slurm.planning import with_time_limit
        settings, files = with_time_limit(plan.provider_settings, plan.files,
                                          args.slurm_time_limit)
    elif deadline is not None:
        from stateset_backend.plan.kuberay import with_deadline
        settings, files = with_deadline(plan, deadline,
                                        registry.get(plan.engine).adapter.cluster_launch)
    else:
        return plan
    return plan.model_copy(update={"provider_settings": settings, "files": files})


def _load_run_document(path: str) -> Any:
    """A plan; a spec given without ``--engine`` is named as such, not as a broken plan."""
    from stateset_backend.common.errors import InvalidInput
    from stateset_backend.common.jsonio import read_json
    from stateset_backend.plan.launch_plan import load_plan

    try:
        return load_plan(path)
    except InvalidInput:
        doc = read_json(path, what="plan")
        if isinstance(doc, dict) and "schema" not in doc and "run_id" not in doc and \
                {"model", "data", "algorithm", "reward"} & set(doc):
            raise InvalidInput(f"{path}: a spec, not a plan: run it with --engine ENGINE "
                               f"(`run --engine native {path}`), or run a plan made by "
                               "`plan`") from None
        raise


def _resume_needs_plan(spec_path: str, engine: str, store: Any) -> str:
    """--resume continues one run, which a spec cannot name: point at the plan of the newest
    run of this spec on this engine in the run store, or say that there is none."""
    from stateset_backend.spec.digest import experiment_digest

    digest = experiment_digest(read_spec(spec_path))
    rows = store.query(digest=digest, engine=engine, limit=1)
    head = "--resume continues an earlier run: pass its PLAN, not --engine SPEC"
    if not rows:
        return (f"{head}; {store.root} holds no run of this spec on {engine} (`runs list` "
                "shows the runs there, --runs-dir picks another store)")
    plan = store.run_dir(rows[0]["run_id"]) / "plan.json"
    return (f"{head}: the newest run of this spec on {engine} is {rows[0]['run_id']} "
            f"({rows[0]['status']}): stateset-backend run {shlex.quote(str(plan))} --resume"
            f" --runs-dir {shlex.quote(str(store.root))}")
