"""The native engine honours the spec v2 settings that change the math or the budget."""

from __future__ import annotations

import math

import pytest
import torch

from stateset_backend.native.data import DataError, PromptSampler
from stateset_backend.native.model import ModelError
from stateset_backend.native.rollout import _top_k_filter
from stateset_backend.native.trainer import SettingsError
from stateset_backend.spec.schedule import lr_factor


@pytest.mark.parametrize("schedule, expected", [
    ("constant", [0.0, 0.5, 1.0, 1.0, 1.0, 1.0]),
    ("linear", [0.0, 0.5, 1.0, 0.1 + 0.9 * 2 / 3, 0.1 + 0.9 / 3, 0.1]),
    ("cosine", [0.0, 0.5, 1.0, 0.55 + 0.45 * math.cos(math.pi / 3),
                0.55 + 0.45 * math.cos(2 * math.pi / 3), 0.1]),
])
def test_lr_schedules_warm_up_from_zero_then_decay_to_the_floor(schedule, expected):
    got = [lr_factor(u, schedule=schedule, warmup=2, total=5, min_lr_ratio=0.1)
           for u in range(6)]
    assert got == pytest.approx(expected)


def test_the_scheduler_steps_once_per_update(tiny, make_trainer):
    doc = tiny(**{"budget.total_updates": 3, "budget.mini_batches": 2, "budget.ppo_epochs": 2,
                  "optim.warmup_steps": 2, "checkpoint.every": None,
                  "evaluation.every": None})
    trainer = make_trainer(doc)
    trainer.train()
    lrs = [row["lr"] for row in map(__import__("json").loads,
                                    trainer.out.metrics.read_text().splitlines())]
    lr = doc["optim"]["lr"]
    assert lrs == pytest.approx([0.0, lr / 2, lr])


def test_optimizer_settings_reach_adamw(tiny, make_trainer):
    trainer = make_trainer(tiny(**{"optim.betas": [0.8, 0.95], "optim.eps": 1e-6}))
    group = trainer.optimizer.param_groups[0]
    assert tuple(group["betas"]) == (0.8, 0.95) and group["eps"] == 1e-6


def test_a_pass_that_cannot_fill_a_request_is_dropped_and_reshuffled():
    sampler = PromptSampler(10, seed=3)
    first = sampler.take(4) + sampler.take(4)
    second = sampler.take(4)  # only 2 left in the first pass: dropped
    assert len(set(first)) == 8
    assert len(set(second)) == 4 and (sampler.epoch, sampler.cursor) == (1, 4)
    assert second == _pass(10, 3, 1)[:4] != _pass(10, 3, 0)[:4]
    in_order = PromptSampler(10, seed=3, shuffle=False)
    assert in_order.take(4) + in_order.take(4) + in_order.take(4) == [0, 1, 2, 3, 4, 5, 6, 7,
                                                                        0, 1, 2, 3]
    with pytest.raises(DataError, match="needs 11 prompts"):
        in_order.take(11)


def _pass(size, seed, epoch):
    sampler = PromptSampler(size, seed)
    sampler.epoch = epoch
    return sampler._permutation()


def test_top_k_keeps_the_k_most_likely_tokens():
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3]])
    assert _top_k_filter(probs, 2)[0].tolist() == pytest.approx([0.0, 4 / 7, 0.0, 3 / 7])
    assert torch.equal(_top_k_filter(probs, None), probs)


@pytest.mark.parametrize("overflow", ["drop", "error", "truncate_left", "truncate_right"])
def test_prompt_overflow(tiny, make_trainer, overflow):
    limit = 6 if overflow.startswith("truncate") else 18  # prompts have 16 to 24 tokens
    doc = tiny(**{"data.max_prompt_tokens": limit, "data.prompt_overflow": overflow})
    if overflow == "error":
        with pytest.raises(DataError, match="exceed max_prompt_tokens 18"):
            make_trainer(doc)
        return
    trainer = make_trainer(doc)
    full = make_trainer(tiny(), "full")
    if overflow == "drop":
        assert 0 < len(trainer.train_rows) < len(full.train_rows)
        lengths = [len(x) for x in trainer.tokenizer([r.prompt for r in trainer.train_rows])[
            "input_ids"]]
        assert max(lengths) <= 18
        assert trainer.collect_batch()[0].prompt_index.tolist()[0] in {
            r.index for r in trainer.train_rows}  # receipts name data-set rows
        return
    ids, _ = trainer._encode(full.train_rows[:3])
    assert ids.shape[1] == 6
    whole = full.tokenizer(full.train_rows[0].prompt)["input_ids"]
    kept = ids[0].tolist()
    # the tokenizer keeps its BOS and cuts the text
    assert kept == (whole[:1] + whole[-5:] if overflow == "truncate_left" else whole[:6])


def test_chat_template_without_one_in_the_model_is_refused(tiny, make_trainer):
    with pytest.raises(ModelError, match="ships no chat template"):
        make_trainer(tiny(**{"data.chat_template": True}))


def test_dual_clip_on_a_loss_without_a_clipped_surrogate_is_refused(tiny, make_trainer):
    doc = tiny()
    doc["algorithm"] = {"objective": "cispo", "group_size": 4, "clip": {"dual_clip": 3.0}}
    with pytest.raises(SettingsError, match="dual_clip"):
        make_trainer(doc)


def test_sampled_validation_draws_several_responses_without_touching_training(tiny,
                                                                              make_trainer):
    doc = tiny(**{"evaluation.temperature": 1.0, "evaluation.samples": 3})
    trainer = make_trainer(doc)
    state = trainer.generator.get_state()
    first = trainer.validate()
    assert torch.equal(trainer.generator.get_state(), state)
    assert first == trainer.validate()  # seeded per update
    greedy = make_trainer(tiny(), "greedy")
    assert greedy.validate() == greedy.validate()


def test_weights_stay_float32_while_computing_in_bfloat16(tiny, make_trainer):
    doc = tiny(**{"budget.total_updates": 1, "checkpoint.every": None,
                  "evaluation.every": None})
    doc["model"]["dtype"] = "bfloat16"
    trainer = make_trainer(doc)
    trainer.train()
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    doc["model"]["param_dtype"] = "bfloat16"
    doc["model"]["dtype"] = "float32"
    with pytest.raises(ModelError, match="computes in the weights' dtype"):
        make_trainer(doc, "wider")
