"""Proving, before launch, that the files a spec names are the files it pinned.

Engines other than the native one never look at ``sha256``; without this check a changed
data file or reward function would run as "the same experiment". Only local paths are
checked: a URI the engine resolves itself (``s3://``, ``hf://``) is the engine's to fetch.
"""

from __future__ import annotations

from pathlib import Path

from .content import sha256_file
from .errors import InvalidInput
from .spec import ExperimentSpec


def _local(uri: str, base_dir: Path) -> Path | None:
    if "://" in uri and not uri.startswith("file://"):
        return None
    path = Path(uri.removeprefix("file://"))
    return path if path.is_absolute() else base_dir / path


def reward_function(spec: ExperimentSpec, base_dir: str | None) -> tuple[str, str]:
    """(absolute file path, function name) of a python reward, for engines that import it."""
    file_part, _, function = spec.reward.entrypoint.rpartition(":")
    path = Path(file_part)
    return str(path if path.is_absolute() else Path(base_dir or ".") / path), function


def pinned_files(spec: ExperimentSpec, base_dir: Path) -> list[tuple[str, Path, str]]:
    """(spec field, local path, expected sha256) for every local file the spec pins."""
    pins: list[tuple[str, Path, str]] = []
    for name in ("train", "validation", "test"):
        split = getattr(spec.data, name)
        local = _local(split.uri, base_dir) if split is not None else None
        if split is not None and local is not None:
            pins.append((f"data.{name}", local, split.sha256))
    reward = spec.reward
    if reward.kind == "python" and reward.sha256 is not None:
        local = _local(reward.entrypoint.rpartition(":")[0], base_dir)
        if local is not None:
            pins.append(("reward", local, reward.sha256))
    return pins


def verify_inputs(spec: ExperimentSpec, base_dir: Path) -> None:
    """Exit 2 naming the first local file that is missing or has changed."""
    for field, path, expected in pinned_files(spec, base_dir):
        if not path.is_file():
            raise InvalidInput(f"{field}: {path} does not exist on this machine")
        actual = sha256_file(path)
        if actual != expected:
            raise InvalidInput(f"{field}: {path} has sha256 {actual}, the spec pins {expected}: "
                               "the file changed, so this would be a different experiment")
