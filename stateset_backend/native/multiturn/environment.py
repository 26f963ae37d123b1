"""Running a conversation's environment: a worker process per live conversation, hard deadlines.

The environment is user code (``environment.entrypoint``, ``file.py:Class``, pinned by sha256
like a reward). Each concurrent conversation is served by its own worker process holding its
own instance, so a step that hangs can really be stopped (the process is killed; a thread
cannot be), and a crash or ``os._exit`` ends only that conversation. Workers are forked (the
start method PyTorch's DataLoader workers use on Linux), once, and reused: each ``reset``
makes a fresh instance, and a killed worker is replaced by a new process. Forking per
conversation would cost tens of milliseconds each from a process holding torch; a spawned
interpreter costs a full Python start-up. The child never touches torch; it only imports the
environment file and answers requests.

Everything an environment returns crosses the process boundary as JSON and is validated here;
anything else is a recorded failure of that conversation, never a reward.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import multiprocessing
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from stateset_backend.spec import environment_protocol as env_rules
from stateset_backend.spec.content import sha256_file
from stateset_backend.spec.environment_protocol import StepResult


class EnvironmentLoadError(ValueError):
    """The environment cannot be loaded or declares something unusable (a run failure)."""


@dataclass(frozen=True)
class EnvironmentRef:
    """Where the environment class lives and the content it must have."""

    path: Path
    class_name: str
    sha256: str | None


@dataclass(frozen=True)
class Failure:
    """Why one conversation's environment call produced nothing usable."""

    reason: str


def load_class(ref: EnvironmentRef) -> type:
    """Import the environment class after proving its file is the one the spec pins."""
    if not ref.path.is_file():
        raise EnvironmentLoadError(f"environment file {ref.path} does not exist")
    actual = sha256_file(ref.path)
    if ref.sha256 is not None and actual != ref.sha256:
        raise EnvironmentLoadError(f"environment file {ref.path} has sha256 {actual}, the spec "
                                f"says {ref.sha256}")
    module_spec = importlib.util.spec_from_file_location(f"_environment_{actual[:12]}", ref.path)
    if module_spec is None or module_spec.loader is None:
        raise EnvironmentLoadError(f"cannot import {ref.path}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    cls = getattr(module, ref.class_name, None)
    if not isinstance(cls, type):
        raise EnvironmentLoadError(f"{ref.path} has no class {ref.class_name!r}")
    return cls


# -- validation of what an environment returns --------------------------------------------
# One implementation of the environment's output rules: the module external engines run.
def check_opening(value: Any) -> list[dict[str, Any]] | Failure:
    """reset(task) must return a non-empty list of user/system/tool messages."""
    try:
        return env_rules.check_opening(value)
    except env_rules.EnvironmentFailed as exc:
        return Failure(str(exc))


def check_step(value: Any) -> StepResult | Failure:
    """step(messages) must return {"observations": [...], "reward": finite number,
    "done": bool}; nothing else is accepted, so a reward is never guessed."""
    try:
        return env_rules.check_step(value)
    except env_rules.EnvironmentFailed as exc:
        return Failure(str(exc))


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: tuple[str, ...]  # property names in schema order: the positional order
    types: tuple[str, ...]
    schema: Mapping[str, Any]


def check_tools(value: Any) -> list[Tool]:
    """The class attribute ``tools`` (the rules in ``env_rules.check_tools``), with each tool's
    parameter names and types in schema order, which is how positional calls are read."""
    try:
        specs = env_rules.check_tools(value)
    except env_rules.EnvironmentFailed as exc:
        raise EnvironmentLoadError(str(exc)) from None
    tools: list[Tool] = []
    for original, spec in zip(value or [], specs, strict=True):
        fn = spec["function"]
        props = fn["parameters"].get("properties", {})
        types = tuple(str(p.get("type", "string")) if isinstance(p, dict) else "string"
                      for p in props.values())
        tools.append(Tool(fn["name"], tuple(props), types, json.loads(json.dumps(original))))
    return tools


# -- the worker processes ------------------------------------------------------------------
def _serve(conn: Connection, ref: EnvironmentRef) -> None:
    """Child process: answer (op, payload) requests with ("ok", json text) or ("error",
    reason). ``reset`` makes a fresh instance of the class, so each conversation has its own;
    ``step`` goes to the current one."""
    env: Any = None
    while True:
        try:
            op, payload = conn.recv()
        except (EOFError, OSError):
            return
        if op == "close":
            return
        try:
            if op == "describe":
                result: Any = getattr(load_class(ref), "tools", None)
            elif op == "reset":
                env = None
                env = load_class(ref)()
                result = env.reset(payload)
            elif env is None:
                raise RuntimeError("step before a successful reset")
            else:
                result = env.step(payload)
        except BaseException as exc:  # everything is the environment's failure
            conn.send(("error", f"raised {type(exc).__name__}: {exc}"))
            continue
        try:
            text = json.dumps(result, allow_nan=False)
        except (TypeError, ValueError) as exc:
            conn.send(("error", f"returned output that is not JSON ({exc})"))
            continue
        conn.send(("ok", text))


class Workers:
    """Worker processes, one per concurrent conversation, reused across conversations (a new
    instance per ``reset``) and replaced when one had to be killed. Every call has a hard
    deadline."""

    def __init__(self, ref: EnvironmentRef, timeout_s: float) -> None:
        self.ref, self.timeout_s = ref, timeout_s
        self._ctx: Any = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
        self._conns: list[Connection | None] = []
        self._procs: list[Any] = []
        self.started = 0  # processes ever started (a test sees replacements)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self, i: int) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_serve, args=(child, self.ref), daemon=True)
        proc.start()
        child.close()
        self.started += 1
        if i == len(self._conns):
            self._conns.append(parent)
            self._procs.append(proc)
        else:
            self._conns[i], self._procs[i] = parent, proc

    def ensure(self, count: int) -> None:
        """At least ``count`` live workers, numbered 0..count-1."""
        for i in range(count):
            if i >= len(self._conns) or self._conns[i] is None:
                self._start(i)

    def alive(self, i: int) -> bool:
        return i < len(self._conns) and self._conns[i] is not None

    def _kill(self, i: int) -> None:
        conn, proc = self._conns[i], self._procs[i]
        self._conns[i] = None
        if conn is not None:
            conn.close()
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=5)

    def call(self, op: str, payloads: Mapping[int, Any]) -> dict[int, Any]:
        """Send ``op`` to each worker in ``payloads`` at once; return each worker's decoded
        JSON result or a Failure. A worker that misses the deadline is killed (a later
        ``reset`` gets a fresh process in its place)."""
        if op == "reset" and payloads:
            self.ensure(max(payloads) + 1)
        results: dict[int, Any] = {}
        pending: dict[Connection, int] = {}
        for i, payload in payloads.items():
            conn = self._conns[i] if i < len(self._conns) else None
            if conn is None:
                results[i] = Failure("the environment process was already stopped")
                continue
            try:
                conn.send((op, payload))
            except (OSError, ValueError, TypeError) as exc:
                results[i] = Failure(f"cannot send {op} to the environment: {exc}")
                self._kill(i)
                continue
            pending[conn] = i
        deadline = time.monotonic() + self.timeout_s
        while pending:
            left = deadline - time.monotonic()
            ready = wait(list(pending), timeout=left) if left > 0 else []
            if not ready:
                for i in pending.values():
                    results[i] = Failure(f"{op} exceeded environment.step_timeout_s "
                                         f"({self.timeout_s:g}s); its process was killed")
                    self._kill(i)
                break
            for ready_conn in ready:
                assert isinstance(ready_conn, Connection)
                i = pending.pop(ready_conn)
                try:
                    status, body = ready_conn.recv()
                except (EOFError, OSError):
                    self._procs[i].join(timeout=1)
                    results[i] = Failure(f"the environment process exited during {op} "
                                         f"(exit code {self._procs[i].exitcode})")
                    self._kill(i)
                    continue
                results[i] = json.loads(body) if status == "ok" else Failure(f"{op} {body}")
        return results

    def close(self) -> None:
        for conn in self._conns:
            if conn is not None:
                with contextlib.suppress(OSError, ValueError):
                    conn.send(("close", None))
        deadline = time.monotonic() + 2.0
        for i, proc in enumerate(self._procs):
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            self._kill(i)


def describe(ref: EnvironmentRef, timeout_s: float) -> list[Tool]:
    """Load the class once, in a worker, and read its declared tools (a run fails here, before
    any conversation, when the environment cannot be imported or declares bad tools)."""
    with Workers(ref, timeout_s) as workers:
        workers.ensure(1)
        result = workers.call("describe", {0: None})[0]
    if isinstance(result, Failure):
        raise EnvironmentLoadError(f"environment {ref.path.name}:{ref.class_name}: "
                                f"{result.reason}")
    return check_tools(result)
