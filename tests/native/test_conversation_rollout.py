"""Multi-turn rollouts: only the assistant's sampled tokens carry loss (the integrity check
refuses any batch where another token would), and the log-probs recorded while sampling with
one reused KV cache equal a full recompute over the finished conversations."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from native.agent_support import agent_spec, bad_environment_file, make_trainer, with_environment

from stateset_backend.native.batch import (
    ROLE_ASSISTANT,
    ROLE_ENVIRONMENT,
    BatchIntegrityError,
    check_conversation_batch,
)
from stateset_backend.native.multiturn.conversation import Decoding, collect, conversation_logprobs

# the tests share what the module-scoped fixtures build: one pytest-xdist worker runs them all
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope="module")
def rolled(tmp_path_factory):
    """Three tasks x two conversations of three turns each (the Echo environment answers every
    turn with a tool result), sampled from the untrained tiny agent."""
    tmp = tmp_path_factory.mktemp("rollout")
    doc = with_environment(agent_spec(), bad_environment_file(tmp), "Echo")
    trainer = make_trainer(doc, tmp / "out")
    rows = [trainer.train_rows[i] for i in range(3)]
    got = collect(trainer.model, trainer.tokenizer, trainer.env_workers, trainer.tools,
                  trainer.limits, [(r.index, r.row) for r in rows], 2,
                  Decoding(1.0, 1.0, None), torch.Generator().manual_seed(3),
                  placement="per_turn", gamma=1.0, policy_version=0)
    trainer.close()
    yield trainer, got


def test_the_batch_passes_and_only_assistant_tokens_carry_loss(rolled):
    trainer, got = rolled
    batch = got.batch
    check_conversation_batch(batch, vocab_size=trainer.vocab_size, group_size=2)
    env_tokens = batch.roles == ROLE_ENVIRONMENT
    assert bool(env_tokens.any()) and not bool(batch.loss_mask[env_tokens].any())
    assert torch.equal(batch.loss_mask.bool(), batch.roles == ROLE_ASSISTANT)
    assert bool(torch.isnan(batch.sample_logprobs[env_tokens]).all())
    assert int(batch.turn_ids.max()) >= 1, "the conversations should have several turns"
    # observations really sit between assistant turns
    for row in range(batch.size):
        roles = batch.roles[row][batch.attention[row].bool()].tolist()
        switches = sum(a != b for a, b in itertools.pairwise(roles))
        turns = int(batch.turn_ids[row].max()) + 1
        assert switches >= 2 * turns - 1


def _tampered(batch, **fields):
    return dataclasses.replace(batch, **{k: v.clone() for k, v in fields.items()})


def test_an_environment_token_that_carries_loss_is_refused(rolled):
    trainer, got = rolled
    batch = got.batch
    mask = batch.loss_mask.clone()
    row, col = (batch.roles == ROLE_ENVIRONMENT).nonzero()[-1].tolist()
    mask[row, col] = 1.0
    with pytest.raises(BatchIntegrityError, match="environment, tool or padding token"):
        check_conversation_batch(_tampered(batch, loss_mask=mask),
                                 vocab_size=trainer.vocab_size, group_size=2)


def test_relabelling_an_environment_token_as_assistant_is_refused(rolled):
    """Even if roles and mask both claim it, a token that was never sampled has no
    sampling-time log-prob."""
    trainer, got = rolled
    batch = got.batch
    roles, mask, turns = batch.roles.clone(), batch.loss_mask.clone(), batch.turn_ids.clone()
    row, col = (batch.roles == ROLE_ENVIRONMENT).nonzero()[-1].tolist()
    roles[row, col], mask[row, col], turns[row, col] = ROLE_ASSISTANT, 1.0, 0
    with pytest.raises(BatchIntegrityError, match="no sampling-time log-prob"):
        check_conversation_batch(_tampered(batch, roles=roles, loss_mask=mask, turn_ids=turns),
                                 vocab_size=trainer.vocab_size, group_size=2)


def test_a_turn_without_its_reward_is_refused(rolled):
    trainer, got = rolled
    batch = got.batch
    rewards = batch.turn_rewards.clone()
    rewards[0, 0] = float("nan")
    with pytest.raises(BatchIntegrityError, match="turn rewards"):
        check_conversation_batch(_tampered(batch, turn_rewards=rewards),
                                 vocab_size=trainer.vocab_size, group_size=2)


def test_kv_cache_reuse_equals_a_full_recompute(rolled):
    trainer, got = rolled
    batch = got.batch
    trainer.model.eval()
    with torch.no_grad():
        full, _ = conversation_logprobs(trainer.model, batch.ids, batch.attention, 1.0)
    sampled = batch.loss_mask.bool()
    assert torch.allclose(full[sampled], batch.sample_logprobs[sampled], atol=1e-5)


def test_receipts_name_the_conversations_and_turns_learned(tmp_path):
    import json

    trainer = make_trainer(agent_spec(**{"budget.total_updates": 1}), tmp_path / "out")
    trainer.train()
    (receipt,) = [json.loads(x) for x in (tmp_path / "out" / "receipts.jsonl").read_text()
                  .splitlines()]
    convs = receipt["conversations"]
    assert len(convs) == 6 and receipt["failed"] == 0
    assert all(c["learned_turns"] == list(range(c["turns"])) for c in convs)
    assert receipt["assistant_tokens"] > 0 and receipt["environment_tokens"] > 0
    (line, *_) = (tmp_path / "out" / "trajectories" / "update-000001.jsonl").read_text() \
        .splitlines()
    record = json.loads(line)
    assert record["messages"][0]["role"] == "user" and len(record["turn_rewards"]) >= 1
