"""The native engine's ``sampling.kernels: "fast"`` against ``"exact"``.

The fast decode step (stateset_backend/native/fast_decode.py) computes the same attention as
the exact one, with other operators: the prompt's and the own keys' values summed in one
product instead of two added together, every row's own keys in one product over a static
cache, and only the rows still generating. Float32 sums in another order round differently,
so its logits differ from the exact path's in the last bits (the log-probs below by at most
``TOLERANCE``, measured ~1e-6 on these models and on the built-in one at 128 tokens).

Where trajectories may part: a sampled token is the first whose cumulative probability passes
the row's uniform draw, so a token differs only where a draw falls within that rounding of a
boundary between two tokens' intervals (or where two greedy logits tie within it), about one
token in a million; from there on the row's continuation is another one altogether. Short
responses, and these long ones, draw the same tokens; a long run over many updates may not,
which is why ``"fast"`` is an opt-in and ``"exact"``, bit for bit every earlier run's numbers,
the default.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from stateset_backend.native import fast_decode, grouped_llama, rollout  # noqa: E402
from stateset_backend.native.rollout import group_generators, sample  # noqa: E402

# the largest difference allowed between the two paths' log-probs of the same token
TOLERANCE = 1e-5
GROUPS, SIZE, EOS = 3, 4, 3


def _model(kind: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    # grouped-query attention (4 heads over 2 key/value heads); Qwen2 adds q/k/v biases
    shape = dict(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                 pad_token_id=0)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=True))
    return Qwen2ForCausalLM(Qwen2Config(**shape))


def _prompts():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(4, 50, (GROUPS, 7), generator=g)
    mask = torch.ones(GROUPS, 7)
    mask[0, :3] = 0  # left padding of different widths
    mask[1, :1] = 0
    ids[mask == 0] = 0
    return ids.repeat_interleave(SIZE, 0), mask.repeat_interleave(SIZE, 0)


def _sample(model, kernels: str, steps: int, **kwargs):
    ids, mask = _prompts()
    args = dict(max_new_tokens=steps, temperature=0.9, top_p=1.0, eos_id=EOS, pad_id=0,
                group_size=SIZE, generator=group_generators(1, 2, range(GROUPS)))
    return sample(model, ids, mask, **{**args, **kwargs}, kernels=kernels)


def _teacher_forced(model, response_ids, response_mask):
    """The fast decoder's log-prob of each given token, fed the given tokens (not its own
    draws), dropping rows as they end just as sampling does."""
    ids, mask = _prompts()
    lean = grouped_llama.GroupedLlama.of(model)
    joined = lean.joined()
    prompt = rollout._encode_prompts(lean, ids, mask, SIZE, joined)
    t = response_ids.shape[1]
    fast = fast_decode.FastDecoder(lean, prompt, mask, SIZE, t, joined)
    logits, out = fast.first, []
    for step in range(t):
        logp = torch.log_softmax(logits.float() / 0.9, -1)
        out.append(logp.gather(-1, response_ids[:, step:step + 1]).squeeze(-1))
        if step < t - 1:
            alive = response_mask[:, step + 1] > 0
            logits = fast.step(response_ids[:, step], alive)
    return torch.stack(out, 1)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_fast_log_probs_of_the_same_tokens_are_the_exact_ones_within_tolerance(kind,
                                                                            monkeypatch):
    """Fed the exact path's own 40-token trajectories, the fast decoder gives each token a
    log-prob within ``TOLERANCE`` of the one the exact path recorded, while finished rows
    leave its cache (compacted at every row that ends, the most often it can be)."""
    monkeypatch.setattr(fast_decode, "DROP_SHARE", 0.01)
    model = _model(kind)
    with torch.no_grad():
        ids, mask, exact = _sample(model, "exact", 40)
        ended = (mask.sum(-1) < 40).sum()
        assert 0 < ended < mask.shape[0]  # some rows end early, some run to the end
        fast = _teacher_forced(model, ids, mask)
    on = mask.bool()
    assert (fast[on] - exact[on]).abs().max() <= TOLERANCE


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_with_the_same_seed_fast_draws_the_exact_paths_tokens(kind, monkeypatch):
    """Sampled, greedy, and under a shared prompt-and-response budget: the same tokens and
    masks; the log-probs within ``TOLERANCE`` (NaN after each row's end on both sides). Short
    (8 tokens) and long enough (48) that rows end and leave the fast cache."""
    monkeypatch.setattr(fast_decode, "DROP_SHARE", 0.05)
    model = _model(kind)
    for steps, kwargs in ((8, {}), (48, {}), (48, {"greedy": True, "generator": None}),
                          (24, {"max_total_tokens": 20})):
        exact = _sample(model, "exact", steps, **kwargs)
        fast = _sample(model, "fast", steps, **kwargs)
        assert torch.equal(exact[0], fast[0]) and torch.equal(exact[1], fast[1])
        assert torch.equal(torch.isnan(exact[2]), torch.isnan(fast[2]))
        on = exact[1].bool()
        assert (exact[2][on] - fast[2][on]).abs().max() <= TOLERANCE


def test_the_fast_cache_drops_finished_rows_and_keeps_the_rest_in_order(monkeypatch):
    """A compaction keeps the rows still generating, in batch order, with their keys."""
    monkeypatch.setattr(fast_decode, "DROP_SHARE", 0.01)
    held = []
    compact = fast_decode.FastDecoder._compact

    def watched(self, alive):
        compact(self, alive)
        held.append(self.held[:self.rows].clone())

    monkeypatch.setattr(fast_decode.FastDecoder, "_compact", watched)
    _, mask, _ = _sample(_model("llama"), "fast", 48)
    assert held[-1].numel() < held[0].numel()
    for rows in held:
        assert torch.equal(rows, rows.sort().values)
    ends = mask.sum(-1).long()
    for step, rows in enumerate(held):  # the held rows include every one still generating
        generating = (ends > step + 1).nonzero().squeeze(-1)
        assert set(generating.tolist()) <= set(rows.tolist())


def test_exact_never_runs_the_fast_decoder(monkeypatch):
    """``"exact"`` (the default) is the decoder every earlier run used: the fast one is not
    built at all (tests/native/test_rollout.py holds its numbers bit for bit)."""
    def refused(*args, **kwargs):
        raise AssertionError("the fast decoder ran for exact kernels")

    monkeypatch.setattr(fast_decode, "FastDecoder", refused)
    model = _model("llama")
    ids, mask = _prompts()
    sample(model, ids, mask, max_new_tokens=4, temperature=1.0, top_p=1.0, eos_id=EOS,
           pad_id=0, generator=None, group_size=SIZE)
    _sample(model, "exact", 4)


def test_a_model_the_grouped_forward_does_not_cover_is_refused_fast_kernels(monkeypatch):
    """Where the grouped forward does not run (here: any model it does not support), the
    model's own forward is the only one: ``"fast"`` is an error, never a silent exact run
    (the trainer refuses it at start, before any sampling)."""
    monkeypatch.setattr(grouped_llama, "supports", lambda model: False)
    model = _model("llama")
    _sample(model, "exact", 6)
    with pytest.raises(ValueError, match="Llama-family forward"):
        _sample(model, "fast", 6)


@pytest.mark.parametrize("kernels", ["Fast", "", "compiled", None])
def test_an_unknown_kernels_value_is_refused(kernels):
    with pytest.raises(ValueError, match="sampling kernels"):
        _sample(_model("llama"), kernels, 2)


def test_a_half_precision_model_samples_through_the_fast_path():
    """Scores and their softmax in float32, the products in the model's dtype, as the exact
    path computes them: a bfloat16 model's tokens and log-probs come out whole (its rounding
    is too coarse to compare the two paths token by token)."""
    model = _model("qwen2").to(torch.bfloat16)
    ids, mask, logps = _sample(model, "fast", 12)
    on = mask.bool()
    assert ids.shape == mask.shape == logps.shape == (GROUPS * SIZE, ids.shape[1])
    assert torch.isfinite(logps[on]).all() and (logps[on] <= 0).all()
    assert torch.isnan(logps[~on]).all()
