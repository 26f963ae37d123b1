"""Launch readers: what an engine reads from a launch (argv, files, environment), modelled on
the engine's own read path and never taken from the adapter's declared ``native`` dict.

The kit certifies an adapter against the engine, so for the built-in engines it brings its own
readers, written from the engines' code and not from the adapters'. A plugin supplies its reader
as ``KitSupport.parse_launch``; without one, every check that needs to see what the engine reads
is reported ``unverified``, never passed.

- verl: Hydra's override grammar, main_ppo's ``OmegaConf.resolve(config)`` in place, Hydra's
  ``instantiate`` resolving a ``_target_`` section's copy again, then reads that interpolate.
- NeMo RL: Hydra's overrides, then one ``OmegaConf.to_container(resolve=True)``.
- OpenRLHF: the release's argparse parser, rebuilt from its generated surface (every option
  string with its action, type, nargs and choices), so abbreviations, switches and lists parse
  as the release parses them.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import io
from collections.abc import Callable
from typing import Any

from stateset_backend.common.jsonio import flatten
from stateset_backend.contracts.surfaces import surface
from stateset_backend.plan.launch_plan import LaunchPlan

Reader = Callable[[LaunchPlan], dict[str, Any]]


class LaunchUnreadable(ValueError):
    """The engine's own parser would refuse this launch; the message is the parser's."""


def _overrides(plan: LaunchPlan) -> list[str]:
    return [a for a in plan.argv if "=" in a and not a.startswith("-")]


@functools.lru_cache(maxsize=8192)
def _parsed(element: str) -> tuple[str, bool, Any] | str:
    """One override through Hydra's own grammar: (key, deletes, value), or the grammar's
    refusal. Launches repeat most elements, and the parser is the costly part of a read."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        (override,) = OverridesParser.create().parse_overrides(overrides=[element])
    except Exception as exc:  # hydra's grammar errors carry the element
        return str(exc)
    return override.key_or_group, override.is_delete(), override.value()


def _update(tree: dict[str, Any], parts: list[str], value: Any) -> None:
    """``OmegaConf.update(cfg, key, value, merge=True, force_add=True)`` on plain dicts (one
    ``OmegaConf.create`` afterwards instead of one validated update per element): missing
    parents are created, a mapping merges into a mapping, anything else replaces."""
    *parents, last = parts
    for part in parents:
        if not isinstance(tree.get(part), dict):
            tree[part] = {}
        tree = tree[part]
    if isinstance(value, dict) and isinstance(tree.get(last), dict):
        for key, item in value.items():
            _update(tree[last], [key], item)
    else:
        tree[last] = value


def _plain(node: Any) -> bool:
    """Nothing OmegaConf would change: JSON values under string keys, and no ``${`` (an
    interpolation, or its escape) in any key or string."""
    if isinstance(node, dict):
        return all(isinstance(k, str) and "${" not in k and _plain(v) for k, v in node.items())
    if isinstance(node, list):
        return all(_plain(item) for item in node)
    if isinstance(node, str):
        return "${" not in node
    return node is None or isinstance(node, bool | int | float)


def hydra(plan: LaunchPlan, *, in_place_resolves: int) -> dict[str, Any]:
    """Hydra's own override parser, applied to an empty config, resolved in place
    ``in_place_resolves`` times, then read with resolution; a flat mapping of dotted keys.
    A config with nothing to resolve reads as it was built: OmegaConf would hand back the
    same values, at a cost that dominates the kit's reads."""
    tree: dict[str, Any] = {}
    for element in _overrides(plan):
        parsed = _parsed(element)
        if isinstance(parsed, str):
            raise LaunchUnreadable(f"Hydra refuses the overrides: {parsed}")
        key, deletes, value = parsed
        if deletes:
            raise LaunchUnreadable(f"the launch deletes {key} (~)")
        _update(tree, key.split("."), copy.deepcopy(value))
    if _plain(tree):
        return flatten(tree)
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(tree)
    for _ in range(in_place_resolves):
        OmegaConf.resolve(cfg)
    out = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(out, dict)
    return flatten(out)


def verl(plan: LaunchPlan) -> dict[str, Any]:
    return hydra(plan, in_place_resolves=2)


def nemo_rl(plan: LaunchPlan) -> dict[str, Any]:
    return hydra(plan, in_place_resolves=0)


class _Refusal(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse exits; the kit reports instead
        raise _Refusal(message)


_TYPES: dict[str | None, Any] = {"int": int, "float": float, "str": str, None: None}


def argparse_from_surface(options: dict[str, Any]) -> argparse.ArgumentParser:
    """The release's parser as its surface records it: one action per option string, its
    value stored under the option string itself."""
    parser = _Parser(add_help=False, allow_abbrev=True)
    for name, option in options.items():
        action = option["action"]
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS}
        if action in ("store_true", "store_false"):
            kwargs["action"] = action
        else:
            kwargs.update(type=_TYPES.get(option.get("type")), nargs=option.get("nargs"),
                          choices=option.get("choices"))
        parser.add_argument(name, **kwargs)
    return parser


@functools.lru_cache(maxsize=32)
def _openrlhf_parser(version: str) -> argparse.ArgumentParser | None:
    """The release's parser, built once: parsing leaves an argparse parser as it was."""
    doc = surface("openrlhf", version)
    return None if doc is None else argparse_from_surface(doc["options"])


def openrlhf(plan: LaunchPlan) -> dict[str, Any]:
    """The flags after the launched module, parsed by the release's parser; only the options
    the launch sets (a parsed value keyed by the option string)."""
    parser = _openrlhf_parser(plan.engine_version)
    if parser is None:
        raise LaunchUnreadable(f"no OpenRLHF {plan.engine_version} surface is known")
    argv = list(plan.argv)
    start = next((i + 1 for i, a in enumerate(argv) if a.endswith(".py") or
                  a == "openrlhf.cli.train_ppo_ray"), len(argv))
    try:
        parsed, rest = parser.parse_known_args(argv[start:])
    except _Refusal as exc:
        raise LaunchUnreadable(f"OpenRLHF {plan.engine_version}'s parser refuses the launch: "
                               f"{exc}") from None
    if rest:
        raise LaunchUnreadable(f"OpenRLHF {plan.engine_version}'s parser does not know "
                               f"{rest[:3]}")
    return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(parsed).items()}


def native(plan: LaunchPlan) -> dict[str, Any]:
    """The native engine reads its settings file: the spec's settings in its own vocabulary,
    and the execution options beside them."""
    import json

    doc = json.loads(plan.files["native_config.json"])
    return {**doc["settings"], **doc.get("execution", {})}


def _new_keys(node: Any, value: dict[str, Any], at: str) -> list[str]:
    """The keys ``value`` would bring into the config's mapping ``node`` (nested too)."""
    if not isinstance(node, dict):
        return []
    out = []
    for key, item in value.items():
        if key not in node:
            out.append(f"{at}.{key}")
        elif isinstance(item, dict):
            out += _new_keys(node[key], item, f"{at}.{key}")
    return out


def _children(options: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The release's config node at ``key`` as a mapping (its own default, or the tree of the
    options under it), or None where the key holds no mapping."""
    if isinstance(options.get(key, {}).get("default"), dict):
        return dict(options[key]["default"])
    tree: dict[str, Any] = {}
    for name, option in options.items():
        if name.startswith(key + "."):
            default = option.get("default")
            _update(tree, name[len(key) + 1:].split("."),
                    dict(default) if isinstance(default, dict) else None)
    return tree or None


def struct_mode(engine: str, read: Reader) -> Reader:
    """The engine applies a launch's overrides in struct mode (verl composes its config so,
    NeMo RL's ``parse_hydra_overrides`` sets it): a plain ``key={...}`` merges into the
    config's mapping and is refused when it brings a key the mapping lacks; only ``+`` and
    ``++`` add one. The engine would refuse such a launch at start-up, so the kit does now."""

    def reader(plan: LaunchPlan) -> dict[str, Any]:
        options = (surface(engine, plan.engine_version) or {}).get("options", {})
        for element in _overrides(plan) if options else []:
            parsed = _parsed(element)
            if element.startswith(("+", "~")) or isinstance(parsed, str) or \
                    not isinstance(parsed[2], dict):
                continue
            node = _children(options, parsed[0])
            new = [] if node is None else _new_keys(node, parsed[2], parsed[0])
            if new:
                raise LaunchUnreadable(
                    f"{engine} {plan.engine_version} applies overrides in struct mode and "
                    f"refuses {element[:80]!r}: {new[0]} is not in its config (only ++ adds it)")
        return read(plan)

    return reader


BUILTIN: dict[str, Reader] = {"verl": struct_mode("verl", verl),
                              "nemo-rl": struct_mode("nemo-rl", nemo_rl), "openrlhf": openrlhf,
                              "native": native}


def guarded(reader: Reader) -> Reader:
    """A plugin's reader whose engine parser exits (argparse does, on a launch it refuses):
    the exit becomes ``LaunchUnreadable`` with what the parser printed, so the kit reports the
    parser's own words instead of ``SystemExit: 2``."""

    def read(plan: LaunchPlan) -> dict[str, Any]:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                return reader(plan)
        except SystemExit as exc:
            said = err.getvalue().strip().splitlines()
            raise LaunchUnreadable(f"the engine's parser refuses the launch (exit {exc.code}): "
                                   f"{said[-1] if said else exc}") from None

    return read


def reader_for(engine: str, declared: Reader | None) -> Reader | None:
    """The kit's own reader for a built-in engine, else the one the plugin declares."""
    if engine in BUILTIN:
        return BUILTIN[engine]
    return guarded(declared) if declared is not None else None
