"""Every adapter we ship or exemplify passes the conformance kit third parties run."""

from __future__ import annotations

import pytest

from stateset_backend.adapters.native import NativeAdapter
from stateset_backend.conformance import AdapterConformance


class TestNativeConformance(AdapterConformance):
    @pytest.fixture
    def adapter(self):
        return NativeAdapter()

    @pytest.fixture
    def engine_versions(self):
        return ["0.1.0"]


class TestExamplePluginConformance(AdapterConformance):
    @pytest.fixture
    def adapter(self):
        from stateset_echo_engine.plugin import EchoAdapter

        return EchoAdapter()

    @pytest.fixture
    def engine_versions(self):
        return ["1.0.0", "1.2.0"]


class TestVerlConformance(AdapterConformance):
    @pytest.fixture
    def adapter(self):
        from stateset_backend.adapters.verl import VerlAdapter

        return VerlAdapter()

    @pytest.fixture
    def engine_versions(self):
        return ["0.4.1", "0.6.0", "0.7.0", "0.7.1", "0.9.1"]


class TestOpenRLHFConformance(AdapterConformance):
    @pytest.fixture
    def adapter(self):
        from stateset_backend.adapters.openrlhf import OpenRLHFAdapter

        return OpenRLHFAdapter()

    @pytest.fixture
    def engine_versions(self):
        return ["0.9.8", "0.10.1", "0.10.2", "0.11.1", "0.11.2"]


class TestNemoRLConformance(AdapterConformance):
    @pytest.fixture
    def adapter(self):
        from stateset_backend.adapters.nemo_rl import NemoRLAdapter

        return NemoRLAdapter()

    @pytest.fixture
    def engine_versions(self):
        return ["0.5.0", "0.6.0", "0.7.0"]
