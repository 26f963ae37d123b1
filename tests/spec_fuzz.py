"""Mutated specs, for the fuzz tests and ``benchmarks/fuzz.py``.

Each mutation is what hostile or careless input looks like in practice: a value of the wrong
shape, an integer beyond what canonical JSON carries, strings with control characters or lone
surrogates, deep nesting, unknown keys, a missing required key. Whatever comes in, the hub must
answer with its own error (a documented exit code) or a valid result, never a crash.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
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
