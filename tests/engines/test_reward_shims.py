"""The generated reward module each external engine imports: it is executed here with each
engine's own calling convention, scores with the spec's function, and refuses a reward file
whose sha256 no longer matches the pin, in the process that scores."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from golden import variant

from stateset_backend.adapters.nemo_rl.adapter import NemoRLAdapter
from stateset_backend.adapters.openrlhf.adapter import OpenRLHFAdapter
from stateset_backend.adapters.verl.adapter import VerlAdapter
from stateset_backend.conformance.samples import parquet_row
from stateset_backend.engines.registry import AdapterEntry
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.content import sha256_file
from stateset_backend.spec.files import parse_spec
from stateset_backend.spec.inputs import REWARD_SHIM_FILE

REWARD = '''
def score(prompt, response, answer):
    return 1.0 if response.strip() == answer else 0.0 if prompt else -1.0
'''

ENGINES = {"verl": (VerlAdapter, "0.9.1"), "openrlhf": (OpenRLHFAdapter, "0.11.2"),
           "nemo-rl": (NemoRLAdapter, "0.7.0")}


def _shim(engine: str, tmp_path: Path) -> tuple[Path, Path]:
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    import pyarrow as pa
    import pyarrow.parquet as pq

    # verl's row layout, which the other engines' loaders read too
    pq.write_table(pa.Table.from_pylist([parquet_row({"prompt": f"p{i}", "answer": "a"}, i)
                                         for i in range(8)]), tmp_path / "train.parquet")
    doc = variant({
        "name": "shim", "seed": 1,
        "algorithm": {"objective": "grpo", "group_size": 4},
        "model": {"path": "/models/m"},
        "data": {"train": {"uri": "train.parquet",
                           "sha256": sha256_file(tmp_path / "train.parquet"),
                           "prompt_field": "prompt", "answer_field": "answer"}},
        "reward": {"entrypoint": "reward.py:score", "sha256": sha256_file(reward)},
        "budget": {"total_updates": 2, "prompts_per_update": 4},
        "resources": {"nodes": 1, "gpus_per_node": 1},
    }, {"objective": "grpo"}, algorithm_defaults={"loss_aggregation": "token_mean"})
    adapter_class, version = ENGINES[engine]
    entry = AdapterEntry(adapter_class(), "builtin", "stateset-backend", "0.1.0")
    plan = make_plan(parse_spec(doc), entry, version, base_dir=tmp_path)
    shim = tmp_path / "run" / REWARD_SHIM_FILE
    shim.parent.mkdir()
    shim.write_text(plan.files[REWARD_SHIM_FILE])
    return shim, reward


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("stateset_reward_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_verl_calls_compute_score(tmp_path):
    module = _load(_shim("verl", tmp_path)[0])
    assert module.compute_score("src", " a ", "a", {"prompt": "p"}) == 1.0
    assert module.compute_score("src", "b", "a", None) == -1.0  # no prompt in extra_info


def test_openrlhf_calls_reward_func_with_full_queries(tmp_path):
    torch = pytest.importorskip("torch")
    module = _load(_shim("openrlhf", tmp_path)[0])
    out = module.reward_func(["Q: a", "Q: b"], ["Q:", "Q:"], ["a", "a"])
    assert torch.equal(out["rewards"], torch.tensor([1.0, 0.0]))


def test_nemo_rl_environment_calls_score(tmp_path):
    module = _load(_shim("nemo-rl", tmp_path)[0])
    assert module.score("p", "a", "a") == 1.0


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_reward_file_changed_after_planning_is_refused_where_it_is_scored(engine, tmp_path):
    shim, reward = _shim(engine, tmp_path)
    reward.write_text(REWARD.replace("1.0 if", "0.5 if"))
    with pytest.raises(RuntimeError, match="no longer has the pinned sha256"):
        _load(shim)
    assert "stateset_reward_under_test" not in sys.modules
