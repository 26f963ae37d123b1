"""The generated NeMo RL launcher: split conversion, prompt rendering and scoring.

The first tests need no NeMo RL. The last one needs real NeMo RL checkouts, named by
``STATESET_TEST_NEMO_RL_CHECKOUTS`` (paths separated by ``os.pathsep``; NeMo RL is not on
PyPI): in each, the launcher registers itself with NeMo RL's own registries, NeMo RL's own
data setup reads the converted splits through the registered processor, NeMo RL's own
``create_env`` starts the reward environment as a Ray actor on a local Ray, and the actor
scores a response with the example's reward. The test interpreter imports those NeMo RL
modules, so it needs their imports: ``datasets``, and ``decord`` (v0.6.0) or ``soundfile``
and ``scipy`` (v0.7.0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stateset_backend.adapters.nemo_rl import launcher as launcher
from stateset_backend.adapters.nemo_rl.adapter import NemoRLAdapter
from stateset_backend.adapters.nemo_rl.render import LAUNCHER_FILE
from stateset_backend.engines.registry import AdapterEntry
from stateset_backend.native.tiny_model import ASSETS
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.files import load_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "external"
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def _plan(version: str, example: str = "grpo"):
    entry = AdapterEntry(NemoRLAdapter(), "builtin", "stateset-backend", "0.1.0")
    return make_plan(load_spec(EXAMPLES / f"{example}.json"), entry, version,
                     base_dir=EXAMPLES)


def _run_dir(version: str, tmp_path: Path) -> tuple[Path, list[str]]:
    """The plan's files written as a launch writes them, and its overrides for ``run_dir``."""
    plan = _plan(version)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name, text in plan.files.items():
        (run_dir / name).write_text(text)
    at = plan.argv.index("--config")
    return run_dir, [a.replace("{run_dir}", str(run_dir)) for a in plan.argv[at + 2:]]


def test_the_launch_runs_the_launcher_with_the_splits_it_converts(tmp_path):
    plan = _plan("0.7.0")
    assert plan.argv[plan.argv.index("python") + 1:][:2] == [
        f"{{run_dir}}/{LAUNCHER_FILE}", "{engine_home}/examples/run_grpo.py"]
    assert plan.files[LAUNCHER_FILE] == Path(launcher.__file__).read_text()
    splits = json.loads(plan.files[launcher.CONFIG_FILE])["splits"]
    assert splits == {name: {"source": str(EXAMPLES / "data" / f"{name}.parquet"),
                             "prompt_field": "prompt", "answer_field": "answer"}
                      for name in ("train", "validation")}


def test_splits_become_response_dataset_rows(tmp_path):
    source = EXAMPLES / "data" / "train.parquet"
    target = tmp_path / "data" / "train.jsonl"
    count = launcher.convert_split(str(source), target, "prompt", "answer")
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    originals = launcher.read_rows(str(source))
    assert count == len(rows) == len(originals) > 0
    for row, original in zip(rows, originals, strict=True):
        assert json.loads(row["input"]) == original["prompt"]  # chat messages, kept whole
        assert row["output"] == original["answer"]
    assert not list(tmp_path.glob("data/*.partial"))


def test_a_text_prompt_is_one_user_message_and_a_bad_row_is_named(tmp_path):
    source = tmp_path / "split.jsonl"
    source.write_text('{"q": "hello", "a": 3}\n{"q": {"not": "a prompt"}, "a": 1}\n')
    with pytest.raises(SystemExit, match=r"split.jsonl: row 2: a prompt must be text or chat"):
        launcher.convert_split(str(source), tmp_path / "out.jsonl", "q", "a")
    assert not (tmp_path / "out.jsonl").exists()
    source.write_text('{"q": "hello", "a": 3}\n')
    launcher.convert_split(str(source), tmp_path / "out.jsonl", "q", "a")
    row = json.loads((tmp_path / "out.jsonl").read_text())
    assert json.loads(row["input"]) == [{"role": "user", "content": "hello"}]
    assert row["output"] == "3"


def _tokenizer():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ASSETS / "tiny-llama-support")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def test_the_processor_renders_the_chat_and_keeps_prompt_and_answer_for_the_reward():
    pytest.importorskip("torch")
    tokenizer = _tokenizer()
    messages = [{"role": "system", "content": "route it"},
                {"role": "user", "content": "where is my parcel"}]
    datum = {"messages": [{"role": "user", "content": json.dumps(messages)},
                          {"role": "assistant", "content": "track_order"}], "task_name": "t"}
    out = launcher.process(datum, None, tokenizer, 512, 7)
    rendered = ("<system>route it</system><user>where is my parcel</user><assistant>")
    assert out["message_log"][0]["content"] == rendered
    assert out["extra_env_info"] == {"prompt": "where is my parcel",
                                     "ground_truth": "track_order"}
    assert out["length"] == len(out["message_log"][0]["token_ids"])
    assert (out["loss_multiplier"], out["idx"], out["task_name"]) == (1.0, 7, "t")
    short = launcher.process(datum, None, tokenizer, 3, 7)  # too long: a stub, learned from 0x
    assert short["loss_multiplier"] == 0.0 and len(short["message_log"][0]["token_ids"]) == 3


def test_prompts_over_the_limit_are_dropped_as_the_processor_counts_them(tmp_path):
    pytest.importorskip("torch")
    tokenizer = _tokenizer()
    source = tmp_path / "split.jsonl"
    rows = [{"q": "hi", "a": 1}, {"q": "word " * 200, "a": 2}, {"q": "hello there", "a": 3}]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    limit = max(len(launcher.render_prompt(tokenizer, launcher.prompt_messages(r["q"]))[1])
                for r in (rows[0], rows[2]))
    fits = launcher.prompt_limit(tokenizer, limit, "drop", str(source))
    assert launcher.convert_split(str(source), tmp_path / "out.jsonl", "q", "a", fits) == 2
    kept = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [row["output"] for row in kept] == ["1", "3"]
    for row in kept:  # NeMo RL's own limit (one above ours) never stubs a kept prompt
        datum = {"messages": [{"role": "user", "content": row["input"]},
                              {"role": "assistant", "content": row["output"]}],
                 "task_name": "t"}
        assert launcher.process(datum, None, tokenizer, limit + 1, 0)["loss_multiplier"] == 1.0
    stop = launcher.prompt_limit(tokenizer, limit, "error", str(source))
    with pytest.raises(SystemExit, match=r"over data.max_prompt_tokens"):
        launcher.convert_split(str(source), tmp_path / "out2.jsonl", "q", "a", stop)


def test_too_few_train_rows_for_one_update_stop_before_nemo_rl_starts(tmp_path):
    pytest.importorskip("torch")
    source = tmp_path / "train.jsonl"
    source.write_text("".join(json.dumps({"q": f"p{i}", "a": i}) + "\n" for i in range(5)))
    config = {"splits": {"train": {"source": str(source), "prompt_field": "q",
                                   "answer_field": "a"}},
              "max_prompt_tokens": 64, "prompt_overflow": "drop", "min_train_rows": 6}
    with pytest.raises(SystemExit, match=r"5 train rows fit .* one update needs 6"):
        launcher.convert_splits(tmp_path, config, _tokenizer())
    assert launcher.convert_splits(tmp_path, {**config, "min_train_rows": 5},
                                   _tokenizer()) == {"train": 5}


CHECKOUTS = [Path(p) for p in os.environ.get("STATESET_TEST_NEMO_RL_CHECKOUTS", "").split(
    os.pathsep) if p]

PROBE = '''
import json, sys
from pathlib import Path

import ray
from transformers import AutoTokenizer

from omegaconf import OmegaConf
from nemo_rl.utils import config as nemo_config

run_dir, overrides, tokenizer_dir, template, ray_dir = sys.argv[1:]
run_dir = Path(run_dir)
sys.path.insert(0, str(run_dir))
import stateset_nemo_rl as launcher

launcher.prepare(run_dir)
# the configuration exactly as run_grpo.py builds it from our overrides
if hasattr(nemo_config, "register_omegaconf_resolvers"):
    nemo_config.register_omegaconf_resolvers()
else:  # v0.5.0 registers its one resolver at the top of run_grpo.py
    OmegaConf.register_new_resolver("mul", lambda a, b: a * b)
cfg = nemo_config.parse_hydra_overrides(
    nemo_config.load_config("examples/configs/grpo_math_1B.yaml"),
    json.loads(Path(overrides).read_text()))
cfg = OmegaConf.to_container(cfg, resolve=True)
tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
tokenizer.chat_template = template
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=ray_dir)
try:
    from nemo_rl.data.utils import setup_response_data
    train, val, task_to_env, val_task_to_env = setup_response_data(tokenizer, cfg["data"],
                                                                   cfg["env"])
except ImportError:
    # v0.5.0's data setup is run_grpo.setup_data, in a script that imports the GPU trainer:
    # these are the NeMo RL calls it makes, in its order
    from nemo_rl.data.datasets import AllTaskProcessedDataset, load_response_dataset
    from nemo_rl.environments.utils import create_env

    env = create_env(env_name=cfg["data"]["env_name"], env_configs=cfg["env"])
    data = load_response_dataset(cfg["data"], cfg["grpo"]["seed"])
    processors = {data.task_name: (data.task_spec, data.processor)}
    train, val = (AllTaskProcessedDataset(data.formatted_ds[split], tokenizer, data.task_spec,
                                          processors,
                                          max_seq_length=cfg["data"]["max_input_seq_length"])
                  for split in ("train", "validation"))
    task_to_env = val_task_to_env = {data.task_name: env}
datum = train[0]
env = task_to_env[datum["task_name"]]
info = datum["extra_env_info"]
logs = [datum["message_log"] + [{"role": "assistant", "content": info["ground_truth"] + " now"}],
        datum["message_log"] + [{"role": "assistant", "content": "escalate"}]]
result = ray.get(env.step.remote(logs, [info, info]))
print("PROBE " + json.dumps({
    "train": len(train), "validation": len(val), "info": info,
    "rendered": datum["message_log"][0]["content"], "rewards": result.rewards.tolist(),
    "terminated": result.terminateds.tolist(),
    "same_env_for_validation": val_task_to_env[val[0]["task_name"]] is env}))
ray.shutdown()
'''


@pytest.mark.skipif(not CHECKOUTS, reason="STATESET_TEST_NEMO_RL_CHECKOUTS names no NeMo RL "
                                          "checkout (NeMo RL is not on PyPI)")
@pytest.mark.parametrize("checkout", CHECKOUTS, ids=lambda p: p.name)
def test_nemo_rl_reads_the_splits_and_scores_with_the_registered_environment(
        checkout, tmp_path, tmp_path_factory):
    version = NemoRLAdapter().installed_version(home=str(checkout))
    assert version is not None
    run_dir, overrides = _run_dir(version, tmp_path)
    config = tmp_path / "overrides.json"
    config.write_text(json.dumps(overrides))
    # a private local Ray that leaves no auth token behind for later clusters
    env = {**os.environ, "PYTHONPATH": str(checkout), "RAY_ADDRESS": "",
           "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.run([sys.executable, "-c", PROBE, str(run_dir), str(config),
                           str(ASSETS / "tiny-llama-support"), CHAT_TEMPLATE,
                           str(tmp_path_factory.mktemp("ray"))],
                          cwd=checkout, env=env, capture_output=True, text=True, timeout=300)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PROBE ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(line.removeprefix("PROBE "))
    rows = {name: len(launcher.read_rows(str(EXAMPLES / "data" / f"{name}.parquet")))
            for name in ("train", "validation")}
    assert (out["train"], out["validation"]) == (rows["train"], rows["validation"])
    first = launcher.read_rows(str(EXAMPLES / "data" / "train.parquet"))[0]
    assert out["info"] == {"prompt": first["prompt"][-1]["content"],
                           "ground_truth": first["answer"]}
    assert out["rendered"] == f"<user>{first['prompt'][-1]['content']}</user><assistant>"
    # the example reward: the right action first is 1.0, a valid wrong one 0.1
    wrong = 1.0 if first["answer"] == "escalate" else 0.1
    assert out["rewards"] == pytest.approx([1.0, wrong])
    assert out["terminated"] == [1.0, 1.0] and out["same_env_for_validation"]
