"""Stand-ins for the built-in engines' entry points, for running a launch without the engine.

Each stub sits where the engine's own module would be (``verl.trainer.main_ppo``,
``openrlhf.cli.train_ppo_ray``, NeMo RL's ``examples/run_grpo.py`` and the registries the
launcher fills), written from the engines' code, not from the adapters: it takes what the launch
hands the engine, scores the kit's cases through the engine's own reward call, and writes what
it received as JSON to ``$STATESET_KIT_RECEIVED``: ``{"argv": [...], "config": {...},
"rewards": [...]}``. A launch that names another entry point, a launcher that changes what it
hands on, or a reward shim that does not answer the engine's call fails there.

A plugin provides the same for its engine as ``KitSupport.engine_stub`` (docs/plugins.md).
"""

from __future__ import annotations

# the part every stub shares: the cases to score and where to write what was received
_COMMON = '''
import json
import os
import sys


def cases():
    return json.loads(os.environ["STATESET_KIT_CASES"])


def received(**doc):
    with open(os.environ["STATESET_KIT_RECEIVED"], "w", encoding="utf-8") as fh:
        json.dump(doc, fh, default=str)


def overrides(argv):
    """Hydra overrides as the engine's Hydra parses them, by dotted key."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(
        overrides=[a for a in argv if "=" in a and not a.startswith("-")])
    return {o.key_or_group.lstrip("+"): o.value() for o in parsed}


def load(path):
    """A module from a file, as the engines import a custom reward file."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("stateset_kit_reward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
'''

# verl's main_ppo: NaiveRewardManager calls custom_reward_function.name from .path with
# keyword arguments, solution_str the decoded response, ground_truth the row's answer
_VERL = '''
from stateset_kit_stub import cases, load, overrides, received
import sys

config = overrides(sys.argv[1:])
where = next(k for k in ("reward.custom_reward_function", "custom_reward_function")
             if f"{k}.path" in config)  # moved under reward. in 0.7
path, name = config[f"{where}.path"], config[f"{where}.name"]
score = getattr(load(path), name)
rewards = [float(score(data_source="stateset", solution_str=c["response"],
                       ground_truth=c["answer"], extra_info={"prompt": c["prompt"]}))
           for c in cases()]
received(argv=sys.argv[1:], config=config, rewards=rewards)
'''

# OpenRLHF's train_ppo_ray: a remote reward given as a .py file is loaded and its reward_func
# called with the full sequences (prompt + response), the prompts and the labels; it returns
# a tensor or a dict holding "rewards"
_OPENRLHF = '''
from stateset_kit_stub import cases, load, received
import sys

import argparse

argv = sys.argv[1:]
parser = argparse.ArgumentParser(add_help=False)  # the flag moved in 0.10
parser.add_argument("--remote_rm_url", "--reward.remote_url", dest="url")
reward_func = load(parser.parse_known_args(argv)[0].url).reward_func
got = reward_func([c["prompt"] + c["response"] for c in cases()],
                  [c["prompt"] for c in cases()], [c["answer"] for c in cases()])
rewards = got["rewards"] if isinstance(got, dict) else got
received(argv=argv, rewards=[float(r) for r in rewards])
'''

# NeMo RL: run_grpo.py loads --config and applies the Hydra overrides; the data setup maps
# each ResponseDataset row through the registered processor, and the registered environment
# actor's step() scores a batch of message logs with their extra_env_info as metadata
_NEMO_RUN_GRPO = '''
import json
import sys
from pathlib import Path

from stateset_kit_stub import cases, overrides, received
from nemo_rl.data.processors import PROCESSOR_REGISTRY
from nemo_rl.environments.utils import ENV_REGISTRY

argv = sys.argv[1:]
config = overrides(argv)


def setting(*keys):  # the key moved between releases (0.5: data.X, 0.6 on: data.default.X)
    return next(config[k] for k in keys if k in config)


data = setting("data.train.data_path", "data.train_data_path")
rows = [json.loads(line) for line in Path(data).read_text().splitlines() if line.strip()]
processor = PROCESSOR_REGISTRY[setting("data.default.processor", "data.processor")]
env_name = setting("data.default.env_name", "data.env_name")
module, _, cls = ENV_REGISTRY[env_name]["actor_class_fqn"].rpartition(".")
import importlib
environment = getattr(importlib.import_module(module), cls)({})
rewards = []
for case in cases():
    datum = {"messages": [{"role": "user", "content": rows[0]["input"]},
                          {"role": "assistant", "content": case["answer"]}],
             "task_name": env_name}
    spec = processor(datum, None, Tokenizer(), 4096, 0)
    meta = {**spec["extra_env_info"], "prompt": case["prompt"]}
    result = environment.step([[{"role": "assistant", "content": case["response"]}]], [meta])
    rewards.append(float(result.rewards[0]))
prompts = []
for row in rows:  # each prompt as the policy and the reward see it, beside the chat template's
    messages = json.loads(row["input"])
    datum = {"messages": [{"role": "user", "content": row["input"]},
                          {"role": "assistant", "content": row["output"]}],
             "task_name": env_name}
    spec = processor(datum, None, Tokenizer(), 4096, 0)
    prompts.append({"seen": spec["message_log"][0]["content"],
                    "template": Tokenizer().apply_chat_template(
                        messages, tokenize=False, add_generation_prompt=True),
                    "reward_prompt": spec["extra_env_info"]["prompt"],
                    "last_user": next((m["content"] for m in reversed(messages)
                                       if m["role"] == "user"), "")})
received(argv=argv, config=config, rewards=rewards, rows=len(rows), prompts=prompts)
'''

# what the NeMo RL launcher imports from NeMo RL and its dependencies, as small as it uses them
_NEMO_REGISTRIES = {
    "nemo_rl/__init__.py": "",
    "nemo_rl/data/__init__.py": "",
    "nemo_rl/data/processors.py": '''
PROCESSOR_REGISTRY = {}


def register_processor(name, processor):
    if name in PROCESSOR_REGISTRY:
        raise ValueError(f"processor {name} is already registered")
    PROCESSOR_REGISTRY[name] = processor
''',
    "nemo_rl/distributed/__init__.py": "",
    "nemo_rl/distributed/ray_actor_environment_registry.py": "ACTOR_ENVIRONMENT_REGISTRY = {}\n",
    "nemo_rl/distributed/virtual_cluster.py": '''
class PY_EXECUTABLES:
    SYSTEM = "python"
''',
    "nemo_rl/environments/__init__.py": "",
    "nemo_rl/environments/interfaces.py": '''
from typing import Any, NamedTuple


class EnvironmentReturn(NamedTuple):
    observations: Any
    metadata: Any
    next_stop_strings: Any
    rewards: Any
    terminateds: Any
    answers: Any = None
''',
    "nemo_rl/environments/utils.py": '''
ENV_REGISTRY = {}


def register_env(env_name, actor_class_fqn):
    if env_name in ENV_REGISTRY:
        raise ValueError(f"environment {env_name} is already registered")
    ENV_REGISTRY[env_name] = {"actor_class_fqn": actor_class_fqn}
''',
    "ray/__init__.py": '''
def remote(*args, **kwargs):
    return lambda cls: cls
''',
    # a character tokenizer: the launcher renders prompts with the model's chat template
    "transformers/__init__.py": '''
class Tokenizer:
    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False,
                            **kwargs):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + (
            "<assistant>" if add_generation_prompt else "")

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        import torch

        return {"input_ids": torch.tensor([[ord(c) % 256 for c in text]])}


class AutoTokenizer:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        return Tokenizer()
''',
}

# (every stub root also gets the shared helpers as stateset_kit_stub.py: launch_run adds them)
BUILTIN: dict[str, dict[str, str]] = {
    "verl": {"verl/__init__.py": "", "verl/trainer/__init__.py": "",
             "verl/trainer/main_ppo.py": _VERL},
    "openrlhf": {"openrlhf/__init__.py": "", "openrlhf/cli/__init__.py": "",
                 "openrlhf/cli/train_ppo_ray.py": _OPENRLHF},
    "nemo-rl": {**_NEMO_REGISTRIES,
                "examples/run_grpo.py": "from transformers import Tokenizer\n" +
                                        _NEMO_RUN_GRPO},
}


def common() -> str:
    """The helpers every stub may import as ``stateset_kit_stub``."""
    return _COMMON
