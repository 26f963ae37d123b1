"""User strings are data. Hostile values in every string field of a spec and in an
``engine_options`` value keep the launch's shape and read back, through the engine's own
parser, as those values verbatim (never an interpolation resolved, never a new key). What an
``engine_options`` entry may reach is options.py's.
"""

from __future__ import annotations

import ast
import copy
import itertools
import json
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stateset_backend.common.errors import InvalidInput
from stateset_backend.common.jsonio import flatten
from stateset_backend.conformance.checks.options import key_of, plan_with_option
from stateset_backend.conformance.checks.planning import CheckFailed
from stateset_backend.conformance.samples import SampleFiles
from stateset_backend.engines.adapter import EngineAdapter
from stateset_backend.plan.launch_plan import LaunchPlan

# -- user strings are data -------------------------------------------------------------------------
HOSTILE = ("${oc.env:STATESET_PROBE}", "a'b", "--help", "x,y", "k=v", "a b", "\\", "[1]",
           "{a:1}", "ünï", "--lr=1", "+x=1", "~trainer")
STRING_FIELDS = ("name", "model", "prompt", "answer", "lora", "label", "option")
BENIGN = {"name": "benign", "model": "/models/benign", "prompt": "prompt", "answer": "answer",
          "lora": "q_proj", "label": "benign", "option": "benign"}


def hostile_doc(base: dict[str, Any], values: Mapping[str, str], option_key: str | None,
                engine: str, lora: bool) -> dict[str, Any]:
    doc = copy.deepcopy(base)
    doc["name"] = values["name"]
    doc["labels"] = {"team": values["label"]}
    doc["model"] = {**doc["model"], "path": values["model"]}
    doc["model"].pop("revision", None)
    if lora:
        doc["model"]["lora"] = {"rank": 8, "alpha": 16, "target_modules": [values["lora"]]}
    for split in ("train", "validation"):
        if split in doc["data"]:
            doc["data"][split] = {**doc["data"][split], "prompt_field": values["prompt"],
                                  "answer_field": values["answer"]}
    if option_key is not None:  # None: the engine takes no free text through its options
        doc["engine_options"] = {engine: {option_key: values["option"]}}
    return doc


def check_no_free_text_option(adapter: EngineAdapter, version: str, base: dict[str, Any],
                              files: SampleFiles, option_key: str | None) -> None:
    """An engine whose kit support names no free-text option (``option_key`` gives None)
    takes only enumerated ones: a free-text key, with a hostile value, is refused with exit 2,
    never planned (and then ignored, or read as syntax)."""
    if option_key is not None:
        return
    for value in ("benign", rotations()[0]["option"]):
        taken = plan_with_option(adapter, version, base, files, "stateset_conformance_probe", value)
        if not isinstance(taken, InvalidInput):
            raise CheckFailed(f"{adapter.name}'s kit support names no free-text option, but "
                              f"engine_options 'stateset_conformance_probe': {value!r} planned")


def benign_refused(reason: str, option_key: str | None, adapter: EngineAdapter) -> str:
    """The failure of a benign sample that does not plan: the planner's reason, and where the
    kit's own probe key is what it refused, what the author gives instead."""
    if BENIGN["model"] in reason:
        return (f"the benign sample with every string field set does not plan: {reason}; if "
                "that is because no such folder is on this machine: a plan names the model's "
                "folder without opening it (it may be made on another machine than the run, "
                "and the hub checks inputs before a run), so refuse a model path for its text, "
                "not for being absent here (docs/plugins.md)")
    if adapter.kit_support().option_key is not None:
        return f"the benign sample with every string field set does not plan: {reason}"
    return (f"the benign sample with every string field set does not plan: {reason}; the kit "
            f"put its own probe key {option_key!r} in engine_options, as KitSupport names no "
            "option_key: name a free-text key the engine accepts, or give `option_key=lambda "
            "plan: None` when every option it takes is enumerated (docs/plugins.md)")


def rotations() -> list[dict[str, str]]:
    """Each string field gets every hostile value once over the rotations."""
    return [{f: HOSTILE[(i + j) % len(HOSTILE)] for i, f in enumerate(STRING_FIELDS)}
            for j in range(len(HOSTILE))]


def _argv(plan: LaunchPlan) -> list[str]:
    digest = plan.experiment_digest.removeprefix("sha256:")
    return [a.replace(plan.run_id, "<run-id>").replace(digest, "<digest>") for a in plan.argv]


def check_argv_structure(clean: LaunchPlan, hostile: LaunchPlan,
                         values: Mapping[str, str]) -> None:
    """The hostile launch has the clean launch's shape: as many elements, the same flags and
    keys in the same places, no hostile option as an element of its own, and every ``${`` in
    a Hydra-style value escaped."""
    a, b = _argv(clean), _argv(hostile)
    if len(a) != len(b):
        raise CheckFailed(f"hostile values changed the number of argv elements ({len(a)} -> "
                          f"{len(b)}): {sorted(set(b) - set(a))[:5]}")
    for x, y in zip(a, b, strict=True):
        if x == y:
            continue
        kx = key_of(x)
        if kx is not None:
            if y.split("=", 1)[0] != kx:
                raise CheckFailed(f"argv element {x!r} became {y!r}: a key changed")
        elif x.startswith("-"):
            raise CheckFailed(f"the flag {x!r} became {y!r}")
    dashed = {v for v in values.values() if v.startswith("-")}
    for y in b:
        if y in dashed:
            raise CheckFailed(f"a hostile value is an argv element of its own: {y!r}")
        if "=" in y and not y.startswith("-"):
            value = y.split("=", 1)[1]
            if re.search(r"(?<!\\)\$\{", value):
                raise CheckFailed(f"an unescaped interpolation reaches a Hydra override: {y!r}")
    if set(clean.native) != set(hostile.native):
        raise CheckFailed("hostile values changed which native keys the launch sets: "
                          f"{sorted(set(clean.native) ^ set(hostile.native))[:5]}")
    check_no_script_holds_text(clean, hostile, values)


# programs whose ``-c`` argument is code, and the shell scripts a launch may write
_SHELL = re.compile(r"(?:^|/)(?:ba|da|z|k)?sh$")
_PYTHON = re.compile(r"(?:^|/)(?:python[\d.]*|\{python\})$")
_SHELL_SCRIPTS = (".sh", ".bash")


def _code(plan: LaunchPlan) -> dict[str, tuple[str, str]]:
    """{where: (language, code)}: each ``-c`` script of the argv, and each shell script file."""
    out = {}
    argv = plan.argv
    for i, (program, flag) in enumerate(itertools.pairwise(argv)):
        if flag == "-c" and i + 2 < len(argv):
            language = "sh" if _SHELL.search(program) else \
                "python" if _PYTHON.search(program) else None
            if language is not None:
                out[f"the {Path(program).name} -c script (argv {i + 2})"] = (language, argv[i + 2])
    out.update({name: ("sh", text) for name, text in plan.files.items()
                if name.endswith(_SHELL_SCRIPTS)})
    return out


def _python_shape(code: str) -> str | None:
    """The program with every string constant blanked: a user string kept a literal leaves
    it as it was; None when it does not parse."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
    return ast.dump(tree)


def check_no_script_holds_text(clean: LaunchPlan, hostile: LaunchPlan,
                               values: Mapping[str, str]) -> None:
    """A user string in code a launch runs (a shell's or Python's ``-c`` script, a shell
    script among its files) stays data: in Python a literal (the program has the clean
    launch's shape once string constants are blanked), in a shell quoted as ``shlex.quote``
    quotes it. Anywhere else in a script it is syntax: a name holding ``$(...)`` runs it."""
    texts = sorted(v for v in values.values() if len(v) >= 3)
    before = _code(clean)
    for where, (language, code) in _code(hostile).items():
        if language == "python":
            if where in before and _python_shape(code) != _python_shape(before[where][1]):
                raise CheckFailed(f"hostile values changed the program of {where}: a user "
                                  "string must be written into Python as a literal (repr)")
            continue
        for text in texts:
            if text in code.replace(shlex.quote(text), ""):
                raise CheckFailed(f"the user string {text!r} is written into {where} "
                                  "unquoted, where a shell reads it as code: pass it as an "
                                  "argument, or quote it with shlex.quote")


def check_read_back(clean: dict[str, Any], hostile: dict[str, Any],
                    values: Mapping[str, str], base_dir: str | None = None) -> None:
    """What the engine's parser reads from the hostile launch differs from the clean one only
    in values that are, verbatim, hostile values; the model's value may also be joined onto
    the spec's folder, as a relative model path is (the text stays a value, one path below
    that folder). No other field's text may become a location."""
    a, b = flatten(clean), flatten(hostile)
    if a.keys() != b.keys():
        raise CheckFailed(f"the engine's parser reads other keys from the hostile launch: "
                          f"{sorted(a.keys() ^ b.keys())[:5]}")
    allowed = set(values.values())
    if base_dir is not None and "model" in values:
        allowed |= {str(f / values["model"]) for f in (Path(base_dir), Path(base_dir).resolve())}
    for key, got in b.items():
        if PROBE_SECRET in json.dumps(got):
            raise CheckFailed(f"{key}: the engine reads the value of STATESET_PROBE: an "
                              "interpolation in a user string resolved, copying an "
                              "environment variable into the run")
        if got == a[key]:
            continue
        items = got if isinstance(got, list) else [got]
        if not items or not all(isinstance(i, str) and (i in allowed or _safe_name(i))
                                for i in items):
            raise CheckFailed(f"{key}: the engine reads {got!r} (clean launch: {a[key]!r}), "
                              "which is neither a hostile value verbatim nor a name made "
                              "safe (letters, digits, '.', '_', '-')")


# The value the kit gives STATESET_PROBE while it reads launches back: nothing a launch sets
# may ever hold it. Not a safe name itself, so it can never pass as one.
PROBE_SECRET = "kit probe: secret/../value"


def _safe_name(text: str) -> bool:
    """A user's text turned into one path component by the adapter: the engine may use it
    as a folder name (verl's project name) without it choosing a location."""
    return re.fullmatch(r"[A-Za-z0-9._-]+", text) is not None and text not in (".", "..")
