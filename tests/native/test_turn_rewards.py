"""Reward placement on hand-computed conversations: final (the last step's reward, the
single-turn formula) and per_turn (discounted reward-to-go, group baseline from G_0)."""

from __future__ import annotations

import math

import torch

from stateset_backend.native.objectives import (
    conversation_advantages,
    conversation_return,
    reward_to_go,
)

NAN = float("nan")
# two conversations of one task: A has three turns, B has two
TURN_REWARDS = torch.tensor([[0.2, 0.3, 0.5], [0.0, 0.4, NAN]])
# token layout: A = context, t0, t0, ctx, t1, ctx, t2 ; B = context, t0, ctx, t1, t1, pad, pad
TURN_IDS = torch.tensor([[-1, 0, 0, -1, 1, -1, 2], [-1, 0, -1, 1, 1, -1, -1]])
MASK = (TURN_IDS >= 0).float()
GROUPS = torch.tensor([0, 0])


def test_reward_to_go_by_hand():
    g = reward_to_go(TURN_REWARDS, 0.5)
    # A: G2 = 0.5, G1 = 0.3 + 0.5*0.5 = 0.55, G0 = 0.2 + 0.5*0.55 = 0.475 ; B: G1 = 0.4, G0 = 0.2
    assert torch.allclose(g[0], torch.tensor([0.475, 0.55, 0.5]))
    assert torch.allclose(g[1, :2], torch.tensor([0.2, 0.4])) and math.isnan(g[1, 2])
    assert torch.allclose(conversation_return(TURN_REWARDS, "per_turn", 0.5),
                          torch.tensor([0.475, 0.2]))
    assert torch.allclose(conversation_return(TURN_REWARDS, "final", 0.5),
                          torch.tensor([0.5, 0.4]))


def _adv(placement, gamma, **kw):
    knobs = {"baseline": "group", "std_normalize": False, "scope": "group", "unbiased": True,
             "eps": 1e-6, **kw}
    return conversation_advantages(TURN_REWARDS, TURN_IDS, MASK, GROUPS, placement=placement,
                                   gamma=gamma, **knobs)


def test_final_placement_is_the_single_turn_formula():
    adv = _adv("final", 0.5)
    # final rewards 0.5 and 0.4, group mean 0.45: +0.05 on every A token, -0.05 on every B token
    expected = torch.tensor([[0, .05, .05, 0, .05, 0, .05], [0, -.05, 0, -.05, -.05, 0, 0]])
    assert torch.allclose(adv, expected, atol=1e-6)


def test_per_turn_placement_by_hand():
    adv = _adv("per_turn", 0.5)
    # baseline = mean G0 = (0.475 + 0.2) / 2 = 0.3375 ; token value = G_t - 0.3375
    a = [0.475 - 0.3375, 0.55 - 0.3375, 0.5 - 0.3375]
    b = [0.2 - 0.3375, 0.4 - 0.3375]
    expected = torch.tensor([[0, a[0], a[0], 0, a[1], 0, a[2]], [0, b[0], 0, b[1], b[1], 0, 0]])
    assert torch.allclose(adv, expected, atol=1e-6)
    # divided by the group's (unbiased) std of G0 plus eps when normalised
    std = torch.tensor([0.475, 0.2]).std().item()
    assert torch.allclose(_adv("per_turn", 0.5, std_normalize=True), expected / (std + 1e-6),
                          atol=1e-5)


def test_per_turn_with_leave_one_out_baseline():
    adv = _adv("per_turn", 1.0, baseline="leave_one_out")
    # gamma 1: A's G = [1.0, 0.8, 0.5], B's G = [0.4, 0.4]; each baseline is the other's G0
    expected = torch.tensor([[0, .6, .6, 0, .4, 0, .1], [0, -.6, 0, -.6, -.6, 0, 0]])
    assert torch.allclose(adv, expected, atol=1e-6)


def test_equal_returns_give_zero_advantage_on_every_turn():
    rewards = torch.tensor([[0.5, 0.5, NAN], [0.0, 1.0, NAN]])  # both return 1.0
    adv = conversation_advantages(rewards, TURN_IDS.clamp(max=1) * (TURN_IDS >= 0) +
                                  (TURN_IDS < 0) * -1, MASK, GROUPS, placement="per_turn",
                                  gamma=1.0, baseline="group", std_normalize=True,
                                  scope="group", unbiased=True, eps=1e-6)
    assert torch.equal(adv, torch.zeros_like(adv))
