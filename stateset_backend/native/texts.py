"""Responses as text: each distinct token sequence decoded once.

The reward reads every response as text, so every update decoded all of its samples; through
the tokenizer's batch call that cost a small model's update about as much as its sampling's
torch work, spent converting the ids to Python and back. Short completions repeat (a routing
label, a yes or no), so a table of the sequences already decoded answers most of them; the rest
go to the tokenizer in one batch. The text of a sequence depends only on its ids and the
tokenizer, so the answers are the tokenizer's own.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

# distinct sequences remembered; past it the table starts again (long responses rarely repeat,
# and the table must not grow with the run)
CAPACITY = 1 << 16


class Decoder:
    def __init__(self, tokenizer: Any, capacity: int = CAPACITY) -> None:
        self.tokenizer = tokenizer
        self.capacity = capacity
        self.known: dict[tuple[int, ...], str] = {}

    def __call__(self, ids: Tensor, mask: Tensor) -> list[str]:
        """The text of each row of ``ids`` ([N, T]) where ``mask`` is set, special tokens
        skipped: what ``batch_decode`` of the ids, padded where the mask is not set, gives."""
        pad = self.tokenizer.pad_token_id
        rows = list(map(tuple, ids.masked_fill(~mask.bool(), pad).tolist()))
        missing = [r for r in dict.fromkeys(rows) if r not in self.known]
        if missing:
            if len(self.known) + len(missing) > self.capacity:
                self.known.clear()
                missing = list(dict.fromkeys(rows))
            texts = self.tokenizer.batch_decode([list(r) for r in missing],
                                                skip_special_tokens=True)
            self.known.update(zip(missing, texts, strict=True))
        return [self.known[r] for r in rows]
