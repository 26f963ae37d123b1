"""verl 0.9.1 runs the spec's environment through the generated agent loop.

The multi-turn plan of examples/external/support-agent.json composes against verl's own Hydra
config and passes verl's ``validate_config``; its converted split is read by verl's own
``RLHFDataset``; the agent loop is registered and instantiated as verl's ``AgentLoopWorker``
does, and a scripted support conversation goes through it (verl_agent_probe.py, in verl's
interpreter): only the assistant's sampled tokens carry ``response_mask`` 1, each turn asks
verl's server for at most the turn limit, the reward is the conversation's and an environment
that raises stops the run with the failure recorded. Needs STATESET_TEST_VERL_PYTHON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from agent_shim_fixtures import REWARDS, SCRIPT, TASK, bad_environment
from optional_installs import VERL_PYTHON_MISSING

from stateset_backend.adapters.verl.adapter import VerlAdapter
from stateset_backend.common.errors import Unsupported
from stateset_backend.engines.registry import AdapterEntry
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.files import load_spec
from stateset_backend.translate.hub import hub_snapshot

VERL_PYTHON = os.environ.get("STATESET_TEST_VERL_PYTHON")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "external"
PROBE = Path(__file__).with_name("verl_agent_probe.py")
COMMIT = "7ae557604adf67be50417f59c2c2f167def9a775"
needs_verl = pytest.mark.skipif(VERL_PYTHON is None, reason=VERL_PYTHON_MISSING)


@pytest.fixture(autouse=True)
def hub_cache(tmp_path, monkeypatch):
    """The pinned snapshot in a Hugging Face cache (verl reads its config when validating)."""
    from stateset_backend.native.tiny_model import ASSETS

    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    snapshot = Path(hub_snapshot("Qwen/Qwen2.5-0.5B-Instruct", COMMIT))
    shutil.copytree(ASSETS / "tiny-llama-support", snapshot)
    config = json.loads((snapshot / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    (snapshot / "config.json").write_text(json.dumps(config))
    return cache


def _plan(version: str = "0.9.1"):
    entry = AdapterEntry(VerlAdapter(), "builtin", "stateset-backend", "0.1.0")
    return make_plan(load_spec(EXAMPLES / "support-agent.json"), entry, version,
                     base_dir=EXAMPLES)


def _probe(tmp_path: Path, bad: bool = False) -> dict:
    plan = _plan()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name, text in plan.files.items():
        (run_dir / name).write_text(text)
    if bad:
        settings = json.loads((run_dir / "stateset_conversation.json").read_text())
        path = bad_environment(tmp_path / "env", "raise RuntimeError('tool backend down')")
        import hashlib

        settings["environment"] = {"path": str(path), "class": "Bad",
                                   "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        (run_dir / "stateset_conversation.json").write_text(json.dumps(settings))
    assert plan.argv[:2] == ["{python}", "{run_dir}/stateset_verl_agent.py"]
    overrides = [a.replace("{run_dir}", str(run_dir)) for a in plan.argv[2:]]
    proc = subprocess.run([VERL_PYTHON or "", str(PROBE), str(run_dir),
                           *(["--bad"] if bad else [])], input=json.dumps(overrides),
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_verl
@pytest.mark.slow
def test_scripted_conversation_through_verls_agent_loop(tmp_path):
    out = _probe(tmp_path)
    assert "error" not in out, out
    assert out["task"] == TASK  # reset got the split's own row
    mask, response = out["response_mask"], out["response_ids"]
    assert len(mask) == len(response) <= out["rollout_response_length"]
    sampled = [t for t, m in zip(response, mask, strict=True) if m == 1]
    script = [t for ids in out["script_ids"] for t in [*ids, out["eos"]]]
    assert sampled == script  # exactly the sampled tokens carry loss, every one of them
    environment = [t for t, m in zip(response, mask, strict=True) if m == 0]
    assert environment  # the observations are there, in context, with mask 0
    assert len(out["asks"]) == len(SCRIPT)
    assert {a["sampling_params"]["max_tokens"] for a in out["asks"]} == {128}  # turn limit
    logprobs = [p for p, m in zip(out["response_logprobs"], mask, strict=True) if m == 1]
    assert logprobs == pytest.approx([-0.25 - 0.01 * i for ids in out["script_ids"]
                                      for i in range(len(ids) + 1)])
    assert out["turn_scores"] == REWARDS
    assert out["reward_score"] == pytest.approx(sum(REWARDS)) == out["rm_scores_sum"]
    assert "Tools:" in out["prompt_text"] and TASK["prompt"] in out["prompt_text"]
    # each turn is generated from everything before it: prompt, turns and observations
    assert out["asks"][1]["prompt"] == out["prompt_ids"] + response[:len(out["asks"][1][
        "prompt"]) - len(out["prompt_ids"])]


@needs_verl
@pytest.mark.slow
def test_an_environment_that_raises_stops_verls_run_recorded(tmp_path):
    out = _probe(tmp_path, bad=True)
    assert "EnvironmentFailed" in out["error"] and "tool backend down" in out["error"]
    assert "max_failed_share is 0" in out["error"] and out["asks"] == 1
    assert [json.loads(line)["task"] for line in out["failures"]] == [TASK]


def test_only_verl_091_runs_conversations():
    with pytest.raises(Unsupported, match=r"tool_use \(available in verl >=0.9.1\)"):
        _plan("0.9.0")


def test_conversation_settings_reach_the_shim_as_data(tmp_path):
    plan = _plan()
    settings = json.loads(plan.files["stateset_conversation.json"])
    assert settings["environment"]["class"] == "SupportAgent"
    assert Path(settings["environment"]["path"]).read_bytes() == \
        (EXAMPLES.parent / "support-agent" / "environment.py").read_bytes()
    assert (settings["max_turns"], settings["max_turn_tokens"], settings["max_total_tokens"],
            settings["reward_placement"]) == (3, 128, 1024, "per_turn")
    argv = " ".join(plan.argv)
    assert "SupportAgent" not in argv  # the class name is data in the JSON, never an override
    assert "data.max_response_length=512" in argv  # total 1024 - prompt 512
