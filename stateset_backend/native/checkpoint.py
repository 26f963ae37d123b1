"""Complete checkpoints, written so that an interrupted write never looks complete.

A checkpoint holds everything exact continuation needs: trainable weights (safetensors),
optimizer and scheduler state, every RNG state, the data position, the update count, the
experiment digest, and the runtime it was computed under (world size, model, package
versions, each rank's data position: ``runtime.json``). It is written into a temporary
directory with a manifest of each file's sha256, fsynced, and renamed into place; a directory
without a valid manifest is not a checkpoint. Resuming verifies every hash and the experiment
digest first.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from stateset_backend.native.layout import (
    MANIFEST,
    RUNTIME_FILE,
    RUNTIME_PACKAGES,
    checkpoint_name,
    complete_checkpoints,
    manifest_problem,
    read_runtime,
)
from stateset_backend.spec.content import sha256_file


class CheckpointError(RuntimeError):
    """No usable checkpoint: missing, incomplete, corrupted, or of another experiment."""


CRITIC_WEIGHTS = "critic_weights.safetensors"
CRITIC_OPTIMIZER = "critic_optimizer.pt"
CRITIC_SCHEDULER = "critic_scheduler.pt"


@dataclass
class TrainerState:
    update: int
    policy_version: int
    sampler: dict[str, Any]
    extra: dict[str, Any]


def trainable_state(model: Any) -> dict[str, torch.Tensor]:
    """Only what trains: all weights, or the LoRA adapter weights alone."""
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {n: t.detach().contiguous().clone() for n, t in model.state_dict().items()
            if n in names}


def _torch_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def save(root: Path, *, model: Any, optimizer: Any, scheduler: Any, generator: torch.Generator,
         state: TrainerState, experiment_digest: str, keep: int | None,
         critic: Any = None, runtime: dict[str, Any] | None = None,
         protect: int | None = None) -> Path:
    """Write ``root/update-NNNNNN`` atomically; prune to the newest ``keep``, never the
    checkpoint of update ``protect`` (the one selection recommends so far: retention must not
    delete the model the run would recommend). A PPO critic (``native.critic.Critic``) is
    saved beside the policy: weights, optimizer, scheduler."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(state.update)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        save_file(trainable_state(model), str(tmp / "weights.safetensors"))
        _fsync_write(tmp / "optimizer.pt", _torch_bytes(optimizer.state_dict()))
        _fsync_write(tmp / "scheduler.pt", _torch_bytes(scheduler.state_dict()))
        if critic is not None:
            save_file(trainable_state(critic.model), str(tmp / CRITIC_WEIGHTS))
            _fsync_write(tmp / CRITIC_OPTIMIZER, _torch_bytes(critic.optimizer.state_dict()))
            _fsync_write(tmp / CRITIC_SCHEDULER, _torch_bytes(critic.scheduler.state_dict()))
        _fsync_write(tmp / "rng.pt", _torch_bytes({
            "torch": torch.get_rng_state(), "generator": generator.get_state(),
            "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}))
        _fsync_write(tmp / "trainer_state.json", json.dumps({
            "update": state.update, "policy_version": state.policy_version,
            "sampler": state.sampler, "extra": state.extra,
            "experiment_digest": experiment_digest}, indent=2, sort_keys=True).encode())
        if runtime is not None:
            _fsync_write(tmp / RUNTIME_FILE, json.dumps(runtime, indent=2,
                                                        sort_keys=True).encode())
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
        _fsync_write(tmp / MANIFEST, json.dumps({
            "experiment_digest": experiment_digest, "update": state.update,
            "files": files}, indent=2, sort_keys=True).encode())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        dir_fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep is not None:
        kept = root / checkpoint_name(protect) if protect is not None else None
        for old in complete_checkpoints(root)[:-keep]:
            if old != kept:
                shutil.rmtree(old)
    return final


def verify(directory: Path, experiment_digest: str) -> dict[str, Any]:
    """The manifest of a complete checkpoint of this experiment, or CheckpointError."""
    problem = manifest_problem(directory, experiment_digest)
    if problem is not None:
        raise CheckpointError(problem)
    return dict(json.loads((directory / MANIFEST).read_text()))


def load(directory: Path, *, experiment_digest: str, model: Any, optimizer: Any,
         scheduler: Any, generator: torch.Generator, critic: Any = None) -> TrainerState:
    verify(directory, experiment_digest)
    if critic is not None:
        _load_critic(directory, critic)
    weights = load_file(str(directory / "weights.safetensors"))
    expected = set(trainable_state(model))
    if set(weights) != expected:
        raise CheckpointError(f"{directory}: weights do not match the model's trainable "
                              "parameters")
    model.load_state_dict(weights, strict=False)
    optimizer.load_state_dict(torch.load(directory / "optimizer.pt", weights_only=False))
    scheduler.load_state_dict(torch.load(directory / "scheduler.pt", weights_only=False))
    rng = torch.load(directory / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    generator.set_state(rng["generator"])
    random.setstate(rng["python"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    doc = json.loads((directory / "trainer_state.json").read_text())
    return TrainerState(doc["update"], doc["policy_version"], doc["sampler"], doc["extra"])


def load_weights(directory: Path, manifest_sha256: str, model: Any) -> None:
    """Start ``model`` from another run's checkpoint (``model.from_run``): its manifest must be
    the one the spec names and every file the one the manifest lists; only the weights load,
    never that run's optimizer, data position or RNG."""
    manifest = directory / MANIFEST
    if not manifest.is_file():
        raise CheckpointError(f"{directory}: no staged checkpoint manifest")
    actual = sha256_file(manifest)
    if actual != manifest_sha256:
        raise CheckpointError(f"{manifest}: sha256 {actual}, model.from_run names "
                              f"{manifest_sha256}")
    problem = manifest_problem(directory, json.loads(manifest.read_text())["experiment_digest"])
    if problem is not None:
        raise CheckpointError(problem)
    weights = load_file(str(directory / "weights.safetensors"))
    if set(weights) != set(trainable_state(model)):
        raise CheckpointError(f"{directory}: its weights do not match this model's trainable "
                              "parameters")
    model.load_state_dict(weights, strict=False)


def _load_critic(directory: Path, critic: Any) -> None:
    if not (directory / CRITIC_WEIGHTS).is_file():
        raise CheckpointError(f"{directory}: has no critic, and this PPO run needs one")
    weights = load_file(str(directory / CRITIC_WEIGHTS))
    if set(weights) != set(trainable_state(critic.model)):
        raise CheckpointError(f"{directory}: critic weights do not match the critic's "
                              "parameters")
    critic.model.load_state_dict(weights, strict=False)
    critic.optimizer.load_state_dict(torch.load(directory / CRITIC_OPTIMIZER,
                                                weights_only=False))
    critic.scheduler.load_state_dict(torch.load(directory / CRITIC_SCHEDULER,
                                                weights_only=False))


def package_versions() -> dict[str, str | None]:
    """The installed versions of the packages that compute a native run."""
    from importlib import metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {name: version(name) for name in RUNTIME_PACKAGES}


def runtime_identity(spec: Any, world_size: int,
                     ranks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    from stateset_backend.native.layout import runtime_identity as build

    return build(spec, world_size, package_versions(), ranks)


def generator_digest(generator: torch.Generator) -> str:
    """A short fingerprint of a generator's state: ranks that agree on it drew alike."""
    import hashlib

    return hashlib.sha256(generator.get_state().numpy().tobytes()).hexdigest()


def refuse_other_world(directory: Path, world_size: int) -> None:
    """The engine's own guard: a checkpoint continues only in the world size it was written
    in (the core refuses earlier, with exit 6; this holds for a direct engine launch too)."""
    runtime = read_runtime(directory)
    recorded = 1 if runtime is None else int(runtime.get("world_size", 1))
    if recorded != world_size:
        raise CheckpointError(f"{directory}: written by {recorded} process(es), resumed with "
                              f"{world_size}: exact continuation needs the same world size")
