"""Built-in adapters, registered through the same hook a third-party plugin implements."""

from __future__ import annotations

from collections.abc import Callable

from ..plugin import EngineAdapter, hookimpl


@hookimpl
def register_adapters(register: Callable[[EngineAdapter], None]) -> None:
    from .native import NativeAdapter
    from .nemo_rl import NemoRLAdapter
    from .openrlhf import OpenRLHFAdapter
    from .verl import VerlAdapter

    register(NativeAdapter())
    register(VerlAdapter())
    register(OpenRLHFAdapter())
    register(NemoRLAdapter())
