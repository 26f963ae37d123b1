"""Every adapter we ship or exemplify passes the conformance kit third parties run, at the
first and last release of every dialect; each class is what an adapter author writes: the
adapter, the versions and the sample data format. The writer of the engine's outputs and the
reader of its launch come from the adapter's own ``kit_support()``, as they do for
``stateset-backend conformance``."""

from __future__ import annotations

import math
import os

import pytest

from stateset_backend.adapters.native.adapter import NativeAdapter
from stateset_backend.conformance import AdapterConformance
from stateset_backend.conformance.writers import write_native
from stateset_backend.engines.adapter import LaunchContext


class TestNativeConformance(AdapterConformance):
    engine_versions = ["0.1.0"]
    base = {"model": {"path": "builtin:tiny-llama-support"}, "data": {"chat_template": False}}

    @pytest.fixture
    def adapter(self):
        return NativeAdapter()


# -- the echo example plugin: its writer ships with it ---------------------------------------
class TestExamplePluginConformance(AdapterConformance):
    engine_versions = ["1.0.0", "1.2.0"]

    @pytest.fixture
    def adapter(self):
        from stateset_echo_engine.plugin import EchoAdapter

        return EchoAdapter()


VERL_RELEASES = ["0.4.1", "0.5.0", "0.6.0", "0.6.1", "0.7.0", "0.7.1", "0.8.0", "0.9.0",
                 "0.9.1"]


class TestVerlConformance(AdapterConformance):
    engine_versions = VERL_RELEASES
    data_format = "parquet"  # verl reads parquet only
    # verl's own environment (CI's .ci-verl-venv): the kit runs verl's trainer there
    engine_python = os.environ.get("STATESET_TEST_VERL_PYTHON")

    @pytest.fixture
    def adapter(self):
        from stateset_backend.adapters.verl.adapter import VerlAdapter

        return VerlAdapter()


class TestOpenRLHFConformance(AdapterConformance):
    engine_versions = ["0.9.8", "0.10.1", "0.10.2", "0.11.1", "0.11.2"]

    @pytest.fixture
    def adapter(self):
        from stateset_backend.adapters.openrlhf.adapter import OpenRLHFAdapter

        return OpenRLHFAdapter()


class TestNemoRLConformance(AdapterConformance):
    engine_versions = ["0.5.0", "0.6.0", "0.7.0"]
    data_format = "parquet"

    @pytest.fixture
    def adapter(self):
        from stateset_backend.adapters.nemo_rl.adapter import NemoRLAdapter

        return NemoRLAdapter()


def test_writers_write_what_they_are_given(tmp_path):
    """The native writer keeps a NaN as NaN (the kit's cases depend on it)."""
    from packaging.version import Version

    adapter = NativeAdapter()
    ctx = LaunchContext("20260101T000000Z-00000000", "sha256:" + "0" * 64, "0.1.0",
                        adapter.contract.dialect(Version("0.1.0")))
    write_native(tmp_path, ctx, metrics=[{"step": 1, "reward/mean": math.nan}], identity=True,
                 artifacts=False, checkpoint_step=None)
    assert math.isnan(adapter.collect(tmp_path, ctx).metrics[0]["reward/mean"])


def test_every_metric_the_kit_writes_has_a_value_of_its_own():
    """The read-back check tells a metric read under another's name, or at another update,
    only while no two values it writes could be read as each other."""
    from stateset_backend.conformance.checks.outputs import HEALTHY, _more

    rows = [{**_more(r["step"]), **r} for r in HEALTHY]
    for row in rows:
        values = [v for k, v in row.items() if k != "step"]
        assert not any(math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-5)
                       for i, a in enumerate(values) for b in values[i + 1:]), row
    for name in ("lr", "lr/next"):
        assert len({row[name] for row in rows}) == len(rows)


def test_every_awkward_sample_is_a_spec_some_engine_plans(tmp_path):
    """An awkward sample the spec itself rejects would be left out on every engine as if the
    release refused it, and check nothing: each is a valid spec, planned by a built-in."""
    from stateset_backend.conformance import checks
    from stateset_backend.conformance.runner import dialect_versions
    from stateset_backend.conformance.samples import write_sample_files
    from stateset_backend.conformance.specs import AWKWARD
    from stateset_backend.engines.registry import build_registry

    files = write_sample_files(tmp_path, "parquet")
    planned: set[str] = set()
    for name in ("native", "verl", "openrlhf", "nemo-rl"):
        adapter = build_registry().get(name).adapter
        version = dialect_versions(adapter.contract)[-1]
        got = checks.awkward_plans(adapter, version, files, dict(adapter.kit_support().base))
        # most plan everywhere: a release refuses only what it cannot run (OpenRLHF: a linear
        # floor, unequal mini-batches, validation's own top-k, temperature and top-p; NeMo RL
        # also several epochs, a sequence mean beside an entropy term, validation samples)
        assert len(got) >= 2 * len(AWKWARD) // 3, \
            (name, sorted(AWKWARD.keys() - dict(got).keys()))
        planned |= dict(got).keys()
    assert planned == AWKWARD.keys()
