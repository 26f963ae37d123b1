"""Python reward functions, loaded from the file the spec names and pinned by its sha256.

A reward is ``def fn(prompt: str, response: str, answer: str) -> float``. The file is hashed
before import: an edited reward function is a different experiment.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stateset_backend.native.data import resolve
from stateset_backend.spec.content import sha256_file
from stateset_backend.spec.inputs import REWARD_CALLS_ENV, REWARD_CALLS_SOURCE
from stateset_backend.spec.model import Reward

RewardFn = Callable[[str, str, str], float]


class RewardError(ValueError):
    """The reward function is missing, changed, or returned something unusable."""


def load_reward(reward: Reward, base_dir: Path) -> RewardFn:
    if reward.entrypoint is None:
        raise RewardError("the spec has no reward function (reward.kind environment)")
    file_part, _, func_name = reward.entrypoint.rpartition(":")
    path = resolve(file_part, base_dir)
    if not path.is_file():
        raise RewardError(f"reward file {path} does not exist")
    actual = sha256_file(path)
    if reward.sha256 is not None and actual != reward.sha256:
        raise RewardError(f"reward file {path} has sha256 {actual}, the spec says "
                          f"{reward.sha256}")
    module_spec = importlib.util.spec_from_file_location(f"_reward_{actual[:12]}", path)
    if module_spec is None or module_spec.loader is None:
        raise RewardError(f"cannot import {path}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise RewardError(f"{path} has no function {func_name!r}")

    def checked(prompt: str, response: str, answer: str) -> float:
        value = float(fn(prompt, response, answer))
        if not math.isfinite(value):
            raise RewardError(f"reward returned {value} for prompt {prompt[:60]!r}")
        return value

    return _recorded(checked) if os.environ.get(REWARD_CALLS_ENV) else checked


def _recorded(fn: RewardFn) -> RewardFn:
    """The calls a rehearsal watches, recorded by the very code the external engines' reward
    shim runs, so every engine's calls are read one way."""
    namespace: dict[str, Any] = {}
    exec(compile(REWARD_CALLS_SOURCE, "<stateset reward calls>", "exec"), namespace)
    recorded: RewardFn = namespace["_recorded"](fn)
    return recorded
