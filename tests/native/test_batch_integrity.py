"""A batch that is not safe to learn from is refused, with the reason."""

from __future__ import annotations

import pytest
import torch

from stateset_backend.native.batch import BatchIntegrityError, RolloutBatch, check_batch

VOCAB, GROUP = 10, 2


def good() -> RolloutBatch:
    return RolloutBatch(
        prompt_ids=torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [7, 8, 9]]),
        prompt_mask=torch.tensor([[0.0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]]),
        response_ids=torch.tensor([[1, 3], [2, 0], [4, 3], [1, 2]]),
        response_mask=torch.tensor([[1.0, 1], [1, 0], [1, 1], [1, 1]]),
        sample_logprobs=torch.tensor([[-0.5, -1.0], [-0.2, float("nan")], [-1.0, -2.0],
                                      [-0.1, -0.3]]),
        group_ids=torch.tensor([0, 0, 1, 1]), prompt_index=torch.tensor([4, 4, 9, 9]),
        rewards=torch.tensor([1.0, 0.0, 0.1, 1.0]), policy_version=3)


def test_a_good_batch_passes():
    check_batch(good(), vocab_size=VOCAB, group_size=GROUP)


def _corrupt(field, value_fn):
    b = good()
    setattr(b, field, value_fn(getattr(b, field)))
    return b


@pytest.mark.parametrize("field, corrupt, message", [
    ("response_mask", lambda m: m[:, :1], "response_mask has shape"),
    ("rewards", lambda r: r[:3], "rewards has 3 rows"),
    ("response_ids", lambda r: r.index_fill(1, torch.tensor([0]), VOCAB), "outside the "
                                                                            "vocabulary"),
    ("prompt_ids", lambda r: r - 1, "outside the vocabulary"),
    ("response_mask", lambda m: m * 0.5, "not binary"),
    ("prompt_mask", lambda m: m.flip(1), "not left-aligned"),
    ("response_mask", lambda m: torch.tensor([[0.0, 1], [1, 0], [1, 1], [1, 1]]), "gap"),
    ("rewards", lambda r: r.index_fill(0, torch.tensor([2]), float("inf")), "reward is not "
                                                                             "finite"),
    ("sample_logprobs", lambda lp: lp.index_fill(1, torch.tensor([0]), float("nan")),
     "have no sampling-time log-prob"),
    ("sample_logprobs", lambda lp: lp.abs(), "finite value <= 0"),
    ("group_ids", lambda g: torch.tensor([0, 0, 0, 1]), "group 0 has 3 samples"),
    ("prompt_index", lambda p: torch.tensor([4, 5, 9, 9]), "mixes samples of different "
                                                           "prompts"),
])
def test_each_corruption_is_named(field, corrupt, message):
    with pytest.raises(BatchIntegrityError, match=message):
        check_batch(_corrupt(field, corrupt), vocab_size=VOCAB, group_size=GROUP)


def test_select_and_concat_keep_groups_whole():
    b = good()
    kept = b.select(torch.tensor([False, False, True, True]))
    assert kept.group_ids.tolist() == [0, 0] and kept.prompt_index.tolist() == [9, 9]
    joined = RolloutBatch.concat([b, kept])
    assert joined.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    check_batch(joined, vocab_size=VOCAB, group_size=GROUP)
