"""Run with verl's own interpreter: a multi-turn plan's overrides composed and validated by
verl, its converted split read by verl's RLHFDataset, and the generated agent loop registered
and instantiated exactly as verl's AgentLoopWorker does (the YAML named by
``agent_loop_config_path``, ``hydra.utils.instantiate`` of the ``default_agent_loop``), then
one scripted conversation driven through it: a stand-in for verl's LLM server answers each
turn with the script's tokens as verl's own ``TokenOutput``. Only the GPU server is replaced.

Usage: python verl_agent_probe.py RUN_DIR [--bad] < overrides.json; prints JSON on stdout.
"""

import asyncio
import json
import os
import sys
from pathlib import Path

run_dir = Path(sys.argv[1])
bad = sys.argv[2:] == ["--bad"]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(run_dir))

import hydra  # noqa: E402
import verl  # noqa: E402
from agent_shim_fixtures import SCRIPT, tokenizer  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop import agent_loop as verl_agent_loop  # noqa: E402
from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopBase,
    AgentLoopOutput,
    DictConfigWrap,
    ToolListWrap,
)
from verl.trainer.ppo.utils import need_critic, need_reference_policy  # noqa: E402
from verl.utils.config import validate_config  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

overrides = json.loads(sys.stdin.read())
config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
with initialize_config_dir(config_dir=config_dir, version_base=None):
    cfg = compose(config_name="ppo_trainer", overrides=overrides)
validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))

import stateset_verl_agent  # noqa: E402  the generated launcher's conversion half

stateset_verl_agent.prepare(run_dir)
tok = tokenizer(run_dir / "tokenizer")
dataset = RLHFDataset(data_files=[cfg.data.train_files], tokenizer=tok, config=cfg.data)
row = dataset[0]

rollout = cfg.actor_rollout_ref.rollout
for entry in OmegaConf.load(rollout.agent.agent_loop_config_path):  # as AgentLoopWorker does
    verl_agent_loop._agent_loop_registry[entry.name] = entry


class Server:
    """verl's LLM server client, answering each turn with the script (and recording asks)."""

    def __init__(self):
        self.asks = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        turn = len(self.asks)
        self.asks.append({"prompt": list(prompt_ids), "sampling_params": dict(sampling_params)})
        ids = tok(SCRIPT[turn], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[-0.25 - 0.01 * i for i in range(len(ids))])


server = Server()
kwargs = {k: v for k, v in row.items() if k != "dummy_tensor"}
sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0,
            "logprobs": True}
agents = []


async def main():
    """As AgentLoopWorker._run_agent_loop: instantiate inside the running loop, then run."""
    agent = hydra.utils.instantiate(
        config=verl_agent_loop._agent_loop_registry[rollout.agent.default_agent_loop],
        trainer_config=DictConfigWrap(config=cfg), server_manager=server, tokenizer=tok,
        processor=None, hf_model_type=None, dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data), tools=ToolListWrap([]))
    agents.append(agent)
    return await agent.run(sampling, **kwargs)


try:
    output = asyncio.run(main())
except Exception as exc:  # the bad-environment case: what the run stops with
    log = run_dir / "environment-failures.jsonl"
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}", "asks": len(server.asks),
                      "failures": log.read_text().splitlines() if log.exists() else []}))
    sys.exit(0)
assert isinstance(agents[0], AgentLoopBase) and isinstance(output, AgentLoopOutput)
tensors = output.as_dict()  # verl's own conversion (rm_scores on the last token)
sampled = [[tok.decode(a["prompt"])] for a in server.asks]
print(json.dumps({
    "task": json.loads(kwargs["stateset_task"]), "raw_prompt": list(kwargs["raw_prompt"]),
    "prompt_ids": output.prompt_ids, "response_ids": output.response_ids,
    "response_mask": output.response_mask, "response_logprobs": output.response_logprobs,
    "reward_score": output.reward_score, "turn_scores": output.extra_fields["turn_scores"],
    "rm_scores_sum": float(tensors["rm_scores"].sum()),
    "prompt_text": tok.decode(output.prompt_ids), "asks": server.asks,
    "eos": tok.eos_token_id, "script_ids": [tok(t, add_special_tokens=False)["input_ids"]
                                            for t in SCRIPT],
    "rollout_response_length": rollout.response_length, "sampled_contexts": sampled}))
