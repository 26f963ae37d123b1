"""Each objective's math against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from stateset_backend.native import objectives as O

approx = pytest.approx


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_group_advantage_with_unbiased_and_population_std():
    rewards, groups = t(1.0, 0.0, 2.0, 2.0), torch.tensor([0, 0, 1, 1])
    unbiased = O.ADVANTAGES["group"](rewards, groups, std_normalize=True, unbiased=True, eps=0)
    # group 0: mean .5, unbiased std sqrt(.5) -> +-.5/.7071; group 1 has zero variance -> 0
    assert unbiased[:2].tolist() == approx([1 / math.sqrt(2), -1 / math.sqrt(2)], rel=1e-5)
    population = O.ADVANTAGES["group"](rewards, groups, std_normalize=True, unbiased=False,
                                       eps=0)
    assert population[:2].tolist() == approx([1.0, -1.0])
    zero = O.ADVANTAGES["group"](rewards, groups, std_normalize=True, unbiased=True, eps=1e-6)
    assert zero[2:].tolist() == [0.0, 0.0]


def test_dr_grpo_advantage_has_no_std_division():
    adv = O.ADVANTAGES["group"](t(3.0, 1.0), torch.tensor([0, 0]), std_normalize=False)
    assert adv.tolist() == approx([1.0, -1.0])


def test_rloo_subtracts_the_mean_of_the_others():
    adv = O.ADVANTAGES["leave_one_out"](t(1.0, 0.0, 0.0), torch.tensor([0, 0, 0]),
                                        std_normalize=False)
    assert adv.tolist() == approx([1.0, -0.5, -0.5])


def test_reinforce_pp_normalises_over_the_batch():
    adv = O.ADVANTAGES["reinforce_pp"](t(1.0, 0.0, 3.0, 1.0), torch.tensor([0, 0, 1, 1]),
                                       std_normalize=True, unbiased=True, eps=0)
    std = math.sqrt((0.25 + 0.25 + 1 + 1) / 3)
    assert adv.tolist() == approx([0.5 / std, -0.5 / std, 1 / std, -1 / std], rel=1e-5)


def test_zero_variance_groups():
    zero = O.zero_variance_groups(t(1.0, 1.0, 0.0, 1.0), torch.tensor([0, 0, 1, 1]))
    assert zero.tolist() == [True, True, False, False]


@pytest.mark.parametrize("estimator, expected", [
    ("k1", math.log(2)), ("k2", 0.5 * math.log(2) ** 2), ("k3", 0.5 - 1 + math.log(2))])
def test_kl_estimators(estimator, expected):
    kl = O.kl_estimate(t(math.log(0.5)), t(math.log(0.25)), estimator)
    assert kl.item() == approx(expected, rel=1e-5)


def test_kl_estimators_are_zero_at_equal_policies():
    for est in ("k1", "k2", "k3"):
        assert O.kl_estimate(t(-1.3), t(-1.3), est).item() == 0.0


@pytest.mark.parametrize("mode, expected", [
    ("token_mean", 2.5), ("seq_mean_token_mean", 3.0), ("seq_mean_token_sum", 5.0),
    ("seq_mean_token_sum_norm", 10 / 6)])
def test_loss_aggregations(mode, expected):
    values = t([1.0, 2.0, 3.0], [4.0, 9.0, 9.0])
    mask = t([1.0, 1.0, 1.0], [1.0, 0.0, 0.0])
    assert O.aggregate(values, mask, mode, max_tokens=3).item() == approx(expected)


@pytest.mark.parametrize("ratio, adv, low, high, loss, clipped", [
    (1.5, 1.0, 0.2, 0.2, -1.2, 1.0),    # above 1+high with positive advantage: clipped
    (1.5, -1.0, 0.2, 0.2, 1.5, 0.0),    # negative advantage: the pessimistic unclipped term
    (1.5, 1.0, 0.2, 0.28, -1.28, 1.0),  # asymmetric clip-higher (DAPO)
    (0.5, -1.0, 0.2, 0.28, 0.8, 1.0),   # below 1-low with negative advantage: clipped
    (1.1, 1.0, 0.2, 0.2, -1.1, 0.0),    # inside the range
])
def test_clipped_surrogate(ratio, adv, low, high, loss, clipped):
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    out = O.POLICY_LOSSES["clipped"](logp, t([0.0]), t(adv), t([1.0]), clip_low=low,
                                     clip_high=high)
    assert out.loss.item() == approx(loss, rel=1e-5)
    assert out.clipped.item() == clipped
    out.loss.sum().backward()
    assert logp.grad is not None
    # clipped tokens carry no gradient; unclipped ones carry -A * ratio
    assert logp.grad.item() == approx(0.0 if clipped else -adv * ratio, rel=1e-5)


def test_gspo_uses_one_length_normalised_ratio_per_sequence():
    logp = torch.tensor([[math.log(2.0), 0.0]], requires_grad=True)
    out = O.POLICY_LOSSES["gspo"](logp, t([0.0, 0.0]), t(-1.0), t([1.0, 1.0]), clip_low=0.5,
                                  clip_high=0.5)
    seq_ratio = math.sqrt(2.0)  # exp((log 2 + 0) / 2)
    assert out.loss[0].tolist() == approx([seq_ratio, seq_ratio], rel=1e-5)
    out.loss.sum().backward()
    assert logp.grad is not None
    assert logp.grad[0].tolist() == approx([seq_ratio, seq_ratio], rel=1e-5)


def test_gspo_clips_the_sequence_ratio():
    logp = torch.tensor([[math.log(1.2), math.log(1.2)]])
    out = O.POLICY_LOSSES["gspo"](logp, t([0.0, 0.0]), t(1.0), t([1.0, 1.0]), clip_low=0.1,
                                  clip_high=0.1)
    assert out.loss[0].tolist() == approx([-1.1, -1.1], rel=1e-5)


def test_gspo_ignores_padding_when_normalising_length():
    logp = torch.tensor([[math.log(1.5), -5.0]])
    out = O.POLICY_LOSSES["gspo"](logp, t([0.0, 0.0]), t(-1.0), t([1.0, 0.0]), clip_low=1.0,
                                  clip_high=1.0)
    assert out.loss[0, 0].item() == approx(1.5, rel=1e-5)


def test_cispo_detaches_the_clipped_weight_and_keeps_the_gradient():
    logp = torch.tensor([[math.log(2.0)]], requires_grad=True)
    out = O.POLICY_LOSSES["cispo"](logp, t([0.0]), t(1.0), t([1.0]), clip_low=1.0,
                                   clip_high=0.28)
    assert out.loss.item() == approx(-1.28 * math.log(2.0), rel=1e-5)
    assert out.clipped.item() == 1.0
    out.loss.sum().backward()
    assert logp.grad is not None
    assert logp.grad.item() == approx(-1.28, rel=1e-5)  # clipped tokens still learn


def test_log_ratios_are_clamped_before_exp():
    out = O.POLICY_LOSSES["clipped"](t([500.0]), t([0.0]), t(-1.0), t([1.0]), clip_low=0.2,
                                     clip_high=0.2)
    assert torch.isfinite(out.loss).all()
    assert out.loss.item() == approx(math.exp(O.LOG_RATIO_LIMIT), rel=1e-4)


def test_overlong_penalty():
    pen = O.overlong_penalty(torch.tensor([5, 6, 8, 10, 12]), max_tokens=10, buffer_tokens=4,
                             penalty=1.0)
    assert pen.tolist() == approx([0.0, 0.0, -0.5, -1.0, -1.0])


def test_every_objective_the_native_contract_promises_has_a_recipe():
    from stateset_backend.adapters.native import NativeAdapter

    promised = {c.split(":")[1] for c in NativeAdapter().contract.all_capabilities()
                if c.startswith("objective:")}
    assert promised == set(O.RECIPES)
    for estimator, loss in O.RECIPES.values():
        assert estimator in O.ADVANTAGES and loss in O.POLICY_LOSSES
