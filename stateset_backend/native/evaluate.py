"""Loading a checkpoint outside training, for `evaluate` and `runs verify`.

Both build the trainer the attempt ran (from the attempt's own launch config, so the identity
check of the settings runs again) and restore the checkpoint through the trainer's resume
path: the same manifest check, the same loads into a fresh model, optimizer and scheduler.
Scoring a split then goes through :meth:`Trainer.validate`, so a checkpoint evaluated on the
validation split reproduces the number training logged at that update, and the test split is
scored with exactly the same decoding. Nothing here writes into the run: the trainer's
output directory is a scratch folder that is removed afterwards.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stateset_backend.native import layout
from stateset_backend.native.data import load_split
from stateset_backend.native.sft.trainer import trainer_for
from stateset_backend.native.trainer import Trainer, load_settings

# metric prefix per split: the validation split keeps the names training logs
PREFIX = {"validation": "val/", "test": "test/"}


@contextlib.contextmanager
def restored(attempt_dir: Path, checkpoint_dir: Path) -> Iterator[Trainer]:
    """A fresh trainer for the attempt with ``checkpoint_dir`` fully loaded into it."""
    settings = load_settings(attempt_dir / layout.CONFIG_FILE)
    with tempfile.TemporaryDirectory(prefix="stateset-evaluate-") as scratch:
        trainer = trainer_for(settings, Path(scratch))
        with contextlib.closing(trainer):
            trainer.resume(checkpoint_dir)
            yield trainer


def evaluate_checkpoint(attempt_dir: Path, checkpoint_dir: Path, split: str) -> dict[str, float]:
    """The validation metrics of ``checkpoint_dir`` on the spec's ``split``, renamed for it."""
    with restored(attempt_dir, checkpoint_dir) as trainer:
        spec = trainer.spec
        data = getattr(spec.data, split)
        if data is None:
            raise ValueError(f"the spec has no data.{split} split")
        rows = load_split(data, trainer.settings.base_dir)
        if not trainer.conversations:  # the same prompt-overflow rule as the other splits
            rows = trainer._fit_prompts(rows, split)
        metrics = trainer.validate(rows, split)
    prefix = PREFIX[split]
    return {prefix + name.removeprefix("val/"): value for name, value in metrics.items()}


def reload_checkpoint(attempt_dir: Path, checkpoint_dir: Path) -> dict[str, Any]:
    """Prove a checkpoint loads whole: weights, optimizer, scheduler and RNG into a fresh
    trainer; what was loaded, for the record that lifts a quarantine."""
    with restored(attempt_dir, checkpoint_dir) as trainer:
        return {"update": trainer.update_count,
                "parameters": sum(p.numel() for p in trainer.model.parameters()
                                  if p.requires_grad),
                "optimizer_states": len(trainer.optimizer.state)}
