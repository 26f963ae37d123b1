"""The native engine's math equals verl's ``core_algos`` wherever it claims a verl objective.

Advantages (GRPO, Dr.GRPO, RLOO, REINFORCE++-baseline, PPO's GAE with its returns), policy
losses (vanilla with dual-clip, GSPO, CISPO) and the critic's clipped value loss in every loss
aggregation, k1/k2/k3 KL and the DAPO overlong penalty are
evaluated by the installed verl (``verl_core_algos.py``, run in verl's interpreter) and by
``stateset_backend.native.objectives`` on the same seeded inputs: values and gradients w.r.t.
the log-probs agree within 1e-6 (float64) and 1e-5 (float32), relative to max(1, |verl|),
over narrow (|log ratio| < 0.3) and wide (|log ratio| up to 30) ranges.

Needs verl in another environment: STATESET_TEST_VERL_PYTHON names its interpreter.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from optional_installs import VERL_PYTHON_MISSING

from stateset_backend.native import objectives as O

VERL_PYTHON = os.environ.get("STATESET_TEST_VERL_PYTHON")
PROBE = Path(__file__).with_name("verl_core_algos.py")
# every test reads the one batch verl's interpreter computes (verl_results): one pytest-xdist
# worker runs them all, so it is computed once
pytestmark = [pytest.mark.skipif(VERL_PYTHON is None, reason=VERL_PYTHON_MISSING),
              pytest.mark.xdist_group(__name__)]

TOLERANCE = {"float64": 1e-6, "float32": 1e-5}
DTYPES = {"float32": torch.float32, "float64": torch.float64}
AGGS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"]
RANGES = {"narrow": 0.3, "wide": 30.0}
B, T, MAX_TOKENS = 12, 7, 10  # MAX_TOKENS != T: the norm constant is the budget, not the width
NO_DUAL_CLIP = 1e30  # verl always dual-clips; a huge clip_ratio_c switches it off


def _inputs(seed: int, log_ratio: float) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 5
    ratio = (torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 1) * log_ratio
    adv = torch.randn(B, generator=g, dtype=torch.float64) * 1.5
    return {"mask": mask.tolist(), "old_log_prob": old.tolist(),
            "log_prob": (old + ratio).tolist(), "advantages": adv.tolist()}


LOSSES = {  # case name -> (verl loss_mode, native loss, extra verl keys, native knobs)
    "vanilla dual-clip 3": ("vanilla", "clipped", {"clip_ratio_c": 3.0}, {"dual_clip": 3.0}),
    "vanilla dual-clip 10": ("vanilla", "clipped", {"clip_ratio_c": 10.0},
                             {"dual_clip": 10.0}),
    "vanilla no dual-clip": ("vanilla", "clipped", {"clip_ratio_c": NO_DUAL_CLIP},
                             {"dual_clip": None}),
    "gspo": ("gspo", "gspo", {}, {}),
    "cispo": ("cispo", "cispo", {}, {}),
}
CLIPS = {"vanilla": (0.2, 0.28), "gspo": (3e-4, 4e-4), "cispo": (1.0, 0.28)}

ADVANTAGES = {  # case -> (verl estimator, native baseline, scope, std_normalize, eps, on var)
    "grpo": ("grpo", "group", "group", True, 1e-6, False),
    "dr_grpo": ("grpo", "group", "group", False, 1e-6, False),
    "rloo": ("rloo", "leave_one_out", "group", False, 1e-6, False),
    "reinforce_pp_baseline": ("reinforce_pp_baseline", "group", "batch", True, 1e-8, True),
}
KL = {"k1": ("kl", None), "k2": ("mse", None), "k3": ("low_var_kl", 10.0)}


def _rewards(seed: int, zero_variance: bool) -> tuple[list[float], list[int]]:
    """Groups of 4; with ``zero_variance``, first a group of 8 equal rewards that no binary
    float represents exactly (verl's float32 mean of them rounds away from them)."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 5, (B,), generator=g).double() / 4 + \
        torch.rand(B, generator=g, dtype=torch.float64)
    index = torch.arange(B).div(4, rounding_mode="floor")
    if zero_variance:
        rewards[:8] = 0.7
        index[:8] = 0
        index[8:] = 1
    return rewards.tolist(), index.tolist()


GAE_PARAMS = [(1.0, 0.95), (1.0, 1.0), (0.99, 0.9), (0.5, 0.0)]
VALUE_CLIPS = [0.2, 0.5, None]  # None: native's unclipped loss; verl gets a clip no value hits
NO_CLIP = 1e9


def _gae_inputs(seed: int, gaps: bool) -> dict[str, Any]:
    """Token rewards (a KL-like penalty on every token plus an outcome on the last), critic
    values and a response mask; with ``gaps``, masked-out tokens inside responses too (GAE
    skips them, carrying the next value and advantage across)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = T
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    if gaps:
        mask = mask * (torch.rand(B, T, generator=g) > 0.3).double()
        mask[:, 0] = 1.0
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64) * 0.1
    rewards[torch.arange(B), lengths - 1] += torch.rand(B, generator=g, dtype=torch.float64)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    return {"mask": mask.tolist(), "token_rewards": rewards.tolist(), "values": values.tolist()}


def _value_inputs(seed: int) -> dict[str, Any]:
    """New values that moved from the rollout's by up to 1.5, so some are clipped."""
    g = torch.Generator().manual_seed(seed)
    inp = _inputs(seed, 1.0)
    old = torch.randn(B, T, generator=g, dtype=torch.float64)
    moved = old + (torch.rand(B, T, generator=g, dtype=torch.float64) * 2 - 1) * 1.5
    returns = old + torch.randn(B, T, generator=g, dtype=torch.float64)
    return {"mask": inp["mask"], "values": old.tolist(), "vpreds": moved.tolist(),
            "returns": returns.tolist()}


def cases() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    seed = 0
    for dtype in DTYPES:
        for range_name, limit in RANGES.items():
            for name, (mode, _, verl_extra, _) in LOSSES.items():
                for agg in AGGS:
                    seed += 1
                    low, high = CLIPS[mode]
                    out.append({"kind": "policy_loss", "name": f"{name} {agg}",
                                "dtype": dtype, "range": range_name, "loss_mode": mode,
                                "agg": agg.replace("_", "-"), "native_agg": agg,
                                "clip_low": low, "clip_high": high, "max_tokens": MAX_TOKENS,
                                "case": name, **verl_extra, **_inputs(seed, limit)})
            for est, (verl_name, _) in KL.items():
                seed += 1
                inp = _inputs(seed, limit)
                g = torch.Generator().manual_seed(seed)
                out.append({"kind": "kl", "name": f"kl {est}", "estimator": est,
                            "kl_penalty": verl_name, "dtype": dtype, "range": range_name,
                            "log_prob": inp["log_prob"], "ref_log_prob": inp["old_log_prob"],
                            "weights": torch.randn(B, T, generator=g,
                                                   dtype=torch.float64).tolist()})
        for agg in AGGS:
            seed += 1
            inp = _inputs(seed, 1.0)
            out.append({"kind": "aggregation", "name": f"aggregate {agg}", "dtype": dtype,
                        "range": "-", "agg": agg.replace("_", "-"), "native_agg": agg,
                        "values": inp["log_prob"], "mask": inp["mask"],
                        "max_tokens": MAX_TOKENS})
        for zero in (False, True):
            for name, (verl_est, *_, eps, _) in ADVANTAGES.items():
                seed += 1
                rewards, index = _rewards(seed, zero)
                out.append({"kind": "advantage", "name": name + (" zero-var" if zero else ""),
                            "case": name, "dtype": dtype, "range": "-",
                            "estimator": verl_est, "std_normalize": ADVANTAGES[name][3],
                            "epsilon": eps, "rewards": rewards, "index": index,
                            "mask": _inputs(seed, 1.0)["mask"], "zero_variance": zero})
        for gamma, lam in GAE_PARAMS:
            for gaps in (False, True):
                seed += 1
                out.append({"kind": "gae", "name": f"gae gamma={gamma} lam={lam}"
                            + (" gaps" if gaps else ""), "dtype": dtype, "range": "-",
                            "gamma": gamma, "lam": lam, **_gae_inputs(seed, gaps)})
        for clip in VALUE_CLIPS:
            for agg in AGGS:
                seed += 1
                out.append({"kind": "value_loss", "name": f"value loss clip={clip} {agg}",
                            "dtype": dtype, "range": "-", "cliprange_value": clip or NO_CLIP,
                            "native_clip": clip, "agg": agg.replace("_", "-"),
                            "native_agg": agg, "max_tokens": MAX_TOKENS,
                            **_value_inputs(seed)})
    out.append({"kind": "overlong", "name": "dapo overlong", "dtype": "float32", "range": "-",
                "lengths": list(range(1, 33)), "max_tokens": 32, "buffer_tokens": 12,
                "penalty": 0.7})
    return out


@functools.cache
def verl_results() -> tuple[str, tuple[dict[str, Any], ...]]:
    assert VERL_PYTHON is not None
    proc = subprocess.run([VERL_PYTHON, str(PROBE)], input=json.dumps(cases()),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc["verl_version"], tuple(doc["results"])


def _t(case: dict[str, Any], name: str) -> torch.Tensor:
    return torch.tensor(case[name], dtype=torch.float64).to(DTYPES[case["dtype"]])


def native(case: dict[str, Any]) -> dict[str, Any]:
    """The native engine's answer to one case, shaped like the probe's."""
    kind = case["kind"]
    if kind == "policy_loss":
        _, loss_name, _, knobs = LOSSES[case["case"]]
        logp = _t(case, "log_prob").requires_grad_(True)
        mask = _t(case, "mask")
        pl = O.POLICY_LOSSES[loss_name](logp, _t(case, "old_log_prob"), _t(case, "advantages"),
                                        mask, clip_low=case["clip_low"],
                                        clip_high=case["clip_high"], **knobs)
        value = O.aggregate(pl.loss, mask, case["native_agg"], case["max_tokens"])
        value.backward()
        assert logp.grad is not None
        return {"value": value.item(), "grad": logp.grad.double().tolist()}
    if kind == "kl":
        logp = _t(case, "log_prob").requires_grad_(True)
        kl = O.kl_estimate(logp, _t(case, "ref_log_prob"), case["estimator"],
                           KL[case["estimator"]][1])
        (kl * _t(case, "weights")).sum().backward()
        assert logp.grad is not None
        return {"value": kl.double().tolist(), "grad": logp.grad.double().tolist()}
    if kind == "aggregation":
        values = _t(case, "values").requires_grad_(True)
        out = O.aggregate(values, _t(case, "mask"), case["native_agg"], case["max_tokens"])
        out.backward()
        assert values.grad is not None
        return {"value": out.item(), "grad": values.grad.double().tolist()}
    if kind == "advantage":
        _, baseline, scope, std_normalize, eps, on_var = ADVANTAGES[case["case"]]
        adv = O.advantages(_t(case, "rewards"), torch.tensor(case["index"]),
                           _t(case, "mask").sum(-1), baseline=baseline,
                           std_normalize=std_normalize, scope=scope, unbiased=True, eps=eps,
                           eps_on_variance=on_var)
        return {"value": adv.double().tolist()}
    if kind == "gae":
        mask = _t(case, "mask")
        adv, returns = O.gae_advantages_returns(_t(case, "token_rewards"), _t(case, "values"),
                                                mask, gamma=case["gamma"], lam=case["lam"])
        # verl whitens GAE advantages: unbiased, 1e-8 on the variance (its masked_whiten)
        white = O.whiten_tokens(adv, mask, unbiased=True, eps=1e-8, eps_on_variance=True)
        return {"value": white.double().tolist(), "returns": returns.double().tolist()}
    if kind == "value_loss":
        vpreds = _t(case, "vpreds").requires_grad_(True)
        mask = _t(case, "mask")
        vl = O.value_loss(vpreds, _t(case, "values"), _t(case, "returns"), mask,
                          clip=case["native_clip"], aggregation=case["native_agg"],
                          max_tokens=case["max_tokens"])
        vl.loss.backward()
        assert vpreds.grad is not None
        return {"value": vl.loss.item(), "grad": vpreds.grad.double().tolist(),
                "clipfrac": O.aggregate(vl.clipped, mask, "token_mean", 1).item()}
    if kind == "overlong":
        pen = O.overlong_penalty(torch.tensor(case["lengths"]), case["max_tokens"],
                                 case["buffer_tokens"], case["penalty"])
        return {"value": pen.tolist()}
    raise AssertionError(kind)


def scaled_diff(ours: Any, theirs: Any) -> float:
    """max |ours - theirs| / max(1, |theirs|), elementwise."""
    a = torch.tensor(ours, dtype=torch.float64)
    b = torch.tensor(theirs, dtype=torch.float64)
    return float(((a - b).abs() / b.abs().clamp(min=1.0)).max())


def _ids(case: dict[str, Any]) -> str:
    return f"{case['name']}-{case['dtype']}-{case['range']}"


CASES = cases()


@pytest.mark.parametrize("index", range(len(CASES)), ids=[_ids(c) for c in CASES])
def test_native_equals_verl(index: int) -> None:
    case = CASES[index]
    version, results = verl_results()
    assert version == "0.9.1"
    theirs, ours = results[index], native(case)
    tol = TOLERANCE[case["dtype"]]
    if case["kind"] == "advantage":
        assert theirs["constant_per_sample"]
        if case["zero_variance"] and case["case"] != "reinforce_pp_baseline":
            # native: a group of equal rewards has advantage exactly 0 (a deviation from verl,
            # whose float mean of equal rewards can round away from them: see below)
            assert ours["value"][:8] == [0.0] * 8
            ours, theirs = {"value": ours["value"][8:]}, {"value": theirs["value"][8:]}
    assert scaled_diff(ours["value"], theirs["value"]) <= tol
    for extra in ("grad", "returns", "clipfrac"):
        if extra in theirs:
            assert scaled_diff(ours[extra], theirs[extra]) <= tol


def test_verl_gives_equal_rewards_a_non_zero_advantage_in_float32() -> None:
    """The declared deviation, measured: where verl's group mean of equal rewards rounds away
    from them, verl's advantage is not 0; native's is exactly 0."""
    _, results = verl_results()
    grpo = next(i for i, c in enumerate(CASES) if c["name"] == "grpo zero-var"
                and c["dtype"] == "float32")
    verl_zero_var = max(abs(v) for v in results[grpo]["value"][:8])
    assert native(CASES[grpo])["value"][:8] == [0.0] * 8
    assert verl_zero_var > 0
