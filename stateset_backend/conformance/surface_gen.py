"""Generating an engine release's configuration surface from the release's own code.

``python -m stateset_backend.conformance.surface_gen openrlhf WHEEL... -o DIR`` runs the
``__main__`` block of each OpenRLHF release's ``train_ppo_ray`` (its real argparse parser)
from the wheel, without installing it (OpenRLHF needs CUDA to install), and writes one
surface per release. The repo's real-engine tests regenerate them and fail when a shipped
surface differs from its release.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
import types
import zipfile
from datetime import datetime
from pathlib import Path
from typing import Any

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
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
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


def openrlhf_parser(wheel: Path) -> argparse.ArgumentParser:
    """The release's own parser, built by its ``__main__`` block and caught at parse_args."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()

        def source(suffix: str) -> str | None:
            match = [n for n in names if n.endswith(suffix)]
            return zf.read(match[0]).decode() if match else None

        main_source = source("openrlhf/cli/train_ppo_ray.py")
        config_source = source("openrlhf/utils/config.py")
    if main_source is None:
        raise SystemExit(f"{wheel}: no openrlhf/cli/train_ppo_ray.py")
    saved = {k: sys.modules.get(k) for k in ("openrlhf", "openrlhf.utils",
                                            "openrlhf.utils.config")}
    original = argparse.ArgumentParser.parse_args
    try:
        if config_source is not None:  # the hierarchical releases import one pure helper
            for name in ("openrlhf", "openrlhf.utils"):
                package = types.ModuleType(name)
                package.__path__ = []
                sys.modules[name] = package
            config = types.ModuleType("openrlhf.utils.config")
            exec(compile(config_source, "openrlhf/utils/config.py", "exec"), config.__dict__)
            sys.modules["openrlhf.utils.config"] = config
        tree = ast.parse(main_source)
        main = next(n for n in tree.body
                    if isinstance(n, ast.If) and "__main__" in ast.dump(n.test))

        def capture(parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
            raise _Captured(parser)

        argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign,assignment]
        namespace = {"__name__": "__main__", "argparse": argparse, "os": os,
                     "datetime": _FixedClock, "train": None}
        try:
            exec(compile(ast.Module(main.body, []), "train_ppo_ray.py", "exec"), namespace)
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
                      "openrlhf/cli/train_ppo_ray.py, built by its own __main__ block",
            "options": dict(sorted(options.items()))}


def render(doc: dict[str, Any]) -> str:
    """Reviewable JSON: one line per option, so a release's change reads as a diff."""
    head = {k: v for k, v in doc.items() if k != "options"}
    lines = [f"  {json.dumps(name)}: {json.dumps(option)}"
             for name, option in doc["options"].items()]
    return json.dumps(head, indent=2)[:-2] + ',\n  "options": {\n' + \
        ",\n".join("  " + line for line in lines) + "\n  }\n}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stateset_backend.conformance.surface_gen")
    parser.add_argument("engine", choices=["openrlhf"])
    parser.add_argument("wheels", nargs="+", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    for wheel in args.wheels:
        doc = openrlhf_surface(wheel)
        target = args.output / f"{doc['engine']}-{doc['version']}.json"
        target.write_text(render(doc), encoding="utf-8")
        print(f"wrote {target} ({len(doc['options'])} options)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
