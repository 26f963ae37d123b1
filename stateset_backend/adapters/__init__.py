"""Built-in adapters, registered through the same hook a third-party plugin implements."""

from __future__ import annotations

from collections.abc import Callable

from stateset_backend.plugin import EngineAdapter, hookimpl


@hookimpl
def register_adapters(register: Callable[[EngineAdapter], None]) -> None:
    from stateset_backend.adapters.native.adapter import NativeAdapter
    from stateset_backend.adapters.nemo_rl.adapter import NemoRLAdapter
    from stateset_backend.adapters.openrlhf.adapter import OpenRLHFAdapter
    from stateset_backend.adapters.verl.adapter import VerlAdapter

    register(NativeAdapter())
    register(VerlAdapter())
    register(OpenRLHFAdapter())
    register(NemoRLAdapter())
