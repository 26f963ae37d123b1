"""How the echo engine reads a launch: its command line and its settings file."""

import argparse
import json


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    for flag in ("--out", "--run-id", "--digest"):
        p.add_argument(flag, required=True)
    p.add_argument("--behaviour", default=None)
    p.add_argument("--updates", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    return p


def read_launch(argv: list, files: dict) -> dict:
    """What this engine takes from a launch: its flags, as its own parser reads them, and
    the settings it records (echo.json)."""
    a = parser().parse_args(argv)
    given = {} if a.behaviour is None else {"behaviour": a.behaviour}
    return {"--updates": a.updates, "seed": a.seed, **given, **json.loads(files["echo.json"])}
