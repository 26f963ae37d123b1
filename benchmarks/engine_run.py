"""One engine's training run, timed, in a process of its own: the launch the hub rendered for
it (``stateset-backend plan``), written into a fresh run folder and run there.

Running each engine from its own rendered launch, rather than rebuilding its trainer here,
makes the comparison the same by construction: TRL gets exactly the GRPOConfig, data, reward
shim and initial weights our TRL plugin hands it, the native engine exactly the settings the
hub hands ``python -m stateset_backend.native``. Only the training loop is timed (the model
load and the final save are not: TRL's launch saves after ``train()`` returns, and the native
engine's final save is left out to match). The process's peak RSS is its own, and torch's
thread pools are fixed before anything runs.

With ``--outside-torch UPDATES``, TRL's run also measures the share of its updates spent outside
torch's operators (outside_torch.py), as profile_native.py measures the native engine's.

    python benchmarks/engine_run.py {native,trl} PLAN --threads N [--outside-torch UPDATES]
        # prints RESULT={...}
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from outside_torch import Stretches


def plan(spec: Path, engine: str, work: Path) -> Path:
    """``stateset-backend plan --engine ENGINE``: the launch the hub would run."""
    out = work / f"{spec.stem}.{engine}.plan.json"
    done = subprocess.run([sys.executable, "-m", "stateset_backend", "plan", "--engine", engine,
                           str(spec), "-o", str(out)], capture_output=True, text=True,
                          env=harness.pinned_env(1))
    if done.returncode:
        raise SystemExit(f"planning {spec.name} for {engine} failed: {done.stderr.strip()}")
    return out


def write_launch(plan: dict[str, Any], run_dir: Path) -> list[str]:
    """The plan's files in ``run_dir`` and its command with the placeholders filled in, as
    the hub prepares an attempt."""
    from stateset_backend.runs.runner import fill_placeholders

    for name, content in plan["files"].items():
        (run_dir / name).write_text(content, encoding="utf-8")
    return [fill_placeholders(a, run_dir, sys.executable, None) for a in plan["argv"]]


def initial_weights(model: Any) -> dict[str, Any]:
    """The parameters' count and sha256 by name, before training: the comparison stops unless
    both sides start from the same weights."""
    digest, count = hashlib.sha256(), 0
    for name, param in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(param.detach().cpu().contiguous().numpy().tobytes())
        count += param.numel()
    return {"sha256": digest.hexdigest(), "parameters": count}


def run_native(plan: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The native engine's ``__main__`` on the rendered config, in this process."""
    from transformers.utils import logging as hf_logging

    from stateset_backend.native.parallel.distributed import World
    from stateset_backend.native.sft.trainer import trainer_for
    from stateset_backend.native.trainer import load_settings

    write_launch(plan, run_dir)
    hf_logging.disable_progress_bar()
    trainer = trainer_for(load_settings(run_dir / "native_config.json"), run_dir, World())
    initial = initial_weights(trainer.model)
    trainer.save_final = lambda: None  # type: ignore[method-assign]  # TRL saves untimed too
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    rows = [json.loads(x) for x in trainer.out.metrics.read_text().splitlines() if x.strip()]
    return {"seconds": seconds, "initial_weights": initial,
            "rewards": [r["reward/mean"] for r in rows if "reward/mean" in r]}


def run_trl(plan: dict[str, Any], run_dir: Path,
            outside: Stretches | None = None) -> dict[str, Any]:
    """The TRL plugin's generated launch script, in this process, with ``GRPOTrainer.train``
    timed (the script's subclass of it inherits the timed method); where ``outside`` is
    given, each optimizer step (an update: the plugin runs one per update where, as in every
    benchmark shape, the spec has one mini-batch and one epoch) begins it, from TRL's own
    ``on_step_begin``, which runs before the step's generation."""
    argv = write_launch(plan, run_dir)
    import trl
    from transformers import TrainerCallback

    timed: dict[str, Any] = {}
    train = trl.GRPOTrainer.train

    class UpdateBegins(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            assert outside is not None
            outside.begin_update()

    def timed_train(self: Any, *args: Any, **kwargs: Any) -> Any:
        timed["initial_weights"] = initial_weights(self.accelerator.unwrap_model(self.model))
        if outside is not None:
            self.add_callback(UpdateBegins())
        start = time.perf_counter()
        out = train(self, *args, **kwargs)
        timed["seconds"] = time.perf_counter() - start
        return out

    trl.GRPOTrainer.train = timed_train  # type: ignore[method-assign]
    script = next(a for a in argv if a.endswith(".py"))
    sys.argv = [script]
    launched = runpy.run_path(script, run_name="__main__")
    metrics = run_dir / launched["SETTINGS"]["files"]["metrics"]
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    got = {**timed, "rewards": [r["logs"]["reward"] for r in rows
                                if "reward" in r.get("logs", {})]}
    if outside is not None:
        got["outside_torch"] = outside.result()
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine", choices=["native", "trl"])
    parser.add_argument("plan", type=Path)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--outside-torch", type=int, metavar="UPDATES",
                        help="TRL only: measure the share outside torch's operators over "
                             "about UPDATES profiled updates (outside_torch.py)")
    args = parser.parse_args()
    plan = json.loads(args.plan.read_text())
    if args.outside_torch is not None:
        if args.engine != "trl":
            parser.error("--outside-torch measures TRL's run (profile_native.py measures "
                         "native's)")
        if args.outside_torch < 1:
            parser.error("--outside-torch takes the updates to profile: at least 1")
        budget = plan["spec"]["budget"]
        if budget["ppo_epochs"] * budget["mini_batches"] != 1:
            parser.error("--outside-torch counts an optimizer step as an update: plan a spec "
                         "with one epoch and one mini-batch")
    harness.set_threads(args.threads)
    os.environ.update(plan["set_env"])  # what the hub sets for the engine's process
    with tempfile.TemporaryDirectory(prefix=f"bench-{args.engine}-") as tmp:
        if args.engine == "native":
            result = run_native(plan, Path(tmp))
        else:
            outside = None if args.outside_torch is None else \
                Stretches.of(args.outside_torch)
            result = run_trl(plan, Path(tmp), outside)
    import torch

    result.update(updates=len(result["rewards"]),
                  peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  threads=torch.get_num_threads(), interop_threads=torch.get_num_interop_threads())
    print("RESULT=" + json.dumps(result))


if __name__ == "__main__":
    main()
