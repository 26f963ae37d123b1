"""Sampling and the learner agree: shared-prompt prefill gives the same log-probs as a plain
full-sequence forward, and sampling-time log-probs match the learner's."""

from __future__ import annotations

import torch

from stateset_backend.native.rollout import positions_from_mask, response_logprobs, sample


def test_shared_prefill_matches_the_full_forward(tiny, make_trainer):
    trainer = make_trainer(tiny(**{"data.max_response_tokens": 4}))
    rows = [trainer.train_rows[i] for i in (0, 1, 2) for _ in range(4)]
    prompt_ids, prompt_mask = trainer._encode(rows)
    g = torch.Generator().manual_seed(0)
    ids, mask, sampled = sample(trainer.model, prompt_ids, prompt_mask, max_new_tokens=4,
                                temperature=0.7, top_p=0.9, eos_id=trainer.tokenizer.eos_token_id,
                                pad_id=trainer.tokenizer.pad_token_id, generator=g,
                                group_size=4)
    shared, _ = response_logprobs(trainer.model, prompt_ids, prompt_mask, ids, mask, 0.7, 4)
    trainer.model.eval()
    full = torch.log_softmax(
        _full_logits(trainer.model, prompt_ids, prompt_mask, ids, mask) / 0.7, -1
    ).gather(-1, ids[..., None]).squeeze(-1)
    on = mask.bool()
    assert torch.allclose(shared[on], full[on], atol=1e-5)
    assert torch.allclose(shared[on], sampled[on], atol=1e-5)


def _full_logits(model, prompt_ids, prompt_mask, response_ids, response_mask):
    ids = torch.cat([prompt_ids, response_ids], dim=1)
    attn = torch.cat([prompt_mask, response_mask], dim=1).long()
    logits = model(input_ids=ids, attention_mask=attn,
                   position_ids=positions_from_mask(attn)).logits
    p, t = prompt_ids.shape[1], response_ids.shape[1]
    return logits[:, p - 1:p + t - 1].float()


def test_gradients_flow_through_the_shared_prompt(tiny, make_trainer):
    trainer = make_trainer(tiny())
    rows = [trainer.train_rows[0]] * 4
    prompt_ids, prompt_mask = trainer._encode(rows)
    ids = torch.randint(4, 100, (4, 2))
    logp, _ = response_logprobs(trainer.model, prompt_ids, prompt_mask, ids,
                                torch.ones(4, 2), 1.0, 4)
    logp.sum().backward()
    grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    assert grads and any(float(g.abs().sum()) > 0 for g in grads)
