"""What :class:`~stateset_backend.conformance.AdapterConformance`'s checks stand on, kept apart
so the public class reads as its list of checks.

The class attributes an author sets and the fixtures the checks take: the adapter, the output
writer and launch reader its ``kit_support()`` supplies, the sample files; the parametrization
over versions, capabilities and collection cases; the planned samples and declared gaps every
check starts from; and how a check reports its outcome: failed (one line, no traceback),
``unsupported`` (a declared gap) or ``unverified`` (nothing could be checked). Both of the
last are never passed: the kit's pytest plugin reads them from the skip reason's prefix.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar, NoReturn

import pytest

from stateset_backend.common.jsonio import flatten
from stateset_backend.conformance import checks, memo, readers, writers
from stateset_backend.conformance.checks import COLLECTION_CASES, CheckFailed, Writer
from stateset_backend.conformance.samples import SAMPLED, Sample, SampleFiles, write_sample_files
from stateset_backend.contracts.loader import parse_version
from stateset_backend.engines.adapter import EngineAdapter
from stateset_backend.plan.launch_plan import LaunchPlan

_BUILTIN_WRITER: object = object()  # the kit writes this engine's outputs itself, per launch
UNSUPPORTED = "unsupported: "  # prefix of a skip reason that reports a declared gap
UNVERIFIED = "unverified: "  # prefix of a skip reason: the kit could not see what the engine reads


def unsupported(reason: str) -> NoReturn:
    """Report the running check as ``unsupported`` (a declared gap), with its reason."""
    pytest.skip(UNSUPPORTED + reason)


def unverified(reason: str) -> NoReturn:
    """Report the running check as ``unverified``: nothing was checked, so it cannot pass."""
    pytest.skip(UNVERIFIED + reason)


@contextmanager
def reported() -> Iterator[None]:
    """A CheckFailed inside becomes the test's failure, as one line without a traceback."""
    try:
        yield
    except CheckFailed as exc:
        failure = str(exc)
    else:
        return
    pytest.fail(failure, pytrace=False)



class KitFixtures:
    """The attributes, fixtures and helpers of :class:`AdapterConformance`; see the package
    docstring for what to provide."""

    #: versions to check: the first and last release of every dialect of the contract
    engine_versions: ClassVar[Iterable[str]] = ()
    #: capabilities (or collection case names, or "resume") the adapter does not honour,
    #: optionally limited to versions by a PEP 440 specifier after a space; a mapping gives
    #: each entry its reason
    unsupported: ClassVar[Iterable[str] | Mapping[str, str]] = frozenset()
    #: the data file format the engine reads: "jsonl" or "parquet"
    data_format: ClassVar[str] = "jsonl"
    #: merged into every sample spec (a model path the engine can load, a prompt policy),
    #: over ``kit_support().base``
    base: ClassVar[dict[str, Any]] = {}
    #: the versions were picked by hand (``conformance --engine-version``), not meant to
    #: cover every dialect: the coverage check is reported skipped instead of failed
    chosen_versions: ClassVar[bool] = False
    #: the interpreter of the environment the engine is installed in (``rehearse --python``),
    #: for the check that runs the engine itself; None: this one
    engine_python: ClassVar[str | None] = None

    # -- what the adapter's class provides -----------------------------------------------------
    @pytest.fixture
    def adapter(self) -> EngineAdapter:
        raise NotImplementedError("provide an `adapter` fixture returning the adapter")

    @pytest.fixture
    def write_outputs(self, adapter: EngineAdapter) -> Writer | None:
        """``write(attempt_dir, ctx, *, metrics, identity, artifacts, checkpoint_step)``:
        the engine's native output files for canonical metric rows, from the adapter's
        ``kit_support()`` (the kit writes the built-in engines' itself, per launch). Without
        one, collection and resume are reported unsupported."""
        writer: Writer | None = adapter.kit_support().write_outputs
        if writer is None and adapter.name in writers.BUILTIN:
            return _BUILTIN_WRITER  # type: ignore[return-value]
        return writer

    def _writer(self, adapter: EngineAdapter, plan: LaunchPlan, declared: Writer | None,
                read: Callable[[LaunchPlan], dict[str, Any]] | None) -> Writer:
        if declared is not _BUILTIN_WRITER:
            assert declared is not None
            return declared
        assert read is not None
        made = writers.writer_for(adapter.name, plan, lambda p: flatten(read(p)), None)
        assert made is not None
        return made

    @pytest.fixture
    def parse_launch(self, adapter: EngineAdapter) -> Callable[[LaunchPlan],
                                                                dict[str, Any]] | None:
        """What the engine reads from a plan's launch: the kit's own reader for a built-in
        engine, else ``kit_support().parse_launch``. Without one, the checks that need it are
        reported ``unverified``. A launch several checks share (a sample's, the base's) is
        read once."""
        declared = adapter.kit_support().parse_launch
        reader = readers.reader_for(adapter.name, declared)
        if reader is None:
            return None
        source = readers.BUILTIN.get(adapter.name, declared)

        def read(plan: LaunchPlan) -> dict[str, Any]:
            assert reader is not None
            shared = memo.read_once(source, reader, plan)
            return reader(plan) if shared is None else copy.deepcopy(shared)

        return read

    def option_key(self, adapter: EngineAdapter, plan: LaunchPlan) -> str | None:
        """A free-text ``engine_options`` key no spec field maps to, for the hostile-value
        check: ``kit_support().option_key`` names one the engine's parser accepts, or gives
        None for an engine whose every option takes only enumerated values."""
        named = adapter.kit_support().option_key
        if named is not None:
            key = named(plan)
            return None if key is None else str(key)
        flags = any(key.startswith("-") for key in plan.native)
        return "--stateset-conformance-probe" if flags else "stateset_conformance_probe"

    # -- generation ---------------------------------------------------------------------------
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        versions = list(type(self).engine_versions) or ["<set engine_versions>"]
        if "engine_version" in metafunc.fixturenames:
            metafunc.parametrize("engine_version", versions)
        if "capability" in metafunc.fixturenames:
            metafunc.parametrize("capability", SAMPLED)
        if "case" in metafunc.fixturenames:
            metafunc.parametrize("case", sorted(COLLECTION_CASES))

    @pytest.fixture(scope="class")
    @classmethod
    def sample_files(cls, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SampleFiles]:
        files = write_sample_files(tmp_path_factory.mktemp("conformance-samples"),
                                   cls.data_format)
        yield files
        memo.forget(files)

    def _overrides(self, adapter: EngineAdapter) -> dict[str, Any]:
        """``kit_support().base`` with the class's ``base`` merged over it: the CLI (which has
        no class of the author's) and the author's test class plan the same samples."""
        from stateset_backend.conformance.samples import deep_merge

        return deep_merge(dict(adapter.kit_support().base), type(self).base)

    def _gap(self, adapter: EngineAdapter, name: str, version: str) -> str | None:
        """A gap declared by the adapter's ``kit_support()`` or by this class."""
        declared = {**checks.reasons_of(adapter.kit_support().unsupported),
                    **checks.reasons_of(type(self).unsupported)}
        return checks.declared_unsupported(declared, name, version)

    @staticmethod
    def _version(adapter: EngineAdapter, version: str) -> None:
        if version.startswith("<"):
            pytest.fail("set engine_versions on the test class: the first and last release "
                        "of every dialect", pytrace=False)
        if not adapter.contract.supports(parse_version(version)):
            pytest.fail(f"{version} is outside {adapter.name}'s supported range "
                        f"{adapter.contract.supported}", pytrace=False)

    def _claimed(self, adapter: EngineAdapter, version: str,
                 files: SampleFiles) -> list[tuple[Any, LaunchPlan]]:
        """One planned sample per claimed capability that is not a declared gap; the check
        fails once, with the reasons, when none plans."""
        with reported():
            samples = checks.claimed_plans(adapter, version, files, self._overrides(adapter),
                                           lambda c: self._gap(adapter, c, version) is not None)
        if not samples:
            pytest.fail(f"no claimed capability of {adapter.name} {version} plans: nothing "
                        "is translated", pytrace=False)
        return samples

    def _read_back(self, adapter: EngineAdapter, version: str,
                   parse_launch: Callable[[LaunchPlan], dict[str, Any]] | None,
                   plans: list[tuple[str, LaunchPlan]]) -> None:
        """Each named plan's launch, read by the engine's own reader (unverified without
        one), holds the keys and values it declares, in the release's surface, and the
        values the kit's expectations say the engine must read for its spec."""
        if parse_launch is None:
            unverified("no launch reader: give KitSupport.parse_launch, the engine's own "
                       "reading of a launch (docs/plugins.md)")
        from stateset_backend.spec.model import ExperimentSpec
        from stateset_backend.spec.modeltree import all_leaf_paths

        # the native engine's launch is the spec: every leaf is read
        leaves = set(all_leaf_paths(ExperimentSpec)) if adapter.name == "native" else set()
        known = self._surface(adapter, version)
        with reported():
            for name, plan in plans:
                try:
                    read = flatten(parse_launch(plan))
                    checks.check_reads_as_declared(adapter, plan, read, known,
                                                   also_read=leaves.__contains__)
                    checks.check_expected(adapter, plan, read, known)
                except (CheckFailed, readers.LaunchUnreadable) as exc:
                    raise CheckFailed(f"{name}: {exc}") from None

    def _first_samples(self, adapter: EngineAdapter, files: SampleFiles) -> dict[str, Sample]:
        """Each checked version's first claimed sample, for checks that serve every version
        at once; a version whose samples do not plan is left to its own checks."""
        out = {}
        for version in type(self).engine_versions:
            def gap(capability: str, version: str = version) -> bool:
                return self._gap(adapter, capability, version) is not None

            try:
                if not adapter.contract.supports(parse_version(version)):
                    continue
                samples = checks.claimed_plans(adapter, version, files,
                                               self._overrides(adapter), gap)
            except Exception:  # what fails here, the version's own checks report
                continue
            if samples:
                out[version] = samples[0][0]
        return out

    @staticmethod
    def _surface(adapter: EngineAdapter, version: str) -> dict[str, Any] | None:
        """The release's configuration surface: the hub's generated one for a built-in
        engine, the plugin's ``KitSupport.surface`` otherwise."""
        from stateset_backend.contracts.surfaces import surface

        return surface(adapter.name, version) or adapter.kit_support().surface

    def _base(self, adapter: EngineAdapter, version: str, files: SampleFiles,
              **extra: Any) -> tuple[dict[str, Any], LaunchPlan]:
        with reported():
            return checks.base_plan(adapter, version, files, self._overrides(adapter), **extra)
        raise AssertionError("unreachable")

    def _resume_plans(self, adapter: EngineAdapter, version: str, files: SampleFiles,
                      provided: frozenset[str]) -> list[LaunchPlan]:
        """The resume check's base, and its critic's sample where the kit's writer saves the
        engine's critic (unless a gap is declared for it): run for the check's updates,
        saving at every one where the release can be asked to."""
        extra = {"budget": {"total_updates": checks.RESUME_UPDATES},
                 **({"checkpoint": {"every": 1}} if "checkpoint" in provided else {})}
        critic = [] if self._gap(adapter, "critic", version) is not None else \
            checks.critic_plan(adapter, version, files, self._overrides(adapter), extra)
        return [self._base(adapter, version, files, **extra)[1], *critic]
