"""Shared pieces of the agent-shim tests: a run folder holding the shims as a plan writes them,
a real byte-level BPE tokenizer with a ChatML chat template that renders tools and tool calls
(no model download: trained here on the scenario's words), and the support-agent script.

Imported by the engine tests and, for verl, by the probe that runs in verl's interpreter, so it
uses nothing but the standard library and ``tokenizers`` / ``transformers``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "examples" / "support-agent"
ENVIRONMENT = SUPPORT / "environment.py"

CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{%- if m.tool_calls %}{%- for c in m.tool_calls %}<tool_call>"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>"
    "{%- endfor %}{%- endif %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# A vague request: ask which order, look it up, answer with the status the tool returned.
TASK = {"answer": "lost", "order": "o4", "prompt": "hello . status of my order ?",
        "status": "lost", "vague": True}
SCRIPT = ["which order ?", '<tool_call>{"name": "lookup", "arguments": {}}</tool_call>', "lost"]
REWARDS = [0.2, 0.2, 0.6]


def tokenizer(directory: Path) -> Any:
    """A real fast tokenizer (byte-level BPE) saved to and loaded from ``directory``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [*SCRIPT, TASK["prompt"], "order o4 lost lost lost lost lost user tool system",
              '{"type": "function", "function": {"name": "lookup", "parameters": {}}}']
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", bos_token=None)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(directory))
    return PreTrainedTokenizerFast.from_pretrained(str(directory))


def settings(run_dir: Path, env_file: Path = ENVIRONMENT, **changes: Any) -> dict[str, Any]:
    """The conversation settings a plan writes, for ``env_file``, into ``run_dir``."""
    import hashlib

    doc = {"environment": {"path": str(env_file), "class": "SupportAgent",
                           "sha256": hashlib.sha256(env_file.read_bytes()).hexdigest()},
           "max_turns": 3, "max_turn_tokens": 32, "max_total_tokens": 400,
           "max_prompt_tokens": 200, "reward_placement": "per_turn", "turn_discount": 1.0,
           "step_timeout_s": 10.0, "max_failed_share": 0.0, "model": str(run_dir / "model"),
           "splits": {}}
    doc.update(changes)
    return doc


def write_run_dir(run_dir: Path, files: dict[str, str], conversation: dict[str, Any]) -> None:
    """The plan's files as a launch writes them, with the settings replaced by ``conversation``
    (the test's own environment file and limits)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (run_dir / name).write_text(text)
    (run_dir / "stateset_conversation.json").write_text(json.dumps(conversation))


def bad_environment(folder: Path, body: str) -> Path:
    """A copy of the support agent whose ``step`` is replaced by ``body``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "environment.py"
    shutil.copy(ENVIRONMENT, path)
    head = "\n\nclass Bad(SupportAgent):\n    def step(self, messages):\n"
    path.write_text(path.read_text() + head
                    + "".join(f"        {line}\n" for line in body.splitlines()))
    return path
