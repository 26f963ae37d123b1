"""Every hook a plugin can implement, declared here and only here.

A plugin is a module (or object) exposed under the ``stateset_backend`` entry-point group that
implements one or more of these hooks with :data:`hookimpl`. Implementations may accept fewer
arguments than declared, so a hook can grow an argument without breaking existing plugins.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from stateset_backend.engines.adapter import EngineAdapter

PROJECT = "stateset_backend"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_adapters(register: Callable[[EngineAdapter], None]) -> None:
    """Register engine adapters by calling ``register(adapter)`` once per adapter.

    Called once per process, when the registry is first built. ``adapter`` is an instance of
    :class:`stateset_backend.engines.adapter.EngineAdapter` whose ``name`` is unique across all
    plugins; a second adapter with a taken name is reported as a plugin failure. The return
    value is ignored. Built-in adapters are registered through this same hook.
    """
