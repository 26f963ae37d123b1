"""Run OpenRLHF's own train_ppo_ray ``__main__`` block (its real argparse parser and its
post-parse checks) from a release wheel, with ``train`` replaced by a recorder, so no GPU
package is needed. Usage: python openrlhf_parse.py WHEEL -- ARGV...; prints the parsed
arguments as JSON (dotted names for the hierarchical releases). With ``--defaults`` instead of
``-- ARGV...`` it prints the parser's own default of every option string, before any
post-parse rule runs: what the release does when a flag is not passed.

``python openrlhf_parse.py --batch`` reads a JSON list of ``{"wheel", "argv"}`` (or ``{"wheel",
"defaults": true}``) and prints a JSON list: ``{"result": ...}``, each as above, or ``{"error":
...}`` with what the parser said when it refused. Starting the interpreter is most of a parse's
time; each job loads its wheel's block again, as a run of its own would."""

import argparse
import contextlib
import io
import json
import os
import sys
import traceback
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

from stateset_backend.conformance.surface_gen import openrlhf_main_block


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


def _run(wheel, argv):
    main = openrlhf_main_block(Path(wheel))
    captured = {}
    sys.argv = ["train_ppo_ray.py", *argv]
    namespace = {"__name__": "__main__", "argparse": argparse, "os": os, "datetime": datetime,
                 "train": lambda args: captured.__setitem__("args", args)}
    exec(main, namespace)
    return captured


def parsed(wheel, argv):
    """The arguments the release's parser and post-parse checks hand to ``train``."""
    return flatten(_run(wheel, argv)["args"])


def defaults(wheel):
    """Every option string's default, as the parser holds it before parsing."""
    captured = {}

    def record(parser, *args, **kwargs):
        captured["defaults"] = {option: action.default for action in parser._actions
                                for option in action.option_strings
                                if option.startswith("--") and action.dest != "help"}
        raise _Stop

    real = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = record
    try:
        _run(wheel, [])
    except _Stop:
        return captured["defaults"]
    finally:
        argparse.ArgumentParser.parse_args = real
    raise AssertionError("the parser never parsed")


def _job(job):
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
            return {"result": defaults(job["wheel"]) if job.get("defaults") else
                    parsed(job["wheel"], job["argv"])}
    except SystemExit as exc:  # argparse refusing the argv
        return {"error": f"exit {exc.code}: {said.getvalue()}"}
    except Exception:
        return {"error": said.getvalue() + traceback.format_exc()}


if __name__ == "__main__":
    if sys.argv[1:] == ["--batch"]:
        jobs = json.loads(sys.stdin.read())
        print(json.dumps([_job(job) for job in jobs], default=str))
    elif sys.argv[2:] == ["--defaults"]:
        print(json.dumps(defaults(sys.argv[1]), default=str))
    else:
        print(json.dumps(parsed(sys.argv[1], sys.argv[sys.argv.index("--") + 1:]), default=str))
