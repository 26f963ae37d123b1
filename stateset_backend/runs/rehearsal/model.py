"""A rehearsal's model: the spec's architecture, small enough to train on a laptop's CPUs.

What a GPU run trips over in a model is rarely its size: it is the model class (its forward,
its attention and cache code, its parameter names, what an engine's sharding and weight sync
expect of them), the tokenizer, the chat template and the vocabulary. So the rehearsal keeps all
of those, and builds the same class from the spec's own ``config.json`` with fewer, narrower
layers and weights seeded from the spec's seed. Weights are never read: a folder holding the
config and the tokenizer is enough, so a user rehearses without downloading a large model.

Built models are kept by what they are made of (the config and tokenizer files, the seed, the
shape, the torch and transformers releases that initialise the weights): a second rehearsal of
the same model reuses the folder, and its content digest, which the rehearsal's plan pins, is
the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stateset_backend.common.errors import InvalidInput, Unsupported
from stateset_backend.spec.inputs import local_path
from stateset_backend.spec.model import ExperimentSpec

# The shrunk shape: enough layers for what happens between them (caches, per-layer attention
# types, a sharding wrapper per block), narrow enough that an update takes seconds.
LAYERS, HIDDEN, HEADS = 2, 64, 4
WIDTH = 2 * HIDDEN  # the MLP's (and an MoE expert's) inner width
DESCRIPTION = "shrunk.json"  # what the folder was built from and to, beside the model's files
# files of a model folder that hold weights (read by no rehearsal) or are written anew
WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack",
           ".onnx", ".npz", ".index.json")
MAX_KEPT_BYTES = 256 << 20  # a tokenizer is far smaller; a file this large is weights
FIX = ("download the model's config and tokenizer into a folder and name it in model.path "
       "(the weights are not needed)")


def source_folder(spec: ExperimentSpec, base_dir: Path) -> Path:
    """The local folder ``model.path`` names; a hub id or URI is refused with the fix."""
    path = local_path(spec.model.path, base_dir)
    if path is None or not path.is_dir():
        raise InvalidInput(f"model.path {spec.model.path!r} names no folder on this machine (a "
                           "hub id?): a rehearsal builds a shrunk model of its architecture "
                           f"from its config and tokenizer; {FIX}")
    if not (path / "config.json").is_file():
        raise InvalidInput(f"model.path {str(path)!r} holds no config.json: a rehearsal builds "
                           f"the model's architecture from it; {FIX}")
    return path


def _kept(source: Path) -> list[Path]:
    """The folder's own files a model loader reads besides weights and config: the tokenizer,
    its chat template, the generation settings."""
    return sorted(p for p in source.iterdir()
                  if p.is_file() and p.name != "config.json" and p.name != DESCRIPTION
                  and not p.name.endswith(WEIGHTS) and p.stat().st_size <= MAX_KEPT_BYTES)


def _key(source: Path, seed: int) -> str:
    import torch
    import transformers

    digest = hashlib.sha256(json.dumps(
        {"shape": [LAYERS, HIDDEN, HEADS, WIDTH], "seed": seed, "torch": torch.__version__,
         "transformers": transformers.__version__}, sort_keys=True).encode())
    for path in [source / "config.json", *_kept(source)]:
        digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:20]


def shrunk_model(spec: ExperimentSpec, base_dir: Path, models: Path) -> tuple[Path, dict[str, Any]]:
    """The folder of the spec's model shrunk (built under ``models`` unless an identical one is
    there) and what it was built from and to."""
    source = source_folder(spec, base_dir)
    try:
        key = _key(source, spec.seed)
    except ImportError as exc:
        raise Unsupported(f"building the rehearsal's model needs torch and transformers here "
                          f"({exc}): pip install 'stateset-backend[native]'") from None
    folder = models / key
    if not (folder / DESCRIPTION).is_file():
        models.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=models))
        try:
            _build(source, staging, spec.seed)
            try:
                os.replace(staging, folder)
            except OSError:  # another rehearsal built the same model first: use that one
                if not (folder / DESCRIPTION).is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return folder, json.loads((folder / DESCRIPTION).read_text(encoding="utf-8"))


def _shape(config: Any) -> dict[str, Any]:
    heads = config.num_attention_heads
    return {"layers": config.num_hidden_layers, "hidden": config.hidden_size, "heads": heads,
            "kv_heads": getattr(config, "num_key_value_heads", None) or heads,
            "intermediate": getattr(config, "intermediate_size", None)}


def _shrink(config: Any) -> None:
    """Fewer, narrower layers in place; the vocabulary, the embeddings' tying, the positions and
    every other setting stay. Heads are scaled to divide the width, keeping the ratio of query
    to key-value heads where it fits."""
    before = _shape(config)
    hidden = min(before["hidden"], HIDDEN)
    heads = max(h for h in range(1, min(before["heads"], HEADS) + 1) if hidden % h == 0)
    group = before["heads"] // before["kv_heads"] if before["heads"] % before["kv_heads"] == 0 \
        else 1
    kv = max(k for k in range(1, heads + 1) if heads % k == 0 and k <= max(1, heads // group))
    layers = min(before["layers"], LAYERS)
    for name in list(vars(config)):  # per-layer lists (attention types): the first layers'
        value = getattr(config, name)
        if isinstance(value, list) and len(value) == before["layers"] and layers < len(value):
            setattr(config, name, value[:layers])
    changes = {"num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
               "num_key_value_heads": kv, "head_dim": hidden // heads}
    for name in ("intermediate_size", "moe_intermediate_size",
                 "shared_expert_intermediate_size"):
        changes[name] = min(getattr(config, name, None) or WIDTH, WIDTH)
    for name, value in changes.items():
        if getattr(config, name, None) is not None:
            setattr(config, name, value)


def _build(source: Path, target: Path, seed: int) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()  # the engine's progress follows on the same screen
    try:
        config = AutoConfig.from_pretrained(source, local_files_only=True)
        text = config.get_text_config()  # a composite model's language part; else itself
        before = _shape(text)
        _shrink(text)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except (ValueError, KeyError, AttributeError, OSError) as exc:
        raise Unsupported(f"model.path {str(source)!r}: transformers cannot build this "
                          f"architecture as a causal LM here: {exc}") from None
    model.save_pretrained(target)
    for path in _kept(source):  # the tokenizer, chat template and generation settings as given
        shutil.copy2(path, target / path.name)
    description = {"source": str(source), "class": type(model).__name__,
                   "model_type": config.model_type, "seed": seed, "from": before,
                   "to": _shape(text),
                   "parameters": sum(p.numel() for p in model.parameters())}
    (target / DESCRIPTION).write_text(json.dumps(description, indent=2) + "\n",
                                      encoding="utf-8")


def token_counter(folder: Path) -> Callable[[str], int] | None:
    """Tokens of a completion's text as the model's own tokenizer counts them (no special
    tokens added), to hold what reached the reward to ``data.max_response_tokens``; None when
    the folder's tokenizer cannot be loaded here."""
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception:  # transformers' loaders raise many types; the check is then not made
        return None

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return count
