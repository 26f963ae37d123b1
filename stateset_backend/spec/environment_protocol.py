"""The spec's environment, run inside an external engine: one conversation at a time, with the
rules of docs/environments.md (run directory name: ``stateset_environment.py``).

Every engine shim (verl's agent loop, OpenRLHF's agent executor, NeMo RL's environment actor)
drives conversations through ``Conversation``, so the environment sees the same calls, the same
messages and the same checks on every engine:

- the environment class is imported from its file by path, in a worker process of its own,
  after the file's bytes are checked against the pinned sha256; the path, class name and
  digest reach the worker as argv items and JSON, never as source text;
- ``reset`` and ``step`` run under a hard deadline (``step_timeout_s``): a worker that misses
  it is killed, which a thread could never be; a crash or ``os._exit`` ends only the worker;
- what the environment returns crosses the process boundary as JSON and is checked exactly as
  the native engine checks it; anything else is a failure, never a reward;
- a failure is appended to ``environment-failures.jsonl`` in the run directory and raised as
  ``EnvironmentFailed``. External engines run only with ``max_failed_share`` 0, so the first
  failure stops the run before the update that would have used it: nothing is invented.

Only the standard library is imported here; the engine shims import this module by name.
"""

from __future__ import annotations

import json
import math
import os
import re
import selectors
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

CONFIG_FILE = "stateset_conversation.json"
FAILURES_FILE = "environment-failures.jsonl"
TASK_FIELD = "stateset_task"  # the converted splits carry each original row as JSON text
OBSERVATION_ROLES = frozenset({"user", "tool", "system"})
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class EnvironmentFailed(RuntimeError):
    """The environment raised, timed out, crashed or answered malformed output."""


def load_config(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The launch's conversation settings (written as JSON by stateset-backend)."""
    config: dict[str, Any] = json.loads(Path(run_dir, CONFIG_FILE).read_text(encoding="utf-8"))
    config["run_dir"] = str(run_dir)
    return config


def here_config() -> dict[str, Any]:
    """The settings beside this module: the run directory the engine imported it from."""
    return load_config(Path(__file__).resolve().parent)


# -- what an environment may return: the one implementation, the native engine's too ---------
def message_problem(msg: Any, where: str) -> str | None:
    if not isinstance(msg, dict):
        return f"{where} is not a message object"
    role, content = msg.get("role"), msg.get("content")
    if role not in OBSERVATION_ROLES:
        return f"{where} has role {role!r}; observations are user, tool or system messages"
    if not isinstance(content, str):
        return f"{where} has no string content"
    if role == "tool" and not isinstance(msg.get("name"), str):
        return f"{where} is a tool result without the tool's name"
    return None


def check_opening(value: Any) -> list[dict[str, Any]]:
    """reset(task) must return a non-empty list of user/system/tool messages."""
    if not isinstance(value, list) or not value:
        raise EnvironmentFailed("reset returned no list of opening messages")
    for i, msg in enumerate(value):
        problem = message_problem(msg, f"opening message {i}")
        if problem:
            raise EnvironmentFailed(f"reset: {problem}")
    return value


@dataclass(frozen=True)
class StepResult:
    observations: list[dict[str, Any]]
    reward: float
    done: bool


def check_step(value: Any) -> StepResult:
    """step(messages) must return exactly {"observations": [...], "reward": finite number,
    "done": bool}; nothing else is accepted, so a reward is never guessed."""
    if not isinstance(value, dict):
        raise EnvironmentFailed("step returned no object")
    extra = set(value) - {"observations", "reward", "done"}
    if extra:
        raise EnvironmentFailed(f"step returned unknown keys {sorted(extra)}")
    obs, reward, done = value.get("observations"), value.get("reward"), value.get("done")
    if not isinstance(obs, list):
        raise EnvironmentFailed("step returned no observations list")
    for i, msg in enumerate(obs):
        problem = message_problem(msg, f"observation {i}")
        if problem:
            raise EnvironmentFailed(f"step: {problem}")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or \
            not math.isfinite(reward):
        raise EnvironmentFailed(f"step returned reward {reward!r}, not a finite number")
    if not isinstance(done, bool):
        raise EnvironmentFailed(f"step returned done {done!r}, not a boolean")
    return StepResult(obs, float(reward), done)


def check_tools(value: Any) -> list[dict[str, Any]]:
    """The class attribute ``tools``: JSON-schema function specs, in the OpenAI form
    ``{"type": "function", "function": {"name", "description", "parameters"}}`` or as the bare
    function object; returned in the OpenAI form (what chat templates render)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise EnvironmentFailed("tools must be a list of JSON-schema function specs")
    specs: list[dict[str, Any]] = []
    for i, spec in enumerate(value):
        fn = spec.get("function", spec) if isinstance(spec, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or \
                not fn["name"] or any(c.isspace() for c in fn["name"]):
            raise EnvironmentFailed(f"tool {i} has no name (one word)")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        props = params.get("properties", {}) if isinstance(params, dict) else None
        if not isinstance(params, dict) or params.get("type", "object") != "object" or \
                not isinstance(props, dict):
            raise EnvironmentFailed(f"tool {fn['name']!r}: parameters must be a JSON schema "
                                    "of type object with properties")
        specs.append({"type": "function", "function": {**fn, "parameters": params}})
    names = [s["function"]["name"] for s in specs]
    if len(set(names)) != len(names):
        raise EnvironmentFailed(f"tool names repeat: {names}")
    return specs


# -- the worker process --------------------------------------------------------------------
def _load_class(path: str, class_name: str, sha256: str) -> type:
    import hashlib
    import types

    with open(path, "rb") as file:
        source = file.read()
    actual = hashlib.sha256(source).hexdigest()
    if actual != sha256:
        raise RuntimeError(f"environment file {path} has sha256 {actual}, the spec pins {sha256}")
    module = types.ModuleType(f"_environment_{actual[:12]}")
    module.__file__ = path
    exec(compile(source, path, "exec"), module.__dict__)
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise RuntimeError(f"{path} has no class {class_name!r}")
    return cls


def serve(path: str, class_name: str, sha256: str) -> None:
    """Worker: answer one JSON request per line with {"ok": result} or {"error": reason}.
    ``reset`` makes a fresh instance, so each conversation has its own. The protocol has a
    descriptor of its own: whatever the environment prints goes to stderr."""
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    env: Any = None
    for line in sys.stdin:
        request = json.loads(line)
        op, payload = request["op"], request.get("payload")
        try:
            if op == "describe":
                result: Any = getattr(_load_class(path, class_name, sha256), "tools", None)
            elif op == "reset":
                env = None
                env = _load_class(path, class_name, sha256)()
                result = env.reset(payload)
            elif env is None:
                raise RuntimeError("step before a successful reset")
            else:
                result = env.step(payload)
        except BaseException as exc:  # everything is the environment's failure
            reply = {"error": f"raised {type(exc).__name__}: {exc}"}
        else:
            try:
                reply = {"ok": json.loads(json.dumps(result, allow_nan=False))}
            except (TypeError, ValueError) as exc:
                reply = {"error": f"returned output that is not JSON ({exc})"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


class Session:
    """One worker process; calls with a hard deadline. Reused across conversations until a
    call fails (then it is killed and the next ``Session`` starts a fresh process)."""

    def __init__(self, config: dict[str, Any]) -> None:
        env = config["environment"]
        self.timeout_s = float(config["step_timeout_s"])
        self.proc = subprocess.Popen(
            [sys.executable, "-u", str(Path(__file__).resolve()), "--serve", env["path"],
             env["class"], env["sha256"]],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None)
        self._buffer = b""

    def call(self, op: str, payload: Any = None) -> Any:
        """Send one request; the decoded answer, or EnvironmentFailed (the worker is killed)."""
        if self.proc.poll() is not None:
            raise EnvironmentFailed(f"the environment process had exited "
                                    f"(exit code {self.proc.returncode})")
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write((json.dumps({"op": op, "payload": payload},
                                              allow_nan=False) + "\n").encode())
            self.proc.stdin.flush()
        except (OSError, ValueError) as exc:
            self.close()
            raise EnvironmentFailed(f"cannot send {op} to the environment: {exc}") from None
        deadline = time.monotonic() + self.timeout_s
        fd = self.proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    self.close()
                    raise EnvironmentFailed(f"{op} exceeded environment.step_timeout_s "
                                            f"({self.timeout_s:g}s); its process was killed")
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    code = self.proc.wait(timeout=5)
                    self.close()
                    raise EnvironmentFailed(f"the environment process exited during {op} "
                                            f"(exit code {code})")
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        reply = json.loads(line)
        if "error" in reply:
            self.close()
            raise EnvironmentFailed(f"{op} {reply['error']}")
        return reply["ok"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


def describe(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The environment's declared tools (loads the class once, in a worker)."""
    session = Session(config)
    try:
        return check_tools(session.call("describe"))
    finally:
        session.close()


# -- one conversation ----------------------------------------------------------------------
@dataclass
class Conversation:
    """A conversation's neutral messages, turns and rewards, and the reward the engine gets.

    ``final``: the last step's reward is the conversation's reward. ``per_turn``: the engines
    give every token of a conversation one scalar, so the conversation's return
    G_0 = sum_k gamma^k r_k is that scalar (the contracts declare this as a deviation: a turn
    learns from G_0, not from its own reward-to-go)."""

    config: dict[str, Any]
    session: Session
    task: Any = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    done: bool = False

    def open(self, task: Any) -> list[dict[str, Any]]:
        self.task = task
        self.messages = [dict(m) for m in self.guard(lambda: check_opening(
            self.session.call("reset", task)))]
        return list(self.messages)

    def step(self, assistant: dict[str, Any]) -> StepResult:
        """The environment's answer to one assistant message; ends the conversation at done
        or at ``max_turns``."""
        self.messages.append(assistant)
        result = self.guard(lambda: check_step(self.session.call("step", self.messages)))
        self.messages.extend(result.observations)
        self.rewards.append(result.reward)
        self.done = result.done or self.turns >= int(self.config["max_turns"])
        return result

    @property
    def turns(self) -> int:
        return len(self.rewards)

    def reward(self) -> float:
        """The one scalar the engine gets for the whole conversation."""
        if not self.rewards:
            raise EnvironmentFailed("a conversation ended before its first step")
        if self.config["reward_placement"] == "final":
            return self.rewards[-1]
        gamma = float(self.config["turn_discount"])
        return sum(gamma ** k * r for k, r in enumerate(self.rewards))

    def increment(self) -> float:
        """For engines that add up the rewards of every step (NeMo RL): this step's share, so
        that the sum after any step is ``reward()`` of the conversation so far."""
        if self.config["reward_placement"] == "final":
            previous = self.rewards[-2] if len(self.rewards) > 1 else 0.0
            return self.rewards[-1] - previous
        return float(self.config["turn_discount"]) ** (self.turns - 1) * self.rewards[-1]

    def guard(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except EnvironmentFailed as exc:
            self.fail(str(exc))

    def fail(self, reason: str) -> NoReturn:
        """Record the failure and stop: the run refuses the update (max_failed_share 0)."""
        record_failure(self.config, reason, self.task, self.turns)
        raise EnvironmentFailed(f"environment failure (environment.max_failed_share is 0, so "
                                f"the update is refused): {reason}")


def record_failure(config: dict[str, Any], reason: str, task: Any, turns: int) -> None:
    """One JSON line per failure, appended in one write (several workers may append)."""
    line = json.dumps({"time": time.time(), "reason": reason, "turns": turns, "task": task},
                      default=str) + "\n"
    fd = os.open(Path(config["run_dir"], FAILURES_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# -- assistant text and chat templates ------------------------------------------------------
def parse_assistant(text: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """An assistant turn's text as a neutral message: ``<tool_call>{"name": ..., "arguments":
    {...}}</tool_call>`` blocks naming a declared tool (the Hermes format of Qwen's chat
    templates) become structured tool calls; anything else stays text."""
    names = {t["function"]["name"] for t in tools}
    calls, kept = [], text
    for block in TOOL_CALL.finditer(text):
        try:
            call = json.loads(block.group(1))
        except ValueError:
            continue
        if isinstance(call, dict) and call.get("name") in names:
            args = call.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    continue
            if isinstance(args, dict):
                calls.append({"name": call["name"], "arguments": args})
                kept = kept.replace(block.group(0), "")
    message: dict[str, Any] = {"role": "assistant", "content": kept.strip() if calls else text}
    if calls:
        message["tool_calls"] = calls
    return message


def chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Neutral messages in the form Hugging Face chat templates read."""
    out = []
    for msg in messages:
        msg = dict(msg)
        if msg.get("tool_calls"):
            msg["tool_calls"] = [{"type": "function", "function": {
                "name": c["name"], "arguments": c["arguments"]}} for c in msg["tool_calls"]]
        out.append(msg)
    return out


def render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
           generation_prompt: bool) -> str:
    text: str = tokenizer.apply_chat_template(chat_messages(messages), tools=tools or None,
                                              tokenize=False,
                                              add_generation_prompt=generation_prompt)
    return text


def observation_text(tokenizer: Any, messages: list[dict[str, Any]],
                     observations: list[dict[str, Any]], tools: list[dict[str, Any]],
                     ended_with_eos: bool) -> str:
    """The text appended after an assistant turn's sampled tokens: the observations and the
    next assistant prompt, as the chat template renders them after the conversation so far
    (``messages`` ends with the assistant message). A turn cut at the turn limit is closed
    with the tokenizer's end-of-sequence text first, which a turn that ended by itself
    already sampled."""
    before = render(tokenizer, messages, tools, False)
    after = render(tokenizer, messages + observations, tools, True)
    if not after.startswith(before):
        raise EnvironmentFailed("the chat template renders the conversation differently once "
                                "the observations are added; it cannot be continued turn by "
                                "turn")
    close = "" if ended_with_eos else (tokenizer.eos_token or "")
    return close + after[len(before):]


# -- the splits ------------------------------------------------------------------------------
def read_rows(path: str) -> list[dict[str, Any]]:
    """Rows of a parquet, JSON-lines or JSON-array file."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
        return rows
    text = Path(path).read_text(encoding="utf-8")
    if path.endswith(".json") and text.lstrip().startswith("["):
        return list(json.loads(text))
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def prompt_messages(value: Any) -> list[dict[str, str]]:
    """A prompt field's value as chat messages: text is one user message."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list) and value and all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in value):
        return [{"role": m["role"], "content": m["content"]} for m in value]
    raise ValueError(f"a prompt must be text or chat messages with role and content, "
                     f"not {type(value).__name__}")


def convert_split(source: str, target: Path, prompt_field: str,
                  layout: Callable[[int, dict[str, Any], list[dict[str, str]]],
                                   dict[str, Any]]) -> int:
    """Write ``source`` as JSON lines at ``target`` (atomically): each row as ``layout``
    lays it out for the engine's dataset, always with the original row as JSON text under
    ``stateset_task``, which is what ``reset`` receives on every engine."""
    lines = []
    for number, row in enumerate(read_rows(source)):
        try:
            messages = prompt_messages(row[prompt_field])
        except (KeyError, ValueError) as exc:
            raise SystemExit(f"{source}: row {number + 1}: {exc}") from None
        doc = layout(number, row, messages)
        doc[TASK_FIELD] = json.dumps(row, sort_keys=True, default=str)
        lines.append(json.dumps(doc))
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(partial, target)
    return len(lines)


def task_of(value: Any) -> Any:
    """The original row back from its ``stateset_task`` text."""
    return json.loads(value) if isinstance(value, str) else value


if __name__ == "__main__" and sys.argv[1:2] == ["--serve"]:
    serve(*sys.argv[2:5])
