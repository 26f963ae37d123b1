"""The trainer loop for ``objective: sft``: the same loop, checkpoints, receipts and validation
as RL, with batches built from the data's answers instead of sampled responses.

Only the three steps that differ are overridden: what a batch is (rows from the resumable
sampler, tokenized and laid out), what learning from it means (answer-token NLL, one optimizer
step) and what a receipt records. Validation adds the teacher-forced validation loss to the
validation reward the RL runs report, so an SFT run and the RL run that starts from it are
scored on the same scale.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from stateset_backend.native.data import DataError, Example
from stateset_backend.native.parallel.distributed import World
from stateset_backend.native.sft.objective import (
    SFTBatch,
    SFTExample,
    check_sft_batch,
    lay_out,
    sft_evaluate,
    sft_update,
)
from stateset_backend.native.trainer import RunSettings, Trainer

VALIDATION_CHUNK = 64  # validation rows per teacher-forced forward pass


class SFTTrainer(Trainer):
    def __init__(self, settings: RunSettings, output: Path, world: World | None = None) -> None:
        super().__init__(settings, output, world)
        sft = self.spec.algorithm.sft
        assert sft is not None
        self.layout = sft.layout
        data = self.spec.data
        self.capacity = data.max_prompt_tokens + data.max_response_tokens
        self.train_examples = self._examples(self.train_rows)
        self.val_examples = self._examples(self.val_rows)

    def _examples(self, rows: list[Example]) -> list[SFTExample]:
        """Prompts encoded as for sampling (template, special tokens, overflow rule); answers
        as the continuation the model should write, ended by EOS, cut at
        max_response_tokens."""
        if not rows:
            return []
        data = self.spec.data
        truncate = data.prompt_overflow in ("truncate_left", "truncate_right")
        prompts = self._tokenize([self._render(r.prompt) for r in rows], truncation=truncate,
                                 max_length=data.max_prompt_tokens if truncate else None)
        answers = self.tokenizer([r.answer for r in rows], add_special_tokens=False)
        eos = self.tokenizer.eos_token_id
        out = []
        for row, prompt, answer in zip(rows, prompts["input_ids"], answers["input_ids"],
                                       strict=True):
            if not prompt:
                raise DataError(f"row {row.index}: the prompt encodes to no tokens; the first "
                                "answer token needs one to be predicted from")
            out.append(SFTExample(row.index, list(prompt),
                                  [*answer, eos][:data.max_response_tokens]))
        return out

    def _batch(self, examples: list[SFTExample]) -> SFTBatch:
        return lay_out(examples, self.layout, pad_id=self.tokenizer.pad_token_id,
                       capacity=self.capacity)

    def collect_batch(self) -> tuple[Any, int, torch.Tensor]:
        """The next rows of the seeded pass over the train split; nothing is sampled."""
        picked = self.sampler.take(self.spec.budget.prompts_per_update)
        return self._batch([self.train_examples[i] for i in picked]), 0, torch.empty(0)

    def learn(self, batch: Any) -> dict[str, float]:
        assert isinstance(batch, SFTBatch)
        check_sft_batch(batch, vocab_size=self.vocab_size)
        metrics = sft_update(self.model, self.optimizer, self.scheduler,
                             self._on_device(batch), self.learner_cfg)
        metrics.update({"answer_tokens": float(batch.answer_mask.sum()),
                        "padding_share": float((batch.segment_ids < 0).float().mean())})
        return metrics

    def _on_device(self, batch: SFTBatch) -> SFTBatch:
        if self.device.type == "cpu":
            return batch
        moved = {name: getattr(batch, name).to(self.device)
                 for name in ("input_ids", "attention_mask", "position_ids", "answer_at",
                              "answer_mask")}
        return SFTBatch(**{**batch.__dict__, **moved})

    def write_receipt(self, batch: Any, rounds: int) -> None:
        """Which rows were learned from, how they were laid out and how many tokens the loss
        read, per update."""
        assert isinstance(batch, SFTBatch)
        self.out.append(self.out.receipts, {
            "update": self.update_count, "rows": batch.example_index.tolist(),
            "layout": batch.layout, "sequences": int(batch.input_ids.shape[0]),
            "prompt_tokens": int(batch.prompt_lengths.sum()),
            "answer_tokens": int(batch.answer_lengths.sum()),
            "padding_tokens": int((batch.segment_ids < 0).sum())})

    @torch.no_grad()
    def validate(self, rows: list[Example] | None = None,
                 split: str = "validation") -> dict[str, float]:
        """The validation reward (greedy responses scored by the reward function, as in RL
        runs) and the teacher-forced loss and token accuracy on the same rows' answers."""
        examples = self.val_examples if rows is None else self._examples(rows)
        metrics = super().validate(rows, split)
        batches = [self._on_device(self._batch(examples[i:i + VALIDATION_CHUNK]))
                   for i in range(0, len(examples), VALIDATION_CHUNK)]
        metrics.update(sft_evaluate(self.model, batches, self.compute))
        return metrics


def trainer_for(settings: RunSettings, output: Path, world: World | None = None) -> Trainer:
    """The trainer that runs the spec: SFT (one process) or RL (one or several)."""
    if settings.spec.algorithm.objective == "sft":
        return SFTTrainer(settings, output, world)
    return Trainer(settings, output, world)
