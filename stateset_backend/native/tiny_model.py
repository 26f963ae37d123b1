"""The built-in tiny causal LM: a 2-layer Llama config and a word-level tokenizer, made in code.

Shipped under ``assets/`` (config and tokenizer only, no weights), so ``model.path:
"builtin:tiny-llama-support"`` means "this architecture, initialised from the spec's seed" —
stated explicitly in the spec rather than inferred from a directory that happens to lack
weights. Regenerate with ``python -m stateset_backend.native.tiny_model``.
"""

from __future__ import annotations

import json
from pathlib import Path

from stateset_backend.common.errors import InvalidInput
from stateset_backend.spec.inputs import builtin_model_dir

ASSETS = Path(__file__).resolve().parent / "assets"
SPECIALS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]


def builtin_dir(model_path: str) -> Path | None:
    """The asset directory a ``builtin:<name>`` model path names, or None for other paths."""
    try:
        return builtin_model_dir(model_path)
    except InvalidInput as exc:
        raise FileNotFoundError(exc.message.removeprefix("model.path: ")) from None


def write_tiny_llama(out: Path, words: list[str], max_positions: int = 64) -> None:
    """Write config.json and a word-level tokenizer for ``words``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *words])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="[BOS] $A", special_tokens=[("[BOS]", vocab["[BOS]"])])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="[BOS]", eos_token="[EOS]",
                                   pad_token="[PAD]", unk_token="[UNK]")
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=max_positions,
        tie_word_embeddings=True, bos_token_id=vocab["[BOS]"], eos_token_id=vocab["[EOS]"],
        pad_token_id=vocab["[PAD]"])
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    config.save_pretrained(out)
    for name in ("config.json", "tokenizer_config.json"):  # drop version stamps: stable bytes
        doc = json.loads((out / name).read_text())
        doc.pop("transformers_version", None)
        (out / name).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    from stateset_backend.native.scenarios import support_agent, support_routing

    write_tiny_llama(ASSETS / "tiny-llama-support", support_routing.vocabulary())
    # conversations are longer than one routing prompt: room for a few turns and observations
    write_tiny_llama(ASSETS / "tiny-llama-agent", support_agent.vocabulary(), max_positions=128)
    print(f"wrote {ASSETS / 'tiny-llama-support'} and {ASSETS / 'tiny-llama-agent'}")
