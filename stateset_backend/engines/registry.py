"""The adapter registry: built-in and third-party adapters, loaded through one pluggy hook.

A plugin that fails to import (or raises while registering) is recorded with its name and
error and the others keep working, so one broken third-party package cannot take down the CLI.
``STATESET_BACKEND_STRICT_PLUGINS=1`` makes such a failure fatal (for CI), and
``STATESET_BACKEND_PLUGINS=a,b`` limits which installed plugins are loaded.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy
from packaging.utils import canonicalize_name

from stateset_backend.common.errors import AdapterBug, InvalidInput, StatesetError
from stateset_backend.engines import hookspecs
from stateset_backend.engines.adapter import EngineAdapter

ENTRY_POINT_GROUP = "stateset_backend"
BUILTIN = "builtin"


class PluginError(StatesetError):
    """A plugin failed to load while strict plugin loading was asked for."""

    exit_code = 2
    kind = "plugin_error"


@dataclass(frozen=True)
class AdapterEntry:
    adapter: EngineAdapter
    plugin: str
    distribution: str
    version: str

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Anything an adapter raises that is not one of our typed errors is its bug: one line
        naming the engine, plugin and distribution (exit 3), never a traceback or exit 1."""
        try:
            yield
        except StatesetError:
            raise
        except (KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as exc:
            raise AdapterBug(f"the {self.adapter.name} adapter (plugin {self.plugin!r}, "
                             f"{self.distribution} {self.version}) failed in {what}: "
                             f"{_describe(exc)}") from exc


def entry_of(adapter: EngineAdapter) -> AdapterEntry:
    """The registry's entry for an adapter held without one (the conformance kit is handed
    the adapter alone), so that a failure the kit reports names the plugin that has it: the
    entry a registry gave it, else the installed plugin whose module is the longest prefix of
    the module that defines it."""
    try:
        found = _ENTRIES.get(adapter)
    except TypeError:  # an adapter that cannot be weakly referenced or hashed
        found = None
    if found is not None:
        return found
    module = type(adapter).__module__
    plugin, dist, version = _origin(module)
    return AdapterEntry(adapter, plugin or adapter.name, dist or module.partition(".")[0],
                        version)


# the entry each adapter of a registry belongs to
_ENTRIES: weakref.WeakKeyDictionary[EngineAdapter, AdapterEntry] = \
    weakref.WeakKeyDictionary()


@functools.cache  # cleared by each build_registry, which reads the entry points anew
def _origin(module: str) -> tuple[str | None, str | None, str]:
    """(entry-point name, distribution, version) of the installed plugin whose entry point's
    module shares the most leading parts with ``module`` (at least its package)."""
    parts = module.split(".")
    best: tuple[int, str | None, str | None, str] = (0, None, None, "unknown")
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.dist is None:
            continue
        theirs = ep.module.split(".")
        shared = next((i for i, (a, b) in enumerate(zip(parts, theirs, strict=False))
                       if a != b),
                      min(len(parts), len(theirs)))
        if shared > best[0]:
            best = (shared, ep.name, ep.dist.metadata["Name"], ep.dist.version)
    return best[1], best[2], best[3]


@dataclass(frozen=True)
class PluginFailure:
    plugin: str
    distribution: str | None
    error: str

    def to_json(self) -> dict[str, Any]:
        return {"plugin": self.plugin, "distribution": self.distribution, "error": self.error}


@dataclass
class Registry:
    adapters: dict[str, AdapterEntry] = field(default_factory=dict)
    failures: list[PluginFailure] = field(default_factory=list)

    def get(self, engine: str) -> AdapterEntry:
        if engine in self.adapters:
            return self.adapters[engine]
        known = ", ".join(sorted(self.adapters)) or "none"
        hint = ""
        failed = [f for f in self.failures if f.plugin == engine]
        if failed:
            hint = f"; plugin {engine!r} failed to load: {failed[0].error}"
        raise InvalidInput(f"unknown engine {engine!r} (registered: {known}){hint}")


def _describe(exc: BaseException) -> str:
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _selected_plugins() -> set[str] | None:
    raw = os.environ.get("STATESET_BACKEND_PLUGINS")
    if raw is None:
        return None
    return {p.strip() for p in raw.split(",") if p.strip()}


def _accept(adapter: object, registry: Registry) -> str:
    """Validate one registered adapter; loading its contract now makes a bad one its plugin's."""
    if not isinstance(adapter, EngineAdapter):
        raise TypeError(f"registered {type(adapter).__name__}, not an EngineAdapter")
    if adapter.name in registry.adapters:
        owner = registry.adapters[adapter.name].plugin
        raise ValueError(f"engine name {adapter.name!r} is already registered by {owner!r}")
    if adapter.contract.engine != adapter.name:
        raise ValueError(f"adapter {adapter.name!r} carries the contract of "
                         f"{adapter.contract.engine!r}")
    return adapter.name


@contextlib.contextmanager
def _real_interrupts() -> Iterator[Any]:
    """Tell a real Ctrl-C (SIGINT delivered to us) from a plugin raising KeyboardInterrupt at
    import: only the first may stop the CLI."""
    seen = [False]
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: Any) -> None:
        seen[0] = True
        raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread: signals cannot be caught here anyway
        yield lambda: True
        return
    try:
        yield lambda: seen[0]
    finally:
        signal.signal(signal.SIGINT, previous)


def _ours(name: str, distribution: str | None) -> bool:
    """This package's own built-ins, which a third party taking their plugin name does not
    displace."""
    return name == BUILTIN and distribution is not None and \
        canonicalize_name(distribution) == "stateset-backend"


def build_registry(*, strict: bool | None = None,
                   only: set[str] | None = None) -> Registry:
    """Load built-in adapters and every selected entry-point plugin."""
    strict = _env_flag("STATESET_BACKEND_STRICT_PLUGINS") if strict is None else strict
    only = _selected_plugins() if only is None else only
    _origin.cache_clear()
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    registry = Registry()
    sources: dict[str, tuple[str, str]] = {}

    def fail(plugin: str, dist: str | None, exc: BaseException) -> None:
        failure = PluginFailure(plugin, dist, _describe(exc))
        if strict:
            raise PluginError(f"plugin {plugin!r} failed to load: {failure.error}")
        registry.failures.append(failure)

    # Built-ins first, so a third-party adapter that takes a built-in name is the one refused.
    entry_points = sorted(metadata.entry_points(group=ENTRY_POINT_GROUP),
                          key=lambda ep: (ep.name != BUILTIN, ep.name))
    claimants: dict[str, list[str]] = {}
    for ep in entry_points:
        claimants.setdefault(ep.name, []).append(ep.dist.name if ep.dist else ep.value)
    with _real_interrupts() as interrupted:
        for ep in entry_points:
            if only is not None and ep.name not in only and ep.name != BUILTIN:
                continue
            # one parse of the distribution's METADATA (its .name and .version each parse it)
            meta = ep.dist.metadata if ep.dist is not None else None
            dist_name = meta["Name"] if meta is not None else None
            dist_version = meta["Version"] if meta is not None else "unknown"
            if len(claimants[ep.name]) > 1 and not _ours(ep.name, dist_name):
                # which of them pluggy kept would be the order the environment lists them
                # in: none of the contenders is loaded (the built-ins keep their own name),
                # and each says why
                kept = "this package's built-ins keep it" if ep.name == BUILTIN else \
                    "none of them is loaded"
                fail(ep.name, dist_name, ValueError(
                    f"the plugin name {ep.name!r} is registered by "
                    f"{len(claimants[ep.name])} installed distributions "
                    f"({', '.join(sorted(claimants[ep.name]))}), so {kept}: "
                    "uninstall all but one"))
                continue
            try:
                plugin = ep.load()
                pm.register(plugin, name=ep.name)
                if not pm.get_hookcallers(plugin):
                    pm.unregister(plugin)
                    raise ValueError(f"{ep.value} implements no hook: mark its "
                                     "register_adapters with stateset_backend's hookimpl "
                                     "(docs/plugins.md)")
                sources[ep.name] = (dist_name or ep.name, dist_version)
            except BaseException as exc:  # SystemExit too: one plugin cannot stop the CLI
                if isinstance(exc, KeyboardInterrupt) and interrupted():
                    raise
                fail(ep.name, dist_name, exc)

    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        bad = pm.get_name(exc.plugin) or "?"
        pm.unregister(exc.plugin)
        fail(bad, sources.get(bad, (None, ""))[0], exc)

    # Call each implementation on its own, in registration order (built-ins first), so that
    # one raising does not lose the rest and a taken engine name is the newcomer's failure.
    for impl in pm.hook.register_adapters.get_hookimpls():
        plugin_name = impl.plugin_name
        dist, version = sources.get(plugin_name, (plugin_name, "unknown"))
        staged: list[EngineAdapter] = []

        def register(adapter: EngineAdapter, _staged: list[EngineAdapter] = staged) -> None:
            _staged.append(adapter)

        try:
            impl.function(**{arg: register for arg in impl.argnames})
            names = [_accept(adapter, registry) for adapter in staged]
            if len(set(names)) != len(names):
                raise ValueError("registered the same engine name twice")
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            fail(plugin_name, dist, exc)
            continue
        for adapter in staged:  # all or nothing per plugin
            entry = AdapterEntry(adapter, plugin_name, dist, version)
            registry.adapters[adapter.name] = entry
            with contextlib.suppress(TypeError):
                _ENTRIES[adapter] = entry
    return registry
