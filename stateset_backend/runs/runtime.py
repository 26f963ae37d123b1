"""The runtime a checkpoint was written under, and what a resume may change of it.

The experiment digest says *what* was trained; exact continuation also needs *how*: the same
world size (the batch split and the order of every gradient sum), the same model files, and
the software that computed it. A resume whose runtime differs is refused (exit 6) naming each
difference. Package versions alone may change when the user says so
(``run --resume --allow-runtime-change``); the result then carries a warning, because the
continuation is no longer provably bit-exact. A world-size change is never allowed: nothing
proves it continues exactly.
"""

from __future__ import annotations

from typing import Any

from stateset_backend.common.errors import ResumeImpossible

# the fields every runtime identity has; only "versions" may change, and only when allowed
FIXED = ("world_size", "model")
CHANGEABLE = "versions"


def differences(recorded: dict[str, Any], current: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(fixed differences, version differences), each one line naming what changed."""
    fixed = [f"{name}: the checkpoint has {recorded.get(name)!r}, this launch "
             f"{current.get(name)!r}" for name in FIXED
             if recorded.get(name) != current.get(name)]
    was, now = recorded.get(CHANGEABLE) or {}, current.get(CHANGEABLE) or {}
    versions = [f"{name} {was.get(name)} -> {now.get(name)}"
                for name in sorted(set(was) | set(now)) if was.get(name) != now.get(name)]
    return fixed, versions


def check_resume(recorded: dict[str, Any] | None, current: dict[str, Any] | None, *,
                 allow_change: bool, where: str) -> list[str]:
    """Warnings to record for an allowed change; ResumeImpossible for any refused one. A
    checkpoint without a recorded runtime (written before runtimes were recorded) or an engine
    that reports none is not compared."""
    if recorded is None or current is None:
        return []
    fixed, versions = differences(recorded, current)
    if fixed:
        raise ResumeImpossible(f"{where}: the runtime differs from the checkpoint's: "
                               + "; ".join(fixed) + " (exact continuation needs the same)")
    if versions and not allow_change:
        raise ResumeImpossible(f"{where}: package versions differ from the checkpoint's: "
                               + "; ".join(versions) + " (pass --allow-runtime-change to "
                               "continue anyway)")
    return [f"resumed under changed package versions: {v}" for v in versions]
