"""Resuming from a checkpoint, as the engine would: the earlier attempt's newest whole
checkpoint is found and accepted, the resumed launch continues from exactly it without
touching the earlier attempt, the engine reading that launch loads it, and the attempt's
outputs read back as a run that continued from it (and a fresh start's as no resume).

A resume that quietly starts afresh keeps every structural sign of a resume, so the kit does
not stop at ``resume_argv`` changing the launch: it reads the resumed launch with the engine's
own parser and follows the engine's own rule, written from its code (``conformance.resumes``,
or a plugin's ``KitSupport.resumes_from``), to the checkpoint folder the engine would load.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stateset_backend.common.jsonio import flatten
from stateset_backend.conformance.checks.determinism import tree
from stateset_backend.conformance.checks.outputs import (
    Writer,
    _collect,
    check_named_as_listed,
    foreign,
)
from stateset_backend.conformance.checks.planning import (
    CheckFailed,
    describe,
    fitted_base,
    plan_doc,
)
from stateset_backend.contracts.loader import parse_version
from stateset_backend.engines.adapter import RUN_DIR, EngineAdapter, LaunchContext
from stateset_backend.plan.launch_plan import LaunchPlan
from stateset_backend.providers.local import Exit
from stateset_backend.runs.results import evaluate

# the resume check's run: 12 updates, the newest whole checkpoint of update 10 with one of
# update 9 beside it (and, for a built-in engine, a save of update 11 a crash cut short):
# numbers whose folder names sort otherwise as text ("global_step_10" < "global_step_9")
UPDATES, OLDER, NEWEST, CUT = 12, 9, 10, 11
ROWS = [{"step": s, "reward/mean": 0.05 * s, "loss/policy": 0.5 / s, "kl": 0.01}
        for s in range(1, UPDATES + 1)]


def check_resume(adapter: EngineAdapter, plan: LaunchPlan, writer: Writer, tmp: Path,
                 parse_launch: Any = None) -> str | None:
    """The resume of an earlier attempt holding checkpoints of updates 9 and 10 of a planned
    12 (``plan``'s budget); returns what could not be verified (the row is then
    ``unverified``), or None when everything was."""
    earlier, new = tmp / "attempts" / "1", tmp / "attempts" / "2"
    ctx = LaunchContext(plan.run_id, plan.experiment_digest, plan.engine_version,
                        plan.resolved_dialect(), plan.base_dir)
    earlier.mkdir(parents=True)
    writer(earlier, ctx, metrics=copy.deepcopy(ROWS), identity=True, artifacts=True,
           checkpoint_step=NEWEST)
    _add_older_checkpoint(writer, ctx, earlier, tmp / "older")
    cut = _add_cut_checkpoint(adapter, plan.engine, writer, ctx, earlier, tmp / "cut")
    found = _newest(adapter, plan, earlier, cut)
    _foreign_refused(adapter, plan, writer, ctx, found, tmp / "foreign")
    before = tree(earlier)
    resumed, staged = _resume(adapter, plan, found, earlier, new)
    if tree(earlier) != before:
        raise CheckFailed("resume_argv changed the earlier attempt's directory")
    unread = _engine_resumes(adapter, plan, resumed, new, found, staged, parse_launch)
    told = "resumed_from" in inspect.signature(writer).parameters
    untold = _continued(adapter, plan, writer, ctx, new, tmp / "outputs", found.update, told)
    _fresh_start(adapter, plan, writer, ctx, found, tmp, told)
    return unread or untold


def _newest(adapter: EngineAdapter, plan: LaunchPlan, earlier: Path, cut: bool) -> Any:
    beside = f"one of update {OLDER} is beside it" + (
        f", and a save of update {CUT} that a crash cut short" if cut else "")
    found = adapter.latest_checkpoint(earlier)
    if found is None:
        raise CheckFailed("resume:exact is claimed, but latest_checkpoint finds no checkpoint "
                          f"in an attempt the writer gave one (update {NEWEST}; {beside})")
    if found.update != NEWEST:
        raise CheckFailed(f"latest_checkpoint reports update {found.update}, where the newest "
                          f"whole checkpoint the writer wrote is of update {NEWEST} ({beside})")
    problem = adapter.checkpoint_problem(found, plan.experiment_digest)
    if problem is not None:
        raise CheckFailed(f"a whole checkpoint of this experiment is refused: {problem}")
    _listed_in_order(adapter, earlier, found.update, beside)
    check_named_as_listed(adapter, plan, earlier)
    return found


def _foreign_refused(adapter: EngineAdapter, plan: LaunchPlan, writer: Writer,
                     ctx: LaunchContext, found: Any, scratch: Path) -> None:
    """The same checkpoint saved by a run of another experiment, where the engine records
    whose experiment a checkpoint is (its files then differ from this one's): the adapter
    refuses it for this experiment, or a resume (and ``runs verify``) continues another
    experiment's weights under this one's name."""
    scratch.mkdir(parents=True)
    writer(scratch, foreign(ctx), metrics=copy.deepcopy(ROWS), identity=True, artifacts=True,
           checkpoint_step=NEWEST)
    other = adapter.latest_checkpoint(scratch)
    if other is None or tree(other.path) == tree(found.path):
        return  # nothing in the engine's checkpoint says whose experiment it is
    if adapter.checkpoint_problem(other, plan.experiment_digest) is None:
        raise CheckFailed(f"a checkpoint of update {NEWEST} saved by another experiment's run "
                          "is accepted for this one: the engine records whose experiment a "
                          "checkpoint is, and checkpoint_problem must refuse another's")


def _listed_in_order(adapter: EngineAdapter, earlier: Path, newest: int, beside: str) -> None:
    """``checkpoints`` lists whole checkpoints oldest first and ends at the one
    ``latest_checkpoint`` finds: ``runs verify`` and a damaged newest checkpoint's fallback
    walk it from the end, and a model taken ``from_run`` by name is looked up in it."""
    updates = [c.update for c in adapter.checkpoints(earlier)]
    if not updates:
        raise CheckFailed(f"checkpoints lists none, where latest_checkpoint finds update "
                          f"{newest} ({beside})")
    if any(b <= a for a, b in itertools.pairwise(updates)) or updates[-1] != newest:
        raise CheckFailed(f"checkpoints lists updates {updates}: it must list them oldest "
                          f"first, ending at update {newest}, which latest_checkpoint finds "
                          f"({beside})")


def _resume(adapter: EngineAdapter, plan: LaunchPlan, found: Any, earlier: Path,
            new: Path) -> tuple[list[str], Any]:
    """The resumed launch into ``new`` and the checkpoint it staged there (None: none): the
    launch keeps writing into the new attempt, points into the earlier one only at the
    checkpoint, and a staged checkpoint is that checkpoint, whole and accepted."""
    new.mkdir(parents=True, exist_ok=True)
    argv = [a.replace(RUN_DIR, str(new)) for a in plan.argv]
    resumed = adapter.resume_argv(found, list(argv), new)
    if not all(isinstance(a, str) for a in resumed):
        raise CheckFailed("resume_argv returns an argv with non-string elements")
    linked = _links(new)
    if linked:
        raise CheckFailed(f"resume_argv leaves a symbolic link in the new attempt "
                          f"({linked[0]}): the hub refuses an attempt's linked files, so the "
                          "resumed run would end invalid, and its checkpoint would live in "
                          "another attempt; stage a copy (stage_checkpoint)")
    staged = adapter.latest_checkpoint(new)
    if resumed == argv and staged is None:
        raise CheckFailed("resume_argv neither changes the launch nor stages the checkpoint "
                          "in the new attempt: the engine would start from scratch")
    if staged is not None:
        if staged.update != found.update or tree(staged.path) != tree(found.path):
            raise CheckFailed(f"the checkpoint staged in the new attempt ({staged.path}, update "
                              f"{staged.update}) is not the one resumed from ({found.path}, "
                              f"update {found.update}), file for file")
        problem = adapter.checkpoint_problem(staged, plan.experiment_digest)
        if problem is not None:
            raise CheckFailed(f"the checkpoint staged in the new attempt is refused: {problem}")
    lost = [a for a in argv if str(new) in a and a not in resumed]
    if lost:
        raise CheckFailed(f"the resumed launch no longer writes into the new attempt: {lost[0]!r}"
                          " is gone")
    into_old = [a for a in resumed if a not in argv and str(earlier) in a and
                str(found.path) not in a]
    if into_old:
        raise CheckFailed(f"the resumed launch points into the earlier attempt beyond its "
                          f"checkpoint: {into_old[0]!r}")
    return resumed, staged


def _links(root: Path) -> list[str]:
    """The symbolic links under ``root`` (not followed), relative to it."""
    out = []
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            if os.path.islink(os.path.join(folder, name)):
                out.append(os.path.relpath(os.path.join(folder, name), root))
    return sorted(out)


def _add_older_checkpoint(writer: Writer, ctx: LaunchContext, attempt: Path,
                          scratch: Path) -> None:
    """An older checkpoint (update 9) beside the newest, as an engine that keeps several
    leaves them: the writer writes it into a scratch attempt, and the files that attempt has
    and ``attempt`` lacks (that checkpoint's folder) join it, so the newest checkpoint's
    records (a tracker file, the logs) stay the newest's."""
    scratch.mkdir(parents=True)
    writer(scratch, ctx, metrics=copy.deepcopy(ROWS[:OLDER]), identity=True, artifacts=True,
           checkpoint_step=OLDER)
    _join(scratch, attempt)


def _renamed(name_of: Callable[[str], str]) -> Callable[[Path], None]:
    def cut(checkpoint: Path) -> None:
        checkpoint.rename(checkpoint.with_name(name_of(checkpoint.name)))
    return cut


def _as_written(checkpoint: Path) -> None:
    """The folder as the save left it: only the tracker written after it says it is whole."""


# how a crash leaves each built-in engine's save, as a plugin's ``KitSupport.cut_save`` says
# it for its engine: verl and DeepSpeed (under OpenRLHF) write the folder, then the tracker
# beside it (latest_checkpointed_iteration.txt, `latest`), which still names the update before
# (the earlier attempt's tracker is kept); NeMo RL and the native engine write a temporary
# folder and rename it into place once it is whole
CUT_SAVE: dict[str, Callable[[Path], None]] = {
    "verl": _as_written, "openrlhf": _as_written,
    "nemo-rl": _renamed(lambda name: f"tmp_{name}"),
    "native": _renamed(lambda name: f".{name}.cut")}


def _add_cut_checkpoint(adapter: EngineAdapter, engine: str, writer: Writer,
                        ctx: LaunchContext, attempt: Path, scratch: Path) -> bool:
    """A save of update 11 beside the newest whole checkpoint, as a crash during it leaves
    it: a resume from it would load a half-written model. For a built-in engine, whose saves
    the kit knows, and a plugin that says how its engine's save is cut
    (``KitSupport.cut_save``); returns whether it was added."""
    cut_save = CUT_SAVE.get(engine) or adapter.kit_support().cut_save
    if cut_save is None:
        return False
    scratch.mkdir(parents=True)
    writer(scratch, ctx, metrics=copy.deepcopy(ROWS), identity=True, artifacts=True,
           checkpoint_step=CUT)
    whole = adapter.latest_checkpoint(scratch)
    if whole is None or whole.update != CUT:
        raise CheckFailed(f"latest_checkpoint finds {whole and whole.update} in an attempt "
                          f"the writer gave one checkpoint, of update {CUT}")
    cut_save(whole.path)
    _join(scratch, attempt)
    return True


def _join(source: Path, target: Path) -> None:
    """The files of ``source`` that ``target`` lacks, copied into it."""
    for path in sorted(source.rglob("*")):
        into = target / path.relative_to(source)
        if path.is_file() and not path.is_symlink() and not into.exists():
            into.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, into)


def _engine_resumes(adapter: EngineAdapter, plan: LaunchPlan, resumed: list[str], new: Path,
                    found: Any, staged: Any, parse_launch: Any) -> str | None:
    """The engine, reading the resumed launch, loads the checkpoint: its own parser's reading
    (the release's defaults under it), then its own rule. Returns what could not be read."""
    from stateset_backend.conformance.readers import LaunchUnreadable, reader_for
    from stateset_backend.conformance.resumes import resumes_for
    from stateset_backend.contracts.surfaces import surface

    support = adapter.kit_support()
    rule = resumes_for(adapter.name, support.resumes_from)
    if rule is None:
        return ("no reading of where the engine resumes from: give KitSupport.resumes_from "
                "(docs/plugins.md)")
    reader = reader_for(adapter.name, parse_launch)
    known = (surface(adapter.name, plan.engine_version) or support.surface or {}).get(
        "options", {})
    read = {key: option.get("default") for key, option in known.items()}
    try:
        if reader is not None:
            read.update(flatten(reader(plan.model_copy(update={"argv": resumed}))))
        target = rule(resumed, read, new)
    except LaunchUnreadable as exc:
        raise CheckFailed(f"the engine refuses the resumed launch: {exc}") from None
    except (Exception, SystemExit) as exc:
        raise CheckFailed(f"reading where the resumed launch resumes from: "
                          f"{describe(exc) if isinstance(exc, Exception) else exc!r}") from None
    if reader is not None:
        _keeps_the_spec(adapter, plan, reader, known, read, new)
    if target is None:
        raise CheckFailed(f"the engine, reading the resumed launch as its code does, loads no "
                          f"checkpoint and starts afresh (the checkpoint of update "
                          f"{found.update} is {found.path})")
    loads = {found.path.resolve(), *([staged.path.resolve()] if staged else [])}
    if Path(target).resolve() not in loads:
        raise CheckFailed(f"the engine would resume from {target}, not from the checkpoint "
                          f"of update {found.update} ({found.path})")
    _critic_resumes(plan, resumed, read, new, found.update)
    return None


def _keeps_the_spec(adapter: EngineAdapter, plan: LaunchPlan, reader: Any,
                    known: dict[str, Any], resumed_read: dict[str, Any], new: Path) -> None:
    """The resumed launch reads every key the spec's settings set as the first launch does: a
    resume changes where the engine starts from, never the experiment (a budget restarted
    at the updates left, a seed bumped to vary the data, a rate reset)."""
    from stateset_backend.conformance.checks.engine_reads import same_value, translated_keys

    argv = [a.replace(RUN_DIR, str(new)) for a in plan.argv]
    first = {key: option.get("default") for key, option in known.items()}
    try:
        first.update(flatten(reader(plan.model_copy(update={"argv": argv}))))
    except Exception:  # the first launch's reading is checked elsewhere
        return
    for key in sorted(translated_keys(adapter, plan)):
        if key in first and not same_value(first[key], resumed_read.get(key)):
            raise CheckFailed(f"the resumed launch reads {key} = {resumed_read.get(key)!r}, "
                              f"where the first launch of the plan reads {first[key]!r}: a "
                              "resume changes where the engine starts, not the experiment")


def _critic_resumes(plan: LaunchPlan, resumed: list[str], read: dict[str, Any], new: Path,
                    update: int) -> None:
    """With a separate critic (PPO with gae, on an engine whose critic the kit's writers
    save): the engine, reading the resumed launch, loads the critic saved with ``update``.
    A critic left behind starts from its initial weights while the policy continues: the
    first advantages after the resume come from an untrained value function, and nothing
    else in the run says so."""
    from stateset_backend.conformance.resumes import CRITICS
    from stateset_backend.conformance.writers import critic_weights

    critic = CRITICS.get(plan.engine)
    if critic is None or plan.validated_spec().algorithm.gae is None:
        return
    if not critic.runs(read):
        raise CheckFailed("the spec's PPO learns a critic (algorithm.gae), but the engine, "
                          "reading the resumed launch, runs none")
    try:
        folder = critic.resumes(resumed, read, new)
    except Exception as exc:
        raise CheckFailed(f"reading where the resumed launch's critic resumes from: "
                          f"{describe(exc)}") from None
    files = [p for p in folder.rglob("*") if p.is_file()] if folder is not None else []
    if not files:
        raise CheckFailed(f"the engine, reading the resumed launch as its code does, loads no "
                          f"critic checkpoint: the critic would start afresh while the policy "
                          f"continues from update {update}")
    if any(p.read_bytes() != critic_weights(update) for p in files):
        raise CheckFailed(f"the engine would load its critic from {folder}, not the critic "
                          f"saved with update {update}")


def critic_plan(adapter: EngineAdapter, version: str, files: Any, overrides: Any,
                extra: dict[str, Any]) -> list[LaunchPlan]:
    """The critic's sample (PPO with gae) on the resume check's base, where the release
    claims a critic and the kit's writer saves the engine's: a resume is only proven whole
    when every model it trains continues. CheckFailed when the release claims a critic and
    no such sample plans (the capability check names the same refusal)."""
    from stateset_backend.conformance.resumes import CRITICS
    from stateset_backend.conformance.samples import deep_merge, samples_for

    if adapter.name not in CRITICS or \
            "critic" not in adapter.contract.provided(parse_version(version)):
        return []
    base = deep_merge(fitted_base(adapter, version, files, overrides), extra)
    errors = []
    for sample in samples_for(adapter.contract, version, "critic", files, overrides, base=base):
        try:
            return [plan_doc(adapter, version, sample.doc, files)]
        except Exception as exc:
            errors.append(describe(exc))
    raise CheckFailed(f"{adapter.name} {version} claims a critic, but no sample with one plans "
                      "for the resume check" + (f": {' | '.join(errors)}" if errors else ""))


def _continued(adapter: EngineAdapter, plan: LaunchPlan, writer: Writer, ctx: LaunchContext,
               new: Path, outputs: Path, update: int, told: bool) -> str | None:
    """The resumed attempt's outputs (the updates after the checkpoint, the last one saved),
    written into a fresh folder with what the resume staged, read back as a run that
    continued from ``update``: an adapter reporting another resume point, or none, would have
    the hub call a real resume invalid. A writer that cannot be told the attempt resumed (no
    ``resumed_from``) whose outputs read otherwise leaves it unverified."""
    rows = [dict(r) for r in ROWS if r["step"] > update]
    collected, error, status, checks = _read_back(adapter, plan, writer, ctx, new, outputs,
                                                  rows, told, update)
    if status == "succeeded":
        return None
    if not told and collected is not None and collected.resumed_from != update:
        return ("a resumed attempt's outputs read back as continued from update "
                f"{collected.resumed_from}, not {update}, and the writer takes no "
                "resumed_from to write them as the engine would")
    failed = "; ".join(f"{c.name}: {c.detail}" for c in checks if not c.ok)
    raise CheckFailed(f"a resumed attempt's outputs (updates {update + 1} to "
                      f"{rows[-1]['step']}) read back {status}: {failed or error}")


def _fresh_start(adapter: EngineAdapter, plan: LaunchPlan, writer: Writer, ctx: LaunchContext,
                 found: Any, tmp: Path, told: bool) -> None:
    """A resumed launch whose engine started afresh (every update logged from the first) is
    no resume, whatever the launch staged: a collector that takes the resume point from the
    launch or the staged checkpoint, not from the engine's outputs, calls it one."""
    attempt, outputs = tmp / "attempts" / "3", tmp / "fresh"
    attempt.mkdir(parents=True)
    adapter.resume_argv(found, [a.replace(RUN_DIR, str(attempt)) for a in plan.argv], attempt)
    _, _, status, _ = _read_back(adapter, plan, writer, ctx, attempt, outputs,
                                 copy.deepcopy(ROWS), told, None, found.update)
    if status == "succeeded":
        raise CheckFailed(f"an attempt resumed from update {found.update} whose outputs show "
                          "every update from the first (the engine started afresh) reads as a "
                          "resume: take the resume point from the engine's outputs, not from "
                          "the launch or the staged checkpoint")


def _read_back(adapter: EngineAdapter, plan: LaunchPlan, writer: Writer, ctx: LaunchContext,
               staged_in: Path, outputs: Path, rows: list[dict[str, Any]], told: bool,
               resumed: int | None, asked: int | None = None) -> tuple[Any, Any, str, Any]:
    """``rows`` written as an attempt that ``resumed`` (told to a writer that takes it) into
    a fresh folder, with what the resume staged in ``staged_in``, then collected and judged as
    a resume from ``asked`` (default ``resumed``): (collected, collect error, status,
    checks). A fresh folder, so a writer never meets files it did not write."""
    outputs.mkdir(parents=True)
    writer(outputs, ctx, metrics=rows, identity=True, artifacts=True,
           checkpoint_step=int(rows[-1]["step"]), **({"resumed_from": resumed} if told else {}))
    _join(staged_in, outputs)
    collected, error = _collect(adapter, outputs, ctx)
    status, checks, _ = evaluate(plan, Exit(0), collected, outputs, collect_error=error,
                                 resumed_from=resumed if asked is None else asked)
    return collected, error, status, checks
