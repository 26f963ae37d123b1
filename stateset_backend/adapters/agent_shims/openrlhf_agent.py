"""OpenRLHF's agent function for the spec's environment, and the launcher that feeds it (run
directory name: ``stateset_openrlhf_agent.py``).

OpenRLHF loads the file named by ``--agent_func_path`` (``--train.agent_func_path`` from
0.10.2) in each vLLM rollout actor and calls ``AgentExecutor().execute(prompt, label,
sampling_params, max_length, hf_tokenizer, llm_engine, images=None)`` once per sample; the
returned dict (``observation_tokens``, ``action_ranges``, ``reward``, ...) becomes one
experience, whose action mask is 1 exactly on ``action_ranges``. OpenRLHF's own
``MultiTurnAgentExecutor`` gives every turn the whole remaining budget, so this executor runs
the conversation itself:

- ``label`` is the original row of the spec's split (``stateset_task``, written by the
  launcher); ``reset`` receives it, and the openings are rendered with the model's chat
  template and the environment's tools (``prompt``, the dataset's rendering of the prompt
  field, is not used). An opening over ``data.max_prompt_tokens`` fails the conversation;
- each turn samples at most the turn limit and starts only if a whole turn still fits
  ``max_length`` (the total limit); its text becomes a neutral message (Hermes
  ``<tool_call>`` blocks naming a declared tool become structured calls);
- observations are the chat template's rendering of the conversation after the sampled
  tokens, and lie outside ``action_ranges``: they never carry loss. Observations that would
  leave no room for the next turn end the conversation untokenized;
- ``reward`` is the conversation's reward (the last step's, or the discounted return for
  ``per_turn``); sampling log-probs are recorded when OpenRLHF asks for them.

Run as a script, this module converts the splits into JSON lines OpenRLHF's PromptDataset
reads (``prompt`` text and the original row as ``stateset_task``, the label) and runs
``openrlhf.cli.train_ppo_ray`` with the same arguments.
"""

from __future__ import annotations

import asyncio
import runpy
import sys
from copy import deepcopy
from pathlib import Path
from typing import Any

import stateset_environment as env_shim

DATA_DIR = "data"
PROMPT_KEY = "prompt"

try:  # the launcher half runs before OpenRLHF is imported
    from openrlhf.utils.agent import AgentExecutorBase
except ImportError:  # pragma: no cover - only when the launcher runs without OpenRLHF
    AgentExecutorBase = object


class AgentExecutor(AgentExecutorBase):
    """One conversation with the spec's environment per ``execute``."""

    def __init__(self) -> None:
        self.settings = env_shim.here_config()
        self.tools: list[dict[str, Any]] | None = None

    async def execute(self, prompt: Any, label: Any, sampling_params: Any, max_length: int,
                      hf_tokenizer: Any, llm_engine: Any, images: Any = None) -> dict[str, Any]:
        if images:
            raise ValueError("the spec's environment is text-only; this sample has images")
        conversation = env_shim.Conversation(self.settings, env_shim.Session(self.settings))
        try:
            return await self._talk(conversation, prompt, label, sampling_params, max_length,
                                    hf_tokenizer, llm_engine)
        finally:
            conversation.session.close()

    async def _talk(self, conversation: Any, prompt: Any, label: Any, sampling_params: Any,
                    max_length: int, tokenizer: Any, llm_engine: Any) -> dict[str, Any]:
        settings = self.settings
        if self.tools is None:
            self.tools = await asyncio.to_thread(env_shim.describe, settings)
        tools = self.tools
        openings = await asyncio.to_thread(conversation.open, env_shim.task_of(label))
        text = env_shim.render(tokenizer, openings, tools, True)
        tokens = _encode(tokenizer, text)
        if len(tokens) > settings["max_prompt_tokens"]:
            conversation.fail(f"the opening has {len(tokens)} tokens, over "
                              f"data.max_prompt_tokens {settings['max_prompt_tokens']}")
        turn_limit = settings["max_turn_tokens"]
        room = min(max_length, settings["max_total_tokens"])
        ranges: list[tuple[int, int]] = []
        logprobs: list[float] | None = [0.0] * len(tokens) \
            if sampling_params.logprobs is not None else None
        truncated = False
        while not conversation.done and len(tokens) + turn_limit <= room:
            params = deepcopy(sampling_params)
            params.max_tokens = turn_limit
            output = (await llm_engine.generate(list(tokens), params)).outputs[0]
            action = list(output.token_ids)
            truncated = output.finish_reason == "length"
            ranges.append((len(tokens), len(tokens) + len(action)))
            tokens += action
            if logprobs is not None:
                logprobs += [step[token].logprob for step, token in zip(output.logprobs, action,
                                                                         strict=True)]
            before = list(conversation.messages)
            message = env_shim.parse_assistant(
                tokenizer.decode(action, skip_special_tokens=True), tools)
            await asyncio.to_thread(conversation.step, message)
            if conversation.done:
                break
            feedback = _encode(tokenizer, env_shim.observation_text(
                tokenizer, [*before, message], conversation.messages[len(before) + 1:], tools,
                ended_with_eos=not truncated))
            if len(tokens) + len(feedback) + turn_limit > room:
                break  # the observations leave no room for a whole turn: recorded only
            tokens += feedback
            if logprobs is not None:
                logprobs += [0.0] * len(feedback)
        reward = await asyncio.to_thread(conversation.reward)
        return {"prompt": prompt, "label": label, "images": None, "mm_train_inputs": None,
                "reward": reward, "scores": reward, "observation_tokens": tokens,
                "action_ranges": ranges, "rollout_log_probs": logprobs, "truncated": truncated,
                "extra_logs": {"turns": float(conversation.turns)}}


def _encode(tokenizer: Any, text: str) -> list[int]:
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return list(ids)


def _openrlhf_row(index: int, row: dict[str, Any],
                  messages: list[dict[str, str]]) -> dict[str, Any]:
    return {PROMPT_KEY: messages}


def prepare(run_dir: Path) -> None:
    settings = env_shim.load_config(run_dir)
    for name, split in settings["splits"].items():
        count = env_shim.convert_split(split["source"], run_dir / DATA_DIR / f"{name}.jsonl",
                                       split["prompt_field"], _openrlhf_row)
        print(f"stateset-backend: {name} split: {count} tasks from {split['source']}",
              flush=True)


def main(argv: list[str]) -> None:
    prepare(Path(__file__).resolve().parent)
    sys.argv = ["openrlhf.cli.train_ppo_ray", *argv]
    runpy.run_module("openrlhf.cli.train_ppo_ray", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
