"""Shared fixtures: specs built in code, and the CLI run in-process or as a real subprocess."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stateset_backend.conformance.specs import FULL_DAPO, FULL_PPO, MINIMAL


@pytest.fixture
def minimal() -> dict[str, Any]:
    return copy.deepcopy(MINIMAL)


@pytest.fixture
def write_json(tmp_path: Path):
    def write(doc: Any, name: str = "spec.json") -> Path:
        path = tmp_path / name
        path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
        return path

    return write


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it: a fresh interpreter, real exit code, real stderr."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "stateset_backend", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=full_env,
                          timeout=timeout)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(params=["dapo", "ppo"])
def full(request: pytest.FixtureRequest) -> dict[str, Any]:
    """A spec with every optional section set (two of them: gae is PPO-only)."""
    return copy.deepcopy(FULL_DAPO if request.param == "dapo" else FULL_PPO)
