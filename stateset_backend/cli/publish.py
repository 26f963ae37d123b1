"""What a finished run is worth to others: its checkpoint scored on a split it never trained
on, a report a reader opens without the hub, and an in-toto statement binding its artifacts
to its experiment. Each starts from a run in the store and none trains."""

from __future__ import annotations

import argparse
import json

from stateset_backend.cli.shared import RUNS_DIR_HELP, Commands, emit, load_registry, store_and_run
from stateset_backend.common.display import elided, elided_line

COMMANDS = ("evaluate", "report", "attest")


def add_parsers(commands: Commands) -> None:
    p = commands.add("evaluate", cmd_evaluate, "score a checkpoint of a run on a held-out split "
                                               "with the spec's validation decoding")
    p.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    p.add_argument("--split", required=True, choices=["test", "validation"])
    p.add_argument("--checkpoint", default="recommended", metavar="recommended|final|update-N",
                   help="which checkpoint (default: the recommended one)")
    p.add_argument("--attempt", type=int, help="this attempt instead of the newest")
    p.add_argument("run")
    p = commands.add("report", cmd_report, "write a self-contained HTML report of a run or of "
                                           "every run of an experiment")
    p.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    p.add_argument("-o", "--output", help="HTML file to write (default report-<target>.html)")
    p.add_argument("target", metavar="RUN|DIGEST")
    p = commands.add("attest", cmd_attest, "write an in-toto statement binding a run's "
                                           "artifacts to its experiment")
    p.add_argument("--runs-dir", help=RUNS_DIR_HELP)
    p.add_argument("-o", "--output", help="file to write (default: print the statement)")
    p.add_argument("--attempt", type=int, help="this attempt instead of the newest")
    p.add_argument("run")


def cmd_evaluate(args: argparse.Namespace) -> int:
    from stateset_backend.runs.evaluate import evaluate_run

    store, args.run = store_and_run(args)
    path, doc = evaluate_run(store, load_registry(), args.run, split=args.split,
                             which=args.checkpoint, attempt=args.attempt)
    emit(args, {**doc, "path": str(path)},
         f"run {args.run} update {doc['checkpoint']['update']} ({args.checkpoint}) on the "
         f"{args.split} split: " + ", ".join(f"{elided(k)} = {v:.4f}" for k, v in
                                             sorted(doc["metrics"].items()))
         + f"\n  record: {path}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from stateset_backend.publish.report import report
    from stateset_backend.runs.store import RunStore, runs_dir_from

    path, records, skipped = report(RunStore(runs_dir_from(args.runs_dir)), args.target,
                                    args.output)
    emit(args, {"report": str(path), "runs": [r.run_id for r in records],
                "not_shown": skipped},
         f"wrote {path} ({len(records)} run{'s' if len(records) != 1 else ''})" + "".join(
             f"\n  not shown, unreadable: {elided_line(why)}" for why in skipped))
    return 0


def cmd_attest(args: argparse.Namespace) -> int:
    from stateset_backend.publish.attest import attest
    from stateset_backend.runs.attempts import load_attempt

    record = load_attempt(*store_and_run(args), args.attempt)
    doc = attest(record, args.output)
    if args.output is None:
        print(json.dumps(doc, indent=2))
    else:
        emit(args, {"attestation": args.output, "subjects": len(doc["subject"]),
                    "predicate_type": doc["predicateType"]},
             f"wrote {args.output}: in-toto statement, {len(doc['subject'])} subjects of run "
             f"{record.run_id} attempt {record.result.attempt}")
    return 0
