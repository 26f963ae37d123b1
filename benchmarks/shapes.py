"""The workload shapes the native engine is measured on, shared by the benchmarks that
compare it (native_vs_trl.py) and that profile it (profile_native.py), so both speak of the
same jobs.

Each shape is a variant of the README's job (``examples/support-routing.json``) with warmup,
checkpoints and evaluation off: ``readme`` (the job as it is: 16 prompts x 16 samples,
2-token completions, the built-in tiny Llama), ``completions-32``, ``completions-128`` and
``completions-512`` (max_response_tokens 32, 128 and 512), ``larger-model`` (a Llama 4x as
wide and twice as deep, seeded weights written under benchmarks/results/, given as the
spec's model path). ``shape_spec(..., kernels=...)`` gives the native engine an execution
option on top (``engine_options.native["sampling.kernels"]``); the exact default adds none,
so its spec is the one every earlier measurement ran.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

import harness

from stateset_backend.native.options import KERNELS  # the native engine's sampling.kernels

EXAMPLES = harness.ROOT / "examples"
SPEC = EXAMPLES / "support-routing.json"
LARGER = harness.ROOT / "benchmarks" / "results" / "larger-llama"


class Shape(NamedTuple):
    updates: int  # timed per run: enough for a steady rate, few enough for ~1 min a side
    completion_tokens: int | None = None  # None: the spec's own
    larger_model: bool = False


SHAPES = {"readme": Shape(200), "completions-32": Shape(20, 32),
          "completions-128": Shape(10, 128), "completions-512": Shape(3, 512),
          "larger-model": Shape(20, larger_model=True)}


def write_larger_model() -> str:
    """The built-in Llama's config and tokenizer at 4x the width (8 heads of 32) and twice
    the layers, ~30x the parameters, seeded weights saved; returns the directory's digest,
    which the spec pins as ``model.revision``."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from stateset_backend.native.tiny_model import ASSETS
    from stateset_backend.spec.content import directory_digest

    builtin = ASSETS / "tiny-llama-support"
    small = json.loads((builtin / "config.json").read_text())
    config = LlamaConfig(**{**small, "hidden_size": 256, "intermediate_size": 512,
                            "num_hidden_layers": 4, "num_attention_heads": 8,
                            "num_key_value_heads": 8, "head_dim": 32})
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(LARGER)
    AutoTokenizer.from_pretrained(builtin).save_pretrained(LARGER)
    return directory_digest(LARGER)


def shape_spec(shape: str, updates: int, larger_revision: str | None,
               kernels: str = "exact") -> dict[str, Any]:
    """The README's spec for one shape, with paths made absolute (it is written elsewhere),
    sampling with ``kernels`` where the native engine runs it."""
    if kernels not in KERNELS:
        raise ValueError(f"sampling kernels {kernels!r}: one of {', '.join(KERNELS)}")
    s = SHAPES[shape]
    doc = json.loads(SPEC.read_text())
    doc["budget"]["total_updates"] = updates
    doc["checkpoint"] = {"every": None, "keep": None}
    doc["evaluation"] = {"every": None, "select_by": None}
    doc["optim"]["warmup_steps"] = 0
    if s.completion_tokens is not None:
        doc["data"]["max_response_tokens"] = s.completion_tokens
    if s.larger_model:
        doc["model"] = {"path": str(LARGER), "revision": larger_revision, "dtype": "float32"}
    for split in ("train", "validation", "test"):
        doc["data"][split]["uri"] = str(EXAMPLES / doc["data"][split]["uri"])
    doc["reward"]["entrypoint"] = str(EXAMPLES / doc["reward"]["entrypoint"])
    if kernels != "exact":
        doc["engine_options"] = {"native": {"sampling.kernels": kernels}}
    return doc


def _shape_list(text: str) -> list[str]:
    names = [name for name in text.split(",") if name]
    if not names or set(names) - set(SHAPES):
        raise argparse.ArgumentTypeError(f"takes some of {', '.join(SHAPES)}, not {text!r}")
    return names


def add_shapes_option(parser: argparse.ArgumentParser,
                      default: Sequence[str] = tuple(SHAPES), *, flag: str = "--shapes",
                      dest: str = "shapes") -> None:
    """``--shapes a,b``: which shapes a benchmark measures, refused (exit 2) when it names
    none or one that is not a shape."""
    parser.add_argument(flag, dest=dest, type=_shape_list, default=list(default),
                        help=f"comma-separated, of {', '.join(SHAPES)} "
                             f"(default {','.join(default)})")


def larger_model_revision(shapes: Sequence[str]) -> str | None:
    """The larger model's digest, written first, where ``shapes`` include it."""
    return write_larger_model() if "larger-model" in shapes else None
