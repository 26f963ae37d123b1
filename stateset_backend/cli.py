"""The ``stateset-backend`` command line.

Every failure is one line on stderr and a documented exit code (0 ok, 2 invalid input,
3 unsupported, 4 engine failed, 5 result invalid, 6 resume impossible, 130 interrupted);
``--json`` adds the detail as JSON on stdout and ``--debug`` shows the traceback. Imports are
deferred into each command so ``--help``, ``validate`` and ``digest`` start fast and never
load an engine or torch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from stateset_backend import __version__

if TYPE_CHECKING:
    from stateset_backend.engines.registry import AdapterEntry, Registry
    from stateset_backend.spec.model import ExperimentSpec

PROG = "stateset-backend"


class _Parser(argparse.ArgumentParser):
    """argparse that reports bad arguments as one line with exit code 2, like every error."""

    def error(self, message: str) -> NoReturn:
        from stateset_backend.common.errors import InvalidInput

        command = self.prog.removeprefix(PROG).strip()  # main adds the program's name
        raise InvalidInput(f"{command}: {message}" if command else message)


def _emit(args: argparse.Namespace, doc: Any, text: str | Callable[[], None]) -> None:
    """Print data as JSON (``--json``) or for humans (a string or a rich renderer)."""
    if args.json:
        print(json.dumps(doc, indent=2))
    elif callable(text):
        text()
    else:
        print(text)


def _console() -> Any:
    from rich.console import Console

    class PipeConsole(Console):
        """rich exits 1 on a closed pipe; hand it to main, which treats it as a normal end."""

        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return PipeConsole(soft_wrap=False)


# -- shared steps --------------------------------------------------------------------------
def _spec(path: str) -> ExperimentSpec:
    from stateset_backend.spec.files import load_spec

    return load_spec(path)


def _registry() -> Registry:
    from stateset_backend.engines.registry import build_registry

    return build_registry()


def _engine_version(entry: AdapterEntry, requested: str | None, python: str | None,
                    home: str | None = None, running: bool = False) -> str:
    from stateset_backend.common.errors import Unsupported
    from stateset_backend.contracts.loader import parse_version

    if requested is not None:
        parse_version(requested)
        return requested
    with entry.guard("detecting the installed version"):
        installed = entry.adapter.installed_version(python, home)
    if installed is None:
        raise Unsupported(_not_installed(entry, python, home, running))
    return installed


def _not_installed(entry: AdapterEntry, python: str | None, home: str | None,
                   running: bool) -> str:
    """Where the engine was looked for, how to install it beside the hub (its own environment,
    as each engine's docs recommend) and the flag that points at it; ``--engine-version`` only
    where it can work (planning for another machine), never for ``run``."""
    contract = entry.adapter.contract
    name, dist = entry.adapter.name, contract.distribution
    newest = contract.newest_known_version()
    where = f"--python {python}" if python else f"--engine-home {home}" if home else \
        "this Python environment"
    if dist is None:
        fix = (f"point --engine-home at a {name} source checkout (a release tag, "
               f"{contract.supported})")
    else:
        venv = f"~/.venvs/{name}"
        fix = (f"install it in its own environment and point --python at it: python -m venv "
               f"{venv} && {venv}/bin/pip install '{dist}=={newest}', then add --python "
               f"{venv}/bin/python (supported: {contract.supported})")
    later = "" if running else "; or pass --engine-version V to plan for a machine that has it"
    return f"{name} is not installed in {where}; {fix}{later}"


# -- commands ------------------------------------------------------------------------------
def cmd_validate(args: argparse.Namespace) -> int:
    from stateset_backend.spec.digest import experiment_digest

    spec = _spec(args.spec)
    digest = experiment_digest(spec)
    _emit(args, {"valid": True, "experiment_digest": digest}, f"{args.spec}: valid ({digest})")
    return 0


def cmd_digest(args: argparse.Namespace) -> int:
    from stateset_backend.spec.digest import experiment_digest

    digest = experiment_digest(_spec(args.spec))
    _emit(args, {"experiment_digest": digest}, digest)
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from stateset_backend.publish.schemas import packaged

    sys.stdout.write(packaged(args.name))
    return 0


def cmd_engines(args: argparse.Namespace) -> int:
    registry = _registry()
    rows: list[dict[str, Any]] = []
    for name, entry in sorted(registry.adapters.items()):
        contract = entry.adapter.contract
        try:
            installed = entry.adapter.installed_version(args.python)
        except Exception as exc:  # detection must never hide the listing
            installed = f"error: {exc}"
        rows.append({
            "engine": name, "plugin": entry.plugin, "distribution": entry.distribution,
            "version": entry.version, "engine_distribution": contract.distribution,
            "supported": contract.supported, "installed": installed,
            "contract_digest": contract.digest,
            "capabilities": [{"versions": r.versions, "provides": sorted(r.provides)}
                             for r in contract.capabilities],
        })
    failures = [f.to_json() for f in registry.failures]

    def table() -> None:
        from rich.table import Table

        t = Table(title="engines")
        for col in ("engine", "plugin", "supported", "installed"):
            t.add_column(col, overflow="fold")
        for r in rows:
            t.add_row(r["engine"], f"{r['distribution']} {r['version']}", r["supported"],
                      r["installed"] or "none")
        console = _console()
        console.print(t)
        for name, entry in sorted(registry.adapters.items()):
            row = next(r for r in rows if r["engine"] == name)
            console.print(_can_do(entry.adapter.contract, row["installed"]), markup=False)
        for f in failures:
            console.print(f"[red]plugin {f['plugin']} failed to load:[/] {f['error']}",
                          markup=True)

    _emit(args, {"engines": rows, "failed_plugins": failures}, table)
    return 0


def _can_do(contract: Any, installed: str | None) -> str:
    """What an engine can do, at the installed release (else the newest the contract knows),
    by family (objectives, KL, aggregation, ...), and what newer releases add."""
    from stateset_backend.common.errors import InvalidInput
    from stateset_backend.contracts.loader import parse_version

    try:
        version = parse_version(installed) if installed else None
    except InvalidInput:  # an unparseable installed version: describe the newest known
        version = None
    at = version if version is not None and contract.supports(version) else \
        parse_version(contract.newest_known_version())
    provided = sorted(contract.provided(at))
    families: dict[str, list[str]] = {}
    for cap in provided:
        family, _, value = cap.partition(":")
        families.setdefault(family if value else "also", []).append(value or cap)
    where = f"{installed} (installed)" if version is not None and at == version else \
        f"{at} (newest known; not installed)"
    parts = [f"{family} {', '.join(values)}" for family, values in families.items()
             if family != "also"] + [f"also {', '.join(families.get('also', []))}"]
    text = f"{contract.engine} {where}: " + "; ".join(parts)
    newest = parse_version(contract.newest_known_version())
    if newest > at:
        added = sorted(set(contract.provided(newest)) - set(provided))
        if added:
            text += f"; {newest} adds {', '.join(added)}"
    return text


def cmd_check(args: argparse.Namespace) -> int:
    from stateset_backend.contracts.capabilities import required_capabilities
    from stateset_backend.contracts.loader import check

    registry = _registry()
    spec, entry, version = target = _target(args, registry)
    report = check(entry.adapter.contract, version, required_capabilities(spec))
    if not report.ok:  # the missing capabilities, as data, before the one-line refusal
        if args.json:
            print(json.dumps(report.to_json(), indent=2))
        report.raise_if_missing()
    # capabilities are not enough: a value the release cannot honour, a deviation refused
    # under equivalence: strict, a budget the data cannot fill are refused by the plan, so
    # `check` answers for the whole plan (made and dropped, nothing written)
    plan = _make_plan(args, registry, target)
    deviations = [d.get("deviation") for d in plan.deviations]
    _emit(args, {**report.to_json(), "deviations": plan.deviations},
          f"{args.engine} {version} can run this spec ({len(report.required)} capabilities "
          f"required" + (f"; declared deviations: {', '.join(map(str, deviations))}"
                         if deviations else "; no declared deviation") + ")")
    return 0


def _explain_column(entry: AdapterEntry, spec: ExperimentSpec, version: str) -> Any:
    from stateset_backend.contracts.loader import parse_version
    from stateset_backend.translate.effective import column

    adapter = entry.adapter
    dialect = adapter.contract.dialect(parse_version(version))
    with entry.guard("explaining the spec"):
        return column(spec, adapter.name, version, dialect, adapter.rules(dialect))


def _outcome_text(row: dict[str, Any]) -> str:
    state = row["state"]
    if state == "pinned" and row.get("native"):
        text = ", ".join(f"{k} = {json.dumps(v)}" for k, v in row["native"].items())
        return text + (f" ({row['reason']})" if row.get("reason") else "")
    if state == "declared":
        return f"declared {row['deviation']}: {json.dumps(row['effective'])}: {row['reason']}"
    return f"{state.replace('_', ' ')}: {row.get('reason', '')}".rstrip(": ")


_CELL = {"same": "same", "pinned": "pinned", "declared": "DECL", "refused": "REFUSED",
         "inert": "-", "not_applicable": "-"}
# what each state means, under every effective table: a reader should never have to guess
_LEGEND = ("same: the engine's default already is the spec's value; pinned: the launch sets "
           "it; DECL n: the engine does something else, named and quantified in note n; "
           "REFUSED n: the engine cannot, nothing launches (note n); -: inert, the spec makes "
           "the setting moot (for example validation decoding when nothing validates)")


def _ascii_head() -> Any:
    """The rule under a table's header in ASCII: as many bytes as columns in a log or pipe."""
    from rich import box

    return box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)


def _effective_table(table: dict[str, Any], differs: bool) -> None:
    """At most 80 columns: one short state per engine, settings grouped under their section
    with the spec's value beside them; the values and reasons of declared and refused cells
    go in numbered notes under the table."""
    from rich.table import Table

    engines = [e["engine"] for e in table["engines"]]
    width = max(7, *(len(name) for name in engines))
    t = Table(box=_ascii_head(), pad_edge=False, collapse_padding=True, title=", ".join(
        f"{e['engine']} {e['engine_version']}" for e in table["engines"]))
    t.add_column("setting = spec value", overflow="fold", ratio=1)
    for name in engines:
        t.add_column(name, overflow="fold", min_width=width, max_width=width, no_wrap=True)
    notes: list[str] = []
    section = None
    for row in table["rows"]:
        if differs and row["same_everywhere"]:
            continue
        head, _, rest = row["field"].partition(".")
        if rest and head != section:
            t.add_row(f"[bold]{head}[/]", *([""] * len(engines)))
        section = head if rest else None
        cells = []
        for name in engines:
            cell = row["cells"][name]
            text = _CELL[cell["state"]]
            if cell["state"] in ("declared", "refused"):
                notes.append(f"{row['field']} on {name}: " + (
                    f"{json.dumps(cell['effective'])} ({cell['reason']})"
                    if cell["state"] == "declared" else cell["reason"]))
                text = f"{text[:width - 4]} {len(notes)}"
            cells.append(text)
        label = f"  {rest}" if rest else head
        t.add_row(f"{label} = {json.dumps(row['value'])}", *cells)
    console = _console()
    console.print(t)
    for i, note in enumerate(notes, 1):
        console.print(f"{i}. {note}", markup=False)
    for name in engines:
        tally = table["counts"][name]
        console.print(f"{name}: " + ", ".join(
            f"{tally.get(state, 0)} {state}" for state in
            ("same", "pinned", "declared", "refused", "inert")), markup=False)
    shown = sum(1 for r in table["rows"] if not (differs and r["same_everywhere"]))
    if differs:
        total = sum(table["counts"][engines[0]].values())
        console.print(f"{shown} of {total} settings differ between engines (a "
                      "declared deviation or a refusal); the others run as the spec says "
                      "everywhere", markup=False)
    console.print(_LEGEND, markup=False)


def cmd_explain(args: argparse.Namespace) -> int:
    from stateset_backend.common.errors import InvalidInput
    from stateset_backend.translate.effective import counts, effective_table

    spec = _spec(args.spec)
    registry = _registry()
    if args.all_engines == (args.engine is not None):
        raise InvalidInput("explain takes --engine E or --all-engines")
    if args.all_engines and args.engine_version:
        raise InvalidInput("--engine-version needs --engine (--all-engines uses each engine's "
                           "installed or newest known version)")
    if (args.effective or args.differs) and not args.all_engines:
        raise InvalidInput("--effective and --differs compare engines: add --all-engines")
    if args.differs and not args.effective:
        raise InvalidInput("--differs filters the --effective table: add --effective")
    columns = []
    for name in (sorted(registry.adapters) if args.all_engines else [args.engine]):
        entry = registry.get(name)
        if args.all_engines:
            with entry.guard("detecting the installed version"):
                installed = entry.adapter.installed_version(args.python, args.engine_home)
            version = installed or entry.adapter.contract.newest_known_version()
        else:
            version = _engine_version(entry, args.engine_version, args.python, args.engine_home)
        columns.append(_explain_column(entry, spec, version))
    if args.effective:
        table = effective_table(columns)
        table["counts"] = counts(table)  # over every setting, whether --differs filters rows
        if args.differs:
            table = {**table, "rows": [r for r in table["rows"] if not r["same_everywhere"]]}
        _emit(args, table, lambda: _effective_table(table, args.differs))
        return 0
    engines = [{"engine": c.engine, "engine_version": c.version, "dialect": c.dialect.name,
                "fields": [r.to_json() for r in c.rows]} for c in columns]

    def table_() -> None:
        """Side by side where the terminal is wide enough to read prose in every column (about
        30 characters each), else one table per engine; --effective compares at any width."""
        from rich.table import Table

        console = _console()
        groups = [engines] if console.width >= 30 * (2 + len(engines)) else \
            [[e] for e in engines]
        if len(groups) > 1:
            console.print("one table per engine at this width (--effective compares them "
                          "in one)", markup=False)
        for group in groups:
            t = Table(title=", ".join(f"{e['engine']} {e['engine_version']}" for e in group))
            t.add_column("field", overflow="fold")
            t.add_column("value", overflow="fold")
            for e in group:
                t.add_column(f"{e['engine']} {e['engine_version']}", overflow="fold")
            for i, row in enumerate(group[0]["fields"]):
                t.add_row(row["field"], json.dumps(row["value"]),
                          *(_outcome_text(e["fields"][i]) for e in group))
            console.print(t)

    doc: dict[str, Any] = {"engines": engines} if args.all_engines else engines[0]
    _emit(args, doc, table_)
    return 0


def _target(args: argparse.Namespace, registry: Registry) -> tuple[Any, Any, str]:
    """The spec, the engine's registry entry and the release a command is asked about."""
    entry = registry.get(args.engine)
    return (_spec(args.spec), entry,
            _engine_version(entry, args.engine_version, args.python, args.engine_home,
                            running=args.command == "run"))


def _make_plan(args: argparse.Namespace, registry: Registry,
               target: tuple[Any, Any, str] | None = None) -> Any:
    """The plan ``plan``, ``run --engine`` and ``check`` make (``check`` drops it)."""
    from stateset_backend.plan.launch_plan import make_plan

    spec, entry, version = target or _target(args, registry)
    return make_plan(spec, entry, version, provider=getattr(args, "provider", "local"),
                     base_dir=Path(args.spec).resolve().parent)


def cmd_plan(args: argparse.Namespace) -> int:
    from stateset_backend.plan.launch_plan import write_plan

    plan = _make_plan(args, _registry())
    if args.output:
        write_plan(plan, args.output)
        _emit(args, {"plan": args.output, "run_id": plan.run_id,
                     "experiment_digest": plan.experiment_digest,
                     "binding_digest": plan.binding_digest, "checksum": plan.checksum},
              f"wrote {args.output} (run {plan.run_id}, {plan.engine} {plan.engine_version})")
    else:
        print(json.dumps(plan.to_json(), indent=2))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from stateset_backend.common.errors import InvalidInput
    from stateset_backend.runs.runner import (
        completed,
        newest_checkpoint,
        raise_for_status,
        run_plan,
    )
    from stateset_backend.runs.store import RunStore, runs_dir_from

    if not args.quiet and not args.json and sys.stderr.isatty():
        # a person watching sees something before the plugins and the spec load; a pipe
        # keeps bad input to its one line
        target = f"{args.document} on {args.engine}" if args.engine else args.document
        print(f"stateset-backend: checking {target}", file=sys.stderr, flush=True)
    registry = _registry()
    store = RunStore(runs_dir_from(args.runs_dir))
    if args.resume and args.engine is not None:
        raise InvalidInput(_resume_needs_plan(args.document, args.engine, store))
    if args.engine is not None:
        args.spec = args.document
        plan = _make_plan(args, registry)
    elif args.engine_version is not None:
        raise InvalidInput("--engine-version needs --engine (a plan already fixes the version)")
    else:
        plan = _load_run_document(args.document)
    if args.retry and (args.resume or args.engine is not None):
        raise InvalidInput("--retry runs a plan's run again from scratch: give the plan, "
                           "without --resume" + (" (with --engine every run is a new run)"
                                                 if args.engine is not None else ""))
    if args.engine is None and not args.resume and not args.retry:
        earlier = _earlier_attempts(plan, store, args.document)
        if earlier is not None:
            code, doc, line = earlier
            if code:
                raise InvalidInput(line)
            _emit(args, doc, line)
            return 0
    done = completed(plan, store) if args.resume else None
    if done is not None:
        result, path = done
        _emit(args, {**result.to_json(), "already_complete": True},
              f"run {result.run_id} is already complete ({result.committed_updates}/"
              f"{result.planned_updates} updates, attempt {result.attempt}); nothing to resume "
              f"(result: {path})")
        return 0
    if args.allow_runtime_change and not args.resume:
        raise InvalidInput("--allow-runtime-change applies to --resume only")
    result, path = run_plan(plan, registry, store, python=args.python, timeout=args.timeout,
                            echo_stderr=not args.quiet, resume=args.resume,
                            live_progress=not args.json,
                            engine_home=args.engine_home, ray_address=args.ray_address,
                            allow_runtime_change=args.allow_runtime_change)
    if result.status != "succeeded":
        newest = newest_checkpoint(registry.get(plan.engine).adapter, store, plan.run_id)
        raise_for_status(result, path, None if newest is None else newest[1].update)
    _emit(args, result.to_json(), _run_summary(result, path, args.runs_dir))
    return 0


def _earlier_attempts(plan: Any, store: Any,
                      document: str) -> tuple[int, dict[str, Any], str] | None:
    """A plan whose run already has attempts is never trained again without being asked:
    (0, result, message) when it finished, (2, {}, message) when it did not; each message
    says what exists and the command for each choice. None when the run has no attempt."""
    from stateset_backend.common.errors import InvalidInput
    from stateset_backend.runs.results import Result
    from stateset_backend.runs.runner import attempt_dirs, completed

    folders = attempt_dirs(store, plan.run_id)  # newest first
    if not folders:
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
    return 2, {}, (f"run {run} already has {count}; attempt {newest} {ended}. Continue it "
                   f"from its newest checkpoint: {cmd} --resume; or train it again from "
                   f"scratch as attempt {newest + 1}: {cmd} --retry")


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

    digest = experiment_digest(_spec(spec_path))
    rows = store.query(digest=digest, engine=engine)
    head = "--resume continues an earlier run: pass its PLAN, not --engine SPEC"
    if not rows:
        return (f"{head}; {store.root} holds no run of this spec on {engine} (`runs list` "
                "shows the runs there, --runs-dir picks another store)")
    plan = store.run_dir(rows[0]["run_id"]) / "plan.json"
    return (f"{head}: the newest run of this spec on {engine} is {rows[0]['run_id']} "
            f"({rows[0]['status']}): stateset-backend run {shlex.quote(str(plan))} --resume"
            f" --runs-dir {shlex.quote(str(store.root))}")


def _run_summary(result: Any, path: Path, runs_dir: str | None = None) -> str:
    """The few numbers a user looks at first, where the run is, and what to do next."""
    from stateset_backend.common.display import metric_text

    lines = [f"run {result.run_id} attempt {result.attempt} succeeded: "
             f"{result.committed_updates}/{result.planned_updates} updates committed in "
             f"{result.duration_s:.1f}s"]
    summary, initial = result.metrics.summary, result.metrics.initial
    for name in ("reward/mean", "val/reward/mean", "loss/policy", "kl", "loss/sft", "val/loss"):
        if summary.get(name) is not None:
            start = initial.get(name)
            was = f"{metric_text(start)} -> " if start is not None and start != summary[name] \
                else ""
            lines.append(f"  {name:16} {was}{metric_text(summary[name])}")
    lines.extend(f"  warning: {w}" for w in result.warnings)
    lines.append(f"  result: {path}")
    run = result.run_id + (f" --runs-dir {shlex.quote(runs_dir)}" if runs_dir else "")
    lines += ["next:",
              f"  stateset-backend runs show {run}",
              "      its attempts, checkpoints and the recommended checkpoint",
              f"  stateset-backend evaluate --split test {run}",
              "      the recommended checkpoint scored on the held-out test split",
              f"  stateset-backend report {run}",
              "      an HTML report with the curves (pip install 'stateset-backend[report]')"]
    return "\n".join(lines)


def cmd_runs(args: argparse.Namespace) -> int:
    from stateset_backend.runs import views as runs
    from stateset_backend.runs.store import RunStore, runs_dir_from

    store = RunStore(runs_dir_from(args.runs_dir))
    if getattr(args, "run", None) is not None:  # an id, or the unique prefix a listing shows
        args.run = store.resolve_run(args.run)
    if args.runs_command == "list":
        digest = None if args.digest is None else store.resolve_digest(args.digest)
        rows = store.query(digest=digest, engine=args.engine, status=args.status)
        _emit(args, {"runs": rows}, lambda: _runs_table(rows))
    elif args.runs_command == "show":
        doc = runs.show(store, args.run)
        _emit(args, doc, lambda: _show_run(doc))
    elif args.runs_command == "compare":
        doc = runs.compare(store, args.targets)
        _emit(args, doc, lambda: _compare_table(doc))
    elif args.runs_command == "verify":
        from stateset_backend.runs.verify import verify_run

        doc = verify_run(store, _registry(), args.run)
        ver = doc["verified"]
        _emit(args, doc, f"run {args.run}: checkpoint of update {ver['update']} verified and "
                         f"reloaded ({ver['checkpoint']})" + (
                             "; quarantine cleared" if doc["was_quarantined"] else ""))
    elif args.runs_command == "from-run":
        return _from_run(args, store)
    else:
        count, unreadable = store.reindex()
        _emit(args, {"indexed_attempts": count, "unreadable": unreadable},
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

    ref = lineage.reference(store, _registry(), args.run, args.checkpoint).model_dump()
    if args.spec is None:
        if args.output is not None:
            raise InvalidInput("--output writes the spec given with --spec")
        _emit(args, ref, json.dumps(ref, indent=2))
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
    _emit(args, {"from_run": ref, "spec": args.output},
          f"{args.output}: model.from_run is run {ref['run_id']} checkpoint "
          f"{ref['checkpoint']} (manifest sha256 {ref['sha256']})")
    return 0


def _runs_table(rows: list[dict[str, Any]]) -> None:
    """Run ids and digests are copied whole, so they never wrap; the digest shows its first
    12 hex digits, which every command taking a digest accepts as a prefix."""
    from rich import box
    from rich.table import Table

    t = Table(title=f"{len(rows)} runs", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    t.add_column("run", no_wrap=True)
    t.add_column("engine", overflow="fold")
    t.add_column("status", overflow="fold")
    t.add_column("updates", no_wrap=True)
    t.add_column("digest", no_wrap=True)
    for r in rows:
        t.add_row(r["run_id"], f"{r['engine']} {r['engine_version']}",
                  f"{r['status']} #{r['attempt']}",
                  f"{r['committed_updates']}/{r['planned_updates']}",
                  r["experiment_digest"][7:19] or "?")
    _console().print(t)


def _show_run(doc: dict[str, Any]) -> None:
    console = _console()
    # each digest on a line of its own: 71 characters fit 80 columns whole, so a terminal
    # never breaks one mid-hex and it is copied in one piece
    console.print(f"run {doc['run_id']}: {doc['engine']} {doc['engine_version']}, seed "
                  f"{doc['seed']}\n  experiment\n    {doc['experiment_digest']}\n  binding\n"
                  f"    {doc['binding_digest']}\n  plan checksum\n    {doc['plan_checksum']}",
                  markup=False, soft_wrap=True)
    for d in doc["deviations"]:
        console.print(f"  declared {d['setting']}: {d['description']}", markup=False)
    for a in doc["attempts"]:
        line = f"attempt {a['attempt']}: {a['status']}"
        if "committed_updates" in a:
            line += f", {a['committed_updates']}/{a['planned_updates']} updates"
        link = a.get("resumed_from")
        if link:
            line += f", resumed from attempt {link['attempt']} at update {link['update']}"
        console.print(line + (f" ({a['reason']})" if a.get("reason") else ""), markup=False)
        sel = a.get("selection")
        if sel and sel.get("update") is None:
            console.print(f"  nothing recommended by {sel['select_by']}"
                          + (f": {sel['reason']}" if sel.get("reason") else ""), markup=False)
        elif sel:
            console.print(f"  recommended by {sel['select_by']}: update {sel['update']}"
                          + (f" = {sel['value']:.4f}" if "value" in sel else
                             f" ({sel.get('reason')})")
                          + (f", attempts/{sel['attempt']}/{sel['checkpoint']}"
                             if sel.get("checkpoint") and isinstance(sel.get("attempt"), int)
                             else ""), markup=False)
        for ckpt in a.get("checkpoints", []):
            console.print(f"  {ckpt['path']}  sha256:{ckpt['sha256'][:16]}", markup=False)
    for e in doc.get("evaluations", []):
        console.print(f"evaluated {e['split']} on attempt {e['attempt']} update {e['update']} "
                      f"({e['checkpoint']}): " + ", ".join(
                          f"{k} = {v:.4f}" for k, v in sorted(e["metrics"].items())),
                      markup=False)
    mark = doc.get("quarantine")
    if mark is not None:
        from stateset_backend.runs.quarantine import describe

        state = "QUARANTINED" if mark.get("quarantined", True) else \
            f"quarantine cleared {mark.get('cleared_at')} by `runs verify`, was"
        console.print(f"{state}: {describe(mark)}", markup=False)


def _compare_table(doc: dict[str, Any]) -> None:
    """One row per attempt, two lines each (run and engine; status and updates), so that the
    full run id, which users copy, fits an 80-column terminal beside the numbers; declared
    deviations, which can be long, are listed under the table."""
    from rich import box
    from rich.table import Table

    same = "one experiment" if doc["same_experiment"] else "DIFFERENT experiments"
    t = Table(title=f"{same}: {', '.join(d[7:19] for d in doc['experiment_digests'])}",
              box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False)
    t.add_column("run / engine", no_wrap=True)
    t.add_column("status", no_wrap=True)
    for col in ("reward", "val", "rec.", "test", "dev."):
        t.add_column(col, no_wrap=True, min_width=len(col))

    def num(value: Any) -> str:
        return f"{value:.3f}" if isinstance(value, int | float) else "-"

    def headline(e: dict[str, Any]) -> str:
        metrics = e["metrics"]
        name = next((k for k in ("test/reward/mean", "val/reward/mean", "test/loss", "val/loss")
                     if k in metrics), min(metrics, default=None))
        return f"{num(metrics.get(name)) if name else '-'}\n@{e['update']}"

    notes: list[str] = []
    for r in doc["attempts"]:
        final, rec = r.get("final", {}), r.get("recommended") or {}
        deviations = [d for d in r.get("deviations", []) if d]
        held_out = r.get("test", [])
        notes += [f"{r['run_id']}#{r['attempt']} {e['split']}@{e['update']} "
                  f"({e['checkpoint']}): " + ", ".join(f"{k} {num(v)}" for k, v in
                                                       sorted(e["metrics"].items()))
                  for e in held_out]
        notes += [f"{r['run_id']}#{r['attempt']} declares {d}" for d in deviations]
        t.add_row(f"{r['run_id']}#{r['attempt']}\n"
                  f"{r.get('engine', '?')} {r.get('engine_version', '')}",
                  f"{r['status']}\n{r.get('committed_updates', '-')}/"
                  f"{r.get('planned_updates', '-')}",
                  num(final.get("reward/mean")), num(final.get("val/reward/mean")),
                  f"{num(rec.get('value'))}\n@{rec['update']}"
                  if isinstance(rec.get("update"), int) else "-",
                  headline(held_out[-1]) if held_out else "-",
                  str(len(deviations)))
    console = _console()
    console.print(t)
    console.print("status: committed/planned updates; reward, val: final training and "
                  "validation reward; rec.: the value of evaluation.select_by at the update "
                  "it recommends; test: the newest held-out evaluation (all listed below); "
                  "dev.: declared deviations", markup=False)
    for note in notes:
        console.print(note, markup=False)


def cmd_conformance(args: argparse.Namespace) -> int:
    """The conformance kit for one registered engine (exit 0, or 5 when a check failed), or
    the compatibility matrix of the built-in engines (or the engines named) as Markdown."""
    from stateset_backend.common.errors import InvalidInput
    from stateset_backend.conformance import runner

    registry = _registry()
    if args.matrix:
        from stateset_backend.conformance.matrix import render

        names = args.engine or sorted(n for n, e in registry.adapters.items()
                                      if e.plugin == "builtin")
        print(render([registry.get(name) for name in names]), end="")
        return 0
    if len(args.engine) != 1:
        raise InvalidInput("conformance: name one ENGINE (or pass --matrix)")
    report = runner.run_conformance(registry.get(args.engine[0]), args.engine_version)
    if args.json in ("-", True):  # True: the top-level --json
        print(json.dumps(report, indent=2))
    else:
        if args.json:
            runner.write_json(report, args.json)
        print(runner.render_text(report))
    # a check that saw nothing of what the engine reads cannot pass
    return runner.FAILED_EXIT if report["counts"]["failed"] or \
        report["counts"].get("unverified") else 0


def _store_and_run(args: argparse.Namespace) -> tuple[Any, str]:
    """The run store a command reads and the run it names (an id, or the unique prefix a
    listing shows)."""
    from stateset_backend.runs.store import RunStore, runs_dir_from

    store = RunStore(runs_dir_from(args.runs_dir))
    return store, store.resolve_run(args.run)


def cmd_evaluate(args: argparse.Namespace) -> int:
    from stateset_backend.runs.evaluate import evaluate_run

    store, args.run = _store_and_run(args)
    path, doc = evaluate_run(store, _registry(), args.run, split=args.split,
                             which=args.checkpoint, attempt=args.attempt)
    _emit(args, {**doc, "path": str(path)},
          f"run {args.run} update {doc['checkpoint']['update']} ({args.checkpoint}) on the "
          f"{args.split} split: " + ", ".join(f"{k} = {v:.4f}" for k, v in
                                              sorted(doc["metrics"].items()))
          + f"\n  record: {path}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from stateset_backend.publish.report import report
    from stateset_backend.runs.store import RunStore, runs_dir_from

    path, records, skipped = report(RunStore(runs_dir_from(args.runs_dir)), args.target,
                                    args.output)
    _emit(args, {"report": str(path), "runs": [r.run_id for r in records],
                 "not_shown": skipped},
          f"wrote {path} ({len(records)} run{'s' if len(records) != 1 else ''})" + "".join(
              f"\n  not shown, unreadable: {why}" for why in skipped))
    return 0


def cmd_attest(args: argparse.Namespace) -> int:
    from stateset_backend.publish.attest import attest
    from stateset_backend.runs.attempts import load_attempt

    record = load_attempt(*_store_and_run(args), args.attempt)
    doc = attest(record, args.output)
    if args.output is None:
        print(json.dumps(doc, indent=2))
    else:
        _emit(args, {"attestation": args.output, "subjects": len(doc["subject"]),
                     "predicate_type": doc["predicateType"]},
              f"wrote {args.output}: in-toto statement, {len(doc['subject'])} subjects of run "
              f"{record.run_id} attempt {record.result.attempt}")
    return 0


def cmd_runs_export(args: argparse.Namespace) -> int:
    from stateset_backend.publish.export import export_mlflow
    from stateset_backend.runs.attempts import load_attempt

    record = load_attempt(*_store_and_run(args), args.attempt)
    doc = export_mlflow(record, args.mlflow, experiment_name=args.experiment)
    added = len(doc.get("evaluations") or [])
    _emit(args, doc, f"run {record.run_id} attempt {record.result.attempt} "
                     + ("was already exported" if doc["already_exported"] else "exported")
                     + f" to {doc['tracking_uri']} as MLflow run {doc['mlflow_run_id']}"
                     + (f" ({added} evaluation record(s) added)" if added else ""))
    return 0


# -- parser --------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    # The flags work before or after the subcommand. A subcommand's copy leaves the
    # namespace alone unless given (SUPPRESS), so it never resets what the top level read.
    top = _Parser(add_help=False)
    top.add_argument("--json", action="store_true", help="print data as JSON")
    top.add_argument("--debug", action="store_true", help="show tracebacks")
    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print data as JSON")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks")

    parser = _Parser(prog=PROG, parents=[top],
                     description="Run one backend-neutral RL post-training experiment on any "
                                 "engine, and keep its identity.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, func: Callable[[argparse.Namespace], int], help_: str,
                ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=help_, description=help_)
        p.set_defaults(func=func)
        return p

    def engine_args(p: argparse.ArgumentParser, required: bool = True) -> None:
        p.add_argument("--engine", required=required, help="engine name (see `engines`)")
        p.add_argument("--engine-version", help="plan for this engine version instead of "
                                                "the installed one")
        p.add_argument("--python", help="interpreter of the environment the engine lives in")
        p.add_argument("--engine-home", help="the engine's source checkout (engines run from "
                                             "one, e.g. NeMo RL)")

    p = command("validate", cmd_validate, "check a spec; every problem as path: message")
    p.add_argument("spec")
    p = command("digest", cmd_digest, "print the experiment digest of a spec")
    p.add_argument("spec")
    p = command("schema", cmd_schema, "print a JSON Schema (spec, plan, result, contract)")
    p.add_argument("name")
    p = command("engines", cmd_engines, "list registered engine adapters")
    p.add_argument("--python", help="detect installed versions in this interpreter")
    p = command("check", cmd_check, "check an engine version can run a spec: capabilities, "
                                     "every setting's translation, the budget (exit 0, 2 or "
                                     "3)")
    engine_args(p)
    p.add_argument("spec")
    p = command("explain", cmd_explain, "show what every spec field becomes on an engine")
    engine_args(p, required=False)
    p.add_argument("--all-engines", action="store_true",
                   help="one column per registered engine, side by side")
    p.add_argument("--effective", action="store_true",
                   help="with --all-engines: what each engine will really do, per setting: "
                        "same, pinned, declared or refused")
    p.add_argument("--differs", action="store_true",
                   help="with --effective: only the settings that are not the same "
                        "everywhere by default")
    p.add_argument("spec")
    p = command("plan", cmd_plan, "make a reviewable launch plan")
    engine_args(p)
    p.add_argument("--provider", choices=["local", "ray"], default="local")
    p.add_argument("-o", "--output", help="plan file to write (default: print it)")
    p.add_argument("spec")
    p = command("run", cmd_run, "run a plan, or plan and run a spec with --engine")
    engine_args(p, required=False)
    p.add_argument("--provider", choices=["local", "ray"], default="local")
    p.add_argument("--runs-dir", help="run store (default ./runs or $STATESET_BACKEND_RUNS_DIR)")
    p.add_argument("--timeout", type=float, help="seconds before the engine is stopped")
    p.add_argument("--quiet", action="store_true", help="do not echo the engine's stderr")
    p.add_argument("--ray-address", help="Ray dashboard address for --provider ray (default "
                                         "$RAY_ADDRESS), e.g. http://127.0.0.1:8265")
    p.add_argument("--resume", action="store_true",
                   help="continue the plan's run from its newest complete checkpoint")
    p.add_argument("--retry", action="store_true",
                   help="train the plan's run again from scratch as a new attempt, although "
                        "earlier attempts exist (without it, a run that has attempts is "
                        "never trained again unasked)")
    p.add_argument("--allow-runtime-change", action="store_true",
                   help="with --resume: continue although torch, transformers or "
                        "stateset-backend changed version since the checkpoint (recorded as "
                        "a warning in the result); a world-size change is always refused")
    p.add_argument("document", metavar="PLAN|SPEC")
    p = command("runs", cmd_runs, "find, inspect and compare runs in the run store")
    store = _Parser(add_help=False)
    store.add_argument("--runs-dir", help="run store (default ./runs or "
                                          "$STATESET_BACKEND_RUNS_DIR)")
    runs_sub = p.add_subparsers(dest="runs_command", required=True, parser_class=_Parser)
    q = runs_sub.add_parser("list", parents=[common, store], help="runs, newest first")
    q.add_argument("--digest", help="only runs of this experiment digest")
    q.add_argument("--engine", help="only runs on this engine")
    q.add_argument("--status", choices=["succeeded", "failed", "invalid", "interrupted",
                                        "quarantined", "unreadable"])
    q = runs_sub.add_parser("show", parents=[common, store], help="one run: identity, attempts, "
                                                            "checkpoints, selection")
    q.add_argument("run")
    q = runs_sub.add_parser("compare", parents=[common, store], help="every run of one experiment "
                                                               "side by side")
    q.add_argument("targets", nargs="+", metavar="DIGEST|RUN")
    runs_sub.add_parser("reindex", parents=[common, store], help="rebuild the index from the run "
                                                           "directories")
    q = runs_sub.add_parser("verify", parents=[common, store],
                            help="reload the run's newest checkpoint whole (hashes checked) and "
                                 "clear its quarantine; exit 6 if it does not")
    q.add_argument("run")
    q = runs_sub.add_parser("from-run", parents=[common, store],
                            help="the model.from_run section that starts another run from this "
                                 "run's checkpoint (run id, checkpoint, manifest sha256)")
    q.add_argument("run")
    q.add_argument("--checkpoint", metavar="update-NNNNNN",
                   help="this checkpoint instead of the newest complete one")
    q.add_argument("--spec", help="a spec to fill in (with --output)")
    q.add_argument("--output", help="where the filled-in spec is written")
    q = runs_sub.add_parser("export", parents=[common, store], help="log a run to a tracking "
                                                              "store (MLflow)")
    q.set_defaults(func=cmd_runs_export)
    q.add_argument("run")
    q.add_argument("--mlflow", required=True, metavar="URI",
                   help="MLflow tracking URI, e.g. sqlite:///mlflow.db or http://host:5000")
    q.add_argument("--experiment", help="MLflow experiment name (default: the spec's name "
                                        "and the digest)")
    q.add_argument("--attempt", type=int, help="this attempt instead of the newest")
    p = command("evaluate", cmd_evaluate, "score a checkpoint of a run on a held-out split "
                                          "with the spec's validation decoding")
    p.add_argument("--runs-dir", help="run store (default ./runs or $STATESET_BACKEND_RUNS_DIR)")
    p.add_argument("--split", required=True, choices=["test", "validation"])
    p.add_argument("--checkpoint", default="recommended", metavar="recommended|final|update-N",
                   help="which checkpoint (default: the recommended one)")
    p.add_argument("--attempt", type=int, help="this attempt instead of the newest")
    p.add_argument("run")
    p = command("report", cmd_report, "write a self-contained HTML report of a run or of "
                                      "every run of an experiment")
    p.add_argument("--runs-dir", help="run store (default ./runs or $STATESET_BACKEND_RUNS_DIR)")
    p.add_argument("-o", "--output", help="HTML file to write (default report-<target>.html)")
    p.add_argument("target", metavar="RUN|DIGEST")
    p = command("attest", cmd_attest, "write an in-toto statement binding a run's artifacts "
                                      "to its experiment")
    p.add_argument("--runs-dir", help="run store (default ./runs or $STATESET_BACKEND_RUNS_DIR)")
    p.add_argument("-o", "--output", help="file to write (default: print the statement)")
    p.add_argument("--attempt", type=int, help="this attempt instead of the newest")
    p.add_argument("run")
    p = sub.add_parser("conformance", help="run the adapter conformance kit for an engine",
                       description="run the adapter conformance kit for a registered engine "
                                   "(exit 0, or 5 when a check failed), or print the "
                                   "compatibility matrix")
    p.set_defaults(func=cmd_conformance)
    p.add_argument("engine", nargs="*", metavar="ENGINE")
    p.add_argument("--engine-version", action="append", metavar="V",
                   help="check this version (repeatable; default: every dialect's first)")
    p.add_argument("--json", nargs="?", const="-", metavar="REPORT", default=argparse.SUPPRESS,
                   help="write the report as JSON to REPORT (stdout without a path)")
    p.add_argument("--matrix", action="store_true",
                   help="print the compatibility matrix (Markdown) of the built-in engines")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show tracebacks")
    return parser


# C0 and C1 controls (U+0085 is a line break to splitlines() and terminals; U+009B starts a
# terminal escape) and the Unicode line and paragraph separators
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def one_line(message: str) -> str:
    """An error is one line whatever the user's strings in it hold: a newline or other
    control character in a path or name is shown escaped, as Python writes it."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], message)


def main(argv: Sequence[str] | None = None) -> int:
    from stateset_backend.common.errors import StatesetError

    raw = list(sys.argv[1:] if argv is None else argv)
    debug, as_json = "--debug" in raw, "--json" in raw
    try:
        args = build_parser().parse_args(raw)
        code = int(args.func(args))
    except StatesetError as exc:
        if debug:
            raise
        if as_json:
            print(json.dumps({"error": exc.to_json()}, indent=2))
        print(f"{PROG}: error: {one_line(exc.message)}", file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        code = 130
    except BrokenPipeError:
        # The reader stopped reading (`| head`): a normal way to stop, not an error. Point
        # stdout at /dev/null so the interpreter's final flush cannot raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 0
    except Exception as exc:
        if debug:
            raise
        print(f"{PROG}: internal error: {type(exc).__name__}: {one_line(str(exc))} "
              "(rerun with --debug)",
              file=sys.stderr)
        code = 1
    if argv is None:
        sys.exit(code)
    return code
