"""PPO with a learned critic on the native engine: GAE and the value loss on hand-computed
tensors, values recorded at rollout and checked, critic warmup, exact resume of policy and
critic, the example spec through the CLI, and what the native engine refuses."""

from __future__ import annotations

import json
import math

import pytest
import torch

from stateset_backend.native import checkpoint
from stateset_backend.native import objectives as O
from stateset_backend.native.batch import BatchIntegrityError, check_batch, check_returns
from stateset_backend.spec.files import parse_spec

from .conftest import EXAMPLES, signal_reward


def ppo_spec(tiny, **critic):
    doc = tiny()
    doc["algorithm"] = {"objective": "ppo", "gae": {"critic": {"lr": 1e-3, **critic}}}
    return doc


def _policy(trainer):
    return checkpoint.trainable_state(trainer.model)


def _critic(trainer):
    return checkpoint.trainable_state(trainer.critic.model)


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- the math, by hand ---------------------------------------------------------------------
def test_gae_by_hand():
    """Two tokens, reward 1 on the last: with gamma = lam = 1 each advantage is the return
    minus its value and every return is 1; the value after the last token is 0."""
    rewards = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.2]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.float64)
    adv, ret = O.gae_advantages_returns(rewards, values, mask, gamma=1.0, lam=1.0)
    assert adv[0].tolist() == pytest.approx([0.5, 0.8])
    assert ret[0].tolist() == pytest.approx([1.0, 1.0])
    # gamma 0.5, lam 0.5: A1 = 1 - 0.2 = 0.8; A0 = 0 + 0.5*0.2 - 0.5 + 0.25*0.8 = -0.2
    adv, ret = O.gae_advantages_returns(rewards, values, mask, gamma=0.5, lam=0.5)
    assert adv[0].tolist() == pytest.approx([-0.2, 0.8])
    assert ret[0].tolist() == pytest.approx([0.3, 1.0])


def test_gae_skips_masked_tokens():
    """A masked token between two sampled ones neither bootstraps nor breaks the chain."""
    rewards = torch.tensor([[0.0, 7.0, 1.0]], dtype=torch.float64)  # 7 sits on a masked token
    values = torch.tensor([[0.5, 9.0, 0.2]], dtype=torch.float64)
    gap = torch.tensor([[1.0, 0.0, 1.0]], dtype=torch.float64)
    adv, ret = O.gae_advantages_returns(rewards, values, gap, gamma=1.0, lam=1.0)
    assert adv[0, 0].item() == pytest.approx(0.5) and adv[0, 2].item() == pytest.approx(0.8)
    assert ret[0, 0].item() == pytest.approx(1.0)


def test_value_loss_by_hand():
    old = torch.tensor([[0.0, 0.0]])
    new = torch.tensor([[1.0, 0.1]])
    returns = torch.tensor([[2.0, 1.0]])
    mask = torch.ones(1, 2)
    # token 0: plain (1-2)^2 = 1, clipped V = 0.5 -> (0.5-2)^2 = 2.25 (larger, used)
    # token 1: plain (0.1-1)^2 = 0.81, clipped = the same (0.1 is inside the range)
    vl = O.value_loss(new, old, returns, mask, clip=0.5, aggregation="token_mean",
                      max_tokens=2)
    assert vl.loss.item() == pytest.approx(0.5 * (2.25 + 0.81) / 2)
    assert vl.clipped.tolist() == [[1.0, 0.0]]
    plain = O.value_loss(new, old, returns, mask, clip=None, aggregation="token_mean",
                         max_tokens=2)
    assert plain.loss.item() == pytest.approx(0.5 * (1 + 0.81) / 2)


# -- the engine ----------------------------------------------------------------------------
def test_values_are_recorded_at_rollout_and_never_recomputed(tiny, make_trainer):
    trainer = make_trainer(ppo_spec(tiny), "values")
    batch, _, _ = trainer.collect_batch()
    assert batch is not None and batch.values is not None
    sampled = batch.response_mask.bool()
    assert bool(torch.isfinite(batch.values[sampled]).all())
    assert bool(torch.isnan(batch.values[~sampled]).all())
    recorded = batch.values.clone()
    trainer.out.trajectories.mkdir(parents=True)
    trainer.learn(batch)
    # the critic learned, the batch still carries the values it had when it was sampled
    assert torch.equal(torch.nan_to_num(batch.values), torch.nan_to_num(recorded))
    assert batch.returns is not None and bool(torch.isfinite(batch.returns[sampled]).all())


def test_the_integrity_check_covers_values_and_returns(tiny, make_trainer):
    trainer = make_trainer(ppo_spec(tiny), "integrity")
    batch, _, _ = trainer.collect_batch()
    assert batch is not None and batch.values is not None
    check = {"vocab_size": trainer.vocab_size, "group_size": 1, "critic": True}
    check_batch(batch, **check)
    values = batch.values
    batch.values = None
    with pytest.raises(BatchIntegrityError, match="no values"):
        check_batch(batch, **check)
    batch.values = torch.nan_to_num(values, nan=0.0)
    if bool((batch.response_mask == 0).any()):
        with pytest.raises(BatchIntegrityError, match="not sampled"):
            check_batch(batch, **check)
    batch.values = values.clone()
    batch.values[0, 0] = float("nan")
    with pytest.raises(BatchIntegrityError, match="values of a sampled token"):
        check_batch(batch, **check)
    batch.values = values
    batch.returns = torch.zeros_like(values)
    batch.returns[0, 0] = float("inf")
    with pytest.raises(BatchIntegrityError, match="returns of a sampled token"):
        check_returns(batch)


def test_critic_warmup_leaves_the_policy_untouched(tiny, make_trainer, tmp_path):
    doc = ppo_spec(tiny, warmup_updates=2)
    doc["optim"]["warmup_steps"] = 0  # the policy's first update then moves it
    doc["reward"] = signal_reward(tmp_path)  # ... given something to learn from
    trainer = make_trainer(doc, "warmup")
    policy = _policy(trainer)
    trainer.train(until=2)
    assert _equal(policy, _policy(trainer))  # two critic-only updates
    assert trainer.scheduler.last_epoch == 0  # nor did the policy's LR schedule advance
    assert not trainer.optimizer.state
    # the critic took every step: 2 updates x 2 epochs x 2 mini-batches
    head = trainer.critic.model.head.weight
    assert int(trainer.critic.optimizer.state[head]["step"]) == 8
    assert trainer.critic.scheduler.last_epoch == 2
    trainer.train(until=3)
    assert not _equal(policy, _policy(trainer))
    assert trainer.scheduler.last_epoch == 1
    rows = [json.loads(x) for x in trainer.out.metrics.read_text().splitlines()]
    updates = [r for r in rows if r["step"] > 0]
    assert [r["policy/updated"] for r in updates] == [0.0, 0.0, 1.0]
    assert all("loss/value" in r for r in updates)
    assert ["loss/policy" in r for r in updates] == [False, False, True]


def test_exact_resume_restores_policy_and_critic(tiny, make_trainer):
    doc = ppo_spec(tiny, warmup_updates=1)
    straight = make_trainer(doc, "straight")
    straight.train()
    interrupted = make_trainer(doc, "interrupted")
    interrupted.train(until=2)
    ckpt = interrupted.out.checkpoints / "update-000002"
    assert (ckpt / checkpoint.CRITIC_WEIGHTS).is_file()
    resumed = make_trainer(doc, "resumed")
    resumed.resume(ckpt)
    resumed.train()
    assert _equal(_policy(straight), _policy(resumed))
    assert _equal(_critic(straight), _critic(resumed))
    last = [t.out.metrics.read_text().splitlines()[-1].split('"tokens_per_second"')[0]
            for t in (straight, resumed)]
    assert last[0] == last[1]


def test_resume_refuses_a_checkpoint_without_its_critic(tiny, make_trainer):
    first = make_trainer(ppo_spec(tiny), "first")
    first.train(until=2)
    ckpt = first.out.checkpoints / "update-000002"
    (ckpt / checkpoint.CRITIC_WEIGHTS).unlink()
    again = make_trainer(ppo_spec(tiny), "again")
    with pytest.raises(checkpoint.CheckpointError):
        again.resume(ckpt)


# -- the spec and the contract -------------------------------------------------------------
def test_the_critic_is_filled_from_the_ppo_recipe(tiny):
    doc = tiny()
    doc["algorithm"] = {"objective": "ppo"}
    gae = parse_spec(doc).algorithm.gae
    assert gae is not None
    assert (gae.gamma, gae.lam) == (1.0, 0.95)
    c = gae.critic
    assert (c.model, c.lr, c.value_clip, c.warmup_updates) == ("separate", 1e-5, 0.5, 0)
    doc["algorithm"] = {"objective": "grpo", "group_size": 4}
    assert parse_spec(doc).algorithm.gae is None


@pytest.mark.parametrize("algorithm, words", [
    ({"objective": "ppo", "gae": {"critic": {"model": "value_head"}}}, "separate value model"),
    ({"objective": "ppo", "advantage": {"std_normalize": True, "scope": "group"}},
     "normalised over the batch"),
])
def test_native_refuses_what_its_critic_cannot_do(cli, tiny, spec_file, tmp_path, algorithm,
                                                  words):
    doc = tiny()
    doc["algorithm"] = algorithm
    proc = cli("plan", "--engine", "native", spec_file(doc), "-o", tmp_path / "plan.json")
    assert proc.returncode == 3, proc.stderr
    assert words in proc.stderr


@pytest.mark.slow
def test_the_ppo_example_learns_through_the_cli(cli, tmp_path):
    """examples/support-routing-ppo.json, shortened: the critic learns, validation is
    recorded, and policy, critic and final model are saved."""
    doc = json.loads((EXAMPLES / "support-routing-ppo.json").read_text())
    for split in ("train", "validation", "test"):
        doc["data"][split]["uri"] = str(EXAMPLES / doc["data"][split]["uri"])
    doc["reward"]["entrypoint"] = str(EXAMPLES / doc["reward"]["entrypoint"])
    warmup = doc["algorithm"]["gae"]["critic"]["warmup_updates"]
    doc["budget"]["total_updates"] = warmup + 10
    doc["checkpoint"] = {"every": warmup + 10, "keep": 1}
    doc["evaluation"]["every"] = warmup + 10
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(doc))
    runs = tmp_path / "runs"
    proc = cli("run", "--engine", "native", "--runs-dir", runs, path)
    assert proc.returncode == 0, proc.stderr
    (result,) = runs.glob("*/result.json")
    doc_result = json.loads(result.read_text())
    assert doc_result["status"] == "succeeded"
    attempt = result.parent / "attempts" / str(doc_result["attempt"])
    rows = [json.loads(x) for x in (attempt / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in rows if r["step"] > 0]
    assert [r["policy/updated"] for r in updates] == [0.0] * warmup + [1.0] * 10
    assert all(math.isfinite(r["loss/value"]) for r in updates)
    # the value head starts at 0 everywhere; the critic has learned something since
    assert updates[0]["value/mean"] == 0.0 and updates[-1]["value/mean"] != 0.0
    assert [r["step"] for r in rows if "val/reward/mean" in r] == [0, warmup + 10]
    (ckpt,) = (attempt / "checkpoints").iterdir()
    assert (ckpt / checkpoint.CRITIC_WEIGHTS).is_file()
