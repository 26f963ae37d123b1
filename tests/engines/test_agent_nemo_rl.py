"""NeMo RL runs the spec's environment through the generated environment actor.

The multi-turn plan of examples/external/support-agent.json applies in struct mode to the
pinned grpo_math_1B.yaml of every supported tag. In a NeMo RL checkout
(``STATESET_TEST_NEMO_RL_CHECKOUTS``), nemo_rl_agent_probe.py parses the overrides with NeMo
RL's own loader, converts the splits with the launcher, renders a task with the registered
processor, starts the actor with NeMo RL's ``create_env`` on a local Ray and drives a scripted
support conversation through NeMo RL's own ``run_multi_turn_rollout``: the opening, assistant
turns and observations land in the message log with only the sampled turns as ``assistant``
messages, the summed reward is the conversation's, and an environment that raises stops the
rollout with the failure recorded.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from agent_shim_fixtures import REWARDS, SCRIPT, TASK, bad_environment, tokenizer
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf
from optional_installs import NEMO_RL_CONFIGS, NEMO_RL_CONFIGS_MISSING

from stateset_backend.adapters.agent_shims import NEMO_RL_ENV, NEMO_RL_PROCESSOR
from stateset_backend.adapters.nemo_rl.adapter import NemoRLAdapter
from stateset_backend.engines.registry import AdapterEntry
from stateset_backend.plan.launch_plan import make_plan
from stateset_backend.spec.files import load_spec

CONFIGS = NEMO_RL_CONFIGS
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "external"
PROBE = Path(__file__).with_name("nemo_rl_agent_probe.py")
CHECKOUTS = [Path(p) for p in os.environ.get("STATESET_TEST_NEMO_RL_CHECKOUTS", "").split(
    os.pathsep) if p]


def _plan(version: str):
    entry = AdapterEntry(NemoRLAdapter(), "builtin", "stateset-backend", "0.1.0")
    return make_plan(load_spec(EXAMPLES / "support-agent.json"), entry, version,
                     base_dir=EXAMPLES)


def _overrides(plan, run_dir: str) -> list[str]:
    at = plan.argv.index("--config")
    return [a.replace("{run_dir}", run_dir) for a in plan.argv[at + 2:]]


@pytest.mark.skipif(not CONFIGS.is_dir(), reason=NEMO_RL_CONFIGS_MISSING)
@pytest.mark.parametrize("version", ["0.5.0", "0.6.0", "0.7.0"])
def test_multi_turn_overrides_apply_to_the_releases_config(version, tmp_path):
    plan = _plan(version)
    base = OmegaConf.load(CONFIGS / f"v{version}" / "examples" / "configs" /
                          "grpo_math_1B.yaml")
    cfg = copy.deepcopy(base)
    OmegaConf.set_struct(cfg, True)
    parsed = OverridesParser.create().parse_overrides(
        overrides=_overrides(plan, str(tmp_path)))
    ConfigLoaderImpl._apply_overrides_to_config(overrides=parsed, cfg=cfg)
    data = cfg.data.get("default", cfg.data)
    assert (data.env_name, data.processor) == (NEMO_RL_ENV, NEMO_RL_PROCESSOR)
    assert cfg.grpo.max_rollout_turns == 3  # environment.max_turns
    assert cfg.policy.generation.max_new_tokens == 128  # the turn limit
    assert cfg.policy.max_total_sequence_length == 1024  # the conversation's total
    assert cfg.env[NEMO_RL_ENV].sha256 == load_spec(
        EXAMPLES / "support-agent.json").environment.sha256
    deviations = {d["deviation"] for d in plan.deviations}
    assert {"per_turn_credit_is_the_return", "turn_cut_at_total_limit"} <= deviations


def _probe(checkout: Path, tmp_path: Path, tmp_path_factory, bad: bool = False) -> dict:
    version = NemoRLAdapter().installed_version(home=str(checkout))
    plan = _plan(version)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name, text in plan.files.items():
        (run_dir / name).write_text(text)
    tok_dir = tmp_path / "tokenizer"
    tokenizer(tok_dir)
    settings = json.loads((run_dir / "stateset_conversation.json").read_text())
    settings["model"] = str(tok_dir)  # the actor loads the policy's tokenizer
    if bad:
        path = bad_environment(tmp_path / "env", "raise RuntimeError('tool backend down')")
        settings["environment"] = {"path": str(path), "class": "Bad",
                                   "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    (run_dir / "stateset_conversation.json").write_text(json.dumps(settings))
    overrides = tmp_path / "overrides.json"
    overrides.write_text(json.dumps(_overrides(plan, str(run_dir))))
    env = {**os.environ, "PYTHONPATH": str(checkout), "RAY_ADDRESS": "",
           "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.run([sys.executable, str(PROBE), str(run_dir), str(overrides),
                           str(tok_dir), str(tmp_path_factory.mktemp("ray"))],
                          cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("PROBE ")), None)
    if line is None and "ModuleNotFoundError" in proc.stderr:
        pytest.skip(f"{checkout.name}: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line.removeprefix("PROBE "))


@pytest.mark.slow
@pytest.mark.skipif(not CHECKOUTS, reason="STATESET_TEST_NEMO_RL_CHECKOUTS names no NeMo RL "
                                          "checkout (NeMo RL is not on PyPI)")
@pytest.mark.parametrize("checkout", CHECKOUTS, ids=lambda p: p.name)
def test_scripted_conversation_through_nemo_rls_rollout(checkout, tmp_path, tmp_path_factory):
    out = _probe(checkout, tmp_path, tmp_path_factory)
    assert out["task"] == TASK and out["kept"]["train"] == 1000
    roles, tokens = out["roles"], out["token_ids"]
    # the opening, then each turn and the environment's answer; the last answer is empty
    assert roles == ["user", "assistant", "environment", "assistant", "environment",
                     "assistant", "environment"]
    assert "Tools:" in out["contents"][0] and TASK["prompt"] in out["contents"][0]
    # only assistant messages carry loss in NeMo RL, and they are exactly the sampled tokens
    assert [t for r, t in zip(roles, tokens, strict=True) if r == "assistant"] == \
        out["script_ids"]
    assert "order o4" in out["contents"][2] and "lost lost lost lost lost" in out["contents"][4]
    assert tokens[-1] == [] and out["contents"][-1] == ""
    assert out["total_reward"] == pytest.approx([sum(REWARDS)])  # per_turn, discount 1
    assert out["metrics"]["natural_termination_rate"] == 1.0
    # each turn was generated from the whole log before it
    assert [len(i[0]) for i in out["inputs"]] == [
        sum(len(t) for t in tokens[:k]) for k in (1, 3, 5)]
    assert len(out["inputs"]) == len(SCRIPT)


@pytest.mark.slow
@pytest.mark.skipif(not CHECKOUTS, reason="STATESET_TEST_NEMO_RL_CHECKOUTS names no NeMo RL "
                                          "checkout (NeMo RL is not on PyPI)")
@pytest.mark.parametrize("checkout", CHECKOUTS[-1:], ids=lambda p: p.name)
def test_an_environment_that_raises_stops_nemo_rls_rollout_recorded(checkout, tmp_path,
                                                                     tmp_path_factory):
    out = _probe(checkout, tmp_path, tmp_path_factory, bad=True)
    assert "tool backend down" in out["error"] and "max_failed_share is 0" in out["error"]
    assert [json.loads(line)["task"] for line in out["failures"]] == [TASK]
