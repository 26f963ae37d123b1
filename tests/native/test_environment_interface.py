"""The engine-neutral environment interface: reset / step / tools, run in worker processes
with hard deadlines, and every malformed answer recorded as a failure, never as a reward."""

from __future__ import annotations

import time

import pytest
from native.agent_support import AGENT_ENV, bad_environment_file

from stateset_backend.native.multiturn.conversation import (
    parse_assistant,
    render_context,
    render_tools,
)
from stateset_backend.native.multiturn.environment import (
    EnvironmentLoadError,
    EnvironmentRef,
    Failure,
    StepResult,
    Workers,
    check_opening,
    check_step,
    check_tools,
    describe,
)
from stateset_backend.spec.content import sha256_file

TASK = {"prompt": "hi . where is order o3 ?", "order": "o3", "status": "lost", "vague": False,
        "answer": "lost"}


def _ref(path, name):
    return EnvironmentRef(path, name, sha256_file(path))


def test_reset_step_and_tools_of_the_support_agent():
    ref = _ref(AGENT_ENV, "SupportAgent")
    tools = describe(ref, 10)
    assert [(t.name, t.parameters) for t in tools] == [("lookup", ())]
    with Workers(ref, 10) as workers:
        opening = check_opening(workers.call("reset", {0: TASK})[0])
        assert opening == [{"role": "user", "content": TASK["prompt"]}]
        messages = [*opening, parse_assistant("lookup", tools)]
        assert messages[-1]["tool_calls"] == [{"name": "lookup", "arguments": {}}]
        step = check_step(workers.call("step", {0: messages})[0])
        assert step == StepResult([{"role": "tool", "name": "lookup",
                                    "content": "lost lost lost lost lost"}], 0.3, False)
        messages += [*step.observations, parse_assistant("lost", tools)]
        assert check_step(workers.call("step", {0: messages})[0]) == StepResult([], 0.7, True)
        # a second conversation in the same worker gets a fresh instance
        check_opening(workers.call("reset", {0: {**TASK, "vague": True}})[0])
        early = [*opening, parse_assistant("lookup", tools)]  # the order is not named yet
        assert check_step(workers.call("step", {0: early})[0]) == StepResult([], 0.0, True)
        check_opening(workers.call("reset", {0: {**TASK, "vague": True}})[0])
        ask = [*opening, parse_assistant("which", tools)]
        step = check_step(workers.call("step", {0: ask})[0])
        assert step.reward == 0.2 and step.observations[0]["content"] == "order o3"


def test_the_plain_text_format():
    tools = check_tools([{"type": "function", "function": {
        "name": "lookup", "parameters": {"type": "object", "properties": {
            "order": {"type": "string"}, "count": {"type": "integer"}}}}}])
    assert render_tools(tools) == "tools: lookup order count"
    assert render_context([{"role": "user", "content": "where is it ?"},
                           {"role": "tool", "name": "lookup", "content": "order o1 : lost"}]) \
        == "user: where is it ? tool: lookup order o1 : lost assistant:"
    call = parse_assistant("lookup o2 3", tools)
    assert call["tool_calls"] == [{"name": "lookup", "arguments": {"order": "o2", "count": 3}}]
    assert parse_assistant("lookup", tools)["tool_calls"][0]["arguments"] == {}
    assert "tool_calls" not in parse_assistant("shipped", tools)


@pytest.mark.parametrize("tools, problem", [
    ("lookup", "must be a list"),
    ([{"function": {"name": "two words"}}], "no name"),
    ([{"name": "a", "parameters": {"type": "array"}}], "type object"),
    ([{"name": "a"}, {"name": "a"}], "repeat"),
])
def test_bad_tool_declarations_are_refused(tools, problem):
    with pytest.raises(EnvironmentLoadError, match=problem):
        check_tools(tools)


def test_a_changed_environment_file_is_refused(tmp_path):
    copy = tmp_path / "environment.py"
    copy.write_text(AGENT_ENV.read_text() + "\n# edited\n")
    with pytest.raises(EnvironmentLoadError, match="sha256"):
        describe(EnvironmentRef(copy, "SupportAgent", sha256_file(AGENT_ENV)), 10)


@pytest.mark.parametrize("value, reason", [
    ([], "reset returned no list"),
    ([{"role": "assistant", "content": "x"}], "role 'assistant'"),
    ([{"role": "tool", "content": "x"}], "without the tool's name"),
])
def test_malformed_openings(value, reason):
    got = check_opening(value)
    assert isinstance(got, Failure) and reason in got.reason


@pytest.mark.parametrize("value, reason", [
    (None, "no object"),
    ({"observations": [], "reward": 1.0}, "done None"),
    ({"observations": [], "reward": True, "done": True}, "not a finite number"),
    ({"observations": [], "reward": "1", "done": True}, "not a finite number"),
    ({"observations": "x", "reward": 1.0, "done": True}, "no observations list"),
    ({"observations": [], "reward": 1.0, "done": True, "extra": 1}, "unknown keys"),
])
def test_malformed_steps(value, reason):
    got = check_step(value)
    assert isinstance(got, Failure) and reason in got.reason


@pytest.mark.parametrize("name, reason", [
    ("Raising", "step raised RuntimeError: the order database is down"),
    ("NaNReward", "not JSON"),
    ("StringReward", "not a finite number"),
    ("NoDone", "done None"),
    ("BadObservation", "role 'assistant'"),
    ("NotJSON", "not JSON"),
    ("Crashing", "exited during step (exit code 3)"),
])
def test_bad_environments_fail_only_their_conversation(tmp_path, name, reason):
    ref = _ref(bad_environment_file(tmp_path), name)
    with Workers(ref, 10) as workers:
        workers.call("reset", {0: TASK, 1: {**TASK, "order": "o1"}})
        got = workers.call("step", {0: [], 1: []})
    assert check_step(got[0]) == StepResult([], 1.0, True)
    bad = got[1] if isinstance(got[1], Failure) else check_step(got[1])
    assert isinstance(bad, Failure) and reason in bad.reason


def test_a_hanging_step_is_killed_at_the_deadline(tmp_path):
    ref = _ref(bad_environment_file(tmp_path), "Hanging")
    with Workers(ref, 1.0) as workers:
        workers.call("reset", {0: TASK, 1: {**TASK, "order": "o1"}})
        t0 = time.monotonic()
        got = workers.call("step", {0: [], 1: []})
        assert time.monotonic() - t0 < 5
        assert check_step(got[0]).reward == 1.0
        assert isinstance(got[1], Failure) and "exceeded environment.step_timeout_s" in \
            got[1].reason
        assert not workers.alive(1)
        started = workers.started
        workers.call("reset", {0: TASK, 1: TASK})  # the killed worker is replaced
        assert workers.alive(1) and workers.started == started + 1
        assert check_step(workers.call("step", {1: []})[1]).reward == 1.0
