"""The interface every engine adapter implements, and the records it exchanges with the core.

An adapter is thin on purpose: it declares field rules (what each spec leaf becomes in its
engine's vocabulary, per dialect), renders the mapped native keys into a launch (argv, files,
environment), and reads the engine's outputs back. Everything engine-neutral — the contract
check, identity, the plan, launching, result checks — stays in the core.
"""

from __future__ import annotations

import abc
import functools
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from stateset_backend.common.errors import AdapterBug, InvalidInput, Unsupported
from stateset_backend.contracts.loader import Contract, Dialect, load_packaged_contract
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.translate.rules import RuleSet, Translation

# Placeholders filled in when a plan runs; spec validation refuses user text holding one
# (spec.files.PLACEHOLDERS), so the substitution never touches user text.
RUN_DIR = "{run_dir}"
PYTHON = "{python}"
ENGINE_HOME = "{engine_home}"  # an engine run from a source checkout (--engine-home)


@dataclass(frozen=True)
class LaunchContext:
    """What an adapter may know when rendering a launch; paths use the placeholders above."""

    run_id: str
    experiment_digest: str
    engine_version: str
    dialect: Dialect
    base_dir: str | None = None  # where the spec's relative paths point (the spec's folder)
    provider: str = "local"  # where the plan runs: local, ray, slurm

    @property
    def run_name(self) -> str:
        """The name every engine gives this run: run id and experiment digest, so the identity
        can be read back from the engine's own outputs."""
        return identity_name(self.run_id, self.experiment_digest)


def identity_name(run_id: str, experiment_digest: str) -> str:
    return f"{run_id}.{experiment_digest.removeprefix('sha256:')}"


@dataclass(frozen=True)
class NativeLaunch:
    """An engine launch, as data: reviewed in the plan, executed verbatim by a provider.

    ``argv`` and ``set_env`` values may contain ``{run_dir}`` and ``{python}``, filled in when
    the plan runs. ``env`` names variables the engine reads from the caller's environment;
    their values are never stored, since they may be secrets.
    """

    argv: list[str]
    files: dict[str, str] = field(default_factory=dict)
    set_env: dict[str, str] = field(default_factory=dict)
    env: list[str] = field(default_factory=list)
    native: dict[str, Any] | None = None  # every native key the launch sets, when it adds keys
    # to the translation's (identity, outputs, memory knobs); the plan records it
    # recorded defaults this launch's entry point has no key for (an engine with several
    # trainers, each with its own config: the other trainers' keys), each with the reason;
    # the plan records them, and every other recorded default must still be set
    unread_defaults: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"argv": self.argv, "files": self.files, "set_env": self.set_env,
                "env": sorted(self.env)}


@dataclass(frozen=True)
class Artifact:
    path: str  # relative to the attempt directory
    kind: str  # checkpoint, model, log, metrics, ...
    step: int | None = None


def checkpoint_artifacts(attempt_dir: Path, step_dir: Path, step: int) -> list[Artifact]:
    """Every file of one checkpoint folder, as the artifacts of that update (sorted, so two
    collections of one attempt list them alike)."""
    return [Artifact(str(p.relative_to(attempt_dir)), "checkpoint", step)
            for p in sorted(step_dir.rglob("*")) if p.is_file()]


def resumed_from_steps(steps: list[int]) -> int | None:
    """The update an attempt continued from, for an engine that numbers its logged updates
    from the step its checkpoint restored (verl, OpenRLHF, NeMo RL): a first training row at
    s > 1 continued from s - 1; one at 1 started afresh, which the hub then reports against
    the update it asked the resume to continue from."""
    return min(steps) - 1 if steps and min(steps) > 1 else None


@dataclass
class Collected:
    """What an adapter read back from an engine's outputs, in canonical form."""

    run_id: str | None = None
    experiment_digest: str | None = None
    committed_updates: int = 0
    metrics: list[dict[str, Any]] = field(default_factory=list)  # {"step": n, name: value}
    raw_metric_names: dict[str, str] = field(default_factory=dict)  # canonical -> engine's
    artifacts: list[Artifact] = field(default_factory=list)
    resumed_from: int | None = None  # the update the engine says it continued from
    # the execution options the engine says it ran with (native key -> value), None where it
    # reports none: each must be the plan's, or the run is not the launch that was reviewed
    execution: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


class CannotWrite(Exception):
    """Raised by a ``KitSupport.write_outputs`` writer for a case its engine's output format
    cannot hold (a string metric in TensorBoard): the kit reports that case ``unsupported``."""


@dataclass(frozen=True)
class KitSupport:
    """What the conformance kit needs from an adapter besides its contract, so that every
    place the kit runs (an author's test class, ``stateset-backend conformance``, CI) checks
    the same things.

    ``write_outputs(attempt_dir, ctx, *, metrics, identity, artifacts, checkpoint_step)``
    writes the engine's native output files for canonical metric rows; without it collection
    and resume are reported ``unsupported``. ``parse_launch(plan)`` reads a launch back with
    the engine's own parser (nested or flat values); ``option_key(plan)`` names a free-text
    ``engine_options`` key the engine's parser accepts (None: every option it takes is
    enumerated, and the kit checks that a free-text key is refused). ``surface`` is the
    engine release's configuration surface (``{"options": {key: {"default": ...}}}``, as
    ``stateset_backend.conformance.surface_gen`` writes it): every key it reads, with its real
    default; the built-in engines' ship with the hub. ``unsupported`` declares gaps the
    kit reports ``unsupported`` instead of failing: capability or case names, optionally
    limited by a PEP 440 specifier after a space, each with its reason. ``base`` is merged into
    every sample spec the kit plans (a model path the engine can load, a prompt policy), in
    the CLI and in an author's test class alike (the class's own ``base`` merges over it).
    ``engine_stub`` maps relative file paths to the source of modules that stand in for the
    engine's entry point when the kit runs a launch for real (``stateset_backend.conformance.
    stubs`` says what they receive and must write); without it the launch-run check is
    ``unverified``. ``expectations`` lists, for every key the launch sets, what the engine
    must read for a spec, written from the engine's own documentation and code, never from the
    adapter: ``((spelling, ...), expect)`` with ``expect(spec)`` the value (None: not checked
    for this spec); a key none names is ``unverified``. ``quantities`` names, for each
    deviation that states a number, the quantity of the release's surface (its
    ``"quantities"``, measured from the release's own code) that number must equal; a
    deviation stating a number none names is ``unverified``. ``math_keys`` lists the engine
    keys whose release defaults change the math or the budget (a key, or ``(key, switch,
    value)`` for one read only where ``switch`` has ``value``), written from the engine's own
    code: every launch must set each that matters to it; without them the check is
    ``unverified``. ``resumes_from(argv, read, attempt_dir)`` is the engine's own rule, from
    its code, for the checkpoint folder a launch resumes from (``read``: ``parse_launch``'s
    reading of it), or None where it starts afresh; without it the resume check is
    ``unverified``. ``cut_save(checkpoint_dir)`` turns a whole checkpoint folder the writer
    wrote into what a crash during the engine's save leaves of it (the file the engine writes
    last removed, the folder under its temporary name): the resume check then puts such a
    save beside the newest whole checkpoint, which neither ``latest_checkpoint`` nor
    ``checkpoints`` may offer.
    """

    write_outputs: Any = None
    parse_launch: Any = None
    option_key: Any = None
    surface: dict[str, Any] | None = None
    unsupported: dict[str, str] = field(default_factory=dict)
    base: dict[str, Any] = field(default_factory=dict)
    engine_stub: dict[str, str] | None = None
    expectations: tuple[tuple[tuple[str, ...], Any], ...] = ()
    quantities: dict[str, str] = field(default_factory=dict)
    math_keys: tuple[Any, ...] = ()
    resumes_from: Any = None
    cut_save: Any = None


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    update: int


def stage_checkpoint(source: Path, target: Path) -> None:
    """Make ``target`` a copy of the checkpoint folder ``source``: files are hard links where
    the filesystem allows (checkpoints are large and engines never rewrite a saved one), copies
    elsewhere. It appears complete or not at all, like the engines' own saves."""
    partial = target.with_name(target.name + ".staging")
    shutil.rmtree(partial, ignore_errors=True)

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, partial, copy_function=link_or_copy)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():  # staged by an earlier try of this same attempt
        shutil.rmtree(target)
    os.replace(partial, target)


def _unchanged(base: Mapping[str, str]) -> dict[str, str]:
    return dict(base)


@dataclass(frozen=True)
class Rehearsal:
    """How an engine's own trainer runs a rehearsal's plan on this machine's CPUs, and what
    the hub reads from it beyond what ``collect`` reads.

    A rehearsal answers "what would a GPU run hit?" before a GPU is paid for, so the launch is
    the engine's own, changed only where a host without an accelerator needs it: ``argv``
    keeps a plan's placeholders (filled as an attempt's are), ``environment(base)`` turns the
    attempt's environment into the rehearsal's, and ``replaced`` names each plan setting it
    changed, as (the plan's value, the rehearsal's), so the verdict can say what it did not
    test. ``covers`` says in a line what the run exercises and what it stands in for.

    ``rollout_gap(run_dir)`` reads, per update, the largest gap between the rollout's token
    probabilities and the learner's recompute of them, from the engine's own log (the metric
    ``gap_metric``): the two must agree while the weights are synced, within
    ``gap_tolerance``. An engine that logs no such comparison leaves it None, and the verdict
    says it was not measured, with ``gap_unmeasured`` as the reason."""

    argv: list[str]
    environment: Callable[[Mapping[str, str]], dict[str, str]] = _unchanged
    replaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    covers: str = ""
    rollout_gap: Callable[[Path], dict[int, float]] | None = None
    gap_metric: str = ""
    gap_tolerance: float = 1e-6
    gap_unmeasured: str = "the engine logs no comparison of its rollout and learner log-probs"


class DialectKeys(BaseModel):
    """Base of an adapter's typed dialect keys: every slot the adapter reads is a field, so a
    contract that misses one, misspells one or gives the wrong type fails when it loads, not
    in the middle of a translation. ``None`` means the release has no such key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # The slots every engine's dialect may declare, each read by the core, not the adapter:
    # keys set only for memory, speed or placement, each with why it cannot change the math,
    # which engine_options may change (translate.execution); keys a switch makes inert and
    # values a key reads alike, each with the engine code that makes it so (translate.reading)
    execution: dict[str, Any] = {}
    inert: list[Any] = []
    alike: dict[str, Any] = {}


@functools.cache
def _packaged_contract(package: str, filename: str,
                       keys_model: type[DialectKeys] | None) -> Contract:
    contract = load_packaged_contract(package, filename)
    if keys_model is not None:
        for dialect in contract.dialects:
            _typed_keys(contract, dialect, keys_model)
    return contract


_TYPED: dict[tuple[int, type[DialectKeys]], tuple[Dialect, Any]] = {}


def _typed_keys(contract: Contract, dialect: Dialect, keys_model: type[DialectKeys]) -> Any:
    cached = _TYPED.get((id(dialect), keys_model))
    if cached is not None and cached[0] is dialect:
        return cached[1]
    try:
        typed = keys_model.model_validate(dialect.keys)
        _TYPED[(id(dialect), keys_model)] = (dialect, typed)
        return typed
    except ValidationError as exc:
        problems = "; ".join(f"keys.{'.'.join(map(str, e['loc']))}: {e['msg']}"
                             for e in exc.errors())
        raise InvalidInput(f"{contract.engine} contract, dialect {dialect.name!r}: "
                           f"{problems}") from None


def unpinned_defaults(dialect: Dialect, native: dict[str, Any],
                      unread: dict[str, str] | None = None) -> list[str]:
    """Native keys whose engine default changes the math but that the launch leaves unset
    (``unread``: recorded defaults the launch's entry point has no key for, which it cannot
    set).

    Hydra's ``+``/``++`` prefixes only say how a key is added; they name the same key."""
    set_keys = {key.lstrip("+") for key in native} | {key.lstrip("+") for key in unread or {}}
    return sorted(key for key in dialect.defaults if key.lstrip("+") not in set_keys)


def check_all_pinned(engine: str, dialect: Dialect, native: dict[str, Any],
                     unread: dict[str, str] | None = None) -> None:
    unread = unread or {}
    for key, reason in sorted(unread.items()):
        if key not in dialect.defaults:
            raise AdapterBug(f"the {engine} launch says it does not read {key}, which the "
                             f"{dialect.name} dialect records no default for")
        if key.lstrip("+") in {k.lstrip("+") for k in native}:
            raise AdapterBug(f"the {engine} launch both sets {key} and says it does not read it")
        if not str(reason).strip():
            raise AdapterBug(f"the {engine} launch does not read {key} and gives no reason")
    missing = unpinned_defaults(dialect, native, unread)
    if missing:
        raise AdapterBug(f"the {engine} adapter leaves {', '.join(missing)} at the "
                         f"{engine} {dialect.name} default; every setting that changes the "
                         "math must be pinned")


class EngineAdapter(abc.ABC):
    """Base class for adapters. Subclasses set ``name`` and where their contract ships
    (``contract_package``, ``contract_file``), and implement the abstract methods."""

    name: str
    contract_package: ClassVar[str] = "stateset_backend.contracts"
    contract_file: ClassVar[str | None] = None
    dialect_keys: ClassVar[type[DialectKeys] | None] = None
    # How the engine spreads over a cluster's nodes, for a cluster provider's job script:
    # "process" (one process, one node), "torchrun" (one torchrun agent per node, meeting at a
    # rendezvous) or "ray" (a Ray cluster on the nodes, the launch as its driver).
    cluster_launch: ClassVar[Literal["process", "torchrun", "ray"]] = "process"

    @property
    def contract(self) -> Contract:
        """The engine's contract, loaded once from package data, every dialect's keys checked
        against ``dialect_keys``."""
        if self.contract_file is None:
            raise NotImplementedError(f"{type(self).__name__} sets no contract_file")
        return _packaged_contract(self.contract_package, self.contract_file, self.dialect_keys)

    def keys(self, dialect: Dialect) -> Any:
        """The dialect's keys as the adapter's typed model."""
        if self.dialect_keys is None:
            raise NotImplementedError(f"{type(self).__name__} sets no dialect_keys")
        return _typed_keys(self.contract, dialect, self.dialect_keys)

    @abc.abstractmethod
    def rules(self, dialect: Dialect) -> RuleSet:
        """Field rules for one dialect; every spec leaf must be covered (exactly or by prefix)."""

    @abc.abstractmethod
    def render(self, translation: Translation, spec: ExperimentSpec,
               ctx: LaunchContext) -> NativeLaunch:
        """Turn mapped native keys into an engine launch."""

    def collect(self, attempt_dir: Path, ctx: LaunchContext) -> Collected:
        """Read the engine's outputs from the attempt directory (override per engine)."""
        raise NotImplementedError(f"{self.name}: collection is not implemented")

    def latest_checkpoint(self, attempt_dir: Path) -> Checkpoint | None:
        """The newest complete checkpoint an attempt left behind (None: nothing to resume)."""
        return None

    def checkpoints(self, attempt_dir: Path) -> list[Checkpoint]:
        """Every complete checkpoint an attempt left, oldest first, so that `runs verify` can
        prove an older one when the newest is damaged (default: the newest alone)."""
        newest = self.latest_checkpoint(attempt_dir)
        return [newest] if newest is not None else []

    def named_checkpoint(self, attempt_dir: Path, name: str) -> Checkpoint | None:
        """The complete checkpoint folder ``name`` an attempt left, for ``model.from_run``
        (None: no such checkpoint, or an engine whose checkpoints cannot start another run)."""
        return None

    def checkpoint_problem(self, checkpoint: Checkpoint, experiment_digest: str) -> str | None:
        """What makes ``checkpoint`` unfit to resume from (a damaged, truncated or missing
        file, another experiment's state), or None. Engines without a manifest answer None."""
        return None

    def checkpoint_runtime(self, checkpoint: Checkpoint) -> dict[str, Any] | None:
        """The runtime identity ``checkpoint`` recorded (runs.runtime: world_size, model,
        versions), or None when the engine records none."""
        return None

    def current_runtime(self, spec: ExperimentSpec, python: str | None = None) -> \
            dict[str, Any] | None:
        """The runtime identity a launch of ``spec`` would have now, comparable with
        checkpoint_runtime; None when the engine records none."""
        return None

    def resume_argv(self, checkpoint: Checkpoint, argv: list[str],
                    attempt_dir: Path) -> list[str]:
        """The plan's argv changed to continue from ``checkpoint`` (an earlier attempt's) in
        the new attempt ``attempt_dir``. An engine that reloads only from its own output folder
        gets the checkpoint staged there (``stage_checkpoint``), so each attempt writes only
        into its own folder and the earlier attempt stays as it was."""
        raise NotImplementedError(f"{self.name}: resume is not implemented")

    def evaluate_checkpoint(self, attempt_dir: Path, checkpoint: Checkpoint,
                            split: str) -> dict[str, float]:
        """Score ``checkpoint`` (already verified by the core) on the spec's ``split`` with
        the spec's validation decoding, through the same code the engine validates with during
        training; metric names carry the split's prefix (``test/reward/mean``). An adapter
        that does not override this has not declared how its engine evaluates, and
        ``evaluate`` refuses its runs (exit 3)."""
        raise NotImplementedError(f"{self.name}: evaluation is not declared")

    def reload_checkpoint(self, attempt_dir: Path, checkpoint: Checkpoint) -> dict[str, Any]:
        """Load ``checkpoint`` completely (weights, optimizer, scheduler, RNG) into a fresh
        model, as a resume would, and say what was loaded. ``runs verify`` needs it to lift a
        quarantine; without it the engine cannot prove a checkpoint loads (exit 3)."""
        raise NotImplementedError(f"{self.name}: reloading a checkpoint is not declared")

    def rehearse(self, plan: Any) -> Rehearsal:
        """How this engine's own trainer runs ``plan`` for a rehearsal on this machine's CPUs
        (``stateset-backend rehearse``: the spec's architecture shrunk, a few updates). The
        hub makes the rehearsal's plan and model and checks what the run leaves; the adapter
        knows only how its engine runs here, or why it cannot: it raises ``Unsupported`` with
        the reason. An adapter that does not override this declares no rehearsal. The hub also
        resumes the rehearsal from a checkpoint through ``checkpoints`` and ``resume_argv``,
        applied to the rehearsal's ``argv`` as to a plan's, so that argv must accept them."""
        raise Unsupported(f"the {self.name} adapter declares no rehearsal")

    def kit_support(self) -> KitSupport:
        """The writer of the engine's outputs and the launch reader the conformance kit uses
        (``KitSupport``); the default supplies neither."""
        return KitSupport()

    def declares(self, method: str) -> bool:
        """Whether this adapter overrides an optional engine capability (``evaluate_checkpoint``,
        ``reload_checkpoint``, ``rehearse``)."""
        return getattr(type(self), method) is not getattr(EngineAdapter, method)

    def installed_version(self, python: str | None = None,
                          home: str | None = None) -> str | None:
        """The engine version installed in this (or the given) Python environment, or in
        the source checkout ``home`` for engines run from one; None when not found."""
        dist = self.contract.distribution
        return None if dist is None else distribution_version(dist, python)


def distribution_version(distribution: str, python: str | None = None) -> str | None:
    """Version of an installed distribution here, or in another interpreter via ``--python``."""
    if python is None:
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            return None
    if not Path(python).is_file():
        raise InvalidInput(f"--python {python}: no such interpreter")
    probe = ("import importlib.metadata as m, json, sys\n"
             "try: print(json.dumps(m.version(sys.argv[1])))\n"
             "except m.PackageNotFoundError: print('null')\n")
    try:
        out = subprocess.run([python, "-c", probe, distribution], capture_output=True,
                             text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise InvalidInput(f"--python {python}: cannot query it: {exc}") from None
    version = json.loads(out.strip().splitlines()[-1])
    return str(version) if version is not None else None


def collect_outputs(adapter: EngineAdapter, run_dir: Path,
                    ctx: LaunchContext) -> tuple[Collected | None, str | None]:
    """(what ``adapter.collect`` read, or None; why not): whatever the adapter raises, or a
    value that is not a ``Collected``, is the attempt's finding, named, never a crash of
    ours further on."""
    try:
        collected = adapter.collect(run_dir, ctx)
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if not isinstance(collected, Collected):
        return None, (f"the {adapter.name} adapter's collect returned a "
                      f"{type(collected).__name__}, not a Collected")
    return collected, None
