"""Runs NeMo RL's ``examples/run_grpo.py`` with a spec's python reward as a NeMo RL environment.

NeMo RL scores only through environments and data processors registered in code, never
through its config, so a python reward needs a launcher in NeMo RL's own interpreter. This
file is written into the run directory and run there in place of ``run_grpo.py``; it imports
nothing from stateset-backend, which is not installed in NeMo RL's environment.

Before handing over to ``run_grpo.py`` (same process, same argv) it
- converts each data split into the rows NeMo RL's ``ResponseDataset`` reads: ``input`` holds
  the prompt as JSON chat messages (a plain-text prompt becomes one user message), so chat
  prompts keep their system messages, and ``output`` holds the answer;
- drops every prompt longer than the spec's ``max_prompt_tokens``, counted exactly as the
  processor below tokenizes it (or stops, for ``prompt_overflow: error``), so NeMo RL's own
  limit, which would keep an over-long prompt as a zero-loss stub, never fires; and checks that
  one pass over the kept train rows holds at least one whole update, so that NeMo RL's epoch
  limit (set to the number of updates) can never end the run early;
- registers a data processor that renders those messages with the tokenizer's chat template
  (no prompt file: NeMo RL's default wraps every prompt in a math chain-of-thought template)
  and keeps the prompt text and answer for the reward;
- registers an environment actor that scores each response with ``stateset_reward.score``,
  the generated module that checks the reward file's sha256 in the process that scores, and
  the actor's python executable (NeMo RL refuses to start an actor without one);
- or, for a multi-turn or tool-use spec, converts the splits into openings and tasks and
  registers the conversation actor and processor of ``stateset_nemo_rl_environment`` (the
  fixed shim copied beside this file; see its docstring).

The run directory goes on ``PYTHONPATH`` so Ray workers import the same two modules; on
several nodes it must be on a shared filesystem, as NeMo RL's checkpoint directory must be.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV_NAME = "stateset_reward"
PROCESSOR_NAME = "stateset_chat_prompt"
CONFIG_FILE = "stateset_nemo_rl.json"
DATA_DIR = "data"
INPUT, OUTPUT = "input", "output"
ACTOR = "RewardEnvironmentActor"


def read_rows(path: str) -> list[dict[str, Any]]:
    """Rows of a parquet, JSON-lines or JSON-array file."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
        return rows
    text = Path(path).read_text(encoding="utf-8")
    if path.endswith(".json") and text.lstrip().startswith("["):
        return list(json.loads(text))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def prompt_messages(value: Any) -> list[dict[str, str]]:
    """A prompt field's value as chat messages: text is one user message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list) and value and all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in value):
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise ValueError(f"a prompt must be text or chat messages with role and content, "
                     f"not {type(value).__name__}")


def prompt_text(messages: list[dict[str, str]]) -> str:
    """What the reward sees as the prompt: the last user message, as on the other engines."""
    return next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")


def convert_split(source: str, target: Path, prompt_field: str, answer_field: str,
                  fits: Callable[[list[dict[str, str]]], bool] | None = None) -> int:
    """Write ``source`` as ResponseDataset rows at ``target`` (atomically), keeping the rows
    whose prompt ``fits``; returns the count written."""
    rows = read_rows(source)
    lines = []
    for number, row in enumerate(rows, 1):
        try:
            messages = prompt_messages(row[prompt_field])
            answer = row[answer_field]
        except (KeyError, ValueError) as exc:
            raise SystemExit(f"{source}: row {number}: {exc}") from None
        if fits is not None and not fits(messages):
            continue
        lines.append(json.dumps({INPUT: json.dumps(messages), OUTPUT: str(answer)}))
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(partial, target)
    return len(lines)


def render_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[str, Any]:
    """The prompt as the policy sees it: the chat template's text and its token ids."""
    rendered = tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=True,
                                             add_special_tokens=False)
    token_ids = tokenizer(rendered, return_tensors="pt", add_special_tokens=False)["input_ids"][0]
    return rendered, token_ids


def prompt_limit(tokenizer: Any, max_tokens: int, overflow: str,
                 source: str) -> Callable[[list[dict[str, str]]], bool]:
    """Whether a prompt fits ``max_tokens``; with ``overflow`` "error" a longer one stops."""

    def fits(messages: list[dict[str, str]]) -> bool:
        length = len(render_prompt(tokenizer, messages)[1])
        if length <= max_tokens:
            return True
        if overflow == "error":
            raise SystemExit(f"{source}: a prompt has {length} tokens, over "
                             f"data.max_prompt_tokens {max_tokens}")
        return False

    return fits


def process(datum: dict[str, Any], task_data_spec: Any, tokenizer: Any, max_seq_length: int,
            idx: int) -> dict[str, Any]:
    """NeMo RL's processor signature: one ResponseDataset row -> a DatumSpec."""
    user, assistant = datum["messages"][0], datum["messages"][1]
    messages = json.loads(user["content"])
    rendered, token_ids = render_prompt(tokenizer, messages)
    length = len(token_ids)
    loss_multiplier = 1.0
    if length >= max_seq_length:  # too long: keep a stub and learn nothing from it, as NeMo does
        token_ids, loss_multiplier = token_ids[:min(4, max_seq_length)], 0.0
    return {"message_log": [{"role": "user", "content": rendered, "token_ids": token_ids}],
            "length": length,
            "extra_env_info": {"prompt": prompt_text(messages),
                               "ground_truth": assistant["content"]},
            "loss_multiplier": loss_multiplier, "idx": idx, "task_name": datum["task_name"]}


def response_text(message_log: list[dict[str, Any]]) -> str:
    return "".join(str(m["content"]) for m in message_log if m["role"] == "assistant")


class RewardEnvironment:
    """A single-turn NeMo RL environment: each response is scored once and the episode ends."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        import stateset_reward  # the generated shim beside this file; checks the sha256

        self.score = stateset_reward.score

    def step(self, message_log_batch: list[list[dict[str, Any]]], metadata: list[dict[str, Any]],
             return_extracted_answer: bool = False) -> Any:
        import torch
        from nemo_rl.environments.interfaces import EnvironmentReturn

        responses = [response_text(log) for log in message_log_batch]
        rewards = torch.tensor([float(self.score(m["prompt"], r, m["ground_truth"]))
                                for r, m in zip(responses, metadata, strict=True)],
                               dtype=torch.float32)
        return EnvironmentReturn(
            observations=[{"role": "environment", "content": f"reward {float(r)}"}
                          for r in rewards],
            metadata=metadata, next_stop_strings=[None] * len(responses), rewards=rewards,
            terminateds=torch.ones_like(rewards),
            answers=responses if return_extracted_answer else None)

    def global_post_process_and_metrics(self, batch: Any) -> tuple[Any, dict[str, float]]:
        return batch, {"accuracy": float(batch["rewards"].float().mean())}

    def shutdown(self) -> None:
        pass


def __getattr__(name: str) -> Any:
    """``RewardEnvironmentActor``, the Ray actor NeMo RL looks up by name, made on first use so
    the rest of this module imports without Ray."""
    if name != ACTOR:
        raise AttributeError(name)
    import ray

    actor = ray.remote(max_restarts=-1, max_task_retries=-1)(RewardEnvironment)
    globals()[ACTOR] = actor
    return actor


def register(run_dir: Path, conversation: bool = False) -> None:
    """Make the environment, its python executable and the processor known to NeMo RL: the
    python reward's single-turn environment, or (``conversation``) the spec's environment."""
    from nemo_rl.data.processors import PROCESSOR_REGISTRY, register_processor
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES
    from nemo_rl.environments.utils import ENV_REGISTRY, register_env

    folder = str(run_dir)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    if conversation:  # the spec's environment: the shim beside this file (agent_shims)
        import stateset_nemo_rl_environment as shim

        env_name, actor, processor_name, processor = (
            shim.ENV_NAME, f"{shim.__name__}.{shim.ACTOR}", shim.PROCESSOR_NAME, shim.process)
    else:
        env_name, actor, processor_name, processor = (
            ENV_NAME, f"{Path(__file__).stem}.{ACTOR}", PROCESSOR_NAME, process)
    ACTOR_ENVIRONMENT_REGISTRY[actor] = PY_EXECUTABLES.SYSTEM
    if env_name not in ENV_REGISTRY:
        register_env(env_name, actor)
    if processor_name not in PROCESSOR_REGISTRY:
        register_processor(processor_name, processor)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([folder, *[p for p in paths if p != folder]])


def load_tokenizer(model: str) -> Any:
    """The policy's tokenizer, loaded as NeMo RL's get_tokenizer loads it (its own template)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model, trust_remote_code=True)


def convert_splits(run_dir: Path, config: dict[str, Any], tokenizer: Any) -> dict[str, int]:
    """Every split converted, over-long prompts dropped; the rows kept per split."""
    if config.get("conversation"):
        sys.path.insert(0, str(run_dir))
        import stateset_nemo_rl_environment as shim

        kept = shim.prepare_splits(run_dir, config, tokenizer, DATA_DIR, INPUT, OUTPUT)
        return _enough(kept, config)
    kept = {}
    for name, split in config["splits"].items():
        fits = prompt_limit(tokenizer, config["max_prompt_tokens"], config["prompt_overflow"],
                            split["source"])
        kept[name] = convert_split(split["source"], run_dir / DATA_DIR / f"{name}.jsonl",
                                   split["prompt_field"], split["answer_field"], fits)
        print(f"stateset-backend: {name} split: {kept[name]} rows of at most "
              f"{config['max_prompt_tokens']} prompt tokens from {split['source']}", flush=True)
    return _enough(kept, config)


def _enough(kept: dict[str, int], config: dict[str, Any]) -> dict[str, int]:
    if kept.get("train", 0) < config["min_train_rows"]:
        raise SystemExit(f"stateset-backend: {kept.get('train', 0)} train rows fit "
                         f"data.max_prompt_tokens; one update needs "
                         f"{config['min_train_rows']} (prompts per update x generation "
                         "rounds), or NeMo RL would stop before budget.total_updates")
    return kept


def prepare(run_dir: Path) -> None:
    """Everything the launcher does before NeMo RL takes over: convert, then register."""
    config = json.loads((run_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    convert_splits(run_dir, config, load_tokenizer(config["model"]))
    register(run_dir, bool(config.get("conversation")))


def main(argv: list[str]) -> None:
    """``argv``: the path of NeMo RL's ``run_grpo.py``, then its own arguments."""
    prepare(Path(__file__).resolve().parent)
    script, *rest = argv
    sys.argv = [script, *rest]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
