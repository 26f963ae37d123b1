"""Run OpenRLHF's own train_ppo_ray ``__main__`` block (its real argparse parser and its
post-parse checks) from a release wheel, with ``train`` replaced by a recorder, so no GPU
package is needed. Usage: python openrlhf_parse.py WHEEL -- ARGV...; prints the parsed
arguments as JSON (dotted names for the hierarchical releases). With ``--defaults`` instead of
``-- ARGV...`` it prints the parser's own default of every option string, before any
post-parse rule runs: what the release does when a flag is not passed."""

import argparse
import json
import os
import sys
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

from stateset_backend.conformance.surface_gen import openrlhf_main_block

wheel = sys.argv[1]
defaults_only = sys.argv[2:] == ["--defaults"]
argv = [] if defaults_only else sys.argv[sys.argv.index("--") + 1:]
main = openrlhf_main_block(Path(wheel))
captured = {}


def train(args):
    captured["args"] = args


def flatten(ns, prefix=""):
    out = {}
    for key, value in vars(ns).items():
        if isinstance(value, SimpleNamespace):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


class _Stop(Exception):
    pass


if defaults_only:
    def _record_defaults(parser, *args, **kwargs):
        captured["defaults"] = {option: action.default for action in parser._actions
                                for option in action.option_strings
                                if option.startswith("--") and action.dest != "help"}
        raise _Stop

    argparse.ArgumentParser.parse_args = _record_defaults

sys.argv = ["train_ppo_ray.py", *argv]
namespace = {"__name__": "__main__", "argparse": argparse, "os": os, "datetime": datetime,
             "train": train}
try:
    exec(main, namespace)
except _Stop:
    print(json.dumps(captured["defaults"], default=str))
else:
    print(json.dumps(flatten(captured["args"]), default=str))
