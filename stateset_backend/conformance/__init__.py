"""The adapter conformance kit: test classes an adapter author runs in their own CI.

Mix :class:`AdapterConformance` into a pytest class and provide two fixtures::

    from stateset_backend.conformance import AdapterConformance

    class TestMyEngine(AdapterConformance):
        @pytest.fixture
        def adapter(self):
            return MyAdapter()

        @pytest.fixture
        def engine_versions(self):
            return ["1.0.0", "2.3.1"]   # at least one version per dialect

The kit proves what the core relies on: the contract is valid against the shipped JSON Schema
and names the adapter's engine; every dialect is exercised; every leaf of every sample spec is
mapped, rejected with a reason, or not applicable with a reason (never silently dropped);
translation is deterministic; and ``engine_options`` cannot override a mapped key. What an
adapter does not support is declared in ``unsupported`` and reported as skipped-unsupported,
never as passed.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, ClassVar

import pytest

from ..core.adapter import EngineAdapter, LaunchContext
from ..core.contracts import parse_version
from ..core.errors import InvalidInput, Unsupported
from ..core.rules import explain_rows, translate
from ..core.specfile import parse_spec
from .specs import SAMPLES

__all__ = ["SAMPLES", "AdapterConformance"]

SAMPLE_NAMES = sorted(SAMPLES)


def _unsupported(feature: str) -> Any:
    """Decorator: skip as unsupported when the adapter class declares ``feature`` unsupported."""

    def deco(fn: Any) -> Any:
        fn._conformance_feature = feature
        return fn

    return deco


class AdapterConformance:
    #: features this adapter does not implement, e.g. {"render"} for a contract-only adapter
    unsupported: ClassVar[frozenset[str]] = frozenset()

    @pytest.fixture(autouse=True)
    def _skip_unsupported(self, request: pytest.FixtureRequest) -> None:
        feature = getattr(request.function, "_conformance_feature", None)
        if feature in self.unsupported:
            pytest.skip(f"unsupported: {feature}")

    @pytest.fixture
    def adapter(self) -> EngineAdapter:
        raise NotImplementedError("provide an `adapter` fixture")

    @pytest.fixture
    def engine_versions(self) -> list[str]:
        raise NotImplementedError("provide an `engine_versions` fixture")

    # -- contract --------------------------------------------------------------------------
    def test_contract_matches_the_shipped_schema(self, adapter: EngineAdapter) -> None:
        import jsonschema

        schema = json.loads(resources.files("stateset_backend.schemas").joinpath(
            "contract.json").read_text(encoding="utf-8"))
        jsonschema.Draft202012Validator(schema).validate(adapter.contract.to_json())
        assert adapter.contract.engine == adapter.name

    def test_versions_cover_every_dialect(self, adapter: EngineAdapter,
                                          engine_versions: list[str]) -> None:
        contract = adapter.contract
        for v in engine_versions:
            assert contract.supports(parse_version(v)), f"{v} is outside {contract.supported}"
        seen = {contract.dialect(parse_version(v)).name for v in engine_versions}
        assert seen == {d.name for d in contract.dialects}, "a dialect is never exercised"

    # -- rules -----------------------------------------------------------------------------
    @pytest.mark.parametrize("sample", SAMPLE_NAMES)
    def test_no_field_is_silently_dropped(self, adapter: EngineAdapter,
                                          engine_versions: list[str], sample: str) -> None:
        spec = parse_spec(SAMPLES[sample])
        for v in engine_versions:
            dialect = adapter.contract.dialect(parse_version(v))
            for row in explain_rows(spec, adapter.rules(dialect), dialect, adapter.name):
                if row.state in ("refused", "declared", "inert", "not_applicable"):
                    assert row.reason.strip(), f"{row.path}: empty reason"
                if row.state == "pinned":
                    assert row.native or row.reason.strip(), \
                        f"{row.path}: pinned onto no native key and no stated carrier"

    @_unsupported("render")
    @pytest.mark.parametrize("sample", SAMPLE_NAMES)
    def test_translation_is_deterministic(self, adapter: EngineAdapter,
                                          engine_versions: list[str], sample: str) -> None:
        spec = parse_spec(SAMPLES[sample])
        for v in engine_versions:
            dialect = adapter.contract.dialect(parse_version(v))
            try:
                first = translate(spec, adapter.rules(dialect), dialect, adapter.name, v)
            except Unsupported:
                continue  # this version cannot honour this sample: that is allowed
            second = translate(spec, adapter.rules(dialect), dialect, adapter.name, v)
            assert first == second
            ctx = LaunchContext("20260101T000000Z-00000000", "sha256:" + "0" * 64, v, dialect)
            a, b = adapter.render(first, spec, ctx), adapter.render(second, spec, ctx)
            assert a == b and a.argv and all(isinstance(x, str) for x in a.argv)

    @_unsupported("render")
    def test_engine_options_cannot_override_a_mapped_key(self, adapter: EngineAdapter,
                                                         engine_versions: list[str]) -> None:
        spec = parse_spec(SAMPLES["minimal"])
        for v in engine_versions:
            dialect = adapter.contract.dialect(parse_version(v))
            rules = adapter.rules(dialect)
            try:
                mapped = translate(spec, rules, dialect, adapter.name, v)
            except Unsupported:
                continue
            key = next(k for k, src in mapped.sources.items() if src != "engine_options")
            doc = dict(SAMPLES["minimal"], engine_options={adapter.name: {key: "override"}})
            with pytest.raises(InvalidInput, match="overrides the key"):
                translate(parse_spec(doc), rules, dialect, adapter.name, v)
            return
        pytest.skip("unsupported: no version can translate the minimal sample")
