"""Mutated specs, for the fuzz tests and ``benchmarks/fuzz.py``.

Each mutation is what hostile or careless input looks like in practice: a value of the wrong
shape, an integer beyond what canonical JSON carries, strings with control characters or lone
surrogates, deep nesting, unknown keys, a missing required key. Whatever comes in, the hub must
answer with its own error (a documented exit code) or a valid result, never a crash.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import random
import re
import shutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

WEIRD_STRINGS = ["", " ", "\x00", "a\x00b", "\ud800", "${oc.env:HOME}", "--flag", "{run_dir}",
                 "x" * 5000, "é", "\n", "../../etc/passwd", "null", "1e3", "-1", "\\", "'",
                 "s3://u:p@host/x", "file:///tmp/x?token=abc"]
WEIRD_NUMBERS = [0, -1, 1, 2**53, 2**63, -(2**64), 1e308, -1e308, 1e-320, 0.5, 3.0, 1e30,
                 True, False]


def _deep(depth: int) -> Any:
    doc: Any = 0
    for _ in range(depth):
        doc = [doc]
    return doc


def weird_value(rng: random.Random) -> Any:
    kind = rng.randrange(7)
    if kind == 0:
        return rng.choice(WEIRD_STRINGS)
    if kind == 1:
        return rng.choice(WEIRD_NUMBERS)
    if kind == 2:
        return None
    if kind == 3:
        return {rng.choice(["a", "objective", "\x00", "api_key"]): rng.choice(WEIRD_NUMBERS)}
    if kind == 4:
        return [rng.choice(WEIRD_STRINGS), rng.choice(WEIRD_NUMBERS)]
    if kind == 5:
        return _deep(rng.choice([3, 40, 400]))
    return rng.choice(["grpo", "dapo", "ppo", "token_mean", "k3", "hf", "vllm", "float32"])


def same_kind(value: Any, rng: random.Random, depth: int = 0) -> Any:
    """A hostile value of the same JSON type, so validation often accepts it. Deep nesting
    (a mutation of its own) is kept as it is below 32 levels, where the spec refuses it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rng.choice([0, 1, 2, 3, 7, 64, 1000, 2**31, 2**53 - 1, value * 2])
    if isinstance(value, float):
        return rng.choice([0.0, 1e-12, 0.5, 0.999, 1.0, 1.5, 10.0, 1e6, value / 3])
    if isinstance(value, str):
        return value + rng.choice(["${oc.env:HOME}", " --help", "{run_dir}", "'\"", ",x=1",
                                   "é", "\\", " ", "--x=y"])
    if isinstance(value, list) and depth < 32:
        return [same_kind(v, rng, depth + 1) for v in value]
    return value


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield (*prefix, key)
            yield from _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield (*prefix, i)
            yield from _paths(value, (*prefix, i))


def mutate(doc: dict[str, Any], rng: random.Random, steps: int = 3) -> dict[str, Any]:
    """A copy of ``doc`` with a few random mutations."""
    out = copy.deepcopy(doc)
    for _ in range(steps):
        paths = list(_paths(out))
        if not paths:
            break
        path = rng.choice(paths)
        parent: Any = out
        for part in path[:-1]:
            parent = parent[part]
        last = path[-1]
        action = rng.randrange(6)
        if action >= 4:  # same type, hostile value: the mutations that pass validation
            parent[last] = same_kind(parent[last], rng)
        elif action == 0 and isinstance(parent, dict):
            del parent[last]
        elif action == 1 and isinstance(parent, dict):
            parent[rng.choice(["extra", "gruop_size", "tokens", "password"])] = \
                weird_value(rng)
        else:
            parent[last] = weird_value(rng)
    return out


# == hostile input ==============================================================================
# What a careless or hostile user writes into the free-text fields of a spec that still passes
# validation: the interpolation grammar of each engine's config reader, Hydra's and argparse's
# own syntax, path tricks, numbers at the edge of a double, Unicode that rewrites what a reader
# sees, mapping keys Hydra reads as another type, and sizes. ``hostile`` mutates a spec the way
# ``mutate`` does, ``write_spec`` writes it (numbers json.dumps refuses as raw JSON text), and
# ``probe`` runs it through the CLI and names every break of a rule of the project.

INTERPOLATIONS = ["${oc.env:AWS_SECRET_ACCESS_KEY}", "${now:%Y}", "${oc.create:[1]}",
                  "${oc.decode:'1'}", "${x}", "${..a}", "\\${x}", "\\\\${x}", "$${x}", "${", "}",
                  "${oc.env:AWS_SECRET_ACCESS_KEY,dflt}", "${oc.select:x,1}", "${env:HOME}",
                  "${hydra:runtime.cwd}", "\\\\\\${x}", "${x}\\", "a${x}b${y}", "$", "{x}"]
GRAMMAR = ["'", '"', "''", "it's", "a,b", ",", "k=v", "=", "a=b=c", "[1,2]", "[", "]", "{a:1}",
           "{", "}", "~", "~x", "+x", "++x", "@", "x@pkg", "a@b:c", "--help", "-h", "-x",
           "--x=y", "-", "--", "-1", "-.5", "-1e-05", "-inf", " ", "  a  ", " lead", "trail ",
           "a b", "\t", "a\\", "\\", "a\\'b", "\\'", "null", "None", "true", "False", "nan",
           "inf", "1e3", ".5", "0x10", "1_000", "%", "%Y", "%(x)s", "{}", ":", "a:b", "#x",
           "*", "?", "|", ";", "`id`", "$(id)", "&&", ">", "<", "\\n", "/", "//"]
UNICODE = ["\u202e", "ab\u202ecd", "\u200d", "\u200b", "\u2066x\u2069", "e\u0301", "A\u030a",
           "\u212b", "\u00c5", "\ufb01", "\uff54\uff52\uff55\uff45", "\U0001f600",
           "\U0001f468\u200d\U0001f469\u200d\U0001f467", "\u2028", "\u2029", "a\u2028b",
           "\ufeff", "\ufeffx", "\u0085", "\u009b31m", "\u00a0", "\u3000", "\u05d0\u05d1",
           "\u0627\u0644", "\u1100\u1161", "z\u0335\u0336", "\U000e0041", "\ufffd", "\ufdd0"]
NON_NFC = ["e\u0301", "A\u030a", "\u212b", "\u1100\u1161", "\u0041\u0308"]
# Number literals as JSON text: json.dumps refuses inf and writes others in one way only.
RAW_NUMBERS = ["1e400", "-1e400", "1e-400", "-0.0", "-0", "5e-324", "4.9e-324",
               "2.2250738585072014e-308", "1.7976931348623157e308",
               "-1.7976931348623157e308", "9007199254740991", "9007199254740992",
               "-9007199254740993", "18446744073709551616", "1" + "0" * 40, "1" + "0" * 5000,
               "0.1e1", "1E2", "0e0", "1.0000000000000002", "123456789012345678901234567890.5",
               "1e-7", "2e9", "-2147483649", "4294967296", "1e16", "0.30000000000000004"]
HOSTILE_KEYS = ["true", "True", "TRUE", "false", "nan", "NaN", "inf", "Inf", "-inf", "null",
                "NULL", "None", "none", "1", "1e3", "a b", "a=b", "${x}", "a:b", "a.b", "", "~",
                "+x", "@", "infinity", "tRuE", "\uff54\uff52\uff55\uff45", "e\u0301", "_", "-"]
STRING_OPTIONS = {"verl": ["trainer.validation_data_dir", "trainer.rollout_data_dir"],
                  "nemo-rl": ["logger.wandb.project", "logger.wandb.group"],
                  "openrlhf": ["--logger.wandb.project", "--logger.wandb.group",
                               "--logger.wandb.org", "--data.input_template"]}
OPTION_KEYS = {"verl": ["+trainer.foo", "++trainer.foo", "~trainer.foo", "trainer.foo",
                        "trainer.val_before_train", "trainer.log_val_generations",
                        "actor_rollout_ref.rollout.gpu_memory_utilization", "trainer.${x}",
                        "a=b", "a b", "--help", "trainer", "+trainer.foo.bar", "x@pkg", "",
                        "trainer.project_name", "+trainer.\u00e9"],
               "nemo-rl": ["logger.wandb.project", "+logger.foo", "++logger.foo",
                           "policy.generation.vllm_cfg.gpu_memory_utilization",
                           "logger.wandb_enabled", "cluster.foo", "+a.b.c", "~logger.x",
                           "logger", "x=y", "${x}", "--config"],
               "openrlhf": ["--ds.packing_samples", "--vllm.enforce_eager",
                            "--actor.muon.no_nesterov", "--algo.advantage.is_correction_threshold",
                            "--logger.wandb.project", "--unknown.flag", "--help", "-h",
                            "logger.wandb.project", "--logger.wandb.project=x", "--ds",
                            "--logger", "--vllm.gpu_memory_utilization", "--train.seed",
                            "--eval.temperature", "--ds.lora.target_modules", "--logger.wandb.key"],
               "native": ["anything", "${x}", "--help"]}
# Fields a user types free text into; the string mutations land on them most of the time.
FREE_TEXT = re.compile(r"^(name|labels\..*|model\.path|model\.lora\.target_modules\.\d+|"
                       r"data\.(train|validation|test)\.(uri|prompt_field|answer_field)|"
                       r"(reward|environment)\.entrypoint|engine_options\..*)$")
PATH_FIELDS = re.compile(r"^(model\.path|data\.(train|validation|test)\.uri|"
                         r"(reward|environment)\.entrypoint)$")
# Bases that plan on the real engines, under examples/: the specs are written beside them in a
# copy of that folder, so their relative paths resolve and the mutations reach the adapters.
HOSTILE_BASES = ["support-routing.json", "support-agent.json", "external/grpo.json",
                 "external/dapo.json", "external/cispo.json", "external/support-agent.json",
                 "recipes/openrlhf-ppo.json", "recipes/nemo-rl-grpo_math_1B.json",
                 "recipes/verl-dapo-qwen2.5-32b.json", "recipes/verl-grpo-qwen2-7b-math.json"]
EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"
ENGINE_RELEASES = (("native", "0.1.0"), ("verl", "0.9.1"), ("openrlhf", "0.11.2"),
                   ("nemo-rl", "0.7.0"))
SECRET_NAME = "AWS_SECRET_ACCESS_KEY"
SECRET_PROBE = "PROBE-SECRET-d41d8cd9"


class Raw:
    """A number written into the spec file as this exact JSON text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Raw({self.text!r})"


def _surface(engine: str, version: str) -> dict[str, Any]:
    path = resources.files("stateset_backend.contracts").joinpath("surfaces",
                                                                  f"{engine}-{version}.json")
    return json.loads(path.read_text(encoding="utf-8"))["options"]


_SURFACES: dict[str, dict[str, Any]] = {}


def surface(engine: str) -> dict[str, Any]:
    version = dict(ENGINE_RELEASES)[engine]
    if engine not in _SURFACES:
        _SURFACES[engine] = _surface(engine, version)
    return _SURFACES[engine]


def _leaves(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _leaves(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _leaves(value, (*prefix, i))
    else:
        yield prefix, doc


def _dotted(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path)


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for part in path[:-1]:
        doc = doc[part]
    doc[path[-1]] = value


def _splice(original: str, token: str, rng: random.Random) -> str:
    where = rng.randrange(5)
    if where == 0 or not original:
        return token
    if where == 1:
        return token + original
    if where == 2:
        return original + token
    if where == 3:
        cut = rng.randrange(len(original) + 1)
        return original[:cut] + token + original[cut:]
    return token.join([original[: len(original) // 2], original[len(original) // 2:]]) + token


def hostile_string(rng: random.Random) -> str:
    pool = rng.choice([INTERPOLATIONS, INTERPOLATIONS, GRAMMAR, GRAMMAR, UNICODE, NON_NFC])
    text = rng.choice(pool)
    if rng.random() < 0.25:  # two classes at once
        text = _splice(text, rng.choice(rng.choice([INTERPOLATIONS, GRAMMAR, UNICODE])), rng)
    return text


def path_variants(original: str, here: Path | None) -> list[str]:
    """Path tricks, relative to the spec's folder ``here`` (the workspace makes ``loop``,
    ``loopa``/``loopb``, ``link`` -> ``.`` and ``afile`` there)."""
    base = original or "x"
    out = ["../../x", "/etc/passwd", "~", "~/x", "~root/x", "file:///etc/passwd", "file://",
           f"file://{base}", "file:" + base, "a" * 256 + "/x", "/".join(["d" * 200] * 21),
           base + "\n", base.replace("/", "/\n", 1), base + "\t", "\t" + base, base + "/",
           base + "/.", "./" + base, "link/" + base, "link/link/" + base,
           base.replace("/", "//"), base.replace("/", "/./"), "spec.json/x.parquet",
           "afile/x.parquet", "loop/x.parquet", "loop", "loopa/x", ".", "..", "./", "../",
           "/", "", " ", " " + base, base + " ", "-", "--help", "-rf", "/dev/null",
           "/dev/zero", "/proc/self/environ", "/dev/stdin", "C:\\x", "\\\\srv\\share\\x",
           "s3://bucket/x", "hf://ds/x", "http://host/x", "builtin:../../x", "builtin:",
           base + "\u202e", "\u202e" + base, base.replace(".", "\u2024"), base + "\x85",
           "data/train.parquet/..", base + "${x}", "${oc.env:AWS_SECRET_ACCESS_KEY}/" + base,
           "a/" + "b/" * 3000 + "c", "é" * 128 + "/x", "\ufeff" + base]
    if here is not None:
        out += [f"{here}/{base}", f"file://{here}/{base}", f"{here}//{base}",
                f"{here}/../{here.name}/{base}", f"{here}/spec.json/x.parquet"]
    return out


def _numbers(rng: random.Random) -> Any:
    return Raw(rng.choice(RAW_NUMBERS)) if rng.random() < 0.7 else \
        rng.choice([0, -1, 2**53 - 1, -(2**53) + 1, 1e308, 5e-324, -0.0, 0.5, 1, True, False])


def hostile_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(10)
    if kind <= 3:
        return hostile_string(rng)
    if kind == 4:
        return _numbers(rng)
    if kind == 5:
        return rng.choice([None, True, False, "yes", "no", "1", "0", "on", "off", "", []])
    if kind == 6 and depth < 3:
        return [hostile_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == 7 and depth < 3:
        return {rng.choice(HOSTILE_KEYS): hostile_value(rng, depth + 1)
                for _ in range(rng.randint(1, 2))}
    if kind == 8:
        return rng.choice(["x", "q_proj", "all-linear", "/tmp/x", "a.b", 0.9, 3, "k1"])
    return rng.choice(GRAMMAR)


def _nested(depth: int, leaf: Any, key: str = "a") -> Any:
    doc = leaf
    for _ in range(depth):
        doc = {key: doc}
    return doc


# -- the mutations -----------------------------------------------------------------------------
def _m_string(doc: dict[str, Any], rng: random.Random, here: Path | None) -> None:
    """A hostile token in a string field, free-text fields most of the time."""
    strings = [(p, v) for p, v in _leaves(doc) if isinstance(v, str)]
    if not strings:
        return
    free = [(p, v) for p, v in strings if FREE_TEXT.match(_dotted(p))]
    path, value = rng.choice(free if free and rng.random() < 0.85 else strings)
    _set(doc, path, _splice(value, hostile_string(rng), rng))


def _m_path(doc: dict[str, Any], rng: random.Random, here: Path | None) -> None:
    """A path trick in model.path, a data uri or the file part of an entrypoint."""
    fields = [(p, v) for p, v in _leaves(doc)
              if isinstance(v, str) and PATH_FIELDS.match(_dotted(p))]
    if not fields:
        return
    path, value = rng.choice(fields)
    entry = path[-1] == "entrypoint" and ":" in value
    file_part, _, func = value.rpartition(":") if entry else (value, "", "")
    new = rng.choice(path_variants(file_part, here))
    if entry:
        func = func if rng.random() < 0.8 else rng.choice(
            ["", "sc ore", "score\n", "a:b", "${x}", "__import__", "score.x", "1x", "\u00e9"])
        new = f"{new}:{func}"
    _set(doc, path, new)


def _m_option(doc: dict[str, Any], rng: random.Random, here: Path | None) -> None:
    """An engine_options entry: a known string option carrying a hostile string, a key from
    the engine's surface or a hostile key, given a value of any type."""
    engine = rng.choice(["verl", "verl", "nemo-rl", "nemo-rl", "openrlhf", "openrlhf", "native"])
    options = doc.setdefault("engine_options", {})
    if not isinstance(options, dict):
        return
    mine = options.setdefault(engine, {})
    if not isinstance(mine, dict):
        return
    roll = rng.random()
    if roll < 0.45 and engine in STRING_OPTIONS:
        mine[rng.choice(STRING_OPTIONS[engine])] = hostile_string(rng)
    elif roll < 0.7 and engine in ("openrlhf", "verl"):
        name = rng.choice(sorted(surface(engine)))
        mine[name] = hostile_value(rng)
    else:
        mine[rng.choice(OPTION_KEYS[engine])] = hostile_value(rng)


def _m_dict_keys(doc: dict[str, Any], rng: random.Random, here: Path | None) -> None:
    """Mapping keys Hydra reads as booleans, floats or null, nested under an added key."""
    engine = rng.choice(["verl", "nemo-rl"])
    options = doc.setdefault("engine_options", {})
    if isinstance(options, dict) and isinstance(options.setdefault(engine, {}), dict):
        key = rng.choice(["actor_rollout_ref.model.override_config",
                          "actor_rollout_ref.rollout.engine_kwargs.vllm",
                          "policy.hf_config_overrides", "policy.generation.vllm_kwargs",
                          "+trainer.foo", "++trainer.bar", "+x", "trainer.foo"])
        value: Any = {rng.choice(HOSTILE_KEYS): hostile_value(rng)}
        if rng.random() < 0.3:
            value = {"ok": value}
        options[engine][key] = value


def _m_openrlhf_switch(doc: dict[str, Any], rng: random.Random, here: Path | None) -> None:
    """An OpenRLHF switch (store_true/store_false) or a typed option given the wrong type."""
    options = doc.setdefault("engine_options", {})
    if not isinstance(options, dict) or not isinstance(options.setdefault("openrlhf", {}), dict):
        return
    known = surface("openrlhf")
    switches = sorted(k for k, v in known.items() if v["action"] != "store")
    typed = sorted(k for k, v in known.items() if v["action"] == "store")
    name = rng.choice(switches if rng.random() < 0.5 else typed)
    options["openrlhf"][name] = rng.choice(
        ["yes", "no", "true", "false", "True", "", "1", "0", 1, 0, 1.0, None, [], {}, [True],
         True, False, Raw("1e400"), Raw("-0.0"), Raw("5e-324"), "--help", "-h", "-1e-05",
         [-1e-05, 0.5], [Raw("-1e-05"), Raw("1e-400")], ["-x"], ["a b", "--c"], "a=b",
         hostile_string(rng), hostile_value(rng)])


def _m_number(doc: dict[str, Any], rng: random.Random, here: Path | None) -> None:
    """A number literal at the edge of a double, in a numeric field, a label or an option."""
    numbers = [p for p, v in _leaves(doc)
               if isinstance(v, int | float) and not isinstance(v, bool)]
    roll = rng.random()
    if numbers and roll < 0.6:
        _set(doc, rng.choice(numbers), Raw(rng.choice(RAW_NUMBERS)))
    elif roll < 0.75:
        labels = doc.setdefault("labels", {})
        if isinstance(labels, dict):
            labels[rng.choice(["n", "1e400", "x"])] = rng.choice(
                [Raw(rng.choice(RAW_NUMBERS)), rng.choice(RAW_NUMBERS)])
    else:
        engine = rng.choice(["verl", "nemo-rl", "openrlhf"])
        options = doc.setdefault("engine_options", {})
        if isinstance(options, dict) and isinstance(options.setdefault(engine, {}), dict):
            key = rng.choice({"verl": ["+trainer.fuzz_n", "trainer.log_val_generations",
                                       "actor_rollout_ref.rollout.gpu_memory_utilization"],
                              "nemo-rl": ["+logger.fuzz_n",
                                          "policy.generation.vllm_cfg.gpu_memory_utilization"],
                              "openrlhf": ["--vllm.gpu_memory_utilization", "--train.seed",
                                           "--algo.advantage.is_correction_threshold",
                                           "--eval.temperature"]}[engine])
            value = Raw(rng.choice(RAW_NUMBERS))
            options[engine][key] = [value, Raw(rng.choice(RAW_NUMBERS))] \
                if rng.random() < 0.2 else value


def _m_unicode(doc: dict[str, Any], rng: random.Random, here: Path | None) -> None:
    """Unicode that changes what a reader sees or compares, in any string or label key."""
    strings = [(p, v) for p, v in _leaves(doc) if isinstance(v, str)]
    if rng.random() < 0.2:
        labels = doc.setdefault("labels", {})
        if isinstance(labels, dict):  # keys equal under NFC, distinct as code points
            labels["\u00e9"], labels["e\u0301"] = "nfc", "nfd"
        return
    if strings:
        path, value = rng.choice(strings)
        _set(doc, path, _splice(value, rng.choice(UNICODE + NON_NFC), rng))


def _m_size(doc: dict[str, Any], rng: random.Random, here: Path | None) -> None:
    """Very long strings, many labels, long lists and nesting near the 32-level limit."""
    kind = rng.randrange(7)
    if kind == 0:
        doc["name"] = rng.choice(["x", "\u00e9", "${x}", "'"]) * 100_000
    elif kind == 1:
        doc.setdefault("labels", {})["big"] = "y" * 100_000 if rng.random() < 0.7 else \
            "${x}" * 25_000
    elif kind == 2:
        doc["labels"] = {f"k{i}": f"v{i}" for i in range(rng.choice([1000, 10_000]))}
    elif kind == 3:
        doc.setdefault("labels", {})["k" * rng.choice([255, 256, 5000])] = "v"
    elif kind == 4:
        model = doc.get("model")
        if isinstance(model, dict):
            model["lora"] = {"rank": 8, "alpha": 16, "target_modules": [
                f"m{i}" for i in range(rng.choice([1000, 20_000]))]}
    else:  # engine_options.E.KEY is 3 levels: the value nests up to the limit and past it
        engine = rng.choice(["verl", "nemo-rl", "openrlhf"])
        key = {"verl": "actor_rollout_ref.model.override_config",
               "nemo-rl": "policy.hf_config_overrides",
               "openrlhf": "--logger.wandb.project"}[engine]
        depth = rng.choice([26, 28, 29, 30, 31, 32])
        doc.setdefault("engine_options", {}).setdefault(engine, {})[key] = \
            _nested(depth, rng.choice([1, "x", [], {}]), rng.choice(["a", "true", "x_y"]))


def _m_ensure(doc: dict[str, Any], rng: random.Random, here: Path | None) -> None:
    """Adds the free-text fields a base lacks (lora, labels, a string option per engine), so the
    string mutations can land on them; the values are hostile already."""
    model = doc.get("model")
    kind = rng.randrange(3)
    if kind == 0 and isinstance(model, dict):
        model.setdefault("lora", {"rank": 8, "alpha": 16, "target_modules": ["q_proj"]})
        lora = model["lora"]
        if isinstance(lora, dict) and isinstance(lora.get("target_modules"), list):
            lora["target_modules"].append(hostile_string(rng))
    elif kind == 1:
        labels = doc.setdefault("labels", {})
        if isinstance(labels, dict):
            labels[rng.choice(["team", "note", hostile_string(rng)])] = hostile_string(rng)
    else:
        options = doc.setdefault("engine_options", {})
        if isinstance(options, dict):
            for engine, names in STRING_OPTIONS.items():
                mine = options.setdefault(engine, {})
                if isinstance(mine, dict):
                    mine[names[0]] = hostile_string(rng)


# Keys outside an engine's own configuration: Hydra's namespace (it steers the launcher), edit
# prefixes, instantiate's instructions, environment variables, abbreviated and short flags.
NAMESPACE_KEYS = {"verl": ["hydra.run.dir", "hydra.job.chdir", "hydra.output_subdir",
                           "hydra.searchpath", "hydra.job_logging.handlers.file.filename",
                           "hydra.sweep.dir", "hydra", "+hydra.run.dir", "++hydra.job.chdir",
                           "~hydra.output_subdir", "actor_rollout_ref.actor._target_",
                           "trainer._partial_", "LD_PRELOAD", "PYTHONPATH", "HYDRA_FULL_ERROR",
                           "+trainer.total_epochs", "~trainer.logger"],
                  "nemo-rl": ["hydra.run.dir", "hydra.searchpath", "+hydra.job.chdir",
                              "policy._target_", "CUDA_VISIBLE_DEVICES", "+logger.foo",
                              "~logger.wandb"],
                  "openrlhf": ["--logger.wandb.proj", "--vllm.gpu_memory", "--ds.pack",
                               "-h", "--hydra.run.dir", "LD_PRELOAD", "hydra.run.dir"],
                  "native": ["hydra.run.dir", "+x", "LD_PRELOAD", "_target_"]}
HYDRA_NAMESPACE = re.compile(r"^[+~]*hydra(\.|=|$)", re.IGNORECASE)
# Traps make_workspace puts beside each base: what a split, reward, environment or model path
# may name that is not a regular file.
SPECIAL_FILES = ["fifo.jsonl", "zero.jsonl", "sock.jsonl", "adir.jsonl", "fifo.py", "zero.py",
                 "fifo.parquet", "zero.json"]
SPECIAL_MODEL = "fifomodel"


def _m_namespace(doc: dict[str, Any], rng: random.Random, here: Path | None) -> None:
    """An engine_options key outside the engine's own configuration."""
    engine = rng.choice(sorted(NAMESPACE_KEYS))
    options = doc.setdefault("engine_options", {})
    if isinstance(options, dict) and isinstance(options.setdefault(engine, {}), dict):
        options[engine][rng.choice(NAMESPACE_KEYS[engine])] = rng.choice(
            ["/tmp/stateset-fuzz", True, ["file:///tmp"], "x", 1])


def _m_special_file(doc: dict[str, Any], rng: random.Random, here: Path | None) -> None:
    """A split, reward, environment or model path naming a FIFO, a device, a socket or a
    folder (or a model folder holding a FIFO)."""
    fields = [(p, v) for p, v in _leaves(doc)
              if isinstance(v, str) and PATH_FIELDS.match(_dotted(p))]
    if not fields:
        return
    path, value = rng.choice(fields)
    if path[-1] == "path":
        _set(doc, path, SPECIAL_MODEL)
        return
    trap = rng.choice(SPECIAL_FILES)
    if here is not None and rng.random() < 0.3:
        trap = f"{here}/{trap}"
    _set(doc, path, f"{trap}:{value.rpartition(':')[2]}" if path[-1] == "entrypoint" else trap)


HOSTILE_MUTATIONS = {"string": (_m_string, 6), "path": (_m_path, 3), "option": (_m_option, 4),
                     "dict_keys": (_m_dict_keys, 2), "openrlhf_switch": (_m_openrlhf_switch, 2),
                     "number": (_m_number, 3), "unicode": (_m_unicode, 3), "size": (_m_size, 1),
                     "ensure": (_m_ensure, 3), "namespace": (_m_namespace, 3),
                     "special_file": (_m_special_file, 3)}


def hostile(doc: dict[str, Any], rng: random.Random, steps: int = 2,
            here: Path | None = None) -> tuple[dict[str, Any], list[str]]:
    """A copy of ``doc`` with ``steps`` hostile mutations, and their names. ``here``: the folder
    the spec is written to (absolute-path tricks name files there)."""
    out = copy.deepcopy(doc)
    names = list(HOSTILE_MUTATIONS)
    weights = [HOSTILE_MUTATIONS[n][1] for n in names]
    applied = []
    for _ in range(steps):
        name = rng.choices(names, weights)[0]
        HOSTILE_MUTATIONS[name][0](out, rng, here)
        applied.append(name)
    return out, applied


# -- writing and the workspace -----------------------------------------------------------------
def dumps(doc: Any, ensure_ascii: bool = True) -> str:
    """JSON text of ``doc``, with every ``Raw`` written as its own literal text."""
    raws: list[str] = []

    def swap(x: Any, depth: int = 0) -> Any:
        if isinstance(x, Raw):
            raws.append(x.text)
            return f"@@stateset-raw-{len(raws) - 1}@@"
        if depth > 64:  # the mutations put no Raw this deep
            return x
        if isinstance(x, dict):
            return {k: swap(v, depth + 1) for k, v in x.items()}
        if isinstance(x, list):
            return [swap(v, depth + 1) for v in x]
        return x

    text = json.dumps(swap(doc), ensure_ascii=ensure_ascii)
    for i, raw in enumerate(raws):
        text = text.replace(f'"@@stateset-raw-{i}@@"', raw, 1)
    return text


def write_spec(path: Path, doc: Any, rng: random.Random) -> bytes:
    """Writes the spec as UTF-8 (escaped ASCII half the time, a BOM now and then); returns
    the bytes written."""
    try:
        data = dumps(doc, ensure_ascii=rng.random() < 0.5).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: only the escaped form can hold it
        data = dumps(doc, ensure_ascii=True).encode("utf-8")
    if rng.random() < 0.02:
        data = b"\xef\xbb\xbf" + data
    path.write_bytes(data)
    return data


def make_workspace(root: Path) -> Path:
    """A copy of examples/ (its data, rewards and environments) with path traps beside each
    base: ``loop`` (a link to itself), ``loopa``/``loopb`` (links to each other), ``link``
    (to its own folder) and ``afile`` (a regular file, for paths through a file)."""
    shutil.copytree(EXAMPLES_DIR, root, ignore=shutil.ignore_patterns("plugins", "*.local.json",
                                                                      "__pycache__"),
                    dirs_exist_ok=True)
    for folder in {(root / base).parent for base in HOSTILE_BASES}:
        for name, target in (("loop", "loop"), ("loopa", "loopb"), ("loopb", "loopa"),
                             ("link", ".")):
            with contextlib.suppress(FileExistsError):
                (folder / name).symlink_to(target)
        (folder / "afile").write_text("x")
        _special_files(folder)
    return root


def _special_files(folder: Path) -> None:
    """SPECIAL_FILES and SPECIAL_MODEL in ``folder``."""
    import socket

    for name in SPECIAL_FILES:
        path = folder / name
        if path.exists() or path.is_symlink():
            continue
        if name.startswith("fifo"):
            os.mkfifo(path)
        elif name.startswith("zero"):
            path.symlink_to("/dev/zero")
        elif name.startswith("sock"):
            server = socket.socket(socket.AF_UNIX)
            with contextlib.suppress(OSError):  # a path too long for a socket address
                server.bind(str(path))
            server.close()
        else:
            path.mkdir()
    model = folder / SPECIAL_MODEL
    if not model.exists():
        model.mkdir()
        (model / "config.json").write_text("{}")
        os.mkfifo(model / "model.safetensors")


def load_bases(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(folder the spec is written to, the base spec) for every hostile base."""
    return [((root / base).parent, json.loads((root / base).read_text(encoding="utf-8")))
            for base in HOSTILE_BASES]


# -- running it, and the rules it must keep ----------------------------------------------------
class Hung(BaseException):
    """A command that did not return within HANG_SECONDS: it blocked on a file or read one
    that never ends."""


HANG_SECONDS = 60


def _hung(signum: int, frame: Any) -> None:
    raise Hung(f"no answer within {HANG_SECONDS} s")


def run_cli(*args: str) -> tuple[int | None, str, str, str | None]:
    """(exit code, stdout, stderr, exception escaping main or None), main() in process, under
    an alarm so that a command that would block forever is reported, not waited on."""
    from stateset_backend.cli import main

    out, err = io.StringIO(), io.StringIO()
    escaped = None
    code: int | None = None
    previous = signal.signal(signal.SIGALRM, _hung)
    signal.alarm(HANG_SECONDS)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except BaseException as exc:
            escaped = f"{type(exc).__name__}: {exc}"[:2000]
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
    return code, out.getvalue(), err.getvalue(), escaped


_C1 = re.compile(r"[\x80-\x9f]")
_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's own test for a negative number
_INTERPOLATION = re.compile(r"(\\*)\$\{")


def unescaped_interpolations(text: str) -> bool:
    """Whether OmegaConf would read an interpolation in ``text``: a '${' after an even number
    of backslashes."""
    return any(len(m.group(1)) % 2 == 0 for m in _INTERPOLATION.finditer(text))


# The rules of the project a probe checks; other findings are counted, not failures.
RULES = frozenset({"escaped", "exit_code", "validate_code", "digest_code", "adapter_bug",
                   "multiline", "verl_interpolation", "nemo-rl_interpolation",
                   "hydra_unparsable", "hydra_resolve", "secret_resolved", "readback",
                   "openrlhf_argv", "openrlhf_argparse", "openrlhf_readback", "hang",
                   "special_file_accepted", "hydra_namespace", "edit_prefix_option"})


@dataclass
class Probe:
    codes: list[tuple[str, int | None]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    valid: bool = False
    plans_ok: list[str] = field(default_factory=list)

    def add(self, kind: str, command: list[str], **detail: Any) -> None:
        self.findings.append({"kind": kind, "command": command, **detail})

    @property
    def broken(self) -> list[dict[str, Any]]:
        """The findings that break a rule of the project."""
        return [f for f in self.findings if f["kind"] in RULES]


def _error_kind(out: str) -> str | None:
    try:
        doc = json.loads(out)
    except ValueError:
        return None
    return doc.get("error", {}).get("kind") if isinstance(doc, dict) else None


def _call(probe: Probe, *args: str, valid: bool) -> tuple[int | None, str, str]:
    code, out, err, escaped = run_cli(*args)
    command = list(args)
    name = f"plan:{args[args.index('--engine') + 1]}" if args[0] == "plan" else args[0]
    probe.codes.append((name, code))
    if escaped is not None:
        probe.add("hang" if escaped.startswith("Hung:") else "escaped", command,
                  exception=escaped, stderr=err[-2000:])
        return code, out, err
    if code not in (0, 2, 3):
        probe.add("exit_code", command, code=code, stderr=err[-2000:])
    if code != 0:
        lines = err.splitlines()
        if err.count("\n") != 1 or not err.endswith("\n") or len(lines) != 1:
            probe.add("multiline", command, code=code, newlines=err.count("\n"),
                      splitlines=len(lines), stderr=err[:2000])
        if valid and (_error_kind(out) == "adapter_bug" or
                      re.search(r"\bthe [\w-]+ adapter\b", err)):
            probe.add("adapter_bug", command, code=code, stderr=err[:2000])
    elif err.strip():
        probe.add("stderr_on_success", command, stderr=err[:2000])
    if _C1.search(err):  # counted, not a rule: a terminal may act on them (U+009B is CSI)
        probe.add("c1_control_in_stderr", command, stderr=err[:2000])
    return code, out, err


def _hydra_checks(probe: Probe, command: list[str], engine: str, argv: list[str],
                  spec_doc: Any) -> None:
    """Every override of a Hydra engine parses with Hydra's own parser, and each
    engine_options value reads back through Hydra and OmegaConf as the spec's value with no
    resolver run (a probe secret in the environment)."""
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from omegaconf import OmegaConf
    except ImportError:
        return
    start = argv.index("--config") + 2 if "--config" in argv else 3
    parser = OverridesParser.create()
    parsed = {}
    for element in argv[start:]:
        if len(element) > 4000:  # Hydra's parser takes quadratic time: the long ones unread
            continue
        try:
            override = parser.parse_override(element)
        except Exception as exc:
            probe.add("hydra_unparsable", command, element=element[:500],
                      error=str(exc).splitlines()[0][:300])
            continue
        parsed[element.split("=", 1)[0]] = override
    options = spec_doc.get("engine_options", {}).get(engine, {}) \
        if isinstance(spec_doc, dict) else {}
    old = os.environ.get(SECRET_NAME)
    os.environ[SECRET_NAME] = SECRET_PROBE
    try:
        keys = [k for k in parsed if not k.startswith("~")]
        try:  # every value resolves, and to no secret: all at once, one by one on an error
            whole = OmegaConf.to_container(OmegaConf.create(
                {f"k{i}": parsed[k].value() for i, k in enumerate(keys)}), resolve=True)
            keys = [] if SECRET_PROBE not in repr(whole) else keys
        except Exception:
            pass
        for key in keys:
            override = parsed[key]
            try:
                cfg = OmegaConf.create({"k": None})
                cfg.k = override.value()
                got = OmegaConf.to_container(cfg, resolve=True)["k"]
            except Exception as exc:
                probe.add("hydra_resolve", command, override=key,
                          error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                continue
            if SECRET_PROBE in repr(got):
                probe.add("secret_resolved", command, override=key)
        for key, expected in options.items() if isinstance(options, dict) else ():
            override = parsed.get(key)
            if override is None or key.startswith("~"):
                continue
            try:
                cfg = OmegaConf.create({"k": None})
                cfg.k = override.value()
                got = OmegaConf.to_container(cfg, resolve=True)["k"]
            except Exception as exc:
                got = f"<{type(exc).__name__}: {str(exc).splitlines()[0][:200]}>"
            if not _same(got, expected):
                probe.add("readback", command, option=key, expected=repr(expected)[:300],
                          got=repr(got)[:300])
    finally:
        if old is None:
            os.environ.pop(SECRET_NAME, None)
        else:
            os.environ[SECRET_NAME] = old


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise argparse.ArgumentError(None, message)

    def exit(self, status: int = 0, message: str | None = None):  # type: ignore[override]
        raise argparse.ArgumentError(None, f"exit {status}: {message or ''}(--help?)")


_OPENRLHF_PARSER: tuple[argparse.ArgumentParser, dict[str, str]] | None = None


def _openrlhf_parser() -> tuple[argparse.ArgumentParser, dict[str, str]]:
    """An argparse parser with every option of the OpenRLHF release's launch parser (its
    surface: action, type, nargs, choices), like the engine's own."""
    global _OPENRLHF_PARSER
    if _OPENRLHF_PARSER is None:
        parser = _RaisingParser(prog="train_ppo_ray", exit_on_error=False)
        dests = {}
        types = {"int": int, "float": float, "str": str, None: None}
        for name, opt in surface("openrlhf").items():
            kwargs: dict[str, Any] = {"default": opt.get("default")}
            if opt["action"] in ("store_true", "store_false"):
                kwargs["action"] = opt["action"]
                kwargs.pop("default")
            else:
                kwargs.update(type=types[opt.get("type")], nargs=opt.get("nargs"),
                              choices=opt.get("choices"))
            dests[name] = parser.add_argument(name, **kwargs).dest
        _OPENRLHF_PARSER = parser, dests
    return _OPENRLHF_PARSER


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _openrlhf_checks(probe: Probe, command: list[str], argv: list[str], spec_doc: Any) -> None:
    """The launch's argv parses with the release's options (no value read as an option, no
    unknown flag) and each engine_options value reads back as given."""
    known = surface("openrlhf")
    args = argv[next((i for i, a in enumerate(argv) if a.startswith("--")), len(argv)):]
    for element in args:
        if element.startswith("-") and not _NEGATIVE.match(element) and \
                element.split("=", 1)[0] not in known:
            probe.add("openrlhf_argv", command, element=element[:300])
    parser, dests = _openrlhf_parser()
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            ns = parser.parse_args(args)
    except (argparse.ArgumentError, SystemExit) as exc:
        probe.add("openrlhf_argparse", command, error=str(exc)[:300])
        return
    for element in args:  # a single-valued --key=value reads back as that text
        key, eq, text = element.partition("=")
        opt = known.get(key)
        if eq and opt and opt["action"] == "store" and opt.get("nargs") is None and \
                (opt.get("type") or "str") == "str" and getattr(ns, dests[key]) != text:
            probe.add("openrlhf_readback", command, option=key, expected=repr(text)[:300],
                      got=repr(getattr(ns, dests[key]))[:300])
    options = spec_doc.get("engine_options", {}).get("openrlhf", {}) \
        if isinstance(spec_doc, dict) else {}
    for key, expected in options.items() if isinstance(options, dict) else ():
        if key not in dests:
            continue
        got = getattr(ns, dests[key])
        opt = known[key]
        if opt["action"] == "store_true":
            want: Any = bool(expected)
        elif opt["action"] == "store_false":
            want = not expected
        else:  # a scalar for a list option is a one-item list; a number for a str its text
            items = expected if isinstance(expected, list) else [expected]
            conv = {"int": int, "float": float}.get(opt.get("type") or "str", _as_text)
            want = [conv(x) for x in items]
            want = want if opt.get("nargs") is not None else want[0]
        if got != want:
            probe.add("openrlhf_readback", command, option=key, expected=repr(expected)[:300],
                      got=repr(got)[:300])


def _special_paths(spec_doc: Any, folder: Path) -> list[str]:
    """The paths the spec names, relative to its folder, that are there and are neither a
    regular file nor (for model.path) a folder of regular files."""
    import stat

    found = []
    for path, value in _leaves(spec_doc) if isinstance(spec_doc, dict) else ():
        if not isinstance(value, str) or not PATH_FIELDS.match(_dotted(path)):
            continue
        text = value.rpartition(":")[0] if path[-1] == "entrypoint" else value
        text = text.removeprefix("file://")
        if "://" in text or not text:
            continue
        target = Path(text) if text.startswith("/") else folder / text
        try:
            mode = target.stat().st_mode
        except (OSError, RuntimeError, ValueError):
            continue
        if path[-1] == "path" and stat.S_ISDIR(mode):
            if any(not (p.is_file() or p.is_dir()) for p in target.iterdir()):
                found.append(f"{_dotted(path)}={text}")
        elif not stat.S_ISREG(mode) and not (path[-1] == "path" and stat.S_ISDIR(mode)):
            found.append(f"{_dotted(path)}={text}")
    return found


def probe(spec: Path, plan_dir: Path, *, all_checks: bool = True) -> Probe:
    """validate, then for a valid spec digest, explain --all-engines --effective and a plan on
    each engine (--json, written with -o), each checked against the project's rules:
    a documented exit code, nothing escaping main, one line on stderr for an error, no adapter
    bug for a spec validate accepts; for a plan made, no interpolation left for OmegaConf in
    a verl or NeMo RL argv and (``all_checks``) the argv parses as the engine parses it and
    carries each engine_options value as given."""
    result = Probe()
    code, _, _ = _call(result, "validate", "--json", str(spec), valid=False)
    if code not in (0, 2):
        result.add("validate_code", ["validate", "--json", str(spec)], code=code)
    if code != 0:
        return result
    result.valid = True
    try:
        spec_doc = json.loads(spec.read_bytes().decode("utf-8-sig"))
    except ValueError:
        spec_doc = None
    special = _special_paths(spec_doc, spec.parent)
    if special:
        result.add("special_file_accepted", ["validate", str(spec)], paths=special)
    digest, _, _ = _call(result, "digest", str(spec), valid=True)
    if digest != 0:
        result.add("digest_code", ["digest", str(spec)], code=digest)
    _call(result, "explain", "--all-engines", "--effective", "--json", str(spec), valid=True)
    for engine, version in ENGINE_RELEASES:
        out = plan_dir / f"{engine}.plan.json"
        out.unlink(missing_ok=True)
        command = ["plan", "--json", "--engine", engine, "--engine-version", version, str(spec),
                   "-o", str(out)]
        code, _, _ = _call(result, *command, valid=True)
        if code != 0:
            continue
        result.plans_ok.append(engine)
        argv = json.loads(out.read_text(encoding="utf-8"))["argv"]
        hydra = [a[:300] for a in argv if HYDRA_NAMESPACE.match(a)]
        if hydra:
            result.add("hydra_namespace", command, elements=hydra)
        options = spec_doc.get("engine_options", {}).get(engine, {}) \
            if isinstance(spec_doc, dict) and isinstance(spec_doc.get("engine_options"), dict) \
            else {}
        prefixed = [k for k in options if isinstance(k, str) and k[:1] in "+~"] \
            if isinstance(options, dict) else []
        if prefixed:
            result.add("edit_prefix_option", command, keys=prefixed)
        if engine in ("verl", "nemo-rl"):
            bad = [a for a in argv if unescaped_interpolations(a)]
            if bad:
                result.add(f"{engine}_interpolation", command, elements=[a[:300] for a in bad])
            if engine == "verl" and any("${" in a for a in argv):
                result.add("verl_escaped_interpolation", command,
                           elements=[a[:300] for a in argv if "${" in a])
            if all_checks:
                _hydra_checks(result, command, engine, argv, spec_doc)
        elif engine == "openrlhf" and all_checks:
            _openrlhf_checks(result, command, argv, spec_doc)
    return result
