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
generating are gathered to the front of a spare cache, all layers in one gather per tensor
kind (``DROP_SHARE`` of them at a time), so each later step reads and multiplies only theirs.
A layer's queries, keys and values come from one product (the attention's scale folded into
the queries' weights) and one rotation, and the own values' product adds onto the prompt's
part in one ``baddbmm``: ~160 operators a token step where the exact path runs ~185.

On the built-in model, 256 rows, one thread of this 2-core machine, sampling took ~10% less
time than the exact path at 128-token completions and ~25% less at 512 (where most rows end
long before the last token); at 32 tokens, where few rows end, the same. In the benchmark's
training runs (benchmarks/native_vs_trl.py) that was a 16% faster update at 512 tokens and
one within the machine's noise at 128, whose trained responses run ~90 of the 128 tokens,
so that few rows leave the cache before the last steps. What remains is
mostly the own keys' products (many matrix-vector products, bound by the bytes of keys and
values they read: ~20 GB/s here, the cache's own speed), the layers' matrix products
(bound by their arithmetic), and the dispatch of the small operators around them.

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
from stateset_backend.native.grouped_llama import _as

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
        self.lean, self.prompt, self.s = lean, prompt, group_size
        self.joined = joined or [grouped_llama.Joined.of(layer) for layer in lean.layers]
        self.qkv = [self._scaled_qkv(j) for j in self.joined]
        n = prompt_mask.shape[0]
        like = prompt.last_hidden
        layers, kv, d, t = len(lean.layers), lean.kv_heads, lean.head_dim, max(steps, 1)
        # keys and values, each [layers, rows, kv, T, D], and a spare pair a compaction
        # gathers into (made at the first one); the product reads the keys as a transposed
        # view ([D, T] buffers were slower: each step's write and each compaction strided)
        self.cache = (like.new_empty((layers, n, kv, t, d)), like.new_empty((layers, n, kv, t, d)))
        self.spare: tuple[Tensor, Tensor] | None = None
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
        if self.spare is None:
            self.spare = (torch.empty_like(self.cache[0]), torch.empty_like(self.cache[1]))
        for old, new in zip(self.cache, self.spare, strict=True):
            # straight into the spare's used part: a gather and a copy back into the same
            # buffer took six times as long
            torch.index_select(old[:, :self.rows, :, :self.done], 1, rows,
                               out=new[:, :kept, :, :self.done])
        self.cache, self.spare = self.spare, self.cache
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
        x = lean._embed(tokens if r == n else tokens.index_select(0, self.held))  # [R, hidden]
        cos, sin = self.cos[:r, :, at], self.sin[:r, :, at]  # [R, 1, D]
        for i, layer in enumerate(lean.layers):
            q, k, v = self._project(i, grouped_llama._rms(x, layer.norm_in), cos, sin)
            keys, values = self.cache[0][i, :r], self.cache[1][i, :r]
            keys[:, :, at] = k
            values[:, :, at] = v
            out = self._attend(i, q, keys[:, :, :at + 1].transpose(-1, -2),
                               values[:, :, :at + 1], n)
            x = x + F.linear(out, *layer.o)
            x = x + lean._mlp(layer, grouped_llama._rms(x, layer.norm_post), self.joined[i])
        self.done += 1
        logits = lean.logits(x)
        self.logits = logits if r == n else self.logits.index_copy(0, self.held, logits)
        return self.logits

    def _scaled_qkv(self, joined: grouped_llama.Joined) -> tuple[Tensor, Tensor | None]:
        """A layer's joined query, key and value weight with the queries' rows multiplied by
        the attention's scale (exact where the scale is a power of two, as 1/sqrt(head_dim)
        is for head dims 16, 64 and 256): one operator fewer per layer and step."""
        weight, bias = joined.qkv
        q_rows = self.lean.kv_heads * self.lean.rep * self.lean.head_dim
        scale = torch.ones(weight.shape[0], dtype=weight.dtype, device=weight.device)
        scale[:q_rows] = self.lean.scaling
        return weight * scale[:, None], None if bias is None else bias * scale

    def _project(self, i: int, h: Tensor, cos: Tensor,
                 sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The held rows' (scaled queries [R, kv, rep, D], keys [R, kv, D], values
        [R, kv, D]) of their new token: one product for all three, and one rotation for the
        queries and keys together (as grouped_llama rotates them, a roll against a signed
        sine)."""
        lean, r = self.lean, h.shape[0]
        kv, rep, d = lean.kv_heads, lean.rep, lean.head_dim
        heads = kv * rep
        qkv = F.linear(h, *self.qkv[i]).view(r, heads + 2 * kv, d)
        qk = qkv[:, :heads + kv]
        qk = qk * cos + qk.roll(d // 2, -1) * sin
        return qk[:, :heads].view(r, kv, rep, d), qk[:, heads:], qkv[:, heads + kv:]

    def _attend(self, i: int, q: Tensor, keys: Tensor, values: Tensor, n: int) -> Tensor:
        """[R, H*D]: the held rows' attention over [group prompt | own keys], one softmax.
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
        every = q if r == n else q.new_zeros((n, kv, rep, d)).index_copy_(0, self.held, q)
        every = every.view(g, s, kv, rep, d).transpose(1, 2).reshape(g, kv, s * rep, d)
        to_prompt = (_as(every @ pk_t, torch.float32) + self.prompt.bias).view(g, kv, s, rep * p)
        to_prompt = to_prompt.transpose(1, 2).reshape(n, kv, rep, p)
        if r < n:
            to_prompt = to_prompt.index_select(0, self.held)
        scores = torch.cat([to_prompt, _as(q @ keys, torch.float32)], dim=-1)
        probs = _as(torch.softmax(scores, dim=-1), q.dtype)  # in float32, as the exact path
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
        return out.view(r, kv * rep * d)
