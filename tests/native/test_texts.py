"""Responses decoded once per distinct token sequence read exactly as the tokenizer's batch
decode reads them."""

from __future__ import annotations

import torch

from stateset_backend.native.texts import Decoder


def _tokenizer(make_trainer, tiny):
    return make_trainer(tiny(**{"budget.total_updates": 1})).tokenizer


def test_decoded_texts_are_the_tokenizers_own(make_trainer, tiny):
    tokenizer = _tokenizer(make_trainer, tiny)
    g = torch.Generator().manual_seed(0)
    vocab = len(tokenizer)
    decode = Decoder(tokenizer)
    for _ in range(3):  # later batches are answered partly from the table
        ids = torch.randint(0, vocab, (64, 5), generator=g)
        ids[32:] = ids[:32]  # repeats within a batch
        mask = (torch.rand(64, 5, generator=g) > 0.2).float().cumprod(-1)
        expected = tokenizer.batch_decode(
            torch.where(mask.bool(), ids, tokenizer.pad_token_id), skip_special_tokens=True)
        assert decode(ids, mask) == expected


def test_a_full_table_starts_again_and_still_answers_every_row(make_trainer, tiny):
    tokenizer = _tokenizer(make_trainer, tiny)
    decode = Decoder(tokenizer, capacity=4)
    ids = torch.arange(10, 22).view(6, 2)
    mask = torch.ones(6, 2)
    expected = tokenizer.batch_decode(ids, skip_special_tokens=True)
    assert decode(ids[:3], mask[:3]) == expected[:3]
    assert decode(ids, mask) == expected  # 6 distinct rows: over capacity
    assert len(decode.known) <= 6
