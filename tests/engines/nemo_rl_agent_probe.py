"""Run in a NeMo RL checkout (cwd, on PYTHONPATH): a multi-turn plan's overrides parsed by NeMo
RL's own config loader against the release's grpo_math_1B.yaml, the splits converted by the
generated launcher, a task rendered by the registered processor and collated by NeMo RL's
``rl_collate_fn``, the conversation actor started by NeMo RL's own ``create_env`` on a local
Ray, and NeMo RL's own ``run_multi_turn_rollout`` driving a scripted support conversation
through it. A stand-in replaces only the vLLM generation (GPU).

Two things the CPU test machine lacks are stood in for: ``wandb`` (rollout metrics tables) and
the ``__init__`` of NeMo RL's model packages, which import GPU libraries and check the
transformers release; the modules used here are imported from their own files.

Usage: python nemo_rl_agent_probe.py RUN_DIR OVERRIDES.json TOKENIZER_DIR RAY_TMP
"""

import importlib.machinery
import inspect
import json
import sys
import types
from pathlib import Path

run_dir, overrides, tokenizer_dir, ray_dir = sys.argv[1:5]
run_dir = Path(run_dir)
sys.path.insert(0, str(run_dir))
sys.path.insert(0, str(Path.cwd()))
for package in ("nemo_rl.models", "nemo_rl.models.generation", "nemo_rl.experience"):
    module = types.ModuleType(package)
    module.__path__ = [package.replace(".", "/")]
    sys.modules[package] = module
wandb = types.ModuleType("wandb")
wandb.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
wandb.Histogram = wandb.Table = object
sys.modules["wandb"] = wandb

import ray  # noqa: E402
import torch  # noqa: E402
from nemo_rl.data.collate_fn import rl_collate_fn  # noqa: E402
from nemo_rl.data.processors import PROCESSOR_REGISTRY  # noqa: E402
from nemo_rl.distributed.batched_data_dict import BatchedDataDict  # noqa: E402
from nemo_rl.environments.utils import create_env  # noqa: E402
from nemo_rl.experience.rollouts import run_multi_turn_rollout  # noqa: E402
from nemo_rl.utils import config as nemo_config  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

SCRIPT = ["which order ?", '<tool_call>{"name": "lookup", "arguments": {}}</tool_call>', "lost"]

import stateset_nemo_rl as launcher  # noqa: E402

if hasattr(nemo_config, "register_omegaconf_resolvers"):
    nemo_config.register_omegaconf_resolvers()
else:
    OmegaConf.register_new_resolver("mul", lambda a, b: a * b)
cfg = OmegaConf.to_container(nemo_config.parse_hydra_overrides(
    nemo_config.load_config("examples/configs/grpo_math_1B.yaml"),
    json.loads(Path(overrides).read_text())), resolve=True)

tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
config = json.loads((run_dir / launcher.CONFIG_FILE).read_text())
kept = launcher.convert_splits(run_dir, config, tokenizer)
launcher.register(run_dir, conversation=True)
data = cfg["data"].get("default", cfg["data"])
processor = PROCESSOR_REGISTRY[data["processor"]]
row = json.loads((run_dir / "data" / "train.jsonl").read_text().splitlines()[0])
datum = {"messages": [{"role": "user", "content": row["input"]},
                      {"role": "assistant", "content": row["output"]}],
         "task_name": "stateset"}  # ResponseDataset's row: input and output as two messages
batch = rl_collate_fn([processor(datum, None, tokenizer, cfg["policy"][
    "max_total_sequence_length"], 0)])


class Generation:
    """vLLM generation as NeMo RL's rollout calls it, answering with the script."""

    def __init__(self):
        self.inputs = []

    def generate(self, data, greedy=False):
        rows, lengths = data["input_ids"], data["input_lengths"]
        self.inputs.append([rows[i, :lengths[i]].tolist() for i in range(len(lengths))])
        turn = len(self.inputs) - 1
        new = [tokenizer(SCRIPT[turn], add_special_tokens=False)["input_ids"]
               + [tokenizer.eos_token_id] for _ in range(len(lengths))]
        width = max(int(lengths[i]) + len(new[i]) for i in range(len(lengths)))
        out = torch.full((len(lengths), width), tokenizer.pad_token_id, dtype=torch.long)
        for i in range(len(lengths)):
            n = int(lengths[i])
            out[i, :n] = rows[i, :n]
            out[i, n:n + len(new[i])] = torch.tensor(new[i])
        gen = torch.tensor([len(x) for x in new])
        return BatchedDataDict({"output_ids": out, "generation_lengths": gen,
                                "unpadded_sequence_lengths": lengths + gen,
                                "logprobs": torch.zeros_like(out, dtype=torch.float32)})


ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=ray_dir)
try:
    env_cfg = cfg["env"]["stateset_environment"]
    params = inspect.signature(create_env).parameters
    env = create_env("stateset_environment", {"stateset_environment": env_cfg}
                     if "env_configs" in params else env_cfg)
    generation = Generation()
    try:
        final, metrics = run_multi_turn_rollout(
            generation, batch, tokenizer, {"stateset": env},
            max_seq_len=cfg["policy"]["max_total_sequence_length"],
            max_rollout_turns=cfg["grpo"]["max_rollout_turns"])
    except Exception as exc:  # the bad-environment case: what the run stops with
        log = run_dir / "environment-failures.jsonl"
        print("PROBE " + json.dumps({"error": f"{type(exc).__name__}: {exc}",
                                     "failures": log.read_text().splitlines()
                                     if log.exists() else []}))
        sys.exit(0)
    log = final["message_log"][0]
    print("PROBE " + json.dumps({
        "kept": kept, "task": json.loads(row["output"]),
        "max_rollout_turns": cfg["grpo"]["max_rollout_turns"],
        "max_new_tokens": cfg["policy"]["generation"]["max_new_tokens"],
        "env_name": data["env_name"],
        "roles": [m["role"] for m in log],
        "contents": [m["content"] for m in log],
        "token_ids": [m["token_ids"].tolist() for m in log],
        "script_ids": [tokenizer(t, add_special_tokens=False)["input_ids"]
                       + [tokenizer.eos_token_id] for t in SCRIPT],
        "total_reward": final["total_reward"].tolist(), "metrics": metrics,
        "inputs": generation.inputs}))
finally:
    ray.shutdown()
