"""The adapter conformance kit: test classes an adapter author runs in their own CI.

One short subclass is all an adapter author writes (install ``stateset-backend[conformance]``)::

    import pytest
    from stateset_backend.conformance import AdapterConformance

    class TestMyEngine(AdapterConformance):
        engine_versions = ["1.0.0", "2.3.1"]     # first and last release of every dialect
        data_format = "parquet"                  # what the engine reads: jsonl or parquet
        unsupported = {"lora <2": "LoRA needs peft, which 1.x cannot load"}

        @pytest.fixture
        def adapter(self):
            return MyAdapter()

The adapter's ``kit_support()`` supplies the writer of the engine's native output files (from
canonical values) and, optionally, a reader of the launch with the engine's own parser, so
``stateset-backend conformance ENGINE`` runs exactly these checks too.

Every check is derived from the adapter's contract, never hand-written per engine; what each
one holds, and the silent failure it stops, is the table in docs/plugins.md. In short: the
contract and the releases it admits, every capability claimed or refused, translations that
are deterministic, pure and read back by the engine's own parser as declared (also at awkward
numbers, unset, and against what the kit knows of the engine), user strings that stay data,
``engine_options`` that reach nothing the launch sets, math defaults pinned, the launch run
under an engine stub, collection and resume on the engine's own outputs, and, where the engine
runs here, its own trainer doing what the spec asks.

A capability or case the adapter declares in ``unsupported`` (or a case its writer raises
:class:`CannotWrite` for) is reported ``unsupported``: never passed, never silently skipped.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from stateset_backend.common.errors import InvalidInput
from stateset_backend.common.jsonio import flatten
from stateset_backend.conformance import checks, engine_run, launch_run, readers, stubs, writers
from stateset_backend.conformance.checks import COLLECTION_CASES, CheckFailed, Writer
from stateset_backend.conformance.fixtures import KitFixtures, reported, unsupported, unverified
from stateset_backend.conformance.samples import SAMPLED, SampleFiles
from stateset_backend.conformance.specs import SAMPLES
from stateset_backend.contracts.loader import parse_version
from stateset_backend.engines.adapter import CannotWrite, EngineAdapter
from stateset_backend.plan.launch_plan import LaunchPlan

__all__ = ["COLLECTION_CASES", "SAMPLED", "SAMPLES", "AdapterConformance", "CannotWrite",
           "CheckFailed", "Writer", "write_tensorboard"]

#: ``write_tensorboard(log_dir, metrics, names, hparams=None)``: a plugin's ``write_outputs``
#: for an engine that logs to TensorBoard writes its scalars with it, each canonical metric
#: under the engine's own tag (``names``), as the engine's SummaryWriter would
write_tensorboard = writers.tensorboard


class AdapterConformance(KitFixtures):
    """Mix into a ``Test*`` class; see the module docstring for what to provide. The class
    attributes to set and the fixtures the checks take come from :class:`KitFixtures`."""

    # -- the contract -------------------------------------------------------------------------
    def test_contract_matches_the_shipped_schema(self, adapter: EngineAdapter) -> None:
        import jsonschema

        schema = json.loads(resources.files("stateset_backend.schemas").joinpath(
            "contract.json").read_text(encoding="utf-8"))
        jsonschema.Draft202012Validator(schema).validate(adapter.contract.to_json())
        assert adapter.contract.engine == adapter.name, \
            f"the contract names {adapter.contract.engine!r}, the adapter {adapter.name!r}"

    def test_versions_cover_every_dialect(self, adapter: EngineAdapter) -> None:
        contract = adapter.contract
        versions = list(type(self).engine_versions)
        if type(self).chosen_versions:
            pytest.skip(f"only the versions asked for were checked: {', '.join(versions)}")
        assert versions, "set engine_versions: the first and last release of every dialect"
        for v in versions:
            assert contract.supports(parse_version(v)), f"{v} is outside {contract.supported}"
        seen = {contract.dialect(parse_version(v)).name for v in versions}
        assert seen == {d.name for d in contract.dialects}, \
            f"dialects never checked: {sorted({d.name for d in contract.dialects} - seen)}"

    def test_plans_across_its_supported_range(self, adapter: EngineAdapter,
                                              sample_files: SampleFiles) -> None:
        """The base sample plans, or is refused with exit 2 or 3, at every release the
        contract's ranges name and past the newest where the support is open above: the
        listed versions are the author's choice, the range is the promise to users."""
        if type(self).chosen_versions:
            pytest.skip(f"only the versions asked for were checked: "
                        f"{', '.join(type(self).engine_versions)}")
        with reported():
            tried = checks.check_range_edges(adapter, type(self).engine_versions,
                                             sample_files, self._overrides(adapter))
        print(f"planned at {', '.join(tried) or 'no release beyond the listed ones'}")

    # -- capabilities: claimed ones plan, unclaimed ones are refused ---------------------------
    def test_capability(self, adapter: EngineAdapter, engine_version: str, capability: str,
                        sample_files: SampleFiles) -> None:
        self._version(adapter, engine_version)
        claimed = capability in adapter.contract.provided(parse_version(engine_version))
        gap = self._gap(adapter, capability, engine_version)
        if claimed and gap is not None:
            unsupported(f"{capability}: {gap}")
        with reported():
            checks.check_capability(adapter, engine_version, capability, sample_files,
                                    self._overrides(adapter))

    def test_translation_is_deterministic_and_pure(self, adapter: EngineAdapter,
                                                   engine_version: str,
                                                   sample_files: SampleFiles) -> None:
        self._version(adapter, engine_version)
        samples = self._claimed(adapter, engine_version, sample_files)
        with reported():
            for sample, _ in samples:
                checks.check_deterministic_and_pure(adapter, engine_version, sample,
                                                    sample_files)

    def test_each_setting_reaches_its_claimed_keys(
            self, adapter: EngineAdapter, engine_version: str, sample_files: SampleFiles,
            parse_launch: Callable[[LaunchPlan], dict[str, Any]] | None) -> None:
        """Every numeric setting the translation pins, planned at two more values and read
        back: it changes what the engine reads, and only in the keys it claims. Different
        estimators, aggregations and objectives launch differently."""
        self._version(adapter, engine_version)
        if parse_launch is None:
            unverified("no launch reader: give KitSupport.parse_launch (docs/plugins.md)")
        assert parse_launch is not None
        from stateset_backend.spec.model import ExperimentSpec
        from stateset_backend.spec.modeltree import all_leaf_paths

        leaves = set(all_leaf_paths(ExperimentSpec)) if adapter.name == "native" else set()
        base, base_plan = self._base(adapter, engine_version, sample_files)
        known = self._surface(adapter, engine_version)
        with reported():
            varied = checks.check_sensitivity(
                adapter, engine_version, base, sample_files, parse_launch,
                also_read=leaves.__contains__, surface=known)
            # settings that live only in a capability's sample (validation, checkpoints, LoRA,
            # KL, ...), each varied in that sample
            at_base = flatten(base_plan.spec)
            for sample, plan in self._claimed(adapter, engine_version, sample_files):
                own = checks.own_leaves(flatten(plan.spec), at_base)
                if not own:
                    continue
                try:
                    varied += checks.check_sensitivity(
                        adapter, engine_version, sample.doc, sample_files, parse_launch,
                        also_read=leaves.__contains__, surface=known,
                        only=lambda path, own=own: path in own or any(  # type: ignore[misc]
                            k.startswith(path + ".") for k in own))
                except CheckFailed as exc:
                    raise CheckFailed(f"{sample.capability}: {exc}") from None
            compared = checks.check_distinct_launches(adapter, engine_version, base,
                                                      sample_files, parse_launch)
        if not varied and not compared:
            pytest.fail("no setting could be planned at two other values: nothing was varied",
                        pytrace=False)

    def test_plans_agree_across_processes(self, adapter: EngineAdapter, engine_version: str,
                                          sample_files: SampleFiles) -> None:
        """The base sample planned in two fresh interpreters with different
        ``PYTHONHASHSEED``: byte-identical plans. The class's other versions are planned by
        the same two interpreters, for their own checks."""
        self._version(adapter, engine_version)
        (sample, _), *_ = self._claimed(adapter, engine_version, sample_files)
        with reported():
            reason = checks.check_plans_agree_across_processes(
                adapter, engine_version, sample, sample_files,
                others=self._first_samples(adapter, sample_files))
        if reason is not None:
            unverified(reason)

    # -- user strings are data ----------------------------------------------------------------
    def test_hostile_strings_cannot_inject(
            self, adapter: EngineAdapter, engine_version: str, sample_files: SampleFiles,
            parse_launch: Callable[[LaunchPlan], dict[str, Any]] | None) -> None:
        self._version(adapter, engine_version)
        provided = adapter.contract.provided(parse_version(engine_version))
        lora = "lora" in provided and self._gap(adapter, "lora", engine_version) is None
        extra: dict[str, Any] = {}
        if "validation" in provided and \
                self._gap(adapter, "validation", engine_version) is None:
            extra = {"data": {"validation": sample_files.split("validation")},
                     "evaluation": {"every": 2}}
        base, probe_plan = self._base(adapter, engine_version, sample_files, **extra)
        key = self.option_key(adapter, probe_plan)
        engine = adapter.name
        refusals: list[str] = []

        def plan(values: Mapping[str, str]) -> LaunchPlan | None:
            doc = checks.hostile_doc(base, values, key, engine, lora)
            try:
                return checks.plan_doc(adapter, engine_version, doc, sample_files)
            except InvalidInput as exc:  # a value the engine cannot carry: exit 2, fine
                refusals.append(str(exc))
                return None

        with reported():
            checks.check_no_free_text_option(adapter, engine_version, base, sample_files, key)
        clean = plan(checks.BENIGN)
        if clean is None:
            pytest.fail(checks.benign_refused(refusals[-1], key, adapter), pytrace=False)

        def read(p: LaunchPlan) -> dict[str, Any]:
            assert parse_launch is not None
            with pytest.MonkeyPatch.context() as env:
                env.setenv("STATESET_PROBE", checks.PROBE_SECRET)
                return dict(checks.normalize_values(parse_launch(p), p))

        clean_read = read(clean) if parse_launch is not None else {}
        refused = 0
        with reported():
            for values in checks.rotations():
                hostile = plan(values)
                if hostile is None:
                    refused += 1
                    continue
                if hostile.spec["name"] != values["name"] or \
                        hostile.spec["labels"] != {"team": values["label"]}:
                    raise CheckFailed("the plan does not keep name and labels verbatim")
                checks.check_argv_structure(clean, hostile, values)
                if parse_launch is not None:
                    checks.check_read_back(clean_read, read(hostile), values, hostile.base_dir)
        assert refused < len(checks.rotations()), "every hostile spec was refused"

    def test_launch_reads_back_as_declared(
            self, adapter: EngineAdapter, engine_version: str, sample_files: SampleFiles,
            parse_launch: Callable[[LaunchPlan], dict[str, Any]] | None) -> None:
        """Every claimed sample's launch, read the way the engine reads it: the keys and values
        the engine gets are the ones the launch declares, every key exists in the release's
        configuration surface, and every default the contract records is the release's own."""
        self._version(adapter, engine_version)
        samples = self._claimed(adapter, engine_version, sample_files)
        self._read_back(adapter, engine_version, parse_launch,
                        [(sample.capability, plan) for sample, plan in samples])

    def test_launch_reads_back_at_awkward_numbers(
            self, adapter: EngineAdapter, engine_version: str, sample_files: SampleFiles,
            parse_launch: Callable[[LaunchPlan], dict[str, Any]] | None) -> None:
        """The base at numbers where a unit slip or a rounding rule shows (``specs.AWKWARD``:
        limits past 16K tokens, batches that divide only one way, an inexact warmup share, a
        cosine after its warmup, validation sampled apart from the rollout), each the release
        plans, read back as in ``launch_reads_back_as_declared``: the claimed samples' round
        numbers read the same through a right and a wrong rule."""
        self._version(adapter, engine_version)
        with reported():
            plans = checks.awkward_plans(adapter, engine_version, sample_files,
                                         self._overrides(adapter))
        if not plans:
            unverified(f"{adapter.name} {engine_version} refuses every awkward sample")
        self._read_back(adapter, engine_version, parse_launch, plans)

    def test_every_key_it_sets_is_expected(self, adapter: EngineAdapter, engine_version: str,
                                           sample_files: SampleFiles) -> None:
        """Every engine key the launch sets, in any claimed sample, has an expectation the kit
        wrote from the engine's own documentation and code (``expectations``, importing nothing
        from the adapter), held in ``launch_reads_back_as_declared``; a key without one is
        named here and the check is unverified, never passed: a wrong but self-consistent
        mapping of it would pass every other check."""
        self._version(adapter, engine_version)
        from stateset_backend.conformance.expectations import expectations_of, idle, unexpected

        if adapter.name == "native":
            pytest.skip("the native engine's launch is the spec itself")
        if not expectations_of(adapter):
            unverified("no expectations of the engine's keys: give KitSupport.expectations, "
                       "written from the engine's own documentation and code "
                       "(docs/plugins.md)")
        claimed = self._claimed(adapter, engine_version, sample_files)
        keys = {k.lstrip("+") for _, plan in claimed for k in flatten(plan.native)}
        missing = unexpected(adapter, keys)
        if missing:
            unverified(f"{len(missing)} of the {len(keys)} keys the launches set have no "
                       f"expectation written from {adapter.name} itself: "
                       + ", ".join(missing[:12]) + (", ..." if len(missing) > 12 else ""))
        if (why := idle(adapter, keys, [plan.validated_spec() for _, plan in claimed])):
            unverified(why)

    def test_launch_runs_under_an_engine_stub(
            self, adapter: EngineAdapter, engine_version: str, sample_files: SampleFiles,
            parse_launch: Callable[[LaunchPlan], dict[str, Any]] | None,
            tmp_path: Path) -> None:
        """The base sample's launch run for real, with a stub standing in for the engine's
        entry point (the kit's own for a built-in engine, ``kit_support().engine_stub`` for a
        plugin): it reaches the entry point, hands it the configuration the launch declares,
        and the reward answers the engine's own call with the spec's scores."""
        self._version(adapter, engine_version)
        if adapter.name == "native":
            pytest.skip("the native engine's launch runs the engine itself, which its own "
                        "tests train through")
        stub = stubs.BUILTIN.get(adapter.name) or adapter.kit_support().engine_stub
        if not stub:
            unverified("no engine stub: give KitSupport.engine_stub, modules that stand in "
                       "for the engine's entry point (docs/plugins.md)")
        if parse_launch is None:
            unverified("no launch reader: give KitSupport.parse_launch (docs/plugins.md)")
        assert parse_launch is not None and stub is not None
        _, plan = self._base(adapter, engine_version, sample_files)
        known = self._surface(adapter, engine_version)
        with reported():
            compared = launch_run.check_launch_runs(plan, dict(stub), parse_launch(plan),
                                                    tmp_path, known, adapter)
        assert compared, "the stub received nothing the kit could compare"

    def test_engine_runs_as_the_spec_asks(
            self, adapter: EngineAdapter, engine_version: str, sample_files: SampleFiles,
            write_outputs: Writer | None,
            parse_launch: Callable[[LaunchPlan], dict[str, Any]] | None,
            tmp_path: Path) -> None:
        """Where the engine can run here (the adapter's ``rehearse``, an installed release),
        its own trainer runs the watched sample for a few updates and does what the spec asks,
        seen where the hub holds the pen: the reward shim's calls, validation, the learning
        rate it logged, its checkpoints, KL at update 1, a resume; and the kit's writer
        matches what the engine wrote (engine_run)."""
        self._version(adapter, engine_version)
        from stateset_backend.common.errors import Unsupported

        python = type(self).engine_python
        base, plan = self._base(adapter, engine_version, sample_files)
        try:
            adapter.rehearse(plan)
        except Unsupported as exc:
            unsupported("the engine cannot run here, so what it does is not watched (the units "
                        "its rules convert, warmup, batches and schedules, are then held only to "
                        f"the adapter's own expectations): {exc}")
        installed = adapter.installed_version(python, None)
        if installed is None or parse_version(installed) != parse_version(engine_version):
            pytest.skip(f"{adapter.name} {engine_version} is not installed "
                        + (f"where engine_python points ({python})" if python else "here")
                        + (f" ({installed} is)" if installed else "")
                        + ": install it, or set the class's engine_python to its interpreter")
        doc = engine_run.watched_doc(adapter, engine_version, base, tmp_path / "watched",
                                     type(self).data_format)
        with reported():
            found = engine_run.run_engine(adapter, engine_version, doc, tmp_path / "watched",
                                          python=python)
            shown = engine_run.check_verdict(found)
            if write_outputs is not None:
                engine_run.check_writer_matches(
                    adapter, found, self._writer(adapter, found.plan, write_outputs,
                                                 parse_launch), tmp_path)
        print("\n".join(shown))

    def test_declared_deviations_run(
            self, adapter: EngineAdapter, engine_version: str, sample_files: SampleFiles,
            parse_launch: Callable[[LaunchPlan], dict[str, Any]] | None) -> None:
        """Every deviation the release's dialect declares runs in some sample whose setting
        differs from what the engine hard-codes, and that launch reads back as declared: a
        deviation no sample reaches is a claim nobody checked."""
        self._version(adapter, engine_version)
        dialect = adapter.contract.dialect(parse_version(engine_version))
        if not dialect.deviations:
            pytest.skip(f"{adapter.name} {dialect.name} declares no deviation")
        samples = self._claimed(adapter, engine_version, sample_files)
        _, base = self._base(adapter, engine_version, sample_files)
        known = self._surface(adapter, engine_version)
        with reported():
            reached = checks.check_deviations_run(adapter, engine_version, base,
                                                  [plan for _, plan in samples], sample_files)
        if parse_launch is None:
            unverified("no launch reader: the deviations' launches cannot be read back "
                       "(give KitSupport.parse_launch, docs/plugins.md)")
        assert parse_launch is not None
        with reported():
            for name, plan in reached.items():
                try:
                    read = flatten(parse_launch(plan))
                    checks.check_reads_as_declared(adapter, plan, read, known)
                    checks.check_expected(adapter, plan, read, known)
                except (CheckFailed, readers.LaunchUnreadable) as exc:
                    raise CheckFailed(f"deviation {name!r}: {exc}") from None

    def test_math_defaults_are_pinned(self, adapter: EngineAdapter, engine_version: str,
                                      sample_files: SampleFiles) -> None:
        """Every engine key whose release default changes the math or the budget (the kit's
        list for a built-in engine, written from the engine's code; ``KitSupport.math_keys``
        for a plugin) is set by every claimed sample's launch it matters to: a key left at
        the release's default changes the experiment when a release changes its default."""
        self._version(adapter, engine_version)
        from stateset_backend.conformance.math_keys import check_math_pinned, math_keys_of

        if adapter.name == "native":
            pytest.skip("the native engine's launch is the spec itself")
        support = adapter.kit_support()
        known = self._surface(adapter, engine_version)
        if known is None:
            unverified("no configuration surface: give KitSupport.surface, so the kit knows "
                       "the release's keys and defaults (docs/plugins.md)")
        assert known is not None
        options = known["options"]
        keys = math_keys_of(adapter.name, options, support.math_keys)
        if not any((k if isinstance(k, str) else k[0]) in options for k in keys):
            unverified("no list of the engine keys whose defaults change the math that "
                       "names a key of the release's surface: give KitSupport.math_keys, "
                       "written from the engine's own code (docs/plugins.md)")
        with reported():
            check_math_pinned(f"{adapter.name} {engine_version}", keys, options,
                              self._claimed(adapter, engine_version, sample_files))

    def test_declared_quantities_are_the_engines(self, adapter: EngineAdapter,
                                                 engine_version: str) -> None:
        """Every number a deviation of the release's dialect states (a clamp, an epsilon, a
        floor) equals what the release's own code gives: the quantity the surface generator
        measured by running the release's function, or read from the line that uses it."""
        self._version(adapter, engine_version)
        from stateset_backend.conformance import quantities
        dialect = adapter.contract.dialect(parse_version(engine_version))
        stated = {name: d for name, d in dialect.deviations.items()
                  if quantities.declared_number(d) is not None}
        if not stated:
            pytest.skip(f"{adapter.name} {dialect.name} declares no deviation that states a "
                        "number")
        support = adapter.kit_support()
        known = self._surface(adapter, engine_version) or {}
        quantity_of = {**quantities.QUANTITY_OF.get(adapter.name, {}), **support.quantities}
        with reported():
            checked, missing = quantities.check_quantities(
                stated, known.get("quantities") or {}, quantity_of,
                f"{adapter.name} {engine_version}", CheckFailed)
        if missing:
            unverified(f"{len(missing)} of the {len(stated)} deviations that state a number "
                       f"have no measurement of {adapter.name} {engine_version} to hold it to: "
                       + ", ".join(missing) + " (give KitSupport.quantities and the surface's "
                       "quantities, measured from the engine's own code; docs/plugins.md)")
        print(f"{len(checked)} stated numbers equal the release's own: {', '.join(checked)}")

    def test_engine_options_cannot_reach_owned_keys(self, adapter: EngineAdapter,
                                                    engine_version: str,
                                                    sample_files: SampleFiles) -> None:
        self._version(adapter, engine_version)
        base, plan = self._base(adapter, engine_version, sample_files)
        tried = 0
        with reported():
            tried = checks.check_option_keys(adapter, engine_version, base, plan, sample_files,
                                             self.option_key(adapter, plan))
            tried += checks.check_option_aliases(adapter, engine_version, base, plan,
                                                 sample_files)
            checks.check_namespace_keys(adapter, engine_version, base, sample_files)
        assert tried, "the launch sets no key, so nothing could be guarded"

    # -- collection and resume ----------------------------------------------------------------
    def test_collection(self, adapter: EngineAdapter, engine_version: str, case: str,
                        sample_files: SampleFiles, write_outputs: Writer | None,
                        tmp_path: Path,
                        parse_launch: Callable[[LaunchPlan], dict[str, Any]] | None) -> None:
        self._version(adapter, engine_version)
        gap = self._gap(adapter, case, engine_version)
        if gap is not None:
            unsupported(f"{case}: {gap}")
        if write_outputs is None:
            unsupported("the adapter's kit_support() supplies no write_outputs: collection "
                        "is not checked")
        _, plan = self._base(adapter, engine_version, sample_files)
        cannot = None
        with reported():
            try:
                checks.check_collection(adapter, plan, COLLECTION_CASES[case],
                                        self._writer(adapter, plan, write_outputs,
                                                     parse_launch), tmp_path)
            except CannotWrite as exc:
                cannot = str(exc)
        if cannot is not None:
            unsupported(f"{case}: the engine's outputs cannot hold it ({cannot})")

    def test_resume(self, adapter: EngineAdapter, engine_version: str,
                    sample_files: SampleFiles, write_outputs: Writer | None,
                    tmp_path: Path,
                    parse_launch: Callable[[LaunchPlan], dict[str, Any]] | None) -> None:
        self._version(adapter, engine_version)
        provided = adapter.contract.provided(parse_version(engine_version))
        if "resume:exact" not in provided:
            unsupported(f"resume:exact is not claimed by {adapter.name} {engine_version}")
        if (gap := self._gap(adapter, "resume:exact", engine_version)) is not None:
            unsupported(f"resume:exact: {gap}")
        if write_outputs is None:
            unsupported("the adapter's kit_support() supplies no write_outputs: resume is "
                        "not checked")
        with reported():
            plans = self._resume_plans(adapter, engine_version, sample_files, provided)
            missing = [checks.check_resume(adapter, plan, self._writer(
                adapter, plan, write_outputs, parse_launch), tmp_path / str(i), parse_launch)
                for i, plan in enumerate(plans)]
        if any(missing):
            unverified("; ".join(dict.fromkeys(m for m in missing if m)))
