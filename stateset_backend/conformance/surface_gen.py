"""Generating an engine release's configuration surface from the release's own code.

``python -m stateset_backend.conformance.surface_gen openrlhf WHEEL... -o DIR`` runs the
``__main__`` block of each OpenRLHF release's ``train_ppo_ray`` (its real argparse parser)
from the wheel, without installing it (OpenRLHF needs CUDA to install), and writes one
surface per release. ``... verl WHEEL...`` (or an installed ``verl/trainer/config`` with
``--version``) composes each release's trainer config with Hydra and records every key;
``... nemo-rl grpo_math_1B.yaml --version V`` loads a NeMo RL tag's example config.
The repo's real-engine tests regenerate them and fail when a shipped surface differs from
its release.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import re
import sys
import types
import zipfile
from datetime import datetime
from pathlib import Path
from typing import Any

from stateset_backend.conformance import quantities
from stateset_backend.contracts import domains

SURFACE_SCHEMA_ID = "stateset-backend/surface/v1"
_ACTIONS = {"_StoreAction": "store", "_StoreTrueAction": "store_true",
            "_StoreFalseAction": "store_false", "_AppendAction": "append",
            "_CountAction": "count", "_StoreConstAction": "store_const"}


class _FixedClock(datetime):
    """A default built from the clock (a run name stamped with the time) is recorded as of
    one fixed instant, so a surface regenerates byte for byte."""

    @classmethod
    def now(cls, tz: Any = None) -> _FixedClock:
        return cls(2000, 1, 1)


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("captured")
        self.parser = parser


def _jsonable(value: Any) -> Any:
    """JSON that strict readers accept: a non-finite default is its name, as contracts
    record it ("inf")."""
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _option(action: argparse.Action) -> dict[str, Any]:
    kind = getattr(action.type, "__name__", None) if action.type is not None else None
    return {"action": _ACTIONS.get(type(action).__name__, type(action).__name__),
            "type": kind if kind in ("int", "float", "str") else None,
            "nargs": action.nargs if action.nargs not in (0,) else None,
            "choices": _jsonable(list(action.choices)) if action.choices else None,
            "default": _jsonable(action.default)}


def openrlhf_main_block(wheel: Path) -> types.CodeType:
    """The ``__main__`` block of a release's ``train_ppo_ray`` (its argparse parser, then the
    release's own post-parse checks, then ``train(args)``), compiled from the wheel without
    installing it. The one pure helper module the hierarchical releases import is put in
    ``sys.modules`` (``openrlhf.utils.config``); the caller restores them if it must."""
    read = wheel_reader(wheel)
    main_source = read("openrlhf/cli/train_ppo_ray.py")
    config_source = read("openrlhf/utils/config.py")
    if main_source is None:
        raise SystemExit(f"{wheel}: no openrlhf/cli/train_ppo_ray.py")
    if config_source is not None:
        for name in ("openrlhf", "openrlhf.utils"):
            package = types.ModuleType(name)
            package.__path__ = []
            sys.modules[name] = package
        config = types.ModuleType("openrlhf.utils.config")
        exec(compile(config_source, "openrlhf/utils/config.py", "exec"), config.__dict__)
        sys.modules["openrlhf.utils.config"] = config
    tree = ast.parse(main_source)
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.dump(n.test))
    return compile(ast.Module(main.body, []), "train_ppo_ray.py", "exec")


def openrlhf_parser(wheel: Path) -> argparse.ArgumentParser:
    """The release's own parser, built by its ``__main__`` block and caught at parse_args."""
    saved = {k: sys.modules.get(k) for k in ("openrlhf", "openrlhf.utils",
                                            "openrlhf.utils.config")}
    original = argparse.ArgumentParser.parse_args
    try:
        code = openrlhf_main_block(wheel)

        def capture(parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
            raise _Captured(parser)

        argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign,assignment]
        namespace = {"__name__": "__main__", "argparse": argparse, "os": os,
                     "datetime": _FixedClock, "train": None}
        try:
            exec(code, namespace)
        except _Captured as got:
            return got.parser
        raise SystemExit(f"{wheel}: the __main__ block never parsed its arguments")
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def wheel_reader(wheel: Path) -> domains.Read:
    """A release file by its package path, from a wheel (a platform wheel keeps its package
    under ``NAME-VERSION.data/purelib/``)."""
    def read(path: str) -> str | None:
        with zipfile.ZipFile(wheel) as archive:
            match = [n for n in archive.namelist()
                     if n == path or n.endswith(".data/purelib/" + path)]
            return archive.read(match[0]).decode() if match else None
    return read


def openrlhf_surface(wheel: Path) -> dict[str, Any]:
    version = re.match(r"openrlhf-([^-]+)-", wheel.name)
    if version is None:
        raise SystemExit(f"{wheel}: not an openrlhf wheel name")
    parser = openrlhf_parser(wheel)
    options = {option: _option(action) for action in parser._actions
               for option in action.option_strings
               if option.startswith("--") and action.dest != "help"}
    return {"schema": SURFACE_SCHEMA_ID, "engine": "openrlhf", "version": version.group(1),
            "source": f"openrlhf=={version.group(1)}: the argparse parser of "
                      "openrlhf/cli/train_ppo_ray.py, built by its own __main__ block; its "
                      "hard-coded numbers measured from its own source "
                      "(conformance/quantities.py)",
            "quantities": quantities.openrlhf_quantities(wheel_reader(wheel)),
            "options": dict(sorted(options.items()))}


def verl_surface(source: Path, version: str | None = None) -> dict[str, Any]:
    """Every key of verl's composed trainer config (``ppo_trainer``, no overrides) with its
    default as Hydra composes it, from a release wheel or an installed ``verl/trainer/config``
    folder. A default that interpolates another key is recorded resolved; one that cannot be
    resolved outside a run (``${oc.env:...}``) is recorded as written."""
    import tempfile

    from hydra import compose, initialize_config_dir

    with tempfile.TemporaryDirectory() as tmp:
        if source.suffix == ".whl":
            match = re.match(r"verl-([^-]+)-", source.name)
            if match is None:
                raise SystemExit(f"{source}: not a verl wheel name")
            version = match.group(1)
            with zipfile.ZipFile(source) as archive:
                for name in archive.namelist():
                    if name.startswith("verl/trainer/config/"):
                        archive.extract(name, tmp)
            config_dir = Path(tmp) / "verl" / "trainer" / "config"
        else:
            config_dir = source
        if version is None:
            raise SystemExit(f"{source}: give --version for a config folder")
        with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base=None):
            cfg = compose(config_name="ppo_trainer")
        options = _leaves(cfg)
        # an installed config folder is verl/trainer/config under the site-packages root
        read = wheel_reader(source) if source.suffix == ".whl" else \
            folder_reader(config_dir.resolve().parents[2])
        for key, values in domains.verl_domains(read, options).items():
            options[key]["values"] = values
        measured = quantities.verl_quantities(read)
    return {"schema": SURFACE_SCHEMA_ID, "engine": "verl", "version": version,
            "source": f"verl=={version}: verl/trainer/config/ppo_trainer composed by Hydra, "
                      "no overrides; each string setting's values from the release's own "
                      "registries and dispatch (contracts/domains.py); its hard-coded numbers "
                      "measured from its own functions (conformance/quantities.py)",
            "quantities": measured, "options": options}


def _leaves(cfg: Any) -> dict[str, Any]:
    """Every leaf of an OmegaConf config with its default: resolved where it interpolates
    another key, as written where only a run can resolve it."""
    from omegaconf import OmegaConf

    raw = OmegaConf.to_container(cfg, resolve=False)
    keys: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else str(key))
            return
        try:
            value = OmegaConf.select(cfg, prefix, throw_on_resolution_failure=True)
            value = OmegaConf.to_container(value, resolve=True) \
                if OmegaConf.is_config(value) else value
        except Exception:  # an interpolation only a run can resolve: kept as written
            value = node
        keys[prefix] = {"default": _jsonable(value)}
        if _jsonable(node) != keys[prefix]["default"]:
            keys[prefix]["written"] = _jsonable(node)

    walk(raw, "")
    return dict(sorted(keys.items()))


def folder_reader(root: Path) -> domains.Read:
    """A release file by its package path, from a source checkout of the release."""
    def read(path: str) -> str | None:
        file = root / path
        return file.read_text(encoding="utf-8") if file.is_file() else None
    return read


def nemo_rl_surface(config: Path, version: str, source: Path | None = None) -> dict[str, Any]:
    """Every key of a NeMo RL release's GRPO example config (``examples/configs/
    grpo_math_1B.yaml`` of its tag; NeMo RL, Apache-2.0), which ``run_grpo.py`` loads and the
    launch's overrides apply to in struct mode; with ``source`` (a checkout of the tag: NeMo RL
    ships no wheel), the numbers its code hard-codes."""
    from omegaconf import OmegaConf

    # run_grpo registers this resolver before it loads the config
    OmegaConf.register_new_resolver("mul", lambda a, b: a * b, replace=True)
    cfg = OmegaConf.load(config)
    doc: dict[str, Any] = {
        "schema": SURFACE_SCHEMA_ID, "engine": "nemo-rl", "version": version,
        "source": f"NeMo RL v{version} (Apache-2.0): examples/configs/{config.name} as "
                  "OmegaConf loads it"}
    options = _leaves(cfg)
    if source is not None:
        doc["source"] += "; each string setting's values and its hard-coded numbers read " \
                         "from the tag's source (contracts/domains.py, " \
                         "conformance/quantities.py)"
        doc["quantities"] = quantities.nemo_rl_quantities(folder_reader(source))
        for key, values in domains.nemo_rl_domains(folder_reader(source), options).items():
            options[key]["values"] = values
    return {**doc, "options": options}


def render(doc: dict[str, Any]) -> str:
    """Reviewable JSON: one line per option, so a release's change reads as a diff."""
    head = {k: v for k, v in doc.items() if k != "options"}
    lines = [f"  {json.dumps(name)}: {json.dumps(option)}"
             for name, option in doc["options"].items()]
    return json.dumps(head, indent=2)[:-2] + ',\n  "options": {\n' + \
        ",\n".join("  " + line for line in lines) + "\n  }\n}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stateset_backend.conformance.surface_gen")
    parser.add_argument("engine", choices=["openrlhf", "verl", "nemo-rl"])
    parser.add_argument("sources", nargs="+", type=Path,
                        help="release wheels (or, for verl, an installed verl/trainer/config)")
    parser.add_argument("--version", help="the release of a config folder (verl)")
    parser.add_argument("--source", type=Path,
                        help="a source checkout of the release (nemo-rl: its hard-coded "
                             "numbers)")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.source is not None and len(args.sources) > 1:
        parser.error("--source is one release's checkout: give one config with it")
    args.output.mkdir(parents=True, exist_ok=True)
    for source in args.sources:
        if args.engine == "openrlhf":
            doc = openrlhf_surface(source)
        elif args.engine == "verl":
            doc = verl_surface(source, args.version)
        else:
            doc = nemo_rl_surface(source, args.version or "", args.source)
        target = args.output / f"{doc['engine']}-{doc['version']}.json"
        target.write_text(render(doc), encoding="utf-8")
        print(f"wrote {target} ({len(doc['options'])} options)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
