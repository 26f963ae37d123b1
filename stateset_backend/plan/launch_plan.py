"""The launch plan: everything that will run, as one reviewable, checksummed document.

A plan is made once (contract check, translation, identity) and can be reviewed, copied to
another machine and run there. Running the same plan file again is an exact retry: it keeps
the run id and checksum and adds an attempt. A plan edited by hand no longer matches its
checksum and is refused.
"""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stateset_backend.common.errors import AdapterBug, InvalidInput, Unsupported
from stateset_backend.common.jsonio import (
    atomic_write_bytes,
    atomic_write_json,
    read_json,
    utc_now,
)
from stateset_backend.contracts.capabilities import required_capabilities
from stateset_backend.contracts.loader import Dialect, check, parse_version
from stateset_backend.contracts.surfaces import check_options, surface
from stateset_backend.engines.adapter import LaunchContext, check_all_pinned
from stateset_backend.engines.registry import AdapterEntry
from stateset_backend.spec.digest import binding_digest, experiment_digest, plan_checksum
from stateset_backend.spec.files import SAFE_INTEGER, parse_spec
from stateset_backend.spec.inputs import check_budget_fits, check_chat_template
from stateset_backend.spec.model import ExperimentSpec
from stateset_backend.translate.execution import (
    ExecutionDefault,
    execution_defaults,
    reached,
    unmet,
)
from stateset_backend.translate.rules import Translation, option_conflict, translate

PLAN_SCHEMA_ID = "stateset-backend/plan/v2"
Provider = Literal["local", "ray", "slurm", "kuberay"]


class AdapterInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    distribution: str
    version: str


class LaunchPlan(BaseModel):
    """A reviewed launch. ``argv``/``set_env`` may hold ``{run_dir}`` and ``{python}``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_id: Literal["stateset-backend/plan/v2"] = Field(
        "stateset-backend/plan/v2", alias="schema")
    run_id: str = Field(pattern=r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}$")
    created_at: str
    experiment_digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    binding_digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    engine: str
    engine_version: str
    adapter: AdapterInfo
    contract_digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    provider: Provider = "local"
    provider_settings: dict[str, Any] = Field(
        default_factory=dict, description="what the provider asks of the cluster (Slurm: "
                                          "partition, time limit, shared filesystem ...; "
                                          "KubeRay: image, namespace, resources, shared "
                                          "volume, secret references)")
    base_dir: str = Field(description="the spec's folder: where its relative paths point")
    required_capabilities: list[str]
    spec: dict[str, Any] = Field(description="the validated spec, defaults filled")
    dialect: dict[str, Any] = Field(description="the engine release's dialect as resolved "
                                                "from the contract: name, keys, recorded "
                                                "defaults, declared deviations")
    deviations: list[dict[str, Any]] = Field(
        description="the declared deviations this launch runs with: setting, deviation name, "
                    "spec value, engine value, description")
    native: dict[str, Any] = Field(description="every native key the launch sets: the spec's "
                                               "settings, engine_options, identity and outputs")
    unread_defaults: dict[str, str] = Field(
        default_factory=dict, description="recorded engine defaults this launch's entry point "
                                          "has no key for (another trainer's configuration), "
                                          "each with the reason; every other recorded default "
                                          "is set in native")
    argv: list[str] = Field(min_length=1)
    env: list[str] = Field(description="names of caller variables the engine reads; values "
                                       "are never stored")
    set_env: dict[str, str]
    files: dict[str, str] = Field(description="files written into the run directory before "
                                              "launch, by relative path")
    checksum: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")

    def to_json(self) -> dict[str, Any]:
        doc = self.model_dump(mode="json", by_alias=True)
        if not doc["unread_defaults"]:  # only a launch that leaves some defaults unread lists them
            del doc["unread_defaults"]
        return doc

    def write_files(self, directory: Path) -> None:
        """The plan's files into an attempt's directory, each written whole (a launch reads
        them when it starts; the conformance kit's collection cases hold them too)."""
        for rel, content in self.files.items():
            atomic_write_bytes(directory / rel, content.encode("utf-8"))

    def validated_spec(self) -> ExperimentSpec:
        return parse_spec(self.spec, source="plan.spec", stored=True)

    def resolved_dialect(self) -> Dialect:
        return Dialect.model_validate(self.dialect)


def new_run_id() -> str:
    """Sortable by creation time, unique without coordination."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(4)


def make_plan(spec: ExperimentSpec, entry: AdapterEntry, engine_version: str,
              provider: Provider = "local", base_dir: Path | None = None,
              provider_settings: dict[str, Any] | None = None) -> LaunchPlan:
    """Contract check, translation and identity; raises before anything could launch."""
    adapter = entry.adapter
    contract = adapter.contract
    required = required_capabilities(spec)
    check(contract, engine_version, required).raise_if_missing()
    check_engine_options(entry, engine_version, spec.engine_options.get(adapter.name, {}))
    check_budget_fits(spec, (base_dir or Path.cwd()).resolve())
    check_chat_template(spec, (base_dir or Path.cwd()).resolve())
    dialect = contract.dialect(parse_version(engine_version))
    with entry.guard("translating the spec"):
        translation = translate(spec, adapter.rules(dialect), dialect, adapter.name,
                                engine_version)
    run_id = new_run_id()
    exp_digest = experiment_digest(spec)
    base = str((base_dir or Path.cwd()).resolve())
    ctx = LaunchContext(run_id, exp_digest, engine_version, dialect, base, provider)
    with entry.guard("rendering the launch"):
        launch = adapter.render(translation, spec, ctx)
    native = launch.native if launch.native is not None else translation.native
    check_all_pinned(adapter.name, dialect, native, launch.unread_defaults)
    _refuse_inexact_integers(adapter.name, {"native": native, **launch.to_json()})
    options = spec.engine_options.get(adapter.name, {})
    if options:
        # What the launch sets on its own (identity, outputs, fixed switches, execution
        # defaults) is what it sets without the options: rendered once more without them.
        mine = f"engine_options.{adapter.name}"
        own = Translation({k: v for k, v in translation.native.items()
                           if translation.sources.get(k) != mine},
                          {k: v for k, v in translation.sources.items() if v != mine},
                          translation.rows)
        with entry.guard("rendering the launch"):
            bare = adapter.render(own, spec, ctx)
        guard_engine_options(adapter.name, options,
                             bare.native if bare.native is not None else own.native,
                             execution_defaults(dialect),
                             _surface_defaults(adapter.name, engine_version))
    settings, provider_files = _provider_files(provider, provider_settings or {}, adapter,
                                               run_id, spec, Path(base))
    launched = launch.to_json()
    if provider == "kuberay":  # the pods' paths, and the spec's files on the shared volume
        from stateset_backend.plan import kuberay

        launched, native = kuberay.pod_launch(spec, kuberay.settings_from(settings), Path(base),
                                              launched, native)
    resources = spec.resources.model_dump(mode="json")
    engine_options = spec.engine_options.get(adapter.name, {})
    doc: dict[str, Any] = {
        "schema": PLAN_SCHEMA_ID,
        "run_id": run_id,
        "created_at": utc_now(),
        "experiment_digest": exp_digest,
        "binding_digest": binding_digest(
            experiment_digest=exp_digest, engine=adapter.name, engine_version=engine_version,
            adapter_distribution=entry.distribution, adapter_version=entry.version,
            contract_digest=contract.digest, resources=resources,
            engine_options=engine_options, native=launched),
        "engine": adapter.name,
        "engine_version": engine_version,
        "adapter": {"distribution": entry.distribution, "version": entry.version},
        "contract_digest": contract.digest,
        "provider": provider,
        "provider_settings": settings,
        "base_dir": base,
        "required_capabilities": sorted(required),
        "spec": spec.model_dump(mode="json"),
        "dialect": dialect.model_dump(mode="json", exclude={"extends"}),
        "deviations": translation.deviations,
        "native": native,
        **({"unread_defaults": dict(sorted(launch.unread_defaults.items()))}
           if launch.unread_defaults else {}),
        **launched,
        "checksum": "",
    }
    if provider == "kuberay":  # the first attempt's RayJob, reviewable, in the checksum
        provider_files = {kuberay.RAYJOB_FILE: kuberay.plan_manifest(
            doc, kuberay.settings_from(settings), adapter.cluster_launch)}
    taken = sorted(set(provider_files) & set(doc["files"]))
    if taken:
        raise AdapterBug(f"{adapter.name}'s launch writes {taken[0]}, a file the {provider} "
                         "provider writes")
    doc["files"] = {**doc["files"], **provider_files}
    doc["checksum"] = plan_checksum(doc)
    return LaunchPlan.model_validate(doc)


def _provider_files(provider: Provider, settings: dict[str, Any], adapter: Any, run_id: str,
                    spec: ExperimentSpec, base_dir: Path) -> tuple[dict[str, Any],
                                                                   dict[str, str]]:
    """What the provider adds to the plan: its checked settings and its files (a kuberay
    plan's manifest is added once the launch is known)."""
    if provider == "kuberay":
        from stateset_backend.plan.kuberay import settings_from

        return settings_from(settings).model_dump(mode="json"), {}
    if provider != "slurm":
        if settings:
            raise InvalidInput(f"provider settings apply to --provider slurm or kuberay, not "
                               f"{provider}")
        return {}, {}
    from stateset_backend.providers.slurm.planning import plan_files

    return plan_files(settings, run_id=run_id, engine=adapter.name,
                      launch=adapter.cluster_launch, nodes=spec.resources.nodes,
                      gpus_per_node=spec.resources.gpus_per_node, base_dir=base_dir,
                      processes_per_node=spec.resources.processes_per_node)


def _refuse_inexact_integers(engine: str, doc: Any, path: str = "") -> None:
    """A launch value the adapter derived (a sum or product of spec counts) that canonical
    JSON cannot carry exactly would make the plan unhashable: the spec's counts are too large
    for this engine, which is the user's to change."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            _refuse_inexact_integers(engine, value, f"{path}.{key}" if path else str(key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            _refuse_inexact_integers(engine, value, f"{path}.{i}")
    elif isinstance(doc, int) and not isinstance(doc, bool) and abs(doc) > SAFE_INTEGER:
        raise InvalidInput(f"{engine} launch value {path} = {doc} is derived from the spec's "
                           "counts and exceeds 2^53 - 1, which a plan cannot carry exactly; "
                           "lower the budget or token limits")


def check_engine_options(entry: AdapterEntry, engine_version: str,
                         options: dict[str, Any]) -> None:
    """Before translation, the same for every engine: ``engine_options`` names only keys of
    the engine's own configuration (contracts.surfaces.check_options). A plugin's surface
    comes from its kit support, asked for only when a flag could be an abbreviation."""
    plugin_surface = None
    if any(name.startswith("--") for name in options) and \
            surface(entry.adapter.name, engine_version) is None:
        with entry.guard("describing its configuration surface"):
            plugin_surface = entry.adapter.kit_support().surface
    check_options(entry.adapter.name, engine_version, options, plugin_surface)


def _surface_defaults(engine: str, engine_version: str) -> dict[str, Any] | None:
    """The release's own default of every key of its configuration surface (None for an
    engine with no recorded surface): what it reads where the launch sets nothing."""
    shipped = surface(engine, engine_version)
    if shipped is None:
        return None
    return {key: option["default"] for key, option in shipped["options"].items()
            if isinstance(option, dict) and "default" in option}


def guard_engine_options(engine: str, options: dict[str, Any], native: dict[str, Any],
                         execution: dict[str, ExecutionDefault] | None = None,
                         defaults: dict[str, Any] | None = None) -> None:
    """``engine_options`` may add what the spec does not describe and change the launch's
    declared execution defaults (``execution``: keys set only for memory, speed or
    placement); it may never reach any other key the launch sets by itself (``native``:
    rendered without the options) for identity, outputs, a spec setting or a fixed switch,
    in any spelling."""
    for key, value in options.items():
        try:
            taken = reached(key, value, native, execution or {}, option_conflict)
        except InvalidInput as exc:
            raise InvalidInput(f"engine_options.{engine}.{exc.message}") from None
        if taken is not None:
            raise InvalidInput(f"engine_options.{engine}.{key}: would change {taken}, which "
                               "stateset-backend sets for this run's identity, outputs, a spec "
                               "setting or the math (it is not one of this release's "
                               "execution defaults)")
    problem = unmet(options, native, execution or {}, defaults)
    if problem is not None:
        raise InvalidInput(f"engine_options.{engine}.{problem}")


def write_plan(plan: LaunchPlan, path: str | os.PathLike[str]) -> None:
    target = Path(path)
    if target.is_dir():
        raise InvalidInput(f"{target}: is a directory; -o takes a file path")
    atomic_write_json(target, plan.to_json())


def load_plan(path: str | os.PathLike[str]) -> LaunchPlan:
    """Read a plan and prove it is the one that was made: checksum and digest both hold."""
    doc = read_json(path, what="plan")
    if not isinstance(doc, dict):
        raise InvalidInput(f"{path}: a plan is a JSON object")
    if doc.get("schema") != PLAN_SCHEMA_ID and isinstance(doc.get("schema"), str) and \
            doc["schema"].startswith("stateset-backend/plan/"):
        raise InvalidInput(f"{path}: a {doc['schema']} plan, made by an earlier stateset-backend "
                           f"that did not pin every setting; make a new plan ({PLAN_SCHEMA_ID})")
    try:
        plan = LaunchPlan.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "plan"
        raise InvalidInput(f"{path}: not a valid plan: {where}: {first['msg']}") from None
    if plan_checksum(doc) != plan.checksum:
        raise InvalidInput(f"{path}: checksum mismatch: the plan was changed after it was "
                           "made; make a new plan")
    if experiment_digest(plan.validated_spec()) != plan.experiment_digest:
        raise InvalidInput(f"{path}: the embedded spec does not match experiment_digest")
    return plan


def verify_engine_version(plan: LaunchPlan, installed: str | None) -> None:
    """A plan runs only on the engine version it was translated for."""
    if installed is None:
        raise Unsupported(f"{plan.engine} is not installed here; the plan needs "
                          f"{plan.engine} {plan.engine_version} (use --python to pick the "
                          "environment that has it)")
    if parse_version(installed) != parse_version(plan.engine_version):
        raise Unsupported(f"the plan was made for {plan.engine} {plan.engine_version} but "
                          f"{installed} is installed; make a new plan for {installed}")
