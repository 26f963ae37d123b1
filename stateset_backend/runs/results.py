"""Result checks: a run is ``succeeded`` only if the engine exited 0 and every check passed.

An engine that exits 0 after a NaN loss, with no committed update, without its checkpoint,
or under somebody else's identity has not produced this experiment's result; it is reported
as ``invalid`` so nobody compares or ships it by mistake.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Container
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from stateset_backend.common.errors import InvalidInput
from stateset_backend.runs import weights_files
from stateset_backend.runs.quarantine import MARKER, describe
from stateset_backend.runs.quarantine import read as read_marker

if TYPE_CHECKING:  # the run store's readers (`runs list`) load results without the rule kit
    from stateset_backend.engines.adapter import Collected
    from stateset_backend.plan.launch_plan import LaunchPlan
    from stateset_backend.providers.local import Exit

RESULT_SCHEMA_ID = "stateset-backend/result/v1"
NEVER_STARTED = "never started"  # the exit_code check's words for an engine that never began
HEADLINE_METRICS = ("reward/mean", "val/reward/mean", "loss/policy", "kl", "loss/sft", "val/loss")
# "prepared": the attempt's files and cluster manifest were written and nothing was executed
# (a kuberay run without apply); never a success
Status = Literal["succeeded", "failed", "invalid", "interrupted", "quarantined", "prepared"]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Check(_Doc):
    name: str
    ok: bool
    detail: str


class ArtifactRecord(_Doc):
    path: str
    kind: str
    step: int | None
    bytes: int
    sha256: str


class ResumeLink(_Doc):
    attempt: int = Field(ge=1, description="the attempt whose checkpoint this one continued")
    update: int = Field(ge=0, description="the update of that checkpoint")


class Metrics(_Doc):
    series: str | None = Field(description="canonical per-update series, relative to the "
                                           "attempt directory; a resumed attempt's begins "
                                           "with the rows of the attempts it continued")
    summary: dict[str, float | None] = Field(description="last value of each canonical metric")
    initial: dict[str, float | None] = Field(
        default_factory=dict, description="first value of each canonical metric (for "
                                          "validation metrics: the untrained policy's)")
    raw_names: dict[str, str] = Field(description="canonical name -> engine's own name")


class Result(_Doc):
    schema_id: Literal["stateset-backend/result/v1"] = Field(
        "stateset-backend/result/v1", alias="schema")
    run_id: str
    attempt: int = Field(ge=1)
    experiment_digest: str
    binding_digest: str
    plan_checksum: str
    engine: str
    engine_version: str
    provider: str
    status: Status
    exit_code: int | None
    started_at: str
    ended_at: str
    duration_s: float
    planned_updates: int
    committed_updates: int
    resumed_from: ResumeLink | None = Field(
        default=None, description="the checkpoint this attempt continued, if it resumed")
    selection: dict[str, Any] | None = Field(
        default=None, description="the recommended checkpoint by evaluation.select_by: the "
                                  "best validated update that has a checkpoint in this or an "
                                  "earlier attempt it continued (ties: the earlier update); "
                                  "never assumed to be the final one")
    deviations: list[dict[str, Any]] = Field(
        description="the declared deviations the engine ran with (from the plan): a run with "
                    "deviations is the same experiment only up to these")
    metrics: Metrics
    artifacts: list[ArtifactRecord]
    checks: list[Check]
    warnings: list[str] = Field(
        default_factory=list, description="what the user allowed that a plain run would have "
                                          "refused, e.g. a resume under changed package "
                                          "versions (run --resume --allow-runtime-change)")

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)

    @classmethod
    def load(cls, path: Path) -> Result:
        """The result stored at ``path``, or InvalidInput saying why it cannot be read."""
        from stateset_backend.common.jsonio import read_json

        try:
            return cls.model_validate(read_json(path, what="result"))
        except ValueError as exc:
            first = str(exc).splitlines()[0]
            raise InvalidInput(f"{path}: not a result ({first})") from None


def never_started(result: Result) -> str | None:
    """``never started: <why>`` for an attempt whose engine never began (its submission
    refused, its launcher missing), else None."""
    for check in result.checks:
        if check.name == "exit_code" and not check.ok and \
                check.detail.startswith(f"{NEVER_STARTED}: "):
            return check.detail
    return None


def failure_reason(result: Result) -> str:
    """The checks that failed; for an interrupted attempt only when it ended, and for one that
    never started only why, since every other check then fails as a consequence (no identity,
    no metrics, no artifacts)."""
    if (why := never_started(result)) is not None:
        return why
    if result.status == "interrupted":
        done = result.committed_updates
        return f"interrupted after update {done}" if done else \
            "interrupted before the first update was committed"
    return "; ".join(f"{c.name}: {c.detail}" for c in result.checks if not c.ok)


METRIC_LIMIT = 1e30  # larger than any loss, reward or norm a healthy run reports


def _non_finite(rows: list[dict[str, Any]]) -> list[str]:
    """Every metric value that is not a finite number: NaN, Infinity, a string such as "NaN"
    (which an engine's logger may write), a bool, null, or a magnitude no healthy run has."""
    bad = []
    for row in rows:
        for name, value in row.items():
            if name == "step":
                continue
            ok = isinstance(value, int | float) and not isinstance(value, bool) and \
                math.isfinite(value) and abs(value) <= METRIC_LIMIT
            if not ok:
                bad.append(f"{name}={value!r} at step {row.get('step')}")
    return bad


ERROR_LINE_LIMIT = 300
_ERROR_LINE = re.compile(r"(^|[\s:])([A-Za-z_][\w.]*(Error|Exception|Exit)|error):")


def last_error(attempt_dir: Path) -> str | None:
    """The engine's own last word on a failure: the last line of its stderr that names an
    error (``SomeError: ...``, or an engine's ``name: error: ...``), skipping the interpreter's
    teardown notes ("Exception ignored in ...")."""
    from stateset_backend.providers.local import STDERR_LOG

    try:
        with (attempt_dir / STDERR_LOG).open("rb") as log:
            log.seek(0, 2)
            log.seek(max(0, log.tell() - 65536))
            tail = log.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        line = line.strip()
        if line.startswith("Exception ignored") or not _ERROR_LINE.search(line):
            continue
        return line if len(line) <= ERROR_LINE_LIMIT else line[:ERROR_LINE_LIMIT] + "..."
    return None


def _escapes(path: Path, attempt_dir: Path) -> str | None:
    """Why an artifact may not be hashed: a symlink anywhere on its path may point outside the
    attempt (a planted link would make another file this run's artifact); it is never
    followed. Hard links are allowed: a resumed attempt's staged checkpoint is one."""
    root = attempt_dir.resolve()
    probe = attempt_dir
    for part in Path(path).relative_to(attempt_dir).parts:
        probe = probe / part
        if probe.is_symlink():
            return f"{probe.relative_to(attempt_dir)} is a symbolic link"
    if not path.resolve().is_relative_to(root):
        return "resolves outside the attempt directory"
    return None


def _execution_differs(ran: dict[str, Any], planned: dict[str, Any]) -> list[str]:
    """Each execution option the engine reports running with at another value than the plan
    sets (``key=value, the plan says ...``): an option that speeds a run up or changes its
    kernels is outside the experiment's identity, but still part of the launch that was
    reviewed. An option the plan does not name is the engine's own default, which the plan
    left to it (a plan made before the engine had the option)."""
    return [f"{key}={value!r}, the plan says {planned[key]!r}"
            for key, value in ran.items() if key in planned and planned[key] != value]


def evaluate(plan: LaunchPlan, exit_: Exit, collected: Collected | None, attempt_dir: Path,
             collect_error: str | None = None, resumed_from: int | None = None,
             ) -> tuple[Status, list[Check], list[ArtifactRecord]]:
    """Run every result check; the status follows from the exit and the checks."""
    from stateset_backend.spec.content import sha256_file
    checks: list[Check] = []

    def add(name: str, ok: bool, detail: str) -> None:
        checks.append(Check(name=name, ok=ok, detail=detail))

    said = f": {exit_.reason}" if exit_.reason else ""
    # the provider's own words for what refused it (kubectl's error) are in stderr.log
    error = f": {why}" if exit_.code != 0 and (why := last_error(attempt_dir)) else ""
    add("exit_code", exit_.code == 0 and not exit_.interrupted and exit_.started,
        f"{NEVER_STARTED}{said or ': no reason was given'}{error}" if not exit_.started else
        f"interrupted{said}" if exit_.interrupted else
        (f"timed out{said}" if exit_.timed_out else
         f"engine exited {exit_.code}{said}{error}"))
    artifacts: list[ArtifactRecord] = []
    if collected is None:
        add("collect", False, collect_error or "outputs could not be read")
    else:
        same_run = collected.run_id == plan.run_id
        same_exp = collected.experiment_digest == plan.experiment_digest
        add("identity", same_run and same_exp,
            "run id and experiment digest found in the engine's outputs" if same_run and
            same_exp else "the engine's outputs name no run (it wrote no identity)"
            if collected.run_id is None and collected.experiment_digest is None else
            f"outputs carry run_id={collected.run_id!r}, "
            f"experiment_digest={collected.experiment_digest!r}")
        if resumed_from is not None:
            add("resume", collected.resumed_from == resumed_from,
                f"continued from update {resumed_from}" if collected.resumed_from ==
                resumed_from else f"asked to continue from update {resumed_from}, the engine "
                                  f"reports {collected.resumed_from}")
        if collected.execution is not None:
            differ = _execution_differs(collected.execution, plan.native)
            add("execution", not differ,
                f"ran with {', '.join(differ)}" if differ else
                "the engine ran with the plan's execution options")
        planned = plan.validated_spec().budget.total_updates
        # every planned update, no more and no fewer: an engine that stops early (a resume
        # that trains nothing, a loop that ends at its own limit) and exits 0 has not run
        # the experiment
        done = collected.committed_updates
        add("committed_updates", done == planned,
            f"{done} of {planned} planned updates committed" + (
                "; the engine stopped before the budget was spent" if 0 < done < planned and
                exit_.code == 0 and not exit_.interrupted else ""))
        bad = _non_finite(collected.metrics)
        # a resume from the last update's checkpoint has no update left to report: it only
        # writes the final model; the earlier attempts reported every row
        nothing_left = resumed_from is not None and resumed_from >= planned
        add("metrics_finite", (bool(collected.metrics) or nothing_left) and not bad,
            (f"nothing left to train after the checkpoint of update {resumed_from}; the "
             "earlier attempts reported the metrics" if nothing_left else
             "no metrics were reported") if not collected.metrics else
            (f"non-finite: {', '.join(bad[:5])}" if bad else
             f"{len(collected.metrics)} rows, all finite"))
        missing, escaping, broken = [], [], []
        for art in collected.artifacts:
            path = attempt_dir / art.path
            rel = Path(art.path)
            why = "names a path outside the attempt directory" if rel.is_absolute() or \
                ".." in rel.parts else _escapes(path, attempt_dir)
            if why is not None:
                escaping.append(f"{art.path} ({why})")
                continue
            if not path.is_file():
                missing.append(art.path)
                continue
            why = weights_files.problem(path)
            if why is not None:
                broken.append(f"{art.path} ({why})")
            artifacts.append(ArtifactRecord(path=art.path, kind=art.kind, step=art.step,
                                            bytes=path.stat().st_size,
                                            sha256=sha256_file(path)))
        add("artifacts", bool(artifacts) and not missing and not escaping and not broken,
            f"refused: {', '.join(escaping[:5])}" if escaping else
            f"missing: {', '.join(missing[:5])}" if missing else
            f"not whole: {', '.join(broken[:5])}" if broken else
            (f"{len(artifacts)} files hashed" if artifacts else "no artifacts were produced"))
    marker = read_marker(attempt_dir) if (attempt_dir / MARKER).exists() else None
    if marker is not None:  # the engine's state may be half-changed: distrust it first
        add("quarantine", False, describe(marker))
    if marker is not None:
        status: Status = "quarantined"
    elif exit_.interrupted:
        status = "interrupted"
    elif exit_.code != 0 or exit_.timed_out:
        status = "failed"
    elif all(c.ok for c in checks):
        status = "succeeded"
    else:
        status = "invalid"
    return status, checks, artifacts


def read_series(attempt_dir: Path, name: str | None) -> list[dict[str, Any]]:
    """The canonical per-update rows an attempt's result names (empty when it names none, or
    names a path outside the attempt); a damaged line is skipped, not the whole series."""
    if not name or Path(name).is_absolute() or ".." in Path(name).parts:
        return []
    try:
        text = (attempt_dir / name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def summarize(rows: list[dict[str, Any]], *, first: bool = False) -> dict[str, float | None]:
    """Last (or first) value of each metric; non-finite values become null (JSON has no NaN)."""
    summary: dict[str, float | None] = {}
    for row in rows:
        for name, value in row.items():
            if name == "step" or not isinstance(value, int | float):
                continue
            if first and name in summary:
                continue
            summary[name] = float(value) if math.isfinite(value) else None
    return summary


@dataclass(frozen=True)
class SavedCheckpoint:
    attempt: int
    folder: str  # relative to that attempt's directory
    files: dict[str, str] = field(default_factory=dict)  # path there -> recorded sha256


def saved_checkpoints(attempt: int, artifacts: list[ArtifactRecord],
                      ) -> dict[int, SavedCheckpoint]:
    """update -> checkpoint, with its hashed files, of the checkpoints one attempt hashed."""
    found: dict[int, SavedCheckpoint] = {}
    for art in artifacts:
        if art.kind == "checkpoint" and art.step is not None:
            folder = art.path.rsplit("/", 1)[0] if "/" in art.path else art.path
            found.setdefault(art.step, SavedCheckpoint(attempt, folder)).files[art.path] = \
                art.sha256
    return found


def select_checkpoint(select_by: str | None, rows: list[dict[str, Any]],
                      saved: dict[int, SavedCheckpoint]) -> dict[str, Any] | None:
    """The recommended checkpoint: among updates that were validated and have a checkpoint,
    the best value of ``select_by`` (lowest for a loss or a failure share, highest otherwise),
    the earlier update on a tie. "recommended" is the strongest word: nothing here approves
    a model."""
    if select_by is None:
        return None
    from stateset_backend.spec.model import LOWER_IS_BETTER

    candidates = _candidates(select_by, rows, saved)
    doc: dict[str, Any] = {"select_by": select_by,
                           "direction": "min" if select_by in LOWER_IS_BETTER else "max",
                           "candidates": len(candidates)}
    if not candidates:
        validated = sorted({r["step"] for r in rows if isinstance(r.get("step"), int) and
                            select_by in r})
        return {**doc, "update": None, "reason": (
            f"no row reported {select_by}" if not validated else
            f"no checkpoint was kept at a validated update (validated: "
            f"{', '.join(map(str, validated[:8]))}; checkpoints: "
            f"{', '.join(map(str, sorted(saved)[:8])) or 'none'})")}
    value, step = best_of(select_by, candidates)
    return {**doc, "update": step, "value": value, "checkpoint": saved[step].folder,
            "attempt": saved[step].attempt}


def _candidates(select_by: str, rows: list[dict[str, Any]],
                updates: Container[int]) -> list[tuple[float, int]]:
    """(value, update) of each finite ``select_by`` logged at one of ``updates``."""
    out = []
    for row in rows:
        value, step = row.get(select_by), row.get("step")
        if isinstance(step, int) and step in updates and isinstance(value, int | float) and \
                not isinstance(value, bool) and math.isfinite(value):
            out.append((float(value), step))
    return out


def best_of(select_by: str, candidates: list[tuple[float, int]]) -> tuple[float, int]:
    """The best (value, update) by ``select_by``, the earlier update on a tie: the rule the
    recommendation and every engine's checkpoint retention share."""
    from stateset_backend.spec.model import LOWER_IS_BETTER

    lower = select_by in LOWER_IS_BETTER
    return min(candidates, key=lambda c: (c[0] if lower else -c[0], c[1]))


def best_update(select_by: str | None, rows: list[dict[str, Any]],
                updates: Container[int]) -> tuple[float, int] | None:
    """The best (value, update) by ``select_by`` among ``updates``, or None."""
    candidates = [] if select_by is None else _candidates(select_by, rows, updates)
    return best_of(select_by, candidates) if select_by is not None and candidates else None


def nothing_ran(plan: LaunchPlan, planned_updates: int, attempt: int, status: Status,
                check: Check) -> Result:
    """The result of an attempt whose engine never ran: no outputs, one check saying why."""
    from stateset_backend.common.jsonio import utc_now

    now = utc_now()
    return Result(
        run_id=plan.run_id, attempt=attempt, experiment_digest=plan.experiment_digest,
        binding_digest=plan.binding_digest, plan_checksum=plan.checksum, engine=plan.engine,
        engine_version=plan.engine_version, provider=plan.provider, status=status,
        exit_code=None, started_at=now, ended_at=now, duration_s=0.0,
        planned_updates=planned_updates, committed_updates=0,
        metrics=Metrics(series=None, summary={}, raw_names={}), deviations=plan.deviations,
        artifacts=[], checks=[check])
