"""Each objective's math against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from stateset_backend.native import objectives as O

approx = pytest.approx


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def adv(rewards, groups, *, baseline="group", std_normalize=True, scope="group",
        unbiased=True, eps=1e-6, token_counts=None, eps_on_variance=False):
    counts = torch.ones_like(rewards) if token_counts is None else token_counts
    return O.advantages(rewards, torch.tensor(groups), counts, baseline=baseline,
                        std_normalize=std_normalize, scope=scope, unbiased=unbiased, eps=eps,
                        eps_on_variance=eps_on_variance)


def test_group_advantage_with_unbiased_and_population_std():
    rewards, groups = t(1.0, 0.0, 2.0, 2.0), [0, 0, 1, 1]
    unbiased = adv(rewards, groups, unbiased=True, eps=1e-12)
    # group 0: mean .5, unbiased std sqrt(.5) -> +-.5/.7071; group 1 has zero variance -> 0
    assert unbiased[:2].tolist() == approx([1 / math.sqrt(2), -1 / math.sqrt(2)], rel=1e-5)
    population = adv(rewards, groups, unbiased=False, eps=1e-12)
    assert population[:2].tolist() == approx([1.0, -1.0])
    assert unbiased[2:].tolist() == [0.0, 0.0]


def test_dr_grpo_advantage_has_no_std_division():
    assert adv(t(3.0, 1.0), [0, 0], std_normalize=False).tolist() == approx([1.0, -1.0])


def test_rloo_subtracts_the_mean_of_the_others():
    out = adv(t(1.0, 0.0, 0.0), [0, 0, 0], baseline="leave_one_out", std_normalize=False)
    assert out.tolist() == approx([1.0, -0.5, -0.5])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16,
                                   torch.float16])
@pytest.mark.parametrize("value", [0.1, 1 / 3, 0.7, -2.9, 1e4 + 0.1])
def test_equal_rewards_have_exactly_zero_advantage_in_any_dtype(dtype, value):
    # eight equal rewards whose float mean rounds away from them (0.7 in float32 gave ~0.056)
    rewards = torch.tensor([value] * 8 + [0.0, 1.0], dtype=torch.float64).to(dtype)
    groups = [0] * 8 + [1, 1]
    for baseline in ("group", "leave_one_out"):
        for std_normalize in (True, False):
            out = adv(rewards, groups, baseline=baseline, std_normalize=std_normalize)
            assert out[:8].tolist() == [0.0] * 8
            assert out[8:].abs().min() > 0


def test_batch_scope_whitens_over_response_tokens():
    # group-centred: [.5, -.5, 1, -1]; sample i counts tokens[i] times
    rewards, tokens = t(1.0, 0.0, 3.0, 1.0), t(1.0, 3.0, 2.0, 2.0)
    centred = [0.5, -0.5, 1.0, -1.0]
    n = 8.0
    mean = sum(c * w for c, w in zip(centred, tokens.tolist(), strict=True)) / n  # -0.125
    var = sum((c - mean) ** 2 * w for c, w in zip(centred, tokens.tolist(), strict=True)) / n
    unbiased_std = math.sqrt(var * n / (n - 1))
    out = adv(rewards, [0, 0, 1, 1], scope="batch", eps=1e-6, token_counts=tokens)
    assert out.tolist() == approx([(c - mean) / (unbiased_std + 1e-6) for c in centred],
                                  rel=1e-6)
    population = adv(rewards, [0, 0, 1, 1], scope="batch", unbiased=False, eps=1e-6,
                     token_counts=tokens)
    assert population.tolist() == approx([(c - mean) / (math.sqrt(var) + 1e-6)
                                          for c in centred], rel=1e-6)
    # verl's masked_whiten: rsqrt(unbiased var + 1e-8)
    verl = adv(rewards, [0, 0, 1, 1], scope="batch", eps=1e-8, token_counts=tokens,
               eps_on_variance=True)
    assert verl.tolist() == approx([(c - mean) / math.sqrt(var * n / (n - 1) + 1e-8)
                                    for c in centred], rel=1e-6)


def test_batch_scope_shifts_zero_variance_groups_by_the_batch_mean():
    # centred [0, 0, 1, -1] weighted [1, 1, 1, 3]: mean -1/3, unbiased var (30/9)/5 = 2/3
    out = adv(t(2.0, 2.0, 3.0, 1.0), [0, 0, 1, 1], scope="batch", eps=1e-6,
              token_counts=t(1.0, 1.0, 1.0, 3.0))
    std = math.sqrt(2 / 3) + 1e-6
    assert out.tolist() == approx([1 / 3 / std, 1 / 3 / std, 4 / 3 / std, -2 / 3 / std],
                                  rel=1e-5)


def test_zero_variance_groups():
    zero = O.zero_variance_groups(t(1.0, 1.0, 0.0, 1.0), torch.tensor([0, 0, 1, 1]))
    assert zero.tolist() == [True, True, False, False]


@pytest.mark.parametrize("estimator, expected", [
    ("k1", math.log(2)), ("k2", 0.5 * math.log(2) ** 2), ("k3", 0.5 - 1 + math.log(2))])
def test_kl_estimators(estimator, expected):
    kl = O.kl_estimate(t(math.log(0.5)), t(math.log(0.25)), estimator)
    assert kl.item() == approx(expected, rel=1e-5)


def test_kl_clamp_bounds_every_estimator():
    logp, ref = t(0.0, 0.0, 0.0), t(-30.0, 3.0, 30.0)  # d = 30, -3, -30; k3(-3) = e^3 - 4
    assert O.kl_estimate(logp, ref, "k1").tolist() == [30.0, -3.0, -30.0]  # no clamp unless set
    assert O.kl_estimate(logp, ref, "k1", clamp=5.0).tolist() == [5.0, -3.0, -5.0]
    assert O.kl_estimate(logp, ref, "k2", clamp=5.0).tolist() == [5.0, 4.5, 5.0]
    k3 = O.kl_estimate(logp, ref, "k3").tolist()
    # inner log-ratio clamped to [-20, 20] before exp: d = +-30 count as +-20
    assert k3 == approx([math.exp(-20) + 20 - 1, math.exp(3) - 3 - 1, math.exp(20) - 20 - 1])
    assert O.kl_estimate(logp, ref, "k3", clamp=10.0).tolist() == approx(
        [10.0, 10.0, 10.0])


def test_kl_clamp_stops_the_gradient_outside_the_bound():
    logp = torch.tensor([0.0, 0.0], requires_grad=True)
    O.kl_estimate(logp, t(-30.0, -1.0), "k1", clamp=5.0).sum().backward()
    assert logp.grad is not None and logp.grad.tolist() == [0.0, 1.0]


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


@pytest.mark.parametrize("ratio, adv, c, loss", [
    (5.0, -1.0, 3.0, 3.0),     # negative advantage, huge ratio: capped at -A*c
    (2.0, -1.0, 3.0, 2.0),     # under the cap: the ordinary clipped loss
    (5.0, 1.0, 3.0, -1.2),     # positive advantage: dual-clip never applies
    (5.0, -1.0, None, 5.0),    # no dual-clip: unbounded
])
def test_dual_clip(ratio, adv, c, loss):
    logp = torch.tensor([[math.log(ratio)]], requires_grad=True)
    out = O.POLICY_LOSSES["clipped"](logp, t([0.0]), t(adv), t([1.0]), clip_low=0.2,
                                     clip_high=0.2, dual_clip=c)
    assert out.loss.item() == approx(loss, rel=1e-5)
    out.loss.sum().backward()
    assert logp.grad is not None
    capped = c is not None and -adv * ratio > -adv * c
    assert logp.grad.item() == approx(0.0 if capped or adv > 0 else -adv * ratio, rel=1e-5)


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


def test_gspo_caps_the_sequence_log_ratio_at_10():
    out = O.POLICY_LOSSES["gspo"](t([30.0, 30.0]), t([0.0, 0.0]), t(-1.0), t([1.0, 1.0]),
                                  clip_low=0.2, clip_high=0.2)
    assert out.loss[0].tolist() == approx([math.exp(10.0)] * 2, rel=1e-5)


def test_overlong_penalty():
    pen = O.overlong_penalty(torch.tensor([5, 6, 8, 10, 12]), max_tokens=10, buffer_tokens=4,
                             penalty=1.0)
    assert pen.tolist() == approx([0.0, 0.0, -0.5, -1.0, -1.0])


def test_every_objective_the_native_contract_promises_has_a_recipe():
    from stateset_backend.adapters.native.adapter import NativeAdapter

    promised = {c.split(":")[1] for c in NativeAdapter().contract.all_capabilities()
                if c.startswith("objective:")}
    # sft is not an RL recipe: native.sft_trainer runs it (tests/native/test_sft.py)
    assert promised == set(O.RECIPES) | {"sft"}
    for estimator, loss in O.RECIPES.values():
        assert estimator in {**O.ADVANTAGES, **O.CRITIC_ESTIMATORS} and loss in O.POLICY_LOSSES


def test_every_spec_choice_has_a_registered_function():
    from typing import get_args

    from stateset_backend.spec.model import KLEstimator, LossAggregation

    assert set(O.KL_ESTIMATORS) == set(get_args(KLEstimator))
    assert set(O.AGGREGATIONS) == set(get_args(LossAggregation))
    assert set(O.NORMALISERS) == {"group", "batch"}


def test_a_group_of_one_has_no_baseline_and_is_never_zero_variance():
    """One sample per prompt (REINFORCE++ with group_size 1): verl's rule, baseline 0, so the
    batch whitening sees the raw rewards instead of all-zero advantages."""
    rewards = torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64)
    groups = torch.tensor([0, 1, 2])
    tokens = torch.tensor([1, 1, 1])
    assert not O.zero_variance_groups(rewards, groups).any()
    adv = O.advantages(rewards, groups, tokens, baseline="group", std_normalize=True,
                                scope="batch", unbiased=True, eps=0.0)
    expected = (rewards - rewards.mean()) / rewards.std()
    assert torch.allclose(adv, expected)
