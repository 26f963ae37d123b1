"""What a rehearsal on verl needs besides verl, shared by the tests that run one: the main job's
model as a Hugging Face folder verl loads, built in code so that nothing is downloaded (the
built-in tiny Llama's config and tokenizer, a chat template that renders a prompt as its text,
weights seeded from the spec's seed), and verl's environment with what its v1 trainer imports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from stateset_backend.native.tiny_model import ASSETS

VERL_PYTHON = os.environ.get("STATESET_TEST_VERL_PYTHON")
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
TRANSFER_QUEUE_MISSING = (
    "verl's v1 trainer imports transfer_queue, which verl lists only in an extra: "
    "$STATESET_TEST_VERL_PYTHON -m pip install 'TransferQueue>=0.1.10' pyzmq msgspec "
    "(.ci/run does)")


def tiny_llama(folder: Path, seed: int) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shutil.copytree(ASSETS / "tiny-llama-support", folder)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings["chat_template"] = CHAT_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, indent=2))
    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig.from_pretrained(folder)).save_pretrained(folder)
    return folder


def verl_python() -> str:
    """verl's interpreter, once it imports verl's v1 trainer's transfer_queue (else a skip
    that says how to install it)."""
    assert VERL_PYTHON is not None
    probe = subprocess.run([VERL_PYTHON, "-c", "import transfer_queue, verl"],
                           capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        pytest.skip(TRANSFER_QUEUE_MISSING)
    return VERL_PYTHON
