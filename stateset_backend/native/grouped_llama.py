"""A Llama-family forward that runs each prompt once per group and never copies its keys.

GRPO samples a group of completions of one prompt. Through Hugging Face's forward, sharing the
prompt means expanding its KV cache to every sample (``batch_repeat_interleave``) and then
concatenating each new token onto every copy: with 16 samples of a 48-token prompt and 2-token
completions, those copies (and their backward) were the largest cost of an update, larger than
the matrix products. Here a response token's attention is split in two: its group's prompt
keys, read in place by one batched product per group, and its own response keys. One softmax
runs over both, so the result is the same attention, computed without the copies.

It reads the model's own parameters (no copy: checkpoints, the optimizer and LoRA-free
training see the same tensors) and is used only where it computes exactly what the model's
forward does: the architectures and settings ``supports`` accepts. Everything else goes
through the model's own forward.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

# response tokens per row from which attention copies the prompt's keys to each sample and
# runs torch's fused kernel: below it (token-by-token decoding, short completions) the copies
# cost more than the scores they avoid materialising
FUSED_FROM_TOKENS = 8
# model_type -> the config switches whose non-default values this forward does not implement
_SUPPORTED = {"llama": (), "qwen2": ("use_sliding_window",), "mistral": ("sliding_window",)}


def supports(model: Any) -> bool:
    """True when ``model`` is a plain Llama-family causal LM this forward reproduces: default
    RoPE, no attention dropout, no sliding window, no tensor-parallel split, not wrapped by an
    adapter library, and not checkpointing activations (whose memory trade it would undo).

    The architecture's part of the answer is taken once per model: its config and modules do
    not change while it trains, and asking again at every forward cost a small model's update
    as much as a layer's operators. Whether it checkpoints activations, a switch that turns on
    and off, is read at every call."""
    try:
        switches = _ARCHITECTURES[model]
    except KeyError:
        switches = _ARCHITECTURES[model] = _architecture(model)
    except TypeError:  # not weakly referenceable: asked every time
        switches = _architecture(model)
    return switches is not None and not any(m.gradient_checkpointing for m in switches)


# model -> the modules whose ``gradient_checkpointing`` switch it has (transformers' own
# ``is_activation_checkpointing`` reads the same ones), or None when the forward does not fit it
_ARCHITECTURES: weakref.WeakKeyDictionary[Any, tuple[Any, ...] | None] = \
    weakref.WeakKeyDictionary()


_BUILT: weakref.WeakKeyDictionary[Any, GroupedLlama] = weakref.WeakKeyDictionary()


def _architecture(model: Any) -> tuple[Any, ...] | None:
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in _SUPPORTED:
        return None
    if hasattr(model, "get_base_model"):
        return None
    if any(getattr(config, name, None) for name in _SUPPORTED[config.model_type]):
        return None
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        return None
    if getattr(config, "attention_dropout", 0.0) or getattr(config, "pretraining_tp", 1) != 1:
        return None
    base = getattr(model, "model", None)
    if base is None or not all(hasattr(base, name) for name in
                               ("embed_tokens", "layers", "norm", "rotary_emb")) or \
            not hasattr(base.norm, "variance_epsilon") or not hasattr(model, "lm_head"):
        return None
    return tuple(m for m in model.modules() if hasattr(m, "gradient_checkpointing"))


@dataclass
class PromptKeys:
    """Per layer, the keys and values of each group's prompt: [G, kv_heads, P, head_dim]."""

    keys: list[Tensor]
    values: list[Tensor]
    bias: Tensor  # [G, 1, 1, P]: 0 where a prompt token is real, -inf on left padding
    last_hidden: Tensor  # [G, hidden]: the final hidden state at each prompt's last position
    _operands: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict, repr=False)

    def operands(self, layer: int) -> tuple[Tensor, Tensor]:
        """The layer's keys, transposed, and values, each contiguous: as the per-group
        products read them. Both are strided views of the projections (heads before
        positions), which the product copied into this layout at every token step; made
        once per prompt instead, the product reads the same numbers in the same layout."""
        got = self._operands.get(layer)
        if got is None:
            got = self._operands[layer] = (self.keys[layer].transpose(-1, -2).contiguous(),
                                           self.values[layer].contiguous())
        return got


@dataclass(frozen=True)
class _Layer:
    """One decoder layer's parameters, read once per call instead of through module lookups
    and module calls for every token step (their overhead was a tenth of a small model's
    decode step)."""

    norm_in: tuple[Tensor, float]
    norm_post: tuple[Tensor, float]
    q: tuple[Tensor, Tensor | None]
    k: tuple[Tensor, Tensor | None]
    v: tuple[Tensor, Tensor | None]
    o: tuple[Tensor, Tensor | None]
    gate: tuple[Tensor, Tensor | None]
    up: tuple[Tensor, Tensor | None]
    down: tuple[Tensor, Tensor | None]
    act: Any

    @staticmethod
    def of(layer: Any) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp

        def lin(m: Any) -> tuple[Tensor, Tensor | None]:
            return m.weight, m.bias

        def norm(m: Any) -> tuple[Tensor, float]:
            return m.weight, m.variance_epsilon

        return _Layer(norm(layer.input_layernorm), norm(layer.post_attention_layernorm),
                      lin(attn.q_proj), lin(attn.k_proj), lin(attn.v_proj), lin(attn.o_proj),
                      lin(mlp.gate_proj), lin(mlp.up_proj), lin(mlp.down_proj),
                      # the activation's own function, without a module call (as the layers')
                      getattr(mlp.act_fn, "forward", mlp.act_fn))


@dataclass(frozen=True)
class Joined:
    """A layer's projections that read the same input, as one matrix each (GroupedLlama.joined):
    built for one no-gradient call from the parameters as they are then."""

    qkv: tuple[Tensor, Tensor | None]
    qkv_sizes: tuple[int, int, int]
    gate_up: tuple[Tensor, Tensor | None]

    @staticmethod
    def of(layer: _Layer) -> Joined:
        def cat(*parts: tuple[Tensor, Tensor | None]) -> tuple[Tensor, Tensor | None]:
            biases = [b for _, b in parts]
            if any(b is None for b in biases) and any(b is not None for b in biases):
                # one projection with a bias, one without: the missing bias is zero
                biases = [b if b is not None else w.new_zeros(w.shape[0])
                          for (w, _), b in zip(parts, biases, strict=True)]
            bias = None if biases[0] is None else torch.cat(biases)  # type: ignore[arg-type]
            return torch.cat([w for w, _ in parts]), bias

        return Joined(cat(layer.q, layer.k, layer.v),
                       (layer.q[0].shape[0], layer.k[0].shape[0], layer.v[0].shape[0]),
                       cat(layer.gate, layer.up))


def _as(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x.to(dtype)``, without the operator call where ``x`` already has it (the call then
    returns ``x`` itself, but costs a dispatch: a tenth of a small model's operators were
    such calls)."""
    return x if x.dtype == dtype else x.to(dtype)


def _rms(x: Tensor, norm: tuple[Tensor, float]) -> Tensor:
    """RMSNorm as the Llama family computes it: in float32, then scaled in the input dtype.

    On the CPU, in float32, torch's ``rms_norm`` is composed of these same operations in the
    same order (the same numbers and gradients, which the tests check bit for bit), in one
    call instead of six: a tenth of a small model's operators were these."""
    weight, eps = norm
    if x.dtype == weight.dtype == torch.float32 and x.device.type == "cpu":
        return F.rms_norm(x, weight.shape, weight, eps)
    h = _as(x, torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * _as(h, x.dtype)


class GroupedLlama:
    """The model's parameters read as a function of (prompts, responses in groups)."""

    @staticmethod
    def of(model: Any) -> GroupedLlama:
        """The grouped forward of ``model``, built at its first use and kept with it: it holds
        the model's own parameter tensors, which stay the model's (weights load into them in
        place; the optimizer steps the same tensors), and reading them again through the
        modules at every forward cost a small model's update more than a layer's operators.
        It is built again when the model has moved to another device or dtype (its rotary
        buffer is then a new tensor)."""
        lean = _BUILT.get(model)
        if lean is None or lean.rotary is not model.model.rotary_emb.inv_freq:
            lean = _BUILT[model] = GroupedLlama(model)
        return lean

    def __init__(self, model: Any) -> None:
        base = model.model
        # the padding row gets no gradient, as in the model's own embedding
        self.embed = (base.embed_tokens.weight, base.embed_tokens.padding_idx)
        self.norm = (base.norm.weight, base.norm.variance_epsilon)
        self.head = (model.lm_head.weight, model.lm_head.bias)
        # both halves of the rotary frequencies, and the scale with the rotation's sign folded
        # in (see _rope): computed once here instead of in every call
        self.rotary = base.rotary_emb.inv_freq
        inv_freq = _as(self.rotary, torch.float32)
        self.inv_freq = torch.cat((inv_freq, inv_freq))
        scale = base.rotary_emb.attention_scaling
        half = inv_freq.shape[0]
        self.cos_scale = None if scale == 1.0 else scale
        self.sin_scale = torch.full((2 * half,), scale, dtype=torch.float32,
                                    device=inv_freq.device)
        self.sin_scale[:half] = -scale
        self.layers = [_Layer.of(layer) for layer in base.layers]
        attn = base.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.kv_heads = model.config.num_key_value_heads
        self.rep = model.config.num_attention_heads // self.kv_heads

    # -- the pieces, as the model's own modules compute them -----------------------------
    def _rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(cos, signed sin) of each position's rotary angles, scaled as the model scales them.

        The model rotates with ``x * cos + rotate_half(x) * sin``, where rotate_half negates
        the second half of ``x`` and swaps the halves. Negating the first half of ``sin``
        instead gives the same numbers (a negation is exact) with one ``roll`` of ``x`` in
        place of a negation, two slices and a concatenation for each of the queries and keys
        of every layer."""
        emb = positions[..., None].float() * self.inv_freq
        cos = emb.cos() if self.cos_scale is None else emb.cos() * self.cos_scale
        sin = emb.sin() * self.sin_scale
        return _as(cos, dtype)[:, None], _as(sin, dtype)[:, None]

    @staticmethod
    def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return x * cos + x.roll(x.shape[-1] // 2, -1) * sin

    def _qkv(self, layer: _Layer, x: Tensor, cos: Tensor, sin: Tensor,
             joined: Joined | None = None) -> tuple[Tensor, Tensor, Tensor]:
        b, t, _ = x.shape
        if joined is None:
            q = F.linear(x, *layer.q)
            k = F.linear(x, *layer.k)
            v = F.linear(x, *layer.v)
        else:
            q, k, v = F.linear(x, *joined.qkv).split(joined.qkv_sizes, dim=-1)
        q = q.view(b, t, -1, self.head_dim).transpose(1, 2)
        k = k.view(b, t, -1, self.head_dim).transpose(1, 2)
        v = v.view(b, t, -1, self.head_dim).transpose(1, 2)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin), v

    @staticmethod
    def _mlp(layer: _Layer, x: Tensor, joined: Joined | None = None) -> Tensor:
        if joined is None:
            gate, up = F.linear(x, *layer.gate), F.linear(x, *layer.up)
        else:
            gate, up = F.linear(x, *joined.gate_up).chunk(2, dim=-1)
        return F.linear(layer.act(gate) * up, *layer.down)

    def joined(self) -> list[Joined] | None:
        """Each layer's query, key and value weights as one matrix, and its gate and up
        weights as another, where no gradient is taken (sampling, the KL reference).

        One product then does the work of three (and of two) at every token step: each
        output column is the same dot product over the same inputs, so the numbers are the
        ones the separate products give, bit for bit (the tests compare them). With a
        gradient the separate products stay: the joined one would sum the input's gradient
        in one product instead of three, in another order, and round differently."""
        if torch.is_grad_enabled():
            return None
        return [Joined.of(layer) for layer in self.layers]

    def _embed(self, ids: Tensor) -> Tensor:
        weight, padding_idx = self.embed
        return F.embedding(ids, weight, padding_idx)

    def logits(self, hidden: Tensor) -> Tensor:
        return F.linear(_rms(hidden, self.norm), *self.head)

    def first_logits(self, prompt: PromptKeys, group_size: int) -> Tensor:
        """[G*S, vocab]: the logits of each sample's first token, from its group's prompt."""
        return self.logits(prompt.last_hidden).repeat_interleave(group_size, dim=0)

    # -- prompts: once per group -----------------------------------------------------------
    def encode_prompts(self, ids: Tensor, mask: Tensor, positions: Tensor,
                       joined: list[Joined] | None = None) -> PromptKeys:
        """Run the distinct prompts ([G, P], left-padded, with their token positions) and keep
        their keys and values. ``joined``: the layers' joined projections (``joined()``),
        where no gradient is taken."""
        real = mask.bool()
        p = ids.shape[1]
        causal = torch.ones(p, p, dtype=torch.bool, device=ids.device).tril()
        # a padding row attends to itself only, so no row is empty (an all-masked softmax
        # would put NaN into values that real rows then multiply by zero)
        allowed = (causal & real[:, None, None, :]) | torch.eye(p, dtype=torch.bool,
                                                                 device=ids.device)
        x = self._embed(ids)
        cos, sin = self._rope(positions, x.dtype)
        keys, values = [], []
        for i, layer in enumerate(self.layers):
            h = _rms(x, layer.norm_in)
            q, k, v = self._qkv(layer, h, cos, sin, joined[i] if joined else None)
            keys.append(k)
            values.append(v)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=allowed, scale=self.scaling, enable_gqa=self.rep > 1)
            x = x + F.linear(out.transpose(1, 2).reshape(*x.shape[:2], -1), *layer.o)
            x = x + self._mlp(layer, _rms(x, layer.norm_post), joined[i] if joined else None)
        bias = torch.zeros(real.shape, dtype=torch.float32, device=ids.device)
        bias = bias.masked_fill(~real, float("-inf"))[:, None, None, :]
        return PromptKeys(keys, values, bias, x[:, -1])

    # -- responses: each attends to its group's prompt in place ---------------------------
    def extend(self, prompt: PromptKeys, group_size: int, tokens: Tensor, positions: Tensor,
               cache: list[tuple[Tensor, Tensor]] | None = None, past_len: int = 0, *,
               rope: tuple[Tensor, Tensor] | None = None,
               joined: list[Joined] | None = None, groups: Tensor | None = None,
               live: Tensor | None = None) -> Tensor:
        """Hidden states of ``tokens`` ([G*S, T], rows grouped as the prompts are).

        Each token attends to its group's prompt, its own earlier response tokens and itself,
        causally. Sampling passes ``cache`` (new_cache: per layer, key and value buffers
        holding ``past_len`` response tokens): this call's keys and values are written into
        it in place, so a long completion never re-copies what it has generated; the learner
        passes none and runs the whole response at once, with gradients. Sampling also passes
        ``rope``, the rotary (cos, sin) of ``positions`` taken from a table built once per
        rollout (``rope_table``), and ``joined`` (``joined()``): per token step, each is a
        handful of operators fewer, for the same numbers. The learner may pass ``groups``,
        each row's group, for rows that are not whole groups in order (a subset of similar
        response lengths, rollout's packing): each row then reads its group's prompt keys
        through the fused kernel. Sampling may pass ``live``, the rows still generating, in
        the order the cache holds them (the cache then holds only those rows: rollout's
        decoder drops the finished ones from it). Their numbers are the ones every row gets
        without it (each row's products, softmax and sums are its own); a finished row's
        hidden state is then of no meaning, and its tokens are padding anyway.
        """
        n, t = tokens.shape
        g = n // group_size
        x = self._embed(tokens)
        cos, sin = self._rope(positions, x.dtype) if rope is None else rope
        own_bias = None  # one token after all of its row's earlier ones: it sees them all
        if t > 1 or groups is not None:
            own_causal = torch.ones(t, past_len + t, dtype=torch.bool,
                                    device=tokens.device).tril(past_len)
            own_bias = torch.zeros(own_causal.shape, dtype=torch.float32, device=tokens.device)
            own_bias = own_bias.masked_fill(~own_causal, float("-inf"))
        for i, layer in enumerate(self.layers):
            h = _rms(x, layer.norm_in)
            q, k, v = self._qkv(layer, h, cos, sin, joined[i] if joined else None)
            if cache is not None:
                keys, values = cache[i]
                if live is not None:
                    k, v = k.index_select(0, live), v.index_select(0, live)
                keys[:, :, past_len:past_len + t] = k
                values[:, :, past_len:past_len + t] = v
                k, v = keys[:, :, :past_len + t], values[:, :, :past_len + t]
            if own_bias is None or (groups is None and t < FUSED_FROM_TOKENS):
                out = self._attend(q, k, v, *prompt.operands(i), prompt.bias, own_bias, g,
                                   group_size, live)
            else:
                out = self._attend_fused(q, k, v, prompt.keys[i], prompt.values[i],
                                         prompt.bias, own_bias, group_size, groups)
            x = x + F.linear(out, *layer.o)
            x = x + self._mlp(layer, _rms(x, layer.norm_post), joined[i] if joined else None)
        return x

    def rope_table(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """The rotary (cos, sin) of ``positions`` ([N, T]), each [N, 1, T, head_dim]: a
        rollout's whole table at once, read one column per token step (the same elementwise
        operations on the same positions, so the same numbers)."""
        return self._rope(positions, dtype)

    def new_cache(self, rows: int, steps: int, like: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Empty per-layer key and value buffers for ``steps`` response tokens of each row."""
        shape = (rows, self.kv_heads, steps, self.head_dim)
        return [(like.new_empty(shape), like.new_empty(shape)) for _ in self.layers]

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, pk_t: Tensor, pv: Tensor,
                prompt_bias: Tensor, own_bias: Tensor | None, g: int, s: int,
                live: Tensor | None = None) -> Tensor:
        """One softmax over [group prompt keys | own response keys]; returns [N, T, H*D].
        ``pk_t``, ``pv``: the prompt's transposed keys and its values (PromptKeys.operands).
        ``own_bias`` None: every response key is visible (adding its zeros changes nothing).
        ``live``: the rows whose own keys ``k`` and ``v`` hold, in their order (extend's
        ``live``); the other rows' outputs are left as their prompt part alone."""
        n, heads, t, d = q.shape
        kv, rep, p = self.kv_heads, self.rep, pk_t.shape[3]
        q = q * self.scaling  # on the queries: fewer numbers than the scores
        # against the prompt: the group's S*rep*T query rows share one product per kv head
        qg = q.reshape(g, s, kv, rep, t, d).transpose(1, 2).reshape(g, kv, s * rep * t, d)
        prompt_scores = _as(qg @ pk_t, torch.float32) + prompt_bias
        prompt_scores = prompt_scores.view(g, kv, s, rep, t, p).transpose(1, 2)
        prompt_scores = prompt_scores.reshape(n, kv, rep, t, p)
        if live is not None:
            q, prompt_scores = q.index_select(0, live), prompt_scores.index_select(0, live)
        rows = q.shape[0]
        # against its own response
        own_scores = _as(q.reshape(rows, kv, rep * t, d) @ k.transpose(-1, -2), torch.float32)
        own_scores = own_scores.view(rows, kv, rep, t, -1)
        if own_bias is not None:
            own_scores = own_scores + own_bias
        scores = torch.cat([prompt_scores, own_scores], dim=-1)
        probs = _as(torch.softmax(scores, dim=-1), q.dtype)
        to_prompt, to_own = probs.split_with_sizes([p, probs.shape[-1] - p], dim=-1)
        if live is not None:  # the rows without their own keys weigh the prompt by nothing
            to_prompt = to_prompt.new_zeros((n, kv, rep, t, p)).index_copy_(0, live, to_prompt)
        to_prompt = to_prompt.reshape(g, s, kv, rep, t, p).transpose(1, 2)
        from_prompt = (to_prompt.reshape(g, kv, s * rep * t, p) @ pv).view(g, kv, s, rep, t, d)
        from_prompt = from_prompt.transpose(1, 2).reshape(n, kv, rep, t, d)
        from_own = to_own.reshape(rows, kv, rep * t, -1).matmul(v).view(rows, kv, rep, t, d)
        if live is None:
            out = from_prompt + from_own
        else:
            out = from_prompt.index_copy(0, live, from_prompt.index_select(0, live) + from_own)
        return out.reshape(n, heads, t, d).transpose(1, 2).reshape(n, t, heads * d)

    def _attend_fused(self, q: Tensor, k: Tensor, v: Tensor, pk: Tensor, pv: Tensor,
                      prompt_bias: Tensor, own_bias: Tensor, s: int,
                      groups: Tensor | None = None) -> Tensor:
        """The same attention through torch's fused kernel, with the prompt's keys copied to
        each sample: for many response tokens per row the score matrices, not the copies,
        are what costs, and the fused kernel never materialises them (nor, in backward, their
        gradients). ``groups``: each row's group, where the rows are not whole groups in
        order (extend's ``groups``)."""
        n, heads, t, d = q.shape

        def each_row(x: Tensor) -> Tensor:
            return x.repeat_interleave(s, dim=0) if groups is None else x.index_select(0, groups)

        keys = torch.cat([each_row(pk), k], dim=2)
        values = torch.cat([each_row(pv), v], dim=2)
        allowed = torch.cat([
            each_row(torch.isfinite(prompt_bias)).expand(n, 1, t, -1),
            torch.isfinite(own_bias).expand(n, 1, t, -1)], dim=-1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed,
                                             scale=self.scaling, enable_gqa=self.rep > 1)
        return out.transpose(1, 2).reshape(n, t, heads * d)
