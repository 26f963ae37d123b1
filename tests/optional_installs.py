"""What a test needs beyond the README's install, and the line that says how to get it when it
is missing: every such test skips with that reason instead of failing on a fresh clone."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

# TRL is a third-party engine added by a plugin; the README's test command installs it
TRL_PLUGIN_MISSING = ("the TRL plugin is not installed: pip install "
                      "examples/plugins/stateset-trl-engine (the README's test command does)")


def trl_plugin_installed() -> bool:
    return importlib.util.find_spec("stateset_trl_engine") is not None


def _nemo_rl_configs() -> Path:
    """NeMo RL's example configs per release tag (``v0.7.0/examples/configs/...``): NeMo RL is
    not on PyPI, so the project keeps pinned copies beside the clone, in
    ``../shared/engines/nemo-rl``; ``STATESET_NEMO_RL_CONFIGS`` names another folder."""
    named = os.environ.get("STATESET_NEMO_RL_CONFIGS")
    return Path(named) if named else \
        Path(__file__).resolve().parents[2] / "shared" / "engines" / "nemo-rl"


NEMO_RL_CONFIGS = _nemo_rl_configs()
NEMO_RL_CONFIGS_MISSING = (
    f"NeMo RL's example configs are not at {NEMO_RL_CONFIGS}: put each release tag's "
    "examples/configs there (a folder per tag, e.g. v0.7.0/examples/configs/grpo_math_1B.yaml, "
    "from a NeMo RL checkout) or set STATESET_NEMO_RL_CONFIGS to such a folder")


# The real engines' own code, for the tests that check translations against it (.ci/run sets
# all three up; each reason is the commands that do it by hand)
VERL_PYTHON_MISSING = (
    "STATESET_TEST_VERL_PYTHON is not set: a venv with verl 0.9.1 (python3 -m venv "
    ".ci-verl-venv && .ci-verl-venv/bin/pip install torch==2.13.0 verl==0.9.1 cachetools "
    "uvicorn fastapi 'TransferQueue>=0.1.10' pyzmq msgspec), then "
    "STATESET_TEST_VERL_PYTHON=$PWD/.ci-verl-venv/bin/python")
VERL_WHEELS_MISSING = (
    "STATESET_TEST_VERL_WHEELS is not set: a folder with the verl release wheels (for V in "
    "0.4.1 0.5.0 0.6.0 0.6.1 0.7.0 0.7.1 0.8.0 0.9.0; do pip download --no-deps -d .ci-wheels "
    "verl==$V; done), then STATESET_TEST_VERL_WHEELS=$PWD/.ci-wheels")
OPENRLHF_WHEELS_MISSING = (
    "STATESET_TEST_OPENRLHF_WHEELS is not set: a folder with the OpenRLHF release wheels (for "
    "V in 0.9.8 0.10.1 0.10.2 0.11.1 0.11.2; do pip download --no-deps -d .ci-wheels "
    "openrlhf==$V; done), then STATESET_TEST_OPENRLHF_WHEELS=$PWD/.ci-wheels")
