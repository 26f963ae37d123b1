"""What differs between NeMo RL releases, and which release a checkout is.

NeMo RL runs from a source checkout rather than an installed package, so its version is read
from the checkout's ``package_info.py``; the dialect that version selects decides every key
the rules write.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Literal

from stateset_backend.plugin import DialectKeys, InvalidInput


class NemoRLKeys(DialectKeys):
    """What differs between NeMo RL releases, as the adapter reads it."""

    config: str  # the recipe whose keys the overrides change
    custom_data: Literal["flat", "nested"]  # one data section (v0.5) or train/validation
    data_defaults: str  # where prompt_file / processor / env_name live
    kl_in_reward: str | None = None  # switch that moves KL from the loss into the reward
    kl_reward: bool = False  # whether that switch computes what the spec means (R++ only)
    kl_gradient: Literal["plain", "score_function"] = "plain"
    adv_estimator: str | None = None
    cispo: str | None = None
    lora: str | None = None
    val_at_end: str | None = None
    save_optimizer: str | None = None
    min_top_k: int | None = None  # vLLM refuses smaller top_k (and top_p) at this release
    min_top_p: float | None = None
    # switches every launch sets to the same value: the features the spec has no name for,
    # each at the value that turns it off (translate says an option reaching one is held)
    fixed: dict[str, Any]


def checkout_version(home: str | None) -> str | None:
    """A NeMo RL checkout states its version in ``nemo_rl/package_info.py``."""
    if home is None:
        return None
    info = Path(home) / "nemo_rl" / "package_info.py"
    if not info.is_file():
        raise InvalidInput(f"--engine-home {home}: not a NeMo RL checkout (no {info.name})")
    values: dict[str, Any] = {}
    for node in ast.parse(info.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    try:
        return (f"{values['MAJOR']}.{values['MINOR']}.{values['PATCH']}"
                f"{values.get('PRE_RELEASE', '')}")
    except KeyError:
        raise InvalidInput(f"{info}: no MAJOR/MINOR/PATCH version") from None
