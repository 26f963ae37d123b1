"""Where an engine resumes from, read the way its own code reads a launch: the kit's
independent word on resume, written from each engine's code, never from an adapter.

A retry that the hub calls a resume but the engine starts afresh is the silent failure the
resume check exists for: a launch that names the checkpoint in a key the engine never reads
at that mode, or that stages it where the engine does not look, keeps every structural sign of
a resume. So the kit reads the resumed launch with the engine's own parser and follows the
engine's own rule from there to the checkpoint folder it would load, or to none:

- verl (``trainer/ppo/ray_trainer.py _load_checkpoint``): ``resume_mode`` ``disable`` loads
  nothing; ``resume_path`` loads ``resume_from_path`` (a ``global_step_N`` folder, N the update);
  ``auto`` loads the folder ``default_local_dir``'s ``latest_checkpointed_iteration.txt`` names
  (``utils/checkpoint/checkpoint_manager.py find_latest_ckpt_path``), when it exists.
- OpenRLHF (``trainer/ray/ppo_actor.py``): only with ``--ckpt.load_enable`` (``--load_checkpoint``
  before 0.10.2) and ``<ckpt path>/_actor`` present, DeepSpeed loads the tag its ``latest`` file
  names.
- NeMo RL (``algorithms/grpo.py`` setup, ``utils/checkpoint.py
  CheckpointManager.get_latest_checkpoint_path``): the ``step_N`` folder of ``checkpoint_dir``
  with the highest N, looked for whether or not checkpointing is on.
- the native engine: the folder its own argument parser reads from ``--resume-from``.

A plugin gives its engine's rule as ``KitSupport.resumes_from(argv, read, attempt_dir)``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

# (the launch's argv as launched, the engine's reading of it, the attempt folder it runs in)
Resumes = Callable[[list[str], dict[str, Any], Path], Path | None]


def _path(value: Any, attempt: Path) -> Path | None:
    """A configured path as the engine opens it: the hub's run folder placeholder filled in,
    a relative path taken from the attempt folder, where the engine runs."""
    if not isinstance(value, str) or not value:
        return None
    path = Path(value.replace("{run_dir}", str(attempt)))
    return path if path.is_absolute() else attempt / path


def verl(argv: list[str], read: dict[str, Any], attempt: Path) -> Path | None:
    mode = read.get("trainer.resume_mode", "auto")
    if mode == "disable":
        return None
    if mode == "resume_path":
        folder = _path(read.get("trainer.resume_from_path"), attempt)
        return folder if folder is not None and "global_step_" in folder.name else None
    root = _path(read.get("trainer.default_local_dir"), attempt)
    if root is None or not (tracker := root / "latest_checkpointed_iteration.txt").is_file():
        return None
    folder = root / f"global_step_{int(tracker.read_text().strip())}"
    return folder if folder.exists() else None


def openrlhf(argv: list[str], read: dict[str, Any], attempt: Path) -> Path | None:
    load = read.get("--ckpt.load_enable", read.get("--load_checkpoint", False))
    root = _path(read.get("--ckpt.path", read.get("--ckpt_path")), attempt)
    if load is not True or root is None:
        return None
    return _deepspeed_tag(root / "_actor")


def _deepspeed_tag(role: Path) -> Path | None:
    """The folder DeepSpeed's ``load_checkpoint`` loads for one model: the tag its ``latest``
    file names; none without it (DeepSpeed: "No checkpoint found", trained from scratch)."""
    latest = role / "latest"
    if not latest.is_file():
        return None
    folder = role / latest.read_text().strip()
    return folder if folder.is_dir() else None


def nemo_rl(argv: list[str], read: dict[str, Any], attempt: Path) -> Path | None:
    root = _path(read.get("checkpointing.checkpoint_dir"), attempt)
    if root is None or not root.is_dir():
        return None
    steps = [p for p in root.glob("step_*") if re.fullmatch(r"step_\d+", p.name)]
    return max(steps, key=lambda p: int(p.name.split("_")[1]), default=None)


def native(argv: list[str], read: dict[str, Any], attempt: Path) -> Path | None:
    """The native engine's own argument parser (``native/__main__.py``): ``--resume-from``."""
    from stateset_backend.native.__main__ import arguments

    module = "stateset_backend.native"
    rest = argv[argv.index(module) + 1:] if module in argv else []
    resume = arguments().parse_args(rest).resume_from
    return resume if resume is None or resume.is_absolute() else attempt / resume


BUILTIN: dict[str, Resumes] = {"verl": verl, "openrlhf": openrlhf, "nemo-rl": nemo_rl,
                               "native": native}


def verl_runs_critic(read: dict[str, Any]) -> bool:
    """verl's ``need_critic`` (``trainer/ppo/utils.py``, 0.6 on; before it, gae alone):
    ``critic.enable`` where set, else a gae advantage estimator."""
    enable = read.get("critic.enable")
    return bool(enable) if enable is not None else read.get("algorithm.adv_estimator") == "gae"


def verl_critic(argv: list[str], read: dict[str, Any], attempt: Path) -> Path | None:
    """verl's critic worker loads ``critic`` in the step folder the actor loads from."""
    folder = verl(argv, read, attempt)
    return None if folder is None else folder / "critic"


def openrlhf_runs_critic(read: dict[str, Any]) -> bool:
    """OpenRLHF builds a critic for a gae estimator (``cli/train_ppo_ray.py``: its
    ``critic_pretrain`` then defaults to the reward model, else the policy)."""
    estimator = read.get("--algo.advantage.estimator", read.get("--advantage_estimator"))
    return estimator == "gae"


def openrlhf_critic(argv: list[str], read: dict[str, Any], attempt: Path) -> Path | None:
    """The critic's DeepSpeed tag, named by ``<ckpt path>/_critic/latest``, under the same
    load switch as the actor's (``trainer/ray/ppo_critic.py``; without it the critic starts
    from its pretrained weights, or, in 0.9.8, the load fails)."""
    actor = openrlhf(argv, read, attempt)
    return None if actor is None else _deepspeed_tag(actor.parent.parent / "_critic")


class Critic(NamedTuple):
    """An engine's own rules for a separate critic: whether the launch, as the engine reads
    it, runs one, and the folder a resumed launch loads it from."""

    runs: Callable[[dict[str, Any]], bool]
    resumes: Resumes


# the engines whose critic the kit's writers save: a resume that left the critic behind would
# train the policy on advantages from an untrained value function, and say nothing
CRITICS: dict[str, Critic] = {"verl": Critic(verl_runs_critic, verl_critic),
                              "openrlhf": Critic(openrlhf_runs_critic, openrlhf_critic)}


def resumes_for(engine: str, declared: Resumes | None) -> Resumes | None:
    """The kit's own rule for a built-in engine, else the one the plugin declares."""
    return BUILTIN.get(engine, declared)
