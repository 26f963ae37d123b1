"""The ``"fast"`` sampling kernels: a decode step of fewer operators, over only the rows
still generating, at the price of float32 rounding that differs from the exact path's.

The exact decoder (grouped_llama's ``extend``, through rollout's ``_decoder``) runs every
layer's products for every row, finished or not, keeps a per-layer cache that it copies out
row by row (strided) whenever enough rows finish, and adds the attention's prompt and own
parts with separate products. Its operators are the ones every earlier run used, and the
kernel torch picks for the own keys' products changes with their size (a plain loop under 400
multiply-adds, the BLAS above): any other formulation rounds differently once a response
passes ~25 tokens, so the exact path keeps its own and this one is opt-in.

Here one static cache per tensor kind ``[layers, rows, kv_heads, steps, head_dim]`` is
allocated for the whole rollout and written in place, one position per step; only the held
rows run (embedding, projections, attention, head), and as rows finish the ones still
generating are moved to the front of the same cache, all layers in one gather
(``DROP_SHARE`` of them at a time), so each later step reads and multiplies only theirs. The
own values' product adds onto the prompt's part in one ``baddbmm``. On the built-in model at
128-token completions that was ~15% less sampling time than the exact path on this
2-core machine; what remains is mostly the own keys' products (bound by the bytes they read
and the per-matrix cost of many matrix-vector products), the layers' matrix products, and
the dispatch of ~180 operators per token step.

What moves: the own part's scores and weighted sums come from other kernels, and the values'
weighted sum is accumulated onto the prompt's in one call. The tests (test_native_fast_kernels)
bound the difference on the log-probs of the same tokens and say where trajectories may part.
A compiled step (torch.compile) was measured and left out: compiling the attention alone took
~19 s on this machine, more than a 128-token benchmark run's whole training loop.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from stateset_backend.native import grouped_llama

# the held rows are compacted once the finished ones are this share of them: a compaction
# copies the used part of the cache (all layers at once), a held finished row costs its
# share of every later step's products
DROP_SHARE = 0.125


class FastDecoder:
    """A rollout's decoder state: ``first`` holds the first token's logits, ``step`` each
    later one's. Rows come in contiguous groups of ``group_size`` samples of one prompt."""

    def __init__(self, lean: grouped_llama.GroupedLlama, prompt: grouped_llama.PromptKeys,
                 prompt_mask: Tensor, group_size: int, steps: int,
                 joined: list[grouped_llama.Joined] | None) -> None:
        self.lean, self.joined, self.prompt, self.s = lean, joined, prompt, group_size
        n = prompt_mask.shape[0]
        like = prompt.last_hidden
        layers, kv, d, t = len(lean.layers), lean.kv_heads, lean.head_dim, max(steps, 1)
        # keys as [D, T] views of [T, D] buffers: the product reads them transposed, and a
        # [D, T] buffer was slower (each step's write and each compaction strided)
        self.keys = like.new_empty((layers, n, kv, t, d)).transpose(-1, -2)
        self.values = like.new_empty((layers, n, kv, t, d))
        positions = prompt_mask.long().sum(-1)[:, None] + \
            torch.arange(max(steps, 1), device=prompt_mask.device)
        self.cos, self.sin = lean.rope_table(positions, like.dtype)  # [N, 1, steps, D]
        self.first = lean.first_logits(prompt, group_size)
        self.logits = self.first  # [N, vocab]: the held rows' rewritten at each step
        self.held = torch.arange(n, device=prompt_mask.device)  # each held row's batch row
        self.rows = n  # the held rows: the first ``rows`` of the cache and the tables
        self.done = 0

    def _compact(self, alive: Tensor) -> None:
        """Move the held rows still generating to the front, once enough have finished."""
        keep = alive.index_select(0, self.held)
        kept = int(keep.sum())
        if kept > (1 - DROP_SHARE) * self.rows or kept == 0:
            return
        rows = keep.nonzero().squeeze(-1)
        done = self.done
        self.keys[:, :kept, ..., :done] = self.keys[:, :self.rows, ..., :done].index_select(1, rows)
        self.values[:, :kept, :, :done] = self.values[:, :self.rows, :, :done].index_select(1, rows)
        self.cos[:kept] = self.cos[:self.rows].index_select(0, rows)
        self.sin[:kept] = self.sin[:self.rows].index_select(0, rows)
        self.held = self.held.index_select(0, rows)
        self.rows = kept

    def step(self, tokens: Tensor, alive: Tensor | None = None) -> Tensor:
        """[N, vocab]: the next token's logits of the held rows (tokens: [N], the last ones
        sampled); a row dropped as finished keeps its last logits, of no meaning."""
        if alive is not None:
            self._compact(alive)
        lean, r, at = self.lean, self.rows, self.done
        n = tokens.shape[0]
        x = lean._embed((tokens if r == n else tokens.index_select(0, self.held))[:, None])
        cos, sin = self.cos[:r, :, at:at + 1], self.sin[:r, :, at:at + 1]
        for i, layer in enumerate(lean.layers):
            joined = self.joined[i] if self.joined else None
            q, k, v = lean._qkv(layer, grouped_llama._rms(x, layer.norm_in), cos, sin, joined)
            keys, values = self.keys[i, :r], self.values[i, :r]
            keys[..., at] = k[:, :, 0]
            values[:, :, at] = v[:, :, 0]
            out = self._attend(i, q, keys[..., :at + 1], values[:, :, :at + 1], n)
            x = x + F.linear(out, *layer.o)
            x = x + lean._mlp(layer, grouped_llama._rms(x, layer.norm_post), joined)
        self.done += 1
        logits = lean.logits(x[:, -1])
        self.logits = logits if r == n else self.logits.index_copy(0, self.held, logits)
        return self.logits

    def _attend(self, i: int, q: Tensor, keys: Tensor, values: Tensor, n: int) -> Tensor:
        """[R, 1, H*D]: the held rows' attention over [group prompt | own keys], one softmax.
        ``keys``: [R, kv, D, T], a transposed view.

        The prompt's part stays one product per group and kv head (its keys are read in
        place, not copied to each row: copied, they were half again the bytes each step
        read from the cache, and this part is bound by those bytes); the held rows' queries
        are put in their batch places for it (zeros elsewhere) and their scores taken back.
        """
        lean, r, s = self.lean, self.rows, self.s
        kv, rep, d = lean.kv_heads, lean.rep, lean.head_dim
        g = n // s
        pk_t, pv = self.prompt.operands(i)
        p = pk_t.shape[-1]
        q = (q * lean.scaling).reshape(r, kv, rep, d)
        every = q if r == n else q.new_zeros((n, kv, rep, d)).index_copy_(0, self.held, q)
        every = every.view(g, s, kv, rep, d).transpose(1, 2).reshape(g, kv, s * rep, d)
        to_prompt = (every @ pk_t + self.prompt.bias).view(g, kv, s, rep * p)
        to_prompt = to_prompt.transpose(1, 2).reshape(n, kv, rep, p)
        if r < n:
            to_prompt = to_prompt.index_select(0, self.held)
        scores = torch.cat([to_prompt, q @ keys], dim=-1)
        probs = torch.softmax(scores, dim=-1)
        from_prompt, from_own = probs.split_with_sizes([p, probs.shape[-1] - p], dim=-1)
        if r < n:
            from_prompt = from_prompt.new_zeros((n, kv, rep, p)).index_copy_(0, self.held,
                                                                             from_prompt)
        from_prompt = from_prompt.reshape(g, s, kv, rep * p).transpose(1, 2)
        from_prompt = from_prompt.reshape(g, kv, s * rep, p) @ pv
        from_prompt = from_prompt.view(g, kv, s, rep, d).transpose(1, 2).reshape(n, kv, rep, d)
        if r < n:
            from_prompt = from_prompt.index_select(0, self.held)
        out = torch.baddbmm(from_prompt.view(r * kv, rep, d),
                            from_own.reshape(r * kv, rep, -1), values.reshape(r * kv, -1, d))
        return out.view(r, 1, kv * rep * d)
