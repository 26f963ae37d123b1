"""Adapter for the native engine: the embedded torch trainer in ``stateset_backend.native``.

The native engine speaks the spec's own vocabulary, so translation is the identity on every
leaf it can honour; it still goes through the same rules, plan and launch path as any other
engine, as a child process, so nothing about it is special-cased in the core.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stateset_backend.native import layout, options
from stateset_backend.native.multiturn.settings import conversation_refusals
from stateset_backend.native.parallel.settings import data_parallel_refusals
from stateset_backend.native.ppo.settings import ppo_refusals
from stateset_backend.plugin import (
    BUILTIN_PREFIX,
    CORE_HANDLED,
    PROVIDERS_ACROSS_NODES,
    PYTHON,
    RUN_DIR,
    Artifact,
    Checkpoint,
    Collected,
    Dialect,
    EngineAdapter,
    ExperimentSpec,
    InvalidInput,
    KitSupport,
    LaunchContext,
    NativeLaunch,
    Outcome,
    Pinned,
    Refused,
    Rehearsal,
    RuleSet,
    Translation,
    Unsupported,
    all_leaf_paths,
    builtin_dir,
    distribution_version,
    leaves,
    log_rows,
    only,
    to,
)


def _chat_template(value: Any, spec: ExperimentSpec) -> Outcome:
    if value and spec.model.path.startswith(BUILTIN_PREFIX):
        return Refused(f"{spec.model.path} ships no chat template: set data.chat_template to "
                       "false to tokenize prompts as plain text")
    return Pinned({"data.chat_template": value})


def _param_dtype(value: Any, spec: ExperimentSpec) -> Outcome:
    if value == "bfloat16" and spec.model.dtype != "bfloat16":
        return Refused(f"bfloat16 weights cannot compute in {spec.model.dtype}: the native "
                       "engine computes in the weights' dtype or narrower")
    return Pinned({"model.param_dtype": value})


def _environment_kind(value: Any, spec: ExperimentSpec) -> Outcome:
    problems = conversation_refusals(spec)
    if problems:
        return Refused("; ".join(problems))
    return Pinned({"environment.kind": value})


def _reward_kind(value: Any, spec: ExperimentSpec) -> Outcome:
    if value == "python" or (value == "environment" and spec.environment.kind != "single_turn"):
        return Pinned({"reward.kind": value})
    return Refused("the native engine calls python reward functions in process, or takes the "
                   "rewards of a conversation's environment")


def _critic(value: Any, spec: ExperimentSpec) -> Outcome:
    """Every PPO setting the native critic cannot honour, refused on the critic's row."""
    problems = ppo_refusals(spec)
    if problems:
        return Refused("; ".join(problems))
    return Pinned({"algorithm.gae.critic.model": value})


def _dual_clip(value: Any, spec: ExperimentSpec) -> Outcome:
    if value is not None and spec.algorithm.objective in ("gspo", "cispo"):
        return Refused(f"the native {spec.algorithm.objective} loss has no dual clip")
    return Pinned({"algorithm.clip.dual_clip": value})


def _processes(value: Any, spec: ExperimentSpec) -> Outcome:
    """Several processes split each update's groups; settings with no exact data-parallel
    meaning are refused here, before anything launches."""
    problems = data_parallel_refusals(spec)
    if problems:
        return Refused("; ".join(problems))
    return Pinned({"resources.processes_per_node": value})


TORCHRUN = ["-m", "torch.distributed.run"]
# a torchrun flag the rendezvous of one launch sets (node_argv replaces them, never doubles them)
_RENDEZVOUS_FLAGS = ("--standalone", "--node-rank", "--node_rank", "--rdzv-backend",
                     "--rdzv_backend", "--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-id",
                     "--rdzv_id", "--master-addr", "--master_addr", "--master-port",
                     "--master_port", "--local-addr", "--local_addr")
# a node rank the caller fills in per node: {node_rank}, $SLURM_NODEID, ${SLURM_NODEID}
_PLACEHOLDER = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\]")
_RENDEZVOUS_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def launcher_argv(spec: ExperimentSpec) -> list[str]:
    """How the engine process starts; every value is its own argv item, never shell text.

    - one process: the engine directly;
    - several processes on one node: torchrun ``--standalone`` (a rendezvous on this machine
      at a free port), what the local provider runs;
    - several nodes: torchrun with the node count and the processes per node, and no
      rendezvous: a provider that starts the launch on every node supplies it, either as
      torchrun's environment (``PET_RDZV_BACKEND``, ``PET_RDZV_ENDPOINT``, ``PET_RDZV_ID``,
      ``PET_NODE_RANK``, as the Slurm batch script does, so every node runs the same argv) or
      as flags (:func:`node_argv`).
    """
    engine = ["-m", "stateset_backend.native", "--config", f"{RUN_DIR}/{layout.CONFIG_FILE}",
              "--output", RUN_DIR]
    resources = spec.resources
    if resources.world_size == 1:
        return [PYTHON, *engine]
    if resources.nodes == 1:
        return [PYTHON, *TORCHRUN, "--standalone", "--nnodes=1",
                f"--nproc_per_node={resources.processes}", "--max_restarts=0", *engine]
    return [PYTHON, *TORCHRUN, f"--nnodes={resources.nodes}",
            f"--nproc_per_node={resources.processes}", "--max_restarts=0", *engine]


def node_argv(argv: Sequence[str], *, node_rank: int | str, endpoint: str,
              rendezvous_id: str, static: bool = False,
              local_addr: str | None = None) -> list[str]:
    """One node's launch of a native plan that runs under torchrun.

    ``argv`` is the plan's argv (or a prepared launch's: placeholders filled, ``--resume-from``
    added), which fixes the node count (``--nnodes``) and the processes per node
    (``--nproc_per_node``). The result is the same launch with this node's place in the
    rendezvous as torchrun flags, replacing ``--standalone`` for a one-node plan:

    - ``node_rank``: this node's rank, ``0 <= node_rank < nodes``, or a placeholder the caller
      fills in on each node (``{node_rank}``, ``$SLURM_NODEID``; the argv is never given to a
      shell, so the caller substitutes it);
    - ``endpoint``: ``HOST:PORT`` every node reaches, on the node that hosts the rendezvous;
    - ``rendezvous_id``: the same on every node of one launch and different between launches
      (a run id and its attempt);
    - ``static``: torchrun's static form (``--master-addr``/``--master-port`` and the node
      ranks as given) instead of a c10d rendezvous (ranks by arrival, any node first);
    - ``local_addr``: the address this node's agent gives the others (default: its fully
      qualified host name), for a node with several interfaces.

    Which node holds global rank 0 does not matter: the ranks compute the same split whatever
    their placement, and rank 0 writes every record into the shared run directory.
    """
    argv = list(argv)
    try:
        script = argv.index("-m", 3)
    except ValueError:
        script = -1
    if argv[1:3] != TORCHRUN or script < 0:
        raise ValueError("not a torchrun launch: a plan of one process has no rendezvous")
    options = argv[3:script]
    nodes = next((int(o.split("=", 1)[1]) for o in options if o.startswith("--nnodes=")), 1)
    if isinstance(node_rank, bool) or not (
            (isinstance(node_rank, int) and 0 <= node_rank < nodes)
            or (isinstance(node_rank, str) and _PLACEHOLDER.fullmatch(node_rank))):
        raise ValueError(f"node_rank {node_rank!r}: a rank below {nodes} or a placeholder "
                         "such as {node_rank} or $SLURM_NODEID")
    host, _, port = endpoint.rpartition(":")
    if not (_HOST.fullmatch(host) and port.isdigit() and 0 < int(port) < 65536) or \
            host in ("0.0.0.0", "[::]"):
        raise ValueError(f"endpoint {endpoint!r}: HOST:PORT of the node that hosts the "
                         "rendezvous, reachable from every node")
    if not _RENDEZVOUS_ID.fullmatch(rendezvous_id):
        raise ValueError(f"rendezvous_id {rendezvous_id!r}: letters, digits, '_', '.', '-'")
    if local_addr is not None and not _HOST.fullmatch(local_addr):
        raise ValueError(f"local_addr {local_addr!r}: a host name or an IP address")
    kept = [o for o in options if o.split("=", 1)[0] not in _RENDEZVOUS_FLAGS]
    if static:
        place = ["--rdzv-backend=static", f"--master-addr={host.strip('[]')}",
                 f"--master-port={port}"]
    else:
        place = ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}"]
    place += [f"--rdzv-id={rendezvous_id}", f"--node-rank={node_rank}"]
    if local_addr is not None:
        place.append(f"--local-addr={local_addr}")
    return [*argv[:3], *kept, *place, *argv[script:]]


def _refuse_one_machine(spec: ExperimentSpec, ctx: LaunchContext) -> None:
    """A run across nodes starts torchrun once on every node; a provider that starts processes
    on one machine cannot run it. The spec is fine: the plan is refused for this provider."""
    nodes = spec.resources.nodes
    if nodes > 1 and ctx.provider not in PROVIDERS_ACROSS_NODES:
        raise Unsupported(
            f"resources.nodes {nodes}: the {ctx.provider} provider starts the native engine's "
            "processes on one machine; across nodes the engine runs under a provider that "
            "starts one torchrun agent on every node: "
            + ", ".join(sorted(PROVIDERS_ACROSS_NODES)))


def _execution(translation: Translation, spec: ExperimentSpec) -> dict[str, Any]:
    """The launch's execution options: the engine's defaults, then ``engine_options.native``
    (a spec setting given there is refused before this, in translation). What the engine
    would not read, or would not use in this run, is refused here rather than ignored there
    (options.problems, which the trainer applies again at start)."""
    given = spec.engine_options.get("native", {})
    execution = {**options.DEFAULTS,
                 **{k: translation.native.get(k, v) for k, v in given.items()}}
    problems = options.problems(execution, spec)
    if problems:
        raise InvalidInput(f"engine_options.native.{problems[0]}")
    return execution


def _update_of(path: Path, root: Path) -> int | None:
    """The update a checkpoint file belongs to, from its ``update-NNNNNN`` folder."""
    folder = path.relative_to(root).parts[0]
    if folder.startswith(layout.CHECKPOINT_PREFIX):
        return int(folder.removeprefix(layout.CHECKPOINT_PREFIX))
    return None


class NativeAdapter(EngineAdapter):
    name = "native"
    contract_file = "native.json"
    cluster_launch = "torchrun"  # one torchrun agent per node (a single node runs it alone)

    def rules(self, dialect: Dialect) -> RuleSet:
        rules: dict[str, Any] = {path: to(path) for path in all_leaf_paths(ExperimentSpec)}
        rules.update({
            "rollout.backend": only(lambda v: v == "hf", "the native engine samples with its "
                                    "own KV-cache loop ('hf'), not vllm or sglang", to(
                                        "rollout.backend")),
            "algorithm.gae.critic.model": _critic,
            "name": to("name"),
            "resources.nodes": to("resources.nodes"),  # the provider decides (render)
            "resources.processes_per_node": _processes,
            "reward.kind": _reward_kind,
            "data.chat_template": _chat_template,
            "model.param_dtype": _param_dtype,
            "algorithm.clip.dual_clip": _dual_clip,
        })
        for core_handled in ("engine_options", "labels", "version", "equivalence"):
            rules.pop(core_handled, None)
        rules["environment.kind"] = _environment_kind
        return rules

    def kit_support(self) -> KitSupport:
        # the kit writes the native engine's outputs from the engine's own layout
        return KitSupport(option_key=lambda plan: None, unsupported={
            "multi_node": "the kit plans for the local provider, which starts processes on "
                          "one machine; a native plan across nodes is made for a provider "
                          "that starts one torchrun agent per node ("
                          + ", ".join(sorted(PROVIDERS_ACROSS_NODES)) + ")"})

    def render(self, translation: Translation, spec: ExperimentSpec,
               ctx: LaunchContext) -> NativeLaunch:
        try:
            builtin_dir(spec.model.path)
        except FileNotFoundError as exc:  # found now, not after a launch
            raise InvalidInput(f"model.path: {exc}") from None
        _refuse_one_machine(spec, ctx)
        execution = _execution(translation, spec)
        # The engine speaks the spec's vocabulary: it gets every leaf, the inert ones too, so
        # it can prove the settings hash back to the experiment digest it carries.
        settings = {**{path: value for path, value in leaves(spec) if path not in CORE_HANDLED},
                    **{k: v for k, v in translation.native.items() if k not in execution}}
        config = {"run_id": ctx.run_id, "experiment_digest": ctx.experiment_digest,
                  "base_dir": ctx.base_dir, "settings": settings, "execution": execution}
        return NativeLaunch(
            argv=launcher_argv(spec),
            files={layout.CONFIG_FILE: json.dumps(config, indent=2, sort_keys=True) + "\n"},
            env=["CUDA_VISIBLE_DEVICES", "STATESET_BACKEND_PROGRESS"],
            native={**settings, **execution},
        )

    def collect(self, attempt_dir: Path, ctx: LaunchContext) -> Collected:
        out = Collected()
        info_path = attempt_dir / layout.RUN_INFO_FILE
        if info_path.is_file():
            info = json.loads(info_path.read_text(encoding="utf-8"))
            out.run_id = info.get("run_id")
            out.experiment_digest = info.get("experiment_digest")
            out.committed_updates = int(info.get("committed_updates", 0))
            out.resumed_from = info.get("resumed_from")
            out.execution = info.get("execution")
        # a sealed checkpoint is committed: its records were flushed before it was written,
        # and the progress record that says so is written just after it, so a run killed
        # between the two still counts the update its resume will start after
        sealed = self.checkpoints(attempt_dir)
        if sealed:
            out.committed_updates = max(out.committed_updates, sealed[-1].update)
        metrics_path = attempt_dir / layout.METRICS_FILE
        if metrics_path.is_file():
            out.metrics.extend(log_rows(metrics_path.read_text(encoding="utf-8")))
        for kind in (layout.CHECKPOINTS_DIR, layout.FINAL_DIR):
            root = attempt_dir / kind
            if root.is_dir():
                out.artifacts.extend(
                    Artifact(str(p.relative_to(attempt_dir)), kind.rstrip("s"),
                             _update_of(p, root))
                    for p in sorted(root.rglob("*")) if p.is_file())
        return out

    def latest_checkpoint(self, attempt_dir: Path) -> Checkpoint | None:
        found = self.checkpoints(attempt_dir)
        return found[-1] if found else None

    def checkpoints(self, attempt_dir: Path) -> list[Checkpoint]:
        return [Checkpoint(p, int(p.name.removeprefix(layout.CHECKPOINT_PREFIX)))
                for p in layout.complete_checkpoints(attempt_dir / layout.CHECKPOINTS_DIR)]

    def named_checkpoint(self, attempt_dir: Path, name: str) -> Checkpoint | None:
        found = [p for p in layout.complete_checkpoints(attempt_dir / layout.CHECKPOINTS_DIR)
                 if p.name == name]
        return Checkpoint(found[0], int(name.removeprefix(layout.CHECKPOINT_PREFIX))) \
            if found else None

    def checkpoint_problem(self, checkpoint: Checkpoint, experiment_digest: str) -> str | None:
        return layout.manifest_problem(checkpoint.path, experiment_digest)

    def checkpoint_runtime(self, checkpoint: Checkpoint) -> dict[str, Any] | None:
        return layout.read_runtime(checkpoint.path)

    def current_runtime(self, spec: ExperimentSpec, python: str | None = None) -> \
            dict[str, Any] | None:
        versions = {name: distribution_version(name, python)
                    for name in layout.RUNTIME_PACKAGES}
        return layout.runtime_identity(spec, spec.resources.world_size, versions)

    def resume_argv(self, checkpoint: Checkpoint, argv: list[str],
                    attempt_dir: Path) -> list[str]:
        return [*argv, "--resume-from", str(checkpoint.path)]

    def rehearse(self, plan: Any) -> Rehearsal:
        # the engine already trains on a CPU: its rehearsal is its own launch of the plan
        return Rehearsal(argv=list(plan.argv), covers="the whole native engine, as `run` "
                         "launches it", gap_unmeasured="the native engine logs no comparison "
                         "of its rollout's log-probs with the learner's recompute")

    def evaluate_checkpoint(self, attempt_dir: Path, checkpoint: Checkpoint,
                            split: str) -> dict[str, float]:
        from stateset_backend.native.evaluate import (
            evaluate_checkpoint,  # torch: only when evaluating
        )

        return evaluate_checkpoint(attempt_dir, checkpoint.path, split)

    def reload_checkpoint(self, attempt_dir: Path, checkpoint: Checkpoint) -> dict[str, Any]:
        from stateset_backend.native.evaluate import reload_checkpoint

        return reload_checkpoint(attempt_dir, checkpoint.path)
