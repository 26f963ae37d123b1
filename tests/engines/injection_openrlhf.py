"""Run openrlhf_parse.py (OpenRLHF's own train_ppo_ray parser from a release wheel) for many
argv lists in one process. Reads a JSON list of {"wheel", "argv"} on stdin; prints a JSON list
on stdout, one entry per job: {"args": <parsed arguments>} or {"exit": <code>, "stdout": ...,
"stderr": ...} when the parser exited (help, an error), plus "dests": groups of option strings
that write the same argument (aliases), as the parser declares them."""

import argparse
import contextlib
import io
import json
import runpy
import sys
from collections import defaultdict
from pathlib import Path

PARSE = str(Path(__file__).with_name("openrlhf_parse.py"))
original_parse_args = argparse.ArgumentParser.parse_args
parsers = []


def recording_parse_args(self, *args, **kwargs):
    parsers.append(self)
    return original_parse_args(self, *args, **kwargs)


argparse.ArgumentParser.parse_args = recording_parse_args
results = []
for job in json.loads(sys.stdin.read()):
    parsers.clear()
    sys.argv = [PARSE, job["wheel"], "--", *job["argv"]]
    out, err = io.StringIO(), io.StringIO()
    entry = {}
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(PARSE, run_name="__main__")
        entry["args"] = json.loads(out.getvalue().strip().splitlines()[-1])
    except SystemExit as exc:
        entry.update({"exit": exc.code, "stdout": out.getvalue()[-2000:],
                      "stderr": err.getvalue()[-2000:]})
    dests = defaultdict(list)
    for parser in parsers[:1]:
        for action in parser._actions:
            dests[action.dest].extend(action.option_strings)
    entry["dests"] = [options for options in dests.values() if len(options) > 1]
    results.append(entry)
print(json.dumps(results, default=str))
