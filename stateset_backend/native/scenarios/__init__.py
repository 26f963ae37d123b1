"""Bundled, generated-in-code scenarios: data, tokenizer vocabulary and reward together."""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

Rows = dict[str, list[dict[str, Any]]]


def write_splits(generate: Callable[[int], Rows], out: Path, seed: int = 0) -> dict[str, str]:
    """Write ``<split>.jsonl`` files; return each file's sha256 for the spec."""
    out.mkdir(parents=True, exist_ok=True)
    digests = {}
    for split, rows in generate(seed).items():
        data = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode("utf-8")
        (out / f"{split}.jsonl").write_bytes(data)
        digests[split] = hashlib.sha256(data).hexdigest()
    return digests


def main(generate: Callable[[int], Rows], description: str) -> None:
    """The scenario's command line: write its splits to a folder and print their digests."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    print(json.dumps(write_splits(generate, a.out, a.seed), indent=2))
