"""The environment half every external engine's shim shares (``stateset_environment``): the
support-agent conversation driven through it, its rewards per placement, and bad environments
(raising, hanging, crashing, malformed) ending as docs/environments.md says, with the failure
recorded and no reward invented. Its checks agree with the native engine's on every case."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from agent_shim_fixtures import REWARDS, SCRIPT, TASK, bad_environment, settings

from stateset_backend.adapters.agent_shims import PROTOCOL_FILE, SHIM_MODULES, shim_source
from stateset_backend.native.multiturn import environment as native


@pytest.fixture
def shim(tmp_path, monkeypatch):
    """The shared shim as the engines import it: by name, from the run folder."""
    path = tmp_path / "run" / "stateset_environment.py"
    path.parent.mkdir()
    path.write_text(shim_source(PROTOCOL_FILE))
    spec = importlib.util.spec_from_file_location("stateset_environment", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "stateset_environment", module)
    spec.loader.exec_module(module)
    return module


def _conversation(shim, run_dir: Path, **changes):
    config = {**settings(run_dir, **changes), "run_dir": str(run_dir)}
    return shim.Conversation(config, shim.Session(config)), config


def test_support_agent_conversation_through_the_shim(shim, tmp_path):
    conversation, config = _conversation(shim, tmp_path / "run")
    tools = shim.describe(config)
    assert [t["function"]["name"] for t in tools] == ["lookup"]
    try:
        assert conversation.open(TASK) == [{"role": "user", "content": TASK["prompt"]}]
        sums = []
        for text in SCRIPT:
            conversation.step(shim.parse_assistant(text, tools))
            sums.append(sum(sums[-1:]) + conversation.increment())
    finally:
        conversation.session.close()
    assert conversation.rewards == REWARDS and conversation.done
    call = conversation.messages[3]
    assert call == {"role": "assistant", "content": "",
                    "tool_calls": [{"name": "lookup", "arguments": {}}]}
    assert conversation.messages[4] == {"role": "tool", "name": "lookup",
                                        "content": "lost lost lost lost lost"}
    assert conversation.reward() == pytest.approx(1.0)  # per_turn, discount 1: the return
    assert sums == pytest.approx([0.2, 0.4, 1.0])  # NeMo RL's running sum is the return so far


def test_final_and_discounted_rewards(shim, tmp_path):
    for placement, discount, expected, sums in (
            ("final", 1.0, 0.6, [0.2, 0.2, 0.6]),
            ("per_turn", 0.5, 0.2 + 0.5 * 0.2 + 0.25 * 0.6, [0.2, 0.3, 0.45])):
        conversation, config = _conversation(shim, tmp_path / placement,
                                             reward_placement=placement, turn_discount=discount)
        got = []
        try:
            conversation.open(TASK)
            for text in SCRIPT:
                conversation.step(shim.parse_assistant(text, shim.describe(config)))
                got.append(sum(got[-1:]) + conversation.increment())
        finally:
            conversation.session.close()
        assert conversation.reward() == pytest.approx(expected)
        assert got == pytest.approx(sums)


def test_max_turns_ends_the_conversation(shim, tmp_path):
    conversation, _ = _conversation(shim, tmp_path / "run", max_turns=1)
    try:
        conversation.open(TASK)
        conversation.step(shim.parse_assistant(SCRIPT[0], []))
    finally:
        conversation.session.close()
    assert conversation.done and conversation.rewards == [0.2]


BAD = {
    "raises": ("raise ValueError('boom')", "raised ValueError: boom"),
    "hangs": ("import time\ntime.sleep(60)", "exceeded environment.step_timeout_s"),
    "crashes": ("import os\nos._exit(3)", "exited during step (exit code 3)"),
    "string_reward": ("return {'observations': [], 'reward': '1', 'done': True}",
                      "not a finite number"),
    "nan_reward": ("return {'observations': [], 'reward': float('nan'), 'done': True}",
                   "not JSON"),
    "extra_keys": ("return {'observations': [], 'reward': 1.0, 'done': True, 'info': 1}",
                   "unknown keys ['info']"),
    "assistant_observation": (
        "return {'observations': [{'role': 'assistant', 'content': 'x'}], 'reward': 1.0, "
        "'done': False}", "role 'assistant'"),
    "not_json": ("return {'observations': [], 'reward': 1.0, 'done': True, 'x': object()}",
                 "not JSON"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_environment_ends_the_conversation_recorded_with_no_reward(shim, tmp_path, case):
    body, reason = BAD[case]
    path = bad_environment(tmp_path / "env", body)
    run_dir = tmp_path / "run"  # made by the shim fixture
    env = settings(run_dir, path)["environment"]
    conversation, _ = _conversation(shim, run_dir, step_timeout_s=1.0,
                                    environment={**env, "class": "Bad"})
    try:
        conversation.open(TASK)
        with pytest.raises(shim.EnvironmentFailed, match="max_failed_share is 0") as failed:
            conversation.step(shim.parse_assistant(SCRIPT[0], []))
    finally:
        conversation.session.close()
    assert reason in str(failed.value)
    assert conversation.rewards == []  # nothing invented
    with pytest.raises(shim.EnvironmentFailed, match="before its first step"):
        conversation.reward()
    record = json.loads((run_dir / shim.FAILURES_FILE).read_text())
    assert reason in record["reason"] and record["task"] == TASK and record["turns"] == 0


def test_an_edited_environment_file_is_refused_by_the_worker(shim, tmp_path):
    run_dir = tmp_path / "run"  # made by the shim fixture
    env = settings(run_dir)["environment"]
    conversation, _ = _conversation(shim, run_dir, environment={**env, "sha256": "0" * 64})
    try:
        with pytest.raises(shim.EnvironmentFailed, match="the spec pins 0000"):
            conversation.open(TASK)
    finally:
        conversation.session.close()


def test_an_environment_that_prints_keeps_the_protocol(shim, tmp_path):
    path = bad_environment(tmp_path / "env", "print('chatty', flush=True)\n"
                           "return super().step(messages)")
    run_dir = tmp_path / "run"  # made by the shim fixture
    env = settings(run_dir, path)["environment"]
    conversation, _ = _conversation(shim, run_dir, environment={**env, "class": "Bad"})
    try:
        conversation.open(TASK)
        assert conversation.step(shim.parse_assistant(SCRIPT[0], [])).reward == 0.2
    finally:
        conversation.session.close()


CHECKS = [
    [], None, [{"role": "user", "content": "hi"}], [{"role": "assistant", "content": "x"}],
    [{"role": "tool", "content": "x"}], [{"role": "user", "content": 3}], ["x"],
    {"observations": [], "reward": 1, "done": True},
    {"observations": [], "reward": True, "done": True},
    {"observations": [], "reward": 1.0, "done": 1},
    {"observations": [{"role": "tool", "name": "t", "content": "r"}], "reward": -2.5,
     "done": False},
    {"observations": "x", "reward": 1.0, "done": True}, {"reward": 1.0, "done": True},
    {"observations": [], "reward": float("inf"), "done": True}, "text",
]


@pytest.mark.parametrize("value", CHECKS, ids=range(len(CHECKS)))
def test_checks_agree_with_the_native_engine(shim, value):
    for ours, theirs, in ((shim.check_opening, native.check_opening),
                          (shim.check_step, native.check_step)):
        expected = theirs(value)
        try:
            got = ours(value)
        except shim.EnvironmentFailed as exc:
            assert isinstance(expected, native.Failure) and str(exc) == expected.reason
        else:
            assert not isinstance(expected, native.Failure)
            assert (got == expected) if isinstance(got, list) else \
                (got.observations, got.reward, got.done) == \
                (expected.observations, expected.reward, expected.done)


def test_hermes_tool_calls_become_structured_messages(shim):
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    parse = shim.parse_assistant
    assert parse('ok <tool_call>{"name": "lookup", "arguments": "{\\"order\\": \\"o3\\"}"}'
                 '</tool_call>', tools) == {
        "role": "assistant", "content": "ok",
        "tool_calls": [{"name": "lookup", "arguments": {"order": "o3"}}]}
    for text in ('<tool_call>{"name": "other"}</tool_call>', "<tool_call>not json</tool_call>",
                 "lost"):
        assert parse(text, tools) == {"role": "assistant", "content": text}


def test_every_shim_imports_only_what_its_engine_has():
    """Shims run where stateset-backend is not installed: no import of it, anywhere."""
    for name in SHIM_MODULES:
        assert "stateset_backend" not in shim_source(name), name
