"""Loading the policy: the built-in tiny Llama (initialised from the seed) or a local HF dir.

Nothing is ever downloaded: hub ids resolve only from the local cache. When the spec pins a
``sha256:`` revision for a local directory, the directory's content digest must match.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from stateset_backend.native.data import resolve
from stateset_backend.native.tiny_model import builtin_dir
from stateset_backend.spec.content import directory_digest
from stateset_backend.spec.model import Model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelError(ValueError):
    """The model cannot be loaded as the spec describes it."""


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def compute_context(spec_model: Model,
                    device: torch.device) -> Callable[[], contextlib.AbstractContextManager[Any]]:
    """Forward and backward in ``model.dtype`` over master weights in ``model.param_dtype``:
    autocast when they differ. Computing wider than the weights is refused."""
    if spec_model.dtype == spec_model.param_dtype:
        return contextlib.nullcontext
    if spec_model.param_dtype != "float32":
        raise ModelError(f"model.dtype {spec_model.dtype} with model.param_dtype "
                         f"{spec_model.param_dtype}: the native engine computes in the weights' "
                         "dtype or a narrower one over float32 weights")
    return functools.partial(torch.autocast, device_type=device.type,
                             dtype=DTYPES[spec_model.dtype])


def _check_revision(directory: Path, revision: str | None) -> None:
    if revision is not None and revision.startswith("sha256:"):
        actual = directory_digest(directory)
        if actual != revision:
            raise ModelError(f"model directory {directory} has content digest {actual}, the "
                             f"spec pins {revision}")


def load_policy(spec_model: Model, seed: int, base_dir: Path, device: torch.device,
                chat_template: bool = False) -> tuple[Any, Any]:
    """(model, tokenizer). LoRA, when asked for, wraps the model so only adapters train."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    dtype = DTYPES[spec_model.param_dtype]  # master weights; compute_context sets compute
    builtin = builtin_dir(spec_model.path)
    if builtin is not None:
        _check_revision(builtin, spec_model.revision)
        config = AutoConfig.from_pretrained(builtin, local_files_only=True)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(builtin, local_files_only=True)
    else:
        local = resolve(spec_model.path, base_dir)
        source: str | Path = local if local.is_dir() else spec_model.path
        if isinstance(source, Path):
            _check_revision(source, spec_model.revision)
        revision = None if (spec_model.revision or "").startswith("sha256:") else \
            spec_model.revision
        try:
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, revision=revision,
                                                         local_files_only=True)
            tokenizer = AutoTokenizer.from_pretrained(source, revision=revision,
                                                      local_files_only=True)
        except OSError as exc:
            raise ModelError(f"cannot load model {spec_model.path!r} without downloading: "
                             f"{str(exc).splitlines()[0]}") from None
    if chat_template and getattr(tokenizer, "chat_template", None) is None:
        raise ModelError(f"model {spec_model.path!r} ships no chat template: set "
                         "data.chat_template to false to tokenize prompts as plain text")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if spec_model.lora is not None:
        from peft import LoraConfig, get_peft_model

        lora = spec_model.lora
        alpha: Any = lora.alpha  # peft annotates int; the scaling alpha / r takes any float
        model = get_peft_model(model, LoraConfig(
            r=lora.rank, lora_alpha=alpha, lora_dropout=lora.dropout,
            target_modules=lora.target_modules, task_type="CAUSAL_LM"))
    return model.to(device), tokenizer


def frozen_reference(model: Any) -> Any:
    """The KL reference: a frozen copy (under LoRA, the base weights via disabled adapters)."""
    if hasattr(model, "disable_adapter"):
        return None  # use ``with model.disable_adapter()`` at the call site
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
