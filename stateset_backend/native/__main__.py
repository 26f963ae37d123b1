"""``python -m stateset_backend.native --config CONFIG --output DIR [--resume-from CKPT]``.

The engine process the core launches, alone or as one rank of a torchrun group (data
parallel: ``resources.processes_per_node`` above 1). Any failure is one line on stderr and exit
status 1; the core records the run as failed and never as a success. A provider's stop request
(``stop-requested`` in the run directory: a cluster's warning before its time limit or a
pre-emption) ends the run after a checkpoint at the current update, with status 75. When one
rank fails or is killed, torchrun ends the others, so the group fails as a whole; a rank also
ends with the torchrun agent that started it (its node's agent killed, on one node or across
several), so the ranks on the other nodes fail at their next collective instead of training on
with an orphan.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_the_agent() -> None:
    """Under torchrun, have the kernel kill this rank when the agent that started it dies.

    torchrun starts each rank in a session of its own, so a signal to the agent's process group
    (a provider's kill, an out-of-memory kill of the agent) leaves the ranks running: an orphan
    would keep its GPU, and its peers would go on training with it. Linux only; elsewhere the
    provider's own cleanup is all there is."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    agent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return
    if os.getppid() != agent:  # the agent died before the request took hold
        os._exit(1)


def arguments() -> argparse.ArgumentParser:
    """The engine's command line; the conformance kit reads a resumed launch with it."""
    parser = argparse.ArgumentParser(prog="stateset_backend.native")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--resume-from", type=Path)
    return parser


def main() -> int:
    args = arguments().parse_args()
    die_with_the_agent()
    if os.environ.get("RANK", "0") == "0":  # before the imports and the model load (seconds)
        print("native engine: loading the model and data", file=sys.stderr, flush=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the run's own bar (or log line) is the one progress
    from stateset_backend.native.parallel.distributed import World, join
    from stateset_backend.native.sft.trainer import trainer_for
    from stateset_backend.native.trainer import StopRequested, load_settings

    world, code = World(), 0
    try:
        settings = load_settings(args.config)
        world = join(settings.spec.resources.world_size)
        trainer = trainer_for(settings, args.output, world)
        if args.resume_from is not None:
            trainer.resume(args.resume_from)
        trainer.train()
        # every rank leaves together, after rank 0 has written the final model: a rank that
        # tears its process group down while a peer still holds the connection can abort
        # (gloo: "terminate called without an active exception") and fail a finished run
        world.barrier()
    except StopRequested as stopped:  # the provider asked; resumable from this checkpoint
        if world.is_main:
            print(f"native engine: {stopped}; `run PLAN --resume` continues from it",
                  file=sys.stderr)
        from stateset_backend.providers.base import EXIT_STOPPED

        code = EXIT_STOPPED
    except Exception as exc:  # the process boundary: one line, non-zero exit
        rank = f" (rank {world.rank} on node {world.node})" if world.parallel else ""
        print(f"native engine{rank}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    finally:
        world.close()
    if code == 0 and world.is_main:
        print(f"native engine: {trainer.update_count} updates committed", file=sys.stderr)
    if world.parallel:
        # Even after the group is destroyed, gloo's threads can still abort the interpreter's
        # finalization the same way, turning a finished (or stopped) rank into a crash. By
        # now every record, checkpoint and the final model are written and closed, so a rank
        # of a parallel run leaves with its code without that finalization.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
