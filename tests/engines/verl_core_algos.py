"""Run with verl's own interpreter: evaluate verl's core_algos (advantages, policy losses, KL
penalties, loss aggregation, GAE and the critic's value loss) and its DAPO overlong penalty
on the cases given on stdin, with gradients w.r.t. log_prob (or the critic's values) from
verl's own autograd graph. Reads JSON, prints JSON.

Each case: {"kind": ..., "dtype": "float32"|"float64", ...tensors as nested lists}.
"""

import json
import sys
import types

import numpy as np
import torch
import verl
from verl import DataProto
from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig
from verl.workers.reward_manager.dapo import DAPORewardManager

DTYPES = {"float32": torch.float32, "float64": torch.float64}
ADV_ESTIMATORS = {"grpo": "grpo", "rloo": "rloo",
                  "reinforce_pp_baseline": "reinforce_plus_plus_baseline"}


def tensor(case, name):
    return torch.tensor(case[name], dtype=torch.float64).to(DTYPES[case["dtype"]])


def policy_loss(case):
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                         clip_ratio_low=case["clip_low"], clip_ratio_high=case["clip_high"],
                         clip_ratio_c=case.get("clip_ratio_c", 3.0),
                         loss_scale_factor=case["max_tokens"])
    # what verl's ppo_loss puts there on one data-parallel rank
    config.global_batch_info["loss_scale_factor"] = config.loss_scale_factor
    log_prob = tensor(case, "log_prob").requires_grad_(True)
    mask = tensor(case, "mask")
    adv = tensor(case, "advantages")[:, None] * mask
    loss, _ = core_algos.get_policy_loss_fn(case["loss_mode"])(
        old_log_prob=tensor(case, "old_log_prob"), log_prob=log_prob, advantages=adv,
        response_mask=mask.bool(), loss_agg_mode=case["agg"], config=config)
    loss.backward()
    return {"value": loss.item(), "grad": log_prob.grad.double().tolist()}


def kl(case):
    log_prob = tensor(case, "log_prob").requires_grad_(True)
    kld = core_algos.kl_penalty(log_prob, tensor(case, "ref_log_prob"), case["kl_penalty"])
    (kld * tensor(case, "weights")).sum().backward()
    return {"value": kld.double().tolist(), "grad": log_prob.grad.double().tolist()}


def aggregation(case):
    values = tensor(case, "values").requires_grad_(True)
    out = core_algos.agg_loss(values, tensor(case, "mask").bool(), case["agg"],
                              loss_scale_factor=case["max_tokens"])
    out.backward()
    return {"value": out.item(), "grad": values.grad.double().tolist()}


def advantage(case):
    mask = tensor(case, "mask")
    rewards = tensor(case, "rewards")
    lengths = mask.sum(-1).long()
    token_rewards = torch.zeros_like(mask)
    token_rewards[torch.arange(len(lengths)), lengths - 1] = rewards  # outcome reward at the end
    index = np.array(case["index"])
    kwargs = {}
    if case["estimator"] == "grpo":
        kwargs["norm_adv_by_std_in_grpo"] = case["std_normalize"]
    fn = core_algos.get_adv_estimator_fn(ADV_ESTIMATORS[case["estimator"]])
    adv, _ = fn(token_level_rewards=token_rewards, response_mask=mask, index=index,
                epsilon=case["epsilon"], **kwargs)
    # one value per sample: each sample's advantage is the same on all its tokens
    return {"value": adv[torch.arange(len(lengths)), lengths - 1].double().tolist(),
            "constant_per_sample": bool(((adv - adv[:, :1]) * mask).abs().max() == 0)}


def gae(case):
    mask = tensor(case, "mask")
    adv, returns = core_algos.compute_gae_advantage_return(
        token_level_rewards=tensor(case, "token_rewards"), values=tensor(case, "values"),
        response_mask=mask, gamma=case["gamma"], lam=case["lam"])
    return {"value": adv.double().tolist(), "returns": returns.double().tolist()}


def value_loss(case):
    vpreds = tensor(case, "vpreds").requires_grad_(True)
    loss, clipfrac = core_algos.compute_value_loss(
        vpreds=vpreds, returns=tensor(case, "returns"), values=tensor(case, "values"),
        response_mask=tensor(case, "mask"), cliprange_value=case["cliprange_value"],
        loss_agg_mode=case["agg"], loss_scale_factor=case["max_tokens"])
    loss.backward()
    return {"value": loss.item(), "grad": vpreds.grad.double().tolist(),
            "clipfrac": float(clipfrac)}


class _Tokenizer:
    eos_token = "</s>"

    def decode(self, ids, skip_special_tokens=True):
        return ""


def overlong(case):
    lengths = case["lengths"]
    width, prompt = max(lengths), 2
    attention = torch.zeros(len(lengths), prompt + width, dtype=torch.long)
    attention[:, :prompt] = 1
    for i, n in enumerate(lengths):
        attention[i, prompt:prompt + n] = 1
    data = DataProto.from_dict(
        tensors={"prompts": torch.ones(len(lengths), prompt, dtype=torch.long),
                 "responses": torch.ones(len(lengths), width, dtype=torch.long),
                 "attention_mask": attention},
        non_tensors={"data_source": np.array(["probe"] * len(lengths), dtype=object),
                     "reward_model": np.array([{"ground_truth": ""}] * len(lengths),
                                              dtype=object)})
    cfg = types.SimpleNamespace(enable=True, len=case["buffer_tokens"],
                                penalty_factor=case["penalty"], log=False)
    manager = DAPORewardManager(_Tokenizer(), num_examine=0,
                                compute_score=lambda **_: 0.0,
                                max_resp_len=case["max_tokens"], overlong_buffer_cfg=cfg)
    rewards = manager(data)
    return {"value": rewards.sum(-1).double().tolist()}


KINDS = {"policy_loss": policy_loss, "kl": kl, "aggregation": aggregation,
         "advantage": advantage, "overlong": overlong, "gae": gae, "value_loss": value_loss}

cases = json.loads(sys.stdin.read())
print(json.dumps({"verl_version": verl.__version__,
                  "results": [KINDS[c["kind"]](c) for c in cases]}))
