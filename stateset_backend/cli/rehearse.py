"""``rehearse``: what a GPU run would hit, found on this machine's CPUs. The spec is planned as
``run`` plans it (the same checks and exit codes), then the engine's own trainer runs it for a
few updates with a shrunk model of the spec's architecture, and one screen says what held.

The command only asks: the adapter says how its engine runs here, or why it cannot, and
``runs.rehearsal`` makes the model, runs and judges; nothing here imports torch or an engine."""

from __future__ import annotations

import argparse
from typing import Any

from stateset_backend.cli.shared import RUNS_DIR_HELP, Commands, emit, load_registry
from stateset_backend.cli.target import engine_options, plan_for

COMMANDS = ("rehearse",)
MARK = {"ok": "ok", "FAILED": "FAILED", "not measured": "--"}
# the parsing the conformance kit's reader of a built-in engine's launch models (a plugin's
# reader is its own)
PARSERS = {"openrlhf": "OpenRLHF {version}'s own argparse parser (rebuilt from the release's "
                       "recorded surface)",
           "nemo-rl": "Hydra's override parser, as NeMo RL applies its overrides",
           "verl": "Hydra's override parser, as verl's main_ppo composes its config"}


def _updates(text: str) -> int:
    from stateset_backend.common.errors import InvalidInput

    if not text.isdigit() or int(text) < 1:
        raise InvalidInput(f"--updates {text!r}: a whole number of updates, at least 1")
    return int(text)


def add_parsers(commands: Commands) -> None:
    p = commands.add("rehearse", cmd_rehearse,
                     "run the engine's own trainer for a few updates on this machine's CPUs "
                     "with a shrunk model of the spec's architecture, and check what it left "
                     "(docs/rehearse.md)")
    engine_options(p)
    p.add_argument("--updates", type=_updates, default=2,
                   help="updates to run (default 2); the spec's own budget is not used")
    p.add_argument("--runs-dir", help=RUNS_DIR_HELP + "; rehearsals are kept apart from its "
                                                      "runs, in .rehearsals/")
    p.add_argument("--timeout", type=float, help="seconds before the engine is stopped")
    p.add_argument("--quiet", action="store_true", help="do not echo the engine's stderr")
    p.add_argument("spec")


def cmd_rehearse(args: argparse.Namespace) -> int:
    from stateset_backend.common.errors import (
        EngineFailed,
        Interrupted,
        InvalidResult,
        Unsupported,
    )
    from stateset_backend.runs.rehearsal import rehearsal_of, rehearse
    from stateset_backend.runs.store import runs_dir_from

    registry = load_registry()
    plan = plan_for(args, registry)
    entry = registry.get(plan.engine)
    try:
        rehearsal_of(plan, entry)
    except Unsupported as exc:
        raise Unsupported(_cannot(plan, entry, exc.message), details=exc.details) from None
    verdict = rehearse(plan, entry, runs_dir_from(args.runs_dir), args.updates,
                       python=args.python, engine_home=args.engine_home,
                       timeout=args.timeout, echo_stderr=not args.quiet,
                       live_progress=not args.json)
    doc = verdict.to_json()
    if not args.json:
        print(_screen(verdict, args.spec))
    if verdict.passed:
        if args.json:
            emit(args, doc, "")
        return 0
    where = f"(kept in {verdict.folder})"
    if verdict.interrupted:
        raise Interrupted(f"rehearsal {verdict.plan.run_id} interrupted {where}", details=doc)
    if verdict.launch_failed:
        raise EngineFailed(f"rehearsal {verdict.plan.run_id}: the engine run failed: "
                           f"{verdict.lines[0].detail.split(';')[0]} {where}", details=doc)
    failed = [line.check for line in verdict.lines if line.state == "FAILED"]
    raise InvalidResult(f"rehearsal {verdict.plan.run_id}: {', '.join(failed)} failed "
                        f"{where}", details=doc)


def _cannot(plan: Any, entry: Any, reason: str) -> str:
    """Why the engine cannot be rehearsed here, and what did pass: the plan was made, so the
    release can do what the spec asks, every setting has its translation and the launch pins
    every default; and where a reader of the engine's own parser is known, it reads the launch
    as the engine would."""
    return (f"{plan.engine} {plan.engine_version} cannot be rehearsed on this machine: "
            f"{reason}. What was checked instead: the plan was made (the release's "
            "capabilities, every setting's translation, every engine default that changes the "
            f"math pinned){_parser_read(plan, entry)}; `stateset-backend conformance "
            f"{plan.engine} --engine-version {plan.engine_version}` checks the launch against "
            "the release's configuration surface.")


def _parser_read(plan: Any, entry: Any) -> str:
    try:  # the kit's readers come with the conformance extra (pytest, hydra-core)
        from stateset_backend.conformance.readers import LaunchUnreadable, reader_for

        reader = reader_for(plan.engine, entry.adapter.kit_support().parse_launch)
        settings = reader(plan) if reader is not None else None
    except LaunchUnreadable as exc:
        return f", but the engine's parser refuses the launch: {exc}"
    except ImportError as exc:
        return (f"; its launch was not read back through the engine's parser ({exc.name} is "
                "not installed: pip install 'stateset-backend[conformance]')")
    if settings is None:
        return ""
    parser = PARSERS.get(plan.engine, "the plugin's reader of its engine's parser")
    return (f", and the launch reads back through {parser.format(version=plan.engine_version)}"
            f" ({len(settings)} settings)")


def _screen(verdict: Any, spec_path: str) -> str:
    plan, model = verdict.plan, verdict.model
    updates = plan.validated_spec().budget.total_updates
    plural = "s" if updates > 1 else ""
    lines = [f"rehearsal {plan.run_id} of {spec_path}: {plan.engine} {plan.engine_version}, "
             f"{updates} update{plural} on this machine's CPUs in {verdict.seconds:.1f} s"]
    shrunk = model["shrunk"]
    if shrunk is None:
        lines.append(f"  model      {model['path']}, used as is")
    else:
        before, after = shrunk["from"], shrunk["to"]
        lines.append(f"  model      {model['path']}: {shrunk['class']} shrunk from "
                     f"{before['layers']} layers x {before['hidden']} to {after['layers']} x "
                     f"{after['hidden']} ({after['heads']} heads, {after['kv_heads']} key-value; "
                     f"{shrunk['parameters']:,} parameters, seed {shrunk['seed']}); vocabulary, "
                     "tokenizer and chat template unchanged")
    if verdict.rehearsal.covers:
        lines.append(f"  covers     {verdict.rehearsal.covers}")
    for key, (was, now) in sorted(verdict.rehearsal.replaced.items()):
        lines.append(f"  replaced   {key}: {was} -> {now}")
    for key, (was, now) in sorted(verdict.changed.items()):
        lines.append(f"  replaced   {key}: {was} -> {now} (for the resume check)")
    for line in verdict.lines:
        said = f"not measured: {line.detail}" if line.state == "not measured" else line.detail
        lines.append(f"  {MARK[line.state]:6}  {line.check:19} {said}")
        lines.extend(f"      | {text}" for text in line.tail)
    lines.append(("rehearsal passed: every check holds" if verdict.passed else
                  "rehearsal FAILED") + f"; kept in {verdict.folder}")
    return "\n".join(lines)
