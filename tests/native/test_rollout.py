"""Sampling and the learner agree: shared-prompt prefill gives the same log-probs as a plain
full-sequence forward, and sampling-time log-probs match the learner's."""

from __future__ import annotations

import pytest
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


# -- the grouped forward computes what the model's own forward does --------------------------

def _llama_family(kind: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    # grouped-query attention (4 heads over 2 key/value heads); Qwen2 adds q/k/v biases
    shape = dict(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                 pad_token_id=0)  # the padding row of the embedding gets no gradient
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=True))
    return Qwen2ForCausalLM(Qwen2Config(**shape))


def _grouped_batch(groups: int = 3, size: int = 4, prompt: int = 7, response: int = 5):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 50, (groups, prompt), generator=g)
    mask = torch.ones(groups, prompt)
    mask[0, :3] = 0  # left padding of different widths
    mask[1, :1] = 0
    ids[mask == 0] = 0
    rids = torch.randint(4, 50, (groups * size, response), generator=g)
    rmask = torch.ones(groups * size, response)
    rmask[2, 3:] = 0  # responses that ended early
    rmask[5, 1:] = 0
    rids[rmask == 0] = 0
    return (ids.repeat_interleave(size, 0), mask.repeat_interleave(size, 0), rids, rmask, size)


def _through(model, monkeypatch, grouped: bool):
    from stateset_backend.native import grouped_llama

    with monkeypatch.context() as m:
        if not grouped:
            m.setattr(grouped_llama, "supports", lambda model: False)
        pids, pmask, rids, rmask, size = _grouped_batch()
        model.zero_grad()
        logp, entropy = response_logprobs(model, pids, pmask, rids, rmask, 0.8, size)
        ((logp * rmask).sum() + 0.1 * (entropy * rmask).sum()).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        kwargs = dict(max_new_tokens=6, temperature=1.0, top_p=0.95, eos_id=3, pad_id=0,
                      group_size=size)
        from stateset_backend.native.rollout import group_generators

        sampled = sample(model, pids, pmask, generator=group_generators(1, 2, range(3)),
                         **kwargs)
        greedy = sample(model, pids, pmask, generator=None, greedy=True, **kwargs)
    return logp, entropy, grads, sampled, greedy, rmask.bool()


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("fused_from", [1, 1000], ids=["fused-attention", "in-place-attention"])
def test_the_grouped_forward_computes_what_the_model_computes(kind, fused_from, monkeypatch):
    """Log-probs, entropies, every parameter's gradient, sampled and greedy tokens: the same
    through the grouped forward as through the model's own (float32 rounding apart), with
    the prompt's keys read in place and through the fused kernel."""
    from stateset_backend.native import grouped_llama

    monkeypatch.setattr(grouped_llama, "FUSED_FROM_TOKENS", fused_from)
    model = _llama_family(kind)
    assert grouped_llama.supports(model)
    own = _through(model, monkeypatch, grouped=False)
    grouped = _through(model, monkeypatch, grouped=True)
    on = own[5]
    assert torch.allclose(own[0][on], grouped[0][on], atol=1e-5)
    assert torch.allclose(own[1][on], grouped[1][on], atol=1e-5)
    for a, b in zip(own[2], grouped[2], strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    for a, b in ((own[3], grouped[3]), (own[4], grouped[4])):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert torch.allclose(torch.nan_to_num(a[2]), torch.nan_to_num(b[2]), atol=1e-5)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_the_decode_shortcuts_give_the_step_by_step_numbers_bit_for_bit(kind, monkeypatch):
    """Without gradients (sampling, the KL reference) each layer's query, key and value
    products run as one, and its gate and up products as one; sampling reads the rotary
    angles from a table built once per rollout, and drops finished rows from its KV cache
    as they finish. None of it may move a number: sampled tokens, their log-probs and the
    reference's log-probs equal, bit for bit, what separate products, angles computed at
    every step and every row's whole cache give."""
    from stateset_backend.native import grouped_llama, rollout
    from stateset_backend.native.rollout import group_generators, response_token_logprobs

    model = _llama_family(kind)
    pids, pmask, _, _, size = _grouped_batch()
    drops = []

    def decode():
        kwargs = dict(max_new_tokens=24, temperature=0.9, top_p=1.0, eos_id=3, pad_id=0,
                      group_size=size)
        drawn = sample(model, pids, pmask, generator=group_generators(1, 2, range(3)),
                       **kwargs)
        greedy = sample(model, pids, pmask, generator=None, greedy=True, **kwargs)
        with torch.no_grad():
            reference = response_token_logprobs(model, pids, pmask, drawn[0], drawn[1], 0.9,
                                                 size)
        return [*drawn, *greedy, reference]

    drop = rollout._drop_finished

    def counted(buffers, live, alive, done):
        got = drop(buffers, live, alive, done)
        if got[1] is not live:
            drops.append(got[1].numel())
        return got

    monkeypatch.setattr(rollout, "DROP_SHARE", 0.01)  # drop at every row that finishes
    monkeypatch.setattr(rollout, "_drop_finished", counted)
    shortcut = decode()
    extend = grouped_llama.GroupedLlama.extend

    def step_by_step(self, *args, rope=None, joined=None, live=None, **kwargs):
        return extend(self, *args, **kwargs)  # angles from the positions, separate products

    with monkeypatch.context() as m:
        m.setattr(grouped_llama.GroupedLlama, "joined", lambda self: None)
        m.setattr(grouped_llama.GroupedLlama, "extend", step_by_step)
        m.setattr(rollout, "_drop_finished", lambda buffers, live, alive, done: (buffers, live))
        plain = decode()
    assert shortcut[0].shape[1] > 12  # long enough for the cache and the table to matter
    assert len(drops) >= 2 and drops[-1] < pids.shape[0]  # rows finished and were dropped
    for a, b in zip(shortcut, plain, strict=True):
        assert torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_the_packed_learner_computes_what_the_whole_batch_computes(kind, monkeypatch):
    """Long responses run in chunks of rows of similar lengths, each only as far as its
    longest response. At every real position the log-probs, entropies, the reference's
    log-probs and every parameter's gradient are the whole batch's within 1e-5, the
    tolerance of the grouped forward against the model's own: not bit for bit, because a
    chunk's products sum over other rows and another length, and float32 rounds those sums
    differently. Padding positions are not compared: the loss multiplies them by the mask."""
    from stateset_backend.native import rollout
    from stateset_backend.native.rollout import response_token_logprobs

    monkeypatch.setattr(rollout, "PACK_ROWS", 4)
    model = _llama_family(kind)
    pids, pmask, _, _, size = _grouped_batch()
    g = torch.Generator().manual_seed(3)
    rids = torch.randint(4, 50, (pids.shape[0], 12), generator=g)
    ends = torch.tensor([12, 3, 9, 1, 12, 7, 5, 11, 2, 12, 8, 6])
    rmask = (torch.arange(12) < ends[:, None]).float()
    rids[rmask == 0] = 0

    def learner():
        model.zero_grad()
        logp, entropy = response_logprobs(model, pids, pmask, rids, rmask, 0.8, size)
        ((logp * rmask).sum() + 0.1 * (entropy * rmask).sum()).backward()
        with torch.no_grad():
            reference = response_token_logprobs(model, pids, pmask, rids, rmask, 0.8, size)
        return (logp.detach(), entropy.detach(), reference,
                [p.grad.clone() for p in model.parameters()])

    assert [longest for _, longest in rollout._packed(rmask)] == [12, 9, 5]
    packed = learner()
    with monkeypatch.context() as m:
        m.setattr(rollout, "_packed", lambda mask: None)
        whole = learner()
    on = rmask.bool()
    for a, b in zip(packed[:3], whole[:3], strict=True):
        assert torch.allclose(a[on], b[on], atol=1e-5) and a.isfinite().all()
    for a, b in zip(packed[3], whole[3], strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_what_the_grouped_forward_does_not_reproduce_takes_the_models_own(tiny, make_trainer):
    from transformers import MistralConfig, MistralForCausalLM

    from stateset_backend.native import grouped_llama

    assert grouped_llama.supports(make_trainer(tiny()).model)
    llama = _llama_family("llama")
    llama.config.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
    assert not grouped_llama.supports(llama)
    checkpointed = _llama_family("llama")
    checkpointed.activation_checkpointing_enable()
    assert not grouped_llama.supports(checkpointed)
    windowed = MistralForCausalLM(MistralConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=16))
    assert not grouped_llama.supports(windowed)


# -- the sampler draws from the distribution it records ----------------------------------

def test_the_draw_follows_the_probabilities_and_never_takes_a_filtered_token():
    from stateset_backend.native.rollout import draw, uniforms

    probs = torch.tensor([[0.5, 0.0, 0.3, 0.2, 0.0]]).repeat(20000, 1)
    tokens = draw(probs, uniforms(torch.Generator().manual_seed(3), 20000, 1, 1)[:, 0])
    counts = torch.bincount(tokens, minlength=5).double() / 20000
    assert counts[1] == 0 and counts[4] == 0
    assert torch.allclose(counts, probs[0].double(), atol=0.015)
    # the very top of the unit interval still lands on a token that has probability
    edge = draw(torch.tensor([[0.25, 0.75, 0.0]]), torch.tensor([1.0 - 1e-17]))
    assert edge.tolist() == [1]


def test_each_group_draws_from_its_own_generator_whatever_else_is_in_the_batch():
    from stateset_backend.native.rollout import group_generators, uniforms

    both = uniforms(group_generators(7, 1, range(2)), 8, 3, 4)
    second_alone = uniforms(group_generators(7, 1, range(1, 2)), 4, 3, 4)
    assert torch.equal(both[4:], second_alone)


def test_prompts_tokenized_once_are_padded_as_the_tokenizer_pads_them(tiny, make_trainer):
    trainer = make_trainer(tiny())
    rows = [trainer.train_rows[i] for i in (3, 0, 3, 1)]
    ids, mask = trainer._encode(rows)
    enc = trainer.tokenizer([r.prompt for r in rows], padding=True, padding_side="left",
                            return_tensors="pt")
    assert torch.equal(ids, enc["input_ids"])
    assert torch.equal(mask, enc["attention_mask"].float())


def test_the_grouped_forward_is_built_once_per_model_and_again_after_a_move():
    from stateset_backend.native import grouped_llama

    model = _llama_family("llama")
    lean = grouped_llama.GroupedLlama.of(model)
    assert grouped_llama.GroupedLlama.of(model) is lean
    model.to(torch.float64)
    moved = grouped_llama.GroupedLlama.of(model)
    assert moved is not lean and moved.layers[0].q[0].dtype == torch.float64


def test_rms_norm_in_one_call_is_the_llama_formula_bit_for_bit():
    """The grouped forward's CPU float32 RMSNorm goes through torch's rms_norm: the same
    numbers and gradients as the formula the model's own RMSNorm computes."""
    from stateset_backend.native.grouped_llama import _rms

    g = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(5, 7, 32, generator=g)).requires_grad_()
    weight = torch.randn(32, generator=g).requires_grad_()
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    formula = weight * h
    fused = _rms(x, (weight, 1e-6))
    assert torch.equal(fused, formula)
    up = torch.randn(5, 7, 32, generator=g)
    for a, b in zip(torch.autograd.grad(fused, (x, weight), up),
                    torch.autograd.grad(formula, (x, weight), up), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_shared_token_budget_gives_longer_prompts_shorter_responses(kind):
    """With ``max_total_tokens`` a row's prompt and response share one budget: a row that
    reaches it ends as one that reaches ``max_new_tokens`` (no EOS, its tokens so far), and
    what every row draws up to its end is what it draws without the budget, bit for bit."""
    from stateset_backend.native.rollout import group_generators

    model = _llama_family(kind)
    pids, pmask, _, _, size = _grouped_batch()  # prompts of 4, 6 and 7 tokens
    kwargs = dict(max_new_tokens=10, temperature=0.9, top_p=1.0, eos_id=-1, pad_id=0,
                  group_size=size)

    def drawn(**budget):
        return sample(model, pids, pmask, generator=group_generators(1, 2, range(3)),
                      **kwargs, **budget)

    free, capped = drawn(), drawn(max_total_tokens=12)
    assert torch.equal(free[0], drawn(max_total_tokens=None)[0])
    prompt = pmask.sum(-1).long()
    lengths = capped[1].sum(-1).long()
    assert sorted(set(prompt.tolist())) == [4, 6, 7]
    assert torch.equal(lengths, (12 - prompt).clamp(max=10))
    assert (free[1].sum(-1) == 10).all()  # no EOS: without the budget every row runs to 10
    on = capped[1].bool()
    assert torch.equal(capped[0][on], free[0][:, :capped[0].shape[1]][on])
    assert torch.equal(capped[2][on], free[2][:, :capped[2].shape[1]][on])
    assert torch.isnan(capped[2][~on]).all()
    # a prompt that already fills the budget still gets one token: no row is left empty
    assert (drawn(max_total_tokens=5)[1].sum(-1) == 1).all()
