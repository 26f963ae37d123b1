"""Prompt data: a split verified against its sha256, and a resumable deterministic sampler."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stateset_backend.spec.content import sha256_file
from stateset_backend.spec.model import DataSplit


class DataError(ValueError):
    """A data split is missing, changed, or lacks the fields the spec names."""


@dataclass(frozen=True)
class Example:
    index: int
    prompt: str
    answer: str
    row: dict[str, Any] = field(default_factory=dict, compare=False)  # the whole JSON row


def resolve(uri: str, base_dir: Path) -> Path:
    path = Path(uri.removeprefix("file://"))
    return path if path.is_absolute() else base_dir / path


def load_split(split: DataSplit, base_dir: Path) -> list[Example]:
    """Read a JSONL split after proving it is the data the experiment names."""
    path = resolve(split.uri, base_dir)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    actual = sha256_file(path)
    if actual != split.sha256:
        raise DataError(f"data file {path} has sha256 {actual}, the spec says {split.sha256}: "
                        "the data changed, so this would be a different experiment")
    rows: list[Example] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        doc = json.loads(line)
        try:
            rows.append(Example(len(rows), str(doc[split.prompt_field]),
                                str(doc[split.answer_field]), doc))
        except KeyError as exc:
            raise DataError(f"{path}:{n}: no field {exc}") from None
    if not rows:
        raise DataError(f"data file {path} has no rows")
    return rows


class PromptSampler:
    """Passes over the train split, each shuffled from the seed (or in file order); a pass that
    cannot fill a whole request drops its remainder and the next pass starts. Its position is
    part of every checkpoint."""

    def __init__(self, size: int, seed: int, shuffle: bool = True) -> None:
        self.size, self.seed, self.shuffle = size, seed, shuffle
        self.epoch, self.cursor = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        order = list(range(self.size))
        if self.shuffle:
            random.Random(f"{self.seed}:{self.epoch}").shuffle(order)
        return order

    def take(self, n: int) -> list[int]:
        if n > self.size:
            raise DataError(f"an update needs {n} prompts but the train split has {self.size}")
        if self.cursor + n > self.size:  # partial_batch "drop": skip the pass's remainder
            self.epoch, self.cursor = self.epoch + 1, 0
            self._order = self._permutation()
        out = self._order[self.cursor:self.cursor + n]
        self.cursor += n
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"size": self.size, "seed": self.seed, "shuffle": self.shuffle,
                "epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state["size"], state["seed"], state.get("shuffle", True)) != \
                (self.size, self.seed, self.shuffle):
            raise DataError("checkpoint's data position belongs to different data or seed")
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._permutation()
