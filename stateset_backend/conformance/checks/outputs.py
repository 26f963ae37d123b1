"""The end of a run, as the adapter reads it: collecting the engine's outputs (resuming from
a checkpoint is ``checks.resume``).

A :class:`Writer` lays down the engine's native output files for canonical metric rows (the
adapter's ``kit_support().write_outputs``, or the kit's own for a built-in engine). Healthy
outputs collect as ``succeeded``; NaN, infinite or string metrics, missing or escaping
artifacts, a missing identity, no committed update or a run stopped early are ``invalid``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from stateset_backend.conformance.checks.planning import CheckFailed
from stateset_backend.contracts.loader import parse_version
from stateset_backend.engines.adapter import (
    CannotWrite,
    EngineAdapter,
    LaunchContext,
    collect_outputs,
)
from stateset_backend.plan.launch_plan import LaunchPlan
from stateset_backend.providers.local import Exit
from stateset_backend.runs.lineage import checkpoint_name
from stateset_backend.runs.results import evaluate
from stateset_backend.runs.weights_files import WEIGHT_SUFFIXES
from stateset_backend.spec.schedule import NEXT_LR


class Writer(Protocol):
    """A writer may also take ``resumed_from``: the update a resumed attempt continued from,
    for an engine whose outputs record it (the resume check passes it where it is taken)."""

    def __call__(self, attempt_dir: Path, ctx: LaunchContext, *, metrics: list[dict[str, Any]],
                 identity: bool, artifacts: bool, checkpoint_step: int | None) -> None: ...


# -- collection ------------------------------------------------------------------------------------
# the base sample's budget: 4 updates (samples.base_doc)
HEALTHY = [{"step": s, "reward/mean": 0.2 * s, "loss/policy": 0.5 / s, "kl": 0.01}
           for s in (1, 2, 3, 4)]


def _every_metric(plan: LaunchPlan, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For a built-in engine, whose writer the kit owns, each training row also carries every
    other metric the engine logs, each at a value of its own at each update (validation's at
    every other update, as an engine validates): a collector that reads one metric under
    another's name, or the next update's rate as this one's, then reads a wrong value. A
    plugin's writer is given the rows as they are, which its docs name."""
    from stateset_backend.conformance.writers import logged

    names = logged(plan)
    if names is None:
        return rows
    return [{**{k: v for k, v in _more(r["step"]).items() if k in names}, **r}
            if "loss/policy" in r else r for r in rows]


def _more(step: int) -> dict[str, float]:
    """The other metrics' values at ``step``: no two in a row alike (nor alike with the
    reward's, the loss's or the KL's), and the rate different at each update, so that
    reading any of them under another's name, or at another update, reads a wrong value."""
    more = {"entropy": 1.0 + 0.1 * step, "clip_fraction": 0.002 + 0.03 * step,
            "grad_norm": 2.0 + 0.25 * step, "lr": 1e-4 * step, NEXT_LR: 1e-4 * (step + 1),
            "response_length/mean": 40.0 + step, "tokens_per_second": 1000.0 + 10 * step}
    if step % 2 == 0:
        more["val/reward/mean"] = 0.05 + 0.15 * step
    return more


def _with(rows: list[dict[str, Any]], step: int, name: str, value: Any) -> list[dict[str, Any]]:
    return [dict(r, **{name: value}) if r["step"] == step else dict(r) for r in rows]


@dataclass(frozen=True)
class Case:
    name: str
    expect: str  # succeeded | invalid
    metrics: list[dict[str, Any]]
    identity: bool = True
    artifacts: bool = True
    checkpoint_step: int | None = 3
    # remove_artifacts | symlink_artifacts | cut_last_line | empty_weights | cut_weights |
    # foreign_identity
    after: str | None = None


COLLECTION_CASES: dict[str, Case] = {c.name: c for c in (
    Case("healthy", "succeeded", HEALTHY),
    # the bad value goes into the reward, the one metric every engine reports
    Case("nan_metric", "invalid", _with(HEALTHY, 2, "reward/mean", math.nan)),
    Case("infinite_metric", "invalid", _with(HEALTHY, 2, "reward/mean", math.inf)),
    Case("string_metric", "invalid", _with(HEALTHY, 2, "reward/mean", "NaN")),
    Case("no_artifacts", "invalid", HEALTHY, artifacts=False),
    Case("missing_artifact", "invalid", HEALTHY, after="remove_artifacts"),
    Case("artifact_symlink_outside", "invalid", HEALTHY, after="symlink_artifacts"),
    Case("missing_identity", "invalid", HEALTHY, identity=False),
    # outputs another run left (a folder reused, a resume into the wrong place): the identity
    # is the engine's record of whose run it trained, not the launch's
    Case("foreign_identity", "invalid", HEALTHY, after="foreign_identity"),
    Case("no_committed_update", "invalid", [], checkpoint_step=None),
    # the engine exited 0 after 3 of the 4 planned updates: not the experiment that was asked
    Case("stopped_early", "invalid", HEALTHY[:3]),
    # a second row logged at the last update (validation metrics beside training ones): still
    # three updates, not four
    Case("two_rows_at_one_update", "succeeded",
         [*HEALTHY, {"step": 4, "reward/mean": 0.7}]),
    # as real logs look: an update logged twice (a logger flushed again after a restart), rows
    # out of order (ranks or threads writing one file), an update whose row was lost, and a
    # row cut off by a crash while it was written; every update is still committed
    Case("repeated_update", "succeeded", [HEALTHY[0], HEALTHY[1], HEALTHY[1], *HEALTHY[2:]]),
    Case("rows_out_of_order", "succeeded", [HEALTHY[1], HEALTHY[0], HEALTHY[3], HEALTHY[2]]),
    Case("update_without_a_row", "succeeded", [*HEALTHY[:2], HEALTHY[3]]),
    Case("row_cut_by_a_crash", "succeeded", HEALTHY, after="cut_last_line"),
    # an engine that takes two optimizer steps per update (mini-batches, epochs): each row
    # carries the optimizer step the update ended at, and an engine that logs or saves by
    # optimizer step writes that; still four updates, never eight
    Case("several_optimizer_steps_per_update", "succeeded",
         [dict(r, optimizer_step=2 * r["step"]) for r in HEALTHY]),
    # weights an engine killed while saving leaves: listed, hashable, and not whole
    Case("empty_weights", "invalid", HEALTHY, after="empty_weights"),
    Case("weights_cut_short", "invalid", HEALTHY, after="cut_weights"),
)}
# the start of a row, as a process killed while writing it leaves it in a JSON-lines log
CUT_ROW = '{"step": 5, "da'


def _cut_last_line(attempt: Path, launched: set[str]) -> int:
    """A row cut off at the end of every JSON-lines file the engine wrote (not the launch's
    own files, ``launched``); how many."""
    cut = 0
    for path in sorted(attempt.rglob("*.jsonl")):
        if path.relative_to(attempt).as_posix() in launched:
            continue
        with path.open("a", encoding="utf-8") as out:
            out.write(CUT_ROW)
        cut += 1
    return cut


def _break(path: Path, empty: bool) -> None:
    """The weights file as a save cut off leaves it: nothing written yet, or a file of its
    format (safetensors, or torch.save's zip archive), built here with the standard library
    so a plugin's CI needs no torch, stopped before its end."""
    if empty:
        path.write_bytes(b"")
        return
    if path.suffix == ".safetensors":
        header = json.dumps({"weight": {"dtype": "F32", "shape": [256],
                                        "data_offsets": [0, 1024]}}).encode()
        whole = len(header).to_bytes(8, "little") + header + bytes(1024)
    else:
        import io
        import zipfile

        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
            archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
            archive.writestr("archive/data/0", bytes(1024))
        whole = buffer.getvalue()
    path.write_bytes(whole[: len(whole) // 2])


def _collect(adapter: EngineAdapter, attempt: Path, ctx: LaunchContext) -> Any:
    return collect_outputs(adapter, attempt, ctx)


def check_read_as_written(plan: LaunchPlan, case: Case, rows: list[dict[str, Any]],
                          collected: Any) -> None:
    """The collector reads back what the writer logged (``rows``): each metric's value under
    its canonical name at its update (every one the kit's writer logs for a built-in engine,
    a plugin's reward), and the checkpoint at the update it was saved at. The status alone
    cannot see a metric read from another of the engine's names (the clip fraction for the
    policy loss, the KL coefficient for the KL), nor a checkpoint labelled with another
    update, which a resume or a recommended checkpoint would then pair with other metrics.
    Values agree to a part in 10,000: an engine may log text with four decimals."""
    from stateset_backend.conformance.writers import logged
    from stateset_backend.spec.model import SUPERVISED

    rewarded = plan.validated_spec().algorithm.objective != SUPERVISED
    required = set(logged(plan) or ({"reward/mean"} if rewarded else set()))
    read = {(r["step"], k): v for r in collected.metrics
            if isinstance(r.get("step"), int) for k, v in r.items() if k != "step"}
    for row in rows:
        for name, value in row.items():
            if name in ("step", "optimizer_step"):
                continue
            got = read.get((row["step"], name))
            if got is None:
                if name in required:
                    raise CheckFailed(f"{case.name}: the engine logged {name} = {value} at "
                                      f"update {row['step']}, and collect reads no {name} "
                                      "there: it reads another name, or none")
                continue
            if not isinstance(got, (int, float)) or \
                    not math.isclose(got, value, rel_tol=1e-4, abs_tol=1e-6):
                raise CheckFailed(f"{case.name}: the engine logged {name} = {value} at update "
                                  f"{row['step']}, and collect reads {got!r}")
    check_checkpoint_labels(case, collected)


def check_checkpoint_labels(case: Case, collected: Any) -> None:
    """Each checkpoint is labelled with the update it was saved at (an engine may also save
    at the last update; a tracker file may carry no update): with several optimizer steps an
    update, an engine that names its folders by optimizer step names update 3's ``6``."""
    last = max((int(r["step"]) for r in case.metrics), default=0)
    labelled = {a.step for a in collected.artifacts
                if a.kind == "checkpoint" and a.step is not None}
    if case.checkpoint_step is not None and labelled and \
            (case.checkpoint_step not in labelled or labelled - {case.checkpoint_step, last}):
        raise CheckFailed(f"{case.name}: the engine saved a checkpoint at update "
                          f"{case.checkpoint_step}; collect labels checkpoint files with "
                          f"update(s) {sorted(labelled)}")


def check_named_as_listed(adapter: EngineAdapter, plan: LaunchPlan, attempt: Path) -> None:
    """Where the release starts a run ``from_run``, each checkpoint ``checkpoints`` lists is
    the one ``named_checkpoint`` finds by the name ``model.from_run`` gives it
    (``update-NNNNNN``): a lookup by the engine's own step, where an update takes several
    optimizer steps, starts the new run from another update than its lineage records."""
    if "init:from_run" not in adapter.contract.provided(parse_version(plan.engine_version)):
        return
    for listed in adapter.checkpoints(attempt):
        name = checkpoint_name(listed.update)
        named = adapter.named_checkpoint(attempt, name)
        if named is None or named.update != listed.update or \
                named.path.resolve() != listed.path.resolve():
            shown = "nothing" if named is None else f"{named.path} (update {named.update})"
            raise CheckFailed(f"named_checkpoint({name!r}) finds {shown}, where checkpoints "
                              f"lists update {listed.update} at {listed.path}: model.from_run "
                              "names a checkpoint by its update, and must start from it")


# the attempt the cases are collected from, and the earlier one a run's folder holds beside it
# (its number sorts after this one's as text): a collector reads the attempt it is given
ATTEMPT, EARLIER_ATTEMPT = "10", "9"


def foreign(ctx: LaunchContext) -> LaunchContext:
    """The launch context of another run of another experiment."""
    stamp, _, suffix = ctx.run_id.rpartition("-")
    other = "".join("1" if c == "0" else "0" for c in suffix)
    digest = "sha256:" + ("d" if ctx.experiment_digest.endswith("e" * 64) else "e") * 64
    return dataclasses.replace(ctx, run_id=f"{stamp}-{other}" if stamp else f"{other}-x",
                               experiment_digest=digest)


def _earlier_attempt(writer: Writer, folder: Path, ctx: LaunchContext, rows: list[dict[str, Any]],
                     plan: LaunchPlan) -> None:
    """An earlier attempt of the same run beside the collected one: the launch's files, and
    outputs stopped after two updates, every value ten times the collected one's."""
    folder.mkdir(parents=True)
    plan.write_files(folder)
    earlier = [{k: v if k in ("step", "optimizer_step") else 10 * v for k, v in r.items()}
               for r in rows if r["step"] <= 2]
    writer(folder, ctx, metrics=earlier, identity=True, artifacts=True, checkpoint_step=2)


def check_raw_names(plan: LaunchPlan, collected: Any, attempt: Path) -> None:
    """Each engine name the collector says it read a metric under (``raw_metric_names``, the
    run's record of where each number came from) is in a file the engine wrote: a name that
    is not points a user who checks the engine's own log at the wrong number."""
    read = {k for r in collected.metrics for k in r if k != "step"}
    claimed = {c: raw for c, raw in collected.raw_metric_names.items() if c in read}
    if not claimed:
        return
    written = b"".join(p.read_bytes() for p in sorted(attempt.rglob("*"))
                       if p.is_file() and not p.is_symlink() and
                       p.relative_to(attempt).as_posix() not in plan.files)
    missing = {c: raw for c, raw in claimed.items() if raw.encode() not in written}
    if missing:
        name, raw = next(iter(sorted(missing.items())))
        raise CheckFailed(f"healthy: collect says it read {name} under the engine's name "
                          f"{raw!r}, which no file the engine wrote holds"
                          + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))


def check_nothing_invented(rows: list[dict[str, Any]], collected: Any) -> None:
    """Every metric collect reports at an update is one the engine logged there: a value
    taken from the launch's settings (the configured rate under a schedule) or made up where
    the engine logged none reads as the engine's own record."""
    logged = {(r["step"], k) for r in rows for k in r}
    for row in collected.metrics:
        step = row.get("step")
        extra = sorted(k for k in row if k not in ("step", "optimizer_step") and
                       (step, k) not in logged)
        if extra:
            raise CheckFailed(f"healthy: collect reports {extra[0]} = {row[extra[0]]!r} at "
                              f"update {step}, where the engine logged no {extra[0]}: report "
                              "what the engine wrote, never the launch's settings")


def check_collection(adapter: EngineAdapter, plan: LaunchPlan, case: Case, writer: Writer,
                     tmp: Path) -> str:
    attempt = tmp / "attempts" / ATTEMPT
    attempt.mkdir(parents=True)
    planned = plan.validated_spec().budget.total_updates
    if planned != len(HEALTHY):
        raise CheckFailed(f"the collection cases are written for the base sample's "
                          f"{len(HEALTHY)} updates, but its budget is {planned}: a `base` "
                          "must not change budget.total_updates")
    ctx = LaunchContext(plan.run_id, plan.experiment_digest, plan.engine_version,
                        plan.resolved_dialect(), plan.base_dir)
    # as a launch leaves them: a collector that takes its counts from the launch's config,
    # not from what the engine wrote, is seen doing so
    plan.write_files(attempt)
    rows = _every_metric(plan, case.metrics)
    if case.name == "healthy":
        _earlier_attempt(writer, tmp / "attempts" / EARLIER_ATTEMPT, ctx, rows, plan)
    written_as = foreign(ctx) if case.after == "foreign_identity" else ctx
    try:
        writer(attempt, written_as, metrics=copy.deepcopy(rows), identity=case.identity,
               artifacts=case.artifacts, checkpoint_step=case.checkpoint_step)
    except (KeyError, TypeError, ValueError) as exc:
        if "optimizer_step" not in str(exc):
            raise
        raise CannotWrite(f"the writer does not take a row's optimizer_step ({exc}); "
                          "docs/plugins.md says what it is") from None
    if case.after == "cut_last_line":
        if not _cut_last_line(attempt, set(plan.files)):
            raise CannotWrite("the engine writes no JSON-lines log to cut a row of")
        collected, error = _collect(adapter, attempt, ctx)
    else:
        collected, error = _collect(adapter, attempt, ctx)
    if case.after in ("empty_weights", "cut_weights"):
        weights = [attempt / a.path for a in (collected.artifacts if collected else [])
                   if Path(a.path).suffix in WEIGHT_SUFFIXES and (attempt / a.path).is_file()]
        if not weights:
            raise CannotWrite("the outputs list no weights file (.safetensors, .pt, .pth, "
                              ".bin, .ckpt) to break")
        for path in weights:
            _break(path, empty=case.after == "empty_weights")
        collected, error = _collect(adapter, attempt, ctx)
    if case.after in ("remove_artifacts", "symlink_artifacts"):
        if collected is None or not collected.artifacts:
            raise CheckFailed(f"{case.name}: the healthy outputs list no artifact "
                              f"({error or 'collect found none'})")
        outside = tmp / "outside"
        for art in collected.artifacts:
            path = attempt / art.path
            if not path.is_file():
                continue
            if case.after == "remove_artifacts":
                path.unlink()
            else:
                target = outside / art.path
                target.parent.mkdir(parents=True, exist_ok=True)
                path.replace(target)
                path.symlink_to(target)
        collected, error = _collect(adapter, attempt, ctx)
    status, checks, _ = evaluate(plan, Exit(0), collected, attempt, collect_error=error)
    failed = [f"{c.name}: {c.detail}" for c in checks if not c.ok]
    if case.expect == "succeeded" and collected is not None:
        shown = max((int(r["step"]) for r in case.metrics), default=0)
        if collected.committed_updates != shown:
            raise CheckFailed(f"{case.name}: committed_updates is "
                              f"{collected.committed_updates}, but the outputs show {shown} "
                              f"updates (logged up to update {shown}, a checkpoint at "
                              f"{case.checkpoint_step}); count updates, not log rows, and "
                              "take them from this attempt's outputs, not from the launch or "
                              "another attempt's")
    if status != case.expect:
        raise CheckFailed(f"{case.name}: the result is {status}, expected {case.expect}"
                          + (f" ({'; '.join(failed)})" if failed else ""))
    if case.name == "healthy" and collected is not None:
        check_read_as_written(plan, case, rows, collected)
        check_raw_names(plan, collected, attempt)
        check_nothing_invented(rows, collected)
    elif case.expect == "succeeded" and collected is not None:
        check_checkpoint_labels(case, collected)
    if case.expect == "succeeded":
        check_named_as_listed(adapter, plan, attempt)
    return f"{status}" + (f" ({failed[0]})" if failed else "")
