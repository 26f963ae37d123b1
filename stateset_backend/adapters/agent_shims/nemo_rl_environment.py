"""NeMo RL's environment actor and data processor for the spec's environment (run directory
name: ``stateset_nemo_rl_environment.py``; the launcher ``stateset_nemo_rl.py`` registers
both and converts the splits through ``prepare_splits``).

NeMo RL runs the conversation loop itself (``run_multi_turn_rollout``): it generates a turn
for every live sample, calls ``step(message_log_batch, metadata)`` on the environment actor,
appends the one observation message per sample that the step returns (tokenized as raw text),
adds the step's reward to the sample's total, and ends a sample when the step says
``terminateds`` or at ``grpo.max_rollout_turns``. Only ``assistant`` messages carry loss. So:

- the launcher calls ``reset`` for every row before training, checks each opening against
  ``data.max_prompt_tokens`` (rendered with the chat template and the environment's tools; one
  over the limit fails, which stops the run) and stores the openings with the row; the
  processor renders them as the first message;
- on a sample's first step the actor starts its conversation: a fresh instance is reset with
  the same row, and its openings must equal the stored ones (``reset`` must be a function of
  the task: NeMo RL renders the opening before the actor exists), then steps it with the
  assistant's text parsed into a neutral message; later steps find the conversation by the id
  the actor put in the sample's metadata;
- the observation message is the chat template's rendering of the step's observations and the
  next assistant prompt, with role ``environment`` (never ``assistant``: it carries no loss);
  at the end of a conversation it is empty, so nothing is tokenized;
- the step's reward is the increment that makes NeMo RL's sum the conversation's reward (the
  last step's reward, or the discounted return for ``per_turn``).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import stateset_environment as env_shim

ENV_NAME = "stateset_environment"
PROCESSOR_NAME = "stateset_conversation"
ACTOR = "ConversationEnvironmentActor"
OBSERVATION_ROLE = "environment"
SESSION_KEY = "stateset_conversation"


def load_tokenizer(model: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model, trust_remote_code=True)


def opening_ids(tokenizer: Any, openings: list[dict[str, Any]],
                tools: list[dict[str, Any]]) -> tuple[str, list[int]]:
    text = env_shim.render(tokenizer, openings, tools, True)
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return text, list(ids)


def prepare_splits(run_dir: Path, config: dict[str, Any], tokenizer: Any,
                   data_dir: str, input_key: str, output_key: str) -> dict[str, int]:
    """Every split as ResponseDataset rows: the openings (JSON) as input, the original row
    (``stateset_task`` text) as output. An opening over the prompt limit fails the run."""
    settings = env_shim.load_config(run_dir)
    tools = env_shim.describe(settings)
    session = env_shim.Session(settings)
    kept = {}
    try:
        for name, split in config["splits"].items():
            rows = []
            for row in env_shim.read_rows(split["source"]):
                conversation = env_shim.Conversation(settings, session)
                openings = conversation.open(row)
                length = len(opening_ids(tokenizer, openings, tools)[1])
                if length > settings["max_prompt_tokens"]:
                    conversation.fail(f"the opening has {length} tokens, over "
                                      f"data.max_prompt_tokens {settings['max_prompt_tokens']}")
                rows.append({input_key: json.dumps(openings),
                             output_key: json.dumps(row, sort_keys=True, default=str)})
            target = run_dir / data_dir / f"{name}.jsonl"
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(target.name + ".partial")
            partial.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
            partial.replace(target)
            kept[name] = len(rows)
            print(f"stateset-backend: {name} split: {len(rows)} tasks from {split['source']}",
                  flush=True)
    finally:
        session.close()
    return kept


_TOOLS: list[list[dict[str, Any]]] = []


def _tools() -> list[dict[str, Any]]:
    if not _TOOLS:
        _TOOLS.append(env_shim.describe(env_shim.here_config()))
    return _TOOLS[0]


def process(datum: dict[str, Any], task_data_spec: Any, tokenizer: Any, max_seq_length: int,
            idx: int) -> dict[str, Any]:
    """NeMo RL's processor signature: one converted row -> a DatumSpec whose first message is
    the rendered opening, with the task and openings kept for the actor."""
    openings = json.loads(datum["messages"][0]["content"])
    task_text = datum["messages"][1]["content"]
    rendered, ids = opening_ids(tokenizer, openings, _tools())
    import torch

    return {"message_log": [{"role": "user", "content": rendered,
                             "token_ids": torch.tensor(ids, dtype=torch.long)}],
            "length": len(ids),
            "extra_env_info": {env_shim.TASK_FIELD: task_text, "openings": openings},
            "loss_multiplier": 1.0, "idx": idx, "task_name": datum["task_name"]}


class ConversationEnvironment:
    """NeMo RL's EnvironmentInterface over the spec's environment (one conversation per
    sample, each in its own worker process)."""

    def __init__(self, cfg: dict[str, Any] | None = None) -> None:
        self.settings = env_shim.here_config()
        self.tokenizer = load_tokenizer(self.settings["model"])
        self.tools = env_shim.describe(self.settings)
        self.live: dict[str, Any] = {}

    def _start(self, meta: dict[str, Any]) -> tuple[str, Any]:
        conversation = env_shim.Conversation(self.settings, env_shim.Session(self.settings))
        openings = conversation.open(env_shim.task_of(meta[env_shim.TASK_FIELD]))
        if openings != meta["openings"]:
            conversation.fail("reset returned other openings for the same task than when the "
                              "split was converted; NeMo RL needs reset to depend on the task "
                              "only")
        key = uuid.uuid4().hex
        self.live[key] = conversation
        return key, conversation

    def step_one(self, log: list[dict[str, Any]], meta: dict[str, Any]) -> tuple[
            dict[str, str], dict[str, Any] | None, float, bool]:
        """(observation message, metadata, reward increment, terminated) for one sample."""
        key = meta.get(SESSION_KEY)
        key, conversation = (key, self.live[key]) if key in self.live else self._start(meta)
        text = str(log[-1]["content"]) if log and log[-1]["role"] == "assistant" else ""
        message = env_shim.parse_assistant(text, self.tools)
        before = list(conversation.messages)
        conversation.step(message)
        reward = conversation.increment()
        if conversation.done:
            self.live.pop(key).session.close()
            return {"role": OBSERVATION_ROLE, "content": ""}, None, reward, True
        cut = len(self.tokenizer(text, add_special_tokens=False)["input_ids"]) >= \
            self.settings["max_turn_tokens"]
        content = env_shim.observation_text(self.tokenizer, [*before, message],
                                            conversation.messages[len(before) + 1:], self.tools,
                                            ended_with_eos=not cut)
        return ({"role": OBSERVATION_ROLE, "content": content}, {**meta, SESSION_KEY: key},
                reward, False)

    def step(self, message_log_batch: list[list[dict[str, Any]]],
             metadata: list[dict[str, Any]]) -> Any:
        import torch
        from nemo_rl.environments.interfaces import EnvironmentReturn

        results = [self.step_one(log, meta)
                   for log, meta in zip(message_log_batch, metadata, strict=True)]
        return EnvironmentReturn(
            observations=[r[0] for r in results], metadata=[r[1] for r in results],
            next_stop_strings=[None] * len(results),
            rewards=torch.tensor([r[2] for r in results], dtype=torch.float32),
            terminateds=torch.tensor([r[3] for r in results], dtype=torch.bool),
            answers=None)

    def global_post_process_and_metrics(self, batch: Any) -> tuple[Any, dict[str, float]]:
        return batch, {"accuracy": float(batch["rewards"].float().mean())}

    def shutdown(self) -> None:
        for conversation in self.live.values():
            conversation.session.close()
        self.live.clear()


def __getattr__(name: str) -> Any:
    """``ConversationEnvironmentActor``, the Ray actor NeMo RL looks up by name, made on first
    use so the rest of this module imports without Ray."""
    if name != ACTOR:
        raise AttributeError(name)
    import ray

    actor = ray.remote(ConversationEnvironment)
    globals()[ACTOR] = actor
    return actor
