"""A run outlives the process that trained it in the run store, and everything done with it
afterwards starts from an id or a digest copied from a listing here: every command takes the
unique prefix a listing shows, and ``export`` sits with them because it sends a stored run
elsewhere rather than making anything new."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from stateset_backend.cli.runs_tables import PAGE, compare_table, runs_table, show_run
from stateset_backend.cli.shared import (
    RUNS_DIR_HELP,
    Commands,
    Parser,
    emit,
    load_registry,
    store_and_run,
)

COMMANDS = ("runs",)


def add_parsers(commands: Commands) -> None:
    p = commands.add("runs", cmd_runs, "find, inspect and compare runs in the run store")
    store = Parser(add_help=False)
    store.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    parents = [commands.common, store]
    runs_sub = p.add_subparsers(dest="runs_command", required=True, parser_class=Parser)
    q = runs_sub.add_parser("list", parents=parents, help="runs, newest first")
    q.add_argument("--digest", help="only runs of this experiment digest")
    q.add_argument("--engine", help="only runs on this engine")
    q.add_argument("--status", choices=["succeeded", "failed", "invalid", "interrupted",
                                        "quarantined", "prepared", "unreadable", "running",
                                        "pending", "abandoned"],
                   help="only runs whose latest attempt ended so; running or pending: only "
                        "attempts in flight; abandoned: only attempts whose job ended after "
                        "their `run` was killed, with no result")
    _paging(q)
    q = runs_sub.add_parser("show", parents=parents, help="one run: identity, attempts, "
                                                          "checkpoints, selection")
    q.add_argument("run")
    q = runs_sub.add_parser("compare", parents=parents, help="every run of one experiment "
                                                             "side by side")
    q.add_argument("targets", nargs="+", metavar="DIGEST|RUN")
    _paging(q)
    runs_sub.add_parser("reindex", parents=parents, help="rebuild the index from the run "
                                                         "directories")
    q = runs_sub.add_parser("verify", parents=parents,
                            help="reload the run's newest checkpoint whole (hashes checked) and "
                                 "clear its quarantine; exit 6 if it does not")
    q.add_argument("run")
    q = runs_sub.add_parser("from-run", parents=parents,
                            help="the model.from_run section that starts another run from this "
                                 "run's checkpoint (run id, checkpoint, manifest sha256)")
    q.add_argument("run")
    q.add_argument("--checkpoint", metavar="update-NNNNNN",
                   help="this checkpoint instead of the newest complete one")
    q.add_argument("--spec", help="a spec to fill in (with --output)")
    q.add_argument("--output", help="where the filled-in spec is written")
    q = runs_sub.add_parser("export", parents=parents, help="log a run to a tracking "
                                                            "store (MLflow)")
    q.set_defaults(func=cmd_runs_export)
    q.add_argument("run")
    q.add_argument("--mlflow", required=True, metavar="URI",
                   help="MLflow tracking URI, e.g. sqlite:///mlflow.db or http://host:5000")
    q.add_argument("--experiment", help="MLflow experiment name (default: the spec's name "
                                        "and the digest)")
    q.add_argument("--attempt", type=int, help="this attempt instead of the newest")


def _paging(q: argparse.ArgumentParser) -> None:
    """A store can hold any number of runs: a listing shows one page of them, newest first."""
    q.add_argument("--limit", type=int, metavar="N",
                   help=f"runs per page (default {PAGE})")
    q.add_argument("--page", type=int, metavar="P", default=1,
                   help="page P of --limit runs (default 1: the newest)")
    q.add_argument("--all", action="store_true", help="every run, on one page")


def _page(args: argparse.Namespace) -> tuple[int | None, int]:
    """(runs per page or None for every one, runs before the page) from the paging flags."""
    from stateset_backend.common.errors import InvalidInput

    if (args.limit is not None and args.limit < 1) or args.page < 1:
        raise InvalidInput("--limit and --page count from 1")
    if args.all:
        if args.limit is not None or args.page != 1:
            raise InvalidInput("--all shows every run on one page: no --limit or --page")
        return None, 0
    limit = PAGE if args.limit is None else args.limit
    return limit, (args.page - 1) * limit


def cmd_runs(args: argparse.Namespace) -> int:
    from stateset_backend.runs import views as runs
    from stateset_backend.runs.store import RunStore, runs_dir_from

    store = RunStore(runs_dir_from(args.runs_dir))
    if getattr(args, "run", None) is not None:  # an id, or the unique prefix a listing shows
        args.run = store.resolve_run(args.run)
    if args.runs_command == "list":
        digest = None if args.digest is None else store.resolve_digest(args.digest)
        limit, offset = _page(args)
        rows, total = store.page(digest=digest, engine=args.engine, status=args.status,
                                 limit=limit, offset=offset)
        unrecorded = [r for r in runs.in_flight(store) if args.status in (None, r["state"])] \
            if args.page == 1 and args.status in (None, "running", "pending", runs.ABANDONED) \
            else []
        doc = {"runs": rows, "total": total, "page": args.page, "limit": limit,
               "more": max(0, total - offset - len(rows)),
               "in_flight": [r for r in unrecorded if r["state"] != runs.ABANDONED],
               "abandoned": [r for r in unrecorded if r["state"] == runs.ABANDONED]}
        emit(args, doc, lambda: runs_table(doc))
    elif args.runs_command == "show":
        doc = runs.show(store, args.run)
        emit(args, doc, lambda: show_run(doc))
    elif args.runs_command == "compare":
        limit, offset = _page(args)
        doc = {**runs.compare(store, args.targets, limit=limit, offset=offset),
               "page": args.page, "limit": limit}
        emit(args, doc, lambda: compare_table(doc))
    elif args.runs_command == "verify":
        from stateset_backend.runs.verify import verify_run

        doc = verify_run(store, load_registry(), args.run)
        ver = doc["verified"]
        emit(args, doc, f"run {args.run}: checkpoint of update {ver['update']} verified and "
                        f"reloaded ({ver['checkpoint']})" + (
                            "; quarantine cleared" if doc["was_quarantined"] else ""))
    elif args.runs_command == "from-run":
        return _from_run(args, store)
    else:
        count, unreadable = store.reindex()
        emit(args, {"indexed_attempts": count, "unreadable": unreadable},
             f"indexed {count} attempts from {store.root}" + "".join(
                 f"\n  unreadable (listed as such): {why}" for why in unreadable))
    return 0


def _from_run(args: argparse.Namespace, store: Any) -> int:
    """Print the ``model.from_run`` section naming a run's checkpoint, or write ``--spec`` with
    it filled in to ``--output``, anywhere: its relative paths are rewritten to name the same
    files from the new spec's folder."""
    from stateset_backend.common.errors import InvalidInput
    from stateset_backend.common.jsonio import atomic_write_json, read_json
    from stateset_backend.runs import lineage
    from stateset_backend.spec.inputs import rebase_spec_paths

    ref = lineage.reference(store, load_registry(), args.run, args.checkpoint).model_dump()
    if args.spec is None:
        if args.output is not None:
            raise InvalidInput("--output writes the spec given with --spec")
        emit(args, ref, json.dumps(ref, indent=2))
        return 0
    if args.output is None:
        raise InvalidInput("--spec needs --output FILE for the spec with model.from_run set")
    doc = read_json(Path(args.spec), what="spec")
    if not isinstance(doc.get("model"), dict):
        raise InvalidInput(f"{args.spec}: has no model section to start from the run")
    doc["model"]["from_run"] = ref
    doc = rebase_spec_paths(doc, Path(args.spec).resolve().parent,
                            Path(args.output).resolve().parent)
    try:
        atomic_write_json(Path(args.output), doc)
    except OSError as exc:
        raise InvalidInput(f"--output {args.output}: {exc.strerror or exc}") from None
    emit(args, {"from_run": ref, "spec": args.output},
         f"{args.output}: model.from_run is run {ref['run_id']} checkpoint "
         f"{ref['checkpoint']} (manifest sha256 {ref['sha256']})")
    return 0


def cmd_runs_export(args: argparse.Namespace) -> int:
    from stateset_backend.publish.export import export_mlflow
    from stateset_backend.runs.attempts import load_attempt

    record = load_attempt(*store_and_run(args), args.attempt)
    doc = export_mlflow(record, args.mlflow, experiment_name=args.experiment)
    added = len(doc.get("evaluations") or [])
    emit(args, doc, f"run {record.run_id} attempt {record.result.attempt} "
                    + ("was already exported" if doc["already_exported"] else "exported")
                    + f" to {doc['tracking_uri']} as MLflow run {doc['mlflow_run_id']}"
                    + (f" ({added} evaluation record(s) added)" if added else ""))
    return 0
