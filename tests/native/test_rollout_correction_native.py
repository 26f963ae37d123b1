"""algorithm.rollout_correction in the native engine: each mode's weights on hand-made
log-probs, the learner's update using them, and a short run with the section set."""

from __future__ import annotations

import json
import math

import pytest
import torch

from stateset_backend.native import learner, objectives
from stateset_backend.native.learner import frozen_logprobs, update

MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADV = torch.tensor([1.0, -2.0])
# sampler/learner weights per token; the last token of row 1 is padding
W = torch.tensor([[2.0, 0.25, 8.0], [8.0, 4.0, 1.0]])
RATIO = 1.1  # every token's (and so every sequence's) policy ratio, inside the clip range


def _logps() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(current, learner old, sampler) log-probs with exp(old - sampler) = W on the mask."""
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.5, 1000.0]])  # padding: no meaning
    rollout = torch.where(MASK > 0, old - W.log(), 0.0)
    current = old + math.log(RATIO)
    return current, old, rollout


# per mode (low 0.5, high 5): the weights, then the token-mean loss over the 5 tokens
# truncate: [2, 0.5, 5], [5, 4]; mask: [2, 0, 0], [0, 4]; sequence_mask: row 0's geometric
# mean (2 * 0.25 * 8)^(1/3) = 1.59 keeps [2, 0.25, 8], row 1's sqrt(8 * 4) = 5.66 drops it
EXPECTED = {
    "truncate": ([[2.0, 0.5, 5.0], [5.0, 4.0, 0.0]],
                 (-1.1 * (2 + 0.5 + 5) + 2.2 * (5 + 4)) / 5),
    "mask": ([[2.0, 0.0, 0.0], [0.0, 4.0, 0.0]], (-1.1 * 2 + 2.2 * 4) / 5),
    "sequence_mask": ([[2.0, 0.25, 8.0], [0.0, 0.0, 0.0]], -1.1 * (2 + 0.25 + 8) / 5),
}


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_weights_by_hand(mode):
    _, old, rollout = _logps()
    w = objectives.rollout_weights(old, rollout, MASK, mode=mode, low=0.5, high=5.0)
    torch.testing.assert_close(w, torch.tensor(EXPECTED[mode][0]))


@pytest.mark.parametrize("loss_name", ["clipped", "gspo"])
@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_weighted_policy_loss_by_hand(mode, loss_name):
    """GSPO's sequence ratio is 1.1 here too, and each of its token terms is weighted alike."""
    current, old, rollout = _logps()
    logp = current.clone().requires_grad_(True)
    w = objectives.rollout_weights(old, rollout, MASK, mode=mode, low=0.5, high=5.0)
    pl = objectives.POLICY_LOSSES[loss_name](logp, old, ADV, MASK, clip_low=0.2,
                                             clip_high=0.2)
    loss = objectives.aggregate(pl.loss * w, MASK, "token_mean", 3)
    assert loss.item() == pytest.approx(EXPECTED[mode][1], rel=1e-6)
    loss.backward()
    if loss_name == "clipped":  # d/dlogp of -A * exp(logp - old) * w / 5; w is a constant
        want = -ADV[:, None] * RATIO * torch.tensor(EXPECTED[mode][0]) / 5
        torch.testing.assert_close(logp.grad, want * MASK)


def test_an_out_of_range_padding_value_stays_harmless():
    _, old, rollout = _logps()
    old[1, 2] = float("inf")
    for mode in EXPECTED:
        w = objectives.rollout_weights(old, rollout, MASK, mode=mode, low=0.5, high=5.0)
        assert torch.isfinite(w).all() and w[1, 2] == 0


def _learner_setup(tiny, make_trainer, name, correction):
    doc = tiny(**{"budget.ppo_epochs": 1, "budget.mini_batches": 1,
                  "checkpoint.every": None, "evaluation.every": None})
    doc["algorithm"] = {"objective": "grpo", "group_size": 4,
                        "rollout_correction": correction}
    trainer = make_trainer(doc, name)
    batch, _, _ = trainer.collect_batch()
    assert batch is not None
    trainer.model.train()
    with trainer.learner_cfg.compute():
        own = frozen_logprobs(trainer.model, batch, trainer.learner_cfg.temperature, 4)
    return trainer, batch, own


def test_the_update_weights_by_the_recorded_log_probs(tiny, make_trainer):
    """The sampler's recorded log-probs are replaced by the learner's minus known log-weights:
    one token far out of range (dropped), one at 3 (kept), the rest 1."""
    trainer, batch, own = _learner_setup(tiny, make_trainer, "mask",
                                         {"mode": "mask", "low": 0.5, "high": 5.0})
    mask = batch.response_mask
    w = torch.ones_like(own)
    w[0, 0], w[1, 0] = 10.0, 3.0
    batch.sample_logprobs = torch.where(mask > 0, own - w.log(), float("nan"))
    adv = torch.linspace(-1.0, 1.0, batch.size)
    metrics = update(trainer.model, trainer.optimizer, trainer.scheduler, batch, adv, None,
                     trainer.learner_cfg, trainer.generator)
    applied = torch.where(w > 5.0, 0.0, w) * mask
    n = float(mask.sum())
    # the first (only) step sees the weights that sampled: every ratio is 1
    want = float((-adv[:, None] * applied).sum()) / n
    assert metrics["loss/policy"] == pytest.approx(want, abs=1e-5)
    assert metrics["rollout_correction/filtered_share"] == pytest.approx(1 / n)
    assert metrics["rollout_correction/weight_mean"] == pytest.approx((n + 1) / n, abs=1e-5)


def test_a_null_section_keeps_the_sampler_log_probs_as_the_old_ones(tiny, make_trainer,
                                                                    monkeypatch):
    trainer, batch, own = _learner_setup(tiny, make_trainer, "null", None)

    def refuse(*args, **kwargs):
        raise AssertionError("no learner pass without the section")

    monkeypatch.setattr(learner, "frozen_logprobs", refuse)
    adv = torch.linspace(-1.0, 1.0, batch.size)
    metrics = update(trainer.model, trainer.optimizer, trainer.scheduler, batch, adv, None,
                     trainer.learner_cfg, trainer.generator)
    assert not any(k.startswith("rollout_correction/") for k in metrics)
    sampled = torch.nan_to_num(batch.sample_logprobs, nan=0.0)
    pl = objectives.clipped_loss(own, sampled, adv, batch.response_mask, clip_low=0.2,
                                 clip_high=0.2)
    want = objectives.aggregate(pl.loss, batch.response_mask, "token_mean", 2)
    assert metrics["loss/policy"] == pytest.approx(float(want), abs=1e-6)


@pytest.mark.parametrize(("objective", "mode"), [("grpo", "sequence_mask"),
                                                 ("gspo", "truncate"), ("ppo", "mask")])
def test_a_run_with_the_section_set_trains(tiny, make_trainer, objective, mode):
    doc = tiny(**{"budget.total_updates": 2, "checkpoint.every": None,
                  "evaluation.every": None})
    doc["algorithm"] = ({"objective": "ppo", "gae": {"critic": {"lr": 1e-3}}}
                        if objective == "ppo" else {"objective": objective, "group_size": 4})
    doc["algorithm"]["rollout_correction"] = {"mode": mode, "low": 0.5, "high": 2.0}
    trainer = make_trainer(doc, objective)
    trainer.train()
    rows = [json.loads(x) for x in trainer.out.metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(v) for r in rows for v in r.values())
    # the sampler and the learner agree to rounding here: weights near 1, nothing dropped
    assert all(abs(r["rollout_correction/weight_mean"] - 1.0) < 1e-3 for r in rows)
    assert all(r["rollout_correction/filtered_share"] == 0.0 for r in rows)
